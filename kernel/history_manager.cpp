#include "history_manager.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <system_error>

namespace terra::kernel {
namespace {

// IPython's history schema (IPython/core/history.py), so its tools can read the file.
constexpr const char* kSchema = R"sql(
  CREATE TABLE IF NOT EXISTS sessions (session integer primary key autoincrement,
                                       start timestamp, end timestamp, num_cmds integer,
                                       remark text);
  CREATE TABLE IF NOT EXISTS history (session integer, line integer, source text,
                                      source_raw text, PRIMARY KEY (session, line));
  CREATE TABLE IF NOT EXISTS output_history (session integer, line integer, output text,
                                             PRIMARY KEY (session, line));
)sql";

constexpr const char* kNow = "strftime('%Y-%m-%d %H:%M:%f', 'now', 'localtime')";

// Owns a prepared statement for the length of one call.
struct statement {
  sqlite3_stmt* handle = nullptr;
  statement(sqlite3* db, const std::string& sql) {
    sqlite3_prepare_v2(db, sql.c_str(), -1, &handle, nullptr);
  }
  ~statement() { sqlite3_finalize(handle); }
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;

  // Binds a JSON array of integers and strings to ?1, ?2, ...
  void bind(const nl::json& params) {
    int index = 1;
    for (const auto& p : params) {
      if (p.is_string()) {
        const auto& text = p.get_ref<const std::string&>();
        sqlite3_bind_text(handle, index, text.c_str(), static_cast<int>(text.size()),
                          SQLITE_TRANSIENT);
      } else {
        sqlite3_bind_int64(handle, index, p.get<sqlite3_int64>());
      }
      ++index;
    }
  }
};

std::string text_column(sqlite3_stmt* stmt, int column) {
  const auto* text = sqlite3_column_text(stmt, column);
  return text ? std::string(reinterpret_cast<const char*>(text)) : std::string();
}

nl::json error_reply(const std::string& what) {
  return {{"status", "error"}, {"ename", "HistoryError"}, {"evalue", what},
          {"traceback", nl::json::array()}, {"history", nl::json::array()}};
}

}  // namespace

std::string history_manager::default_path() {
  namespace fs = std::filesystem;
  fs::path data;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) {
    data = xdg;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    data = fs::path(home) / ".local" / "share";
  } else {
    return ":memory:";
  }
  return (data / "terra" / "history.sqlite").string();
}

history_manager::history_manager(const std::string& path) {
  if (!open(path)) {
    std::cerr << "terra-kernel: cannot open the history store " << path << " ("
              << (m_db ? sqlite3_errmsg(m_db) : "out of memory")
              << "); this session's history stays in memory" << std::endl;
    sqlite3_close(m_db);
    m_db = nullptr;
    open(":memory:");
  }
}

history_manager::~history_manager() { sqlite3_close(m_db); }

bool history_manager::open(const std::string& path) {
  m_path = path;
  if (path != ":memory:") {
    std::error_code ignored;  // a failure shows up as sqlite3_open_v2's error below
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  }
  if (sqlite3_open_v2(path.c_str(), &m_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    return false;
  }
  // Several kernels may share the file; wait for a writer instead of failing.
  sqlite3_busy_timeout(m_db, 5000);
  if (!exec(kSchema)) return false;
  if (!exec((std::string("INSERT INTO sessions (start, num_cmds, remark) VALUES (") + kNow +
             ", 0, 'terra')").c_str())) {
    return false;
  }
  m_session = static_cast<int>(sqlite3_last_insert_rowid(m_db));
  return true;
}

bool history_manager::exec(const char* sql) const {
  char* message = nullptr;
  if (sqlite3_exec(m_db, sql, nullptr, nullptr, &message) == SQLITE_OK) return true;
  std::cerr << "terra-kernel: history store: " << (message ? message : "unknown error")
            << std::endl;
  sqlite3_free(message);
  return false;
}

void history_manager::record(int line, const std::string& source, const std::string& raw,
                             const std::optional<std::string>& output) {
  statement input(m_db, "INSERT OR REPLACE INTO history VALUES (?, ?, ?, ?)");
  input.bind(nl::json::array({m_session, line, source, raw}));
  if (sqlite3_step(input.handle) != SQLITE_DONE) {
    std::cerr << "terra-kernel: history store: " << sqlite3_errmsg(m_db) << std::endl;
    return;
  }
  ++m_commands;
  if (output) {
    statement out(m_db, "INSERT OR REPLACE INTO output_history VALUES (?, ?, ?)");
    out.bind(nl::json::array({m_session, line, *output}));
    sqlite3_step(out.handle);
  }
}

void history_manager::end_session() {
  statement end(m_db, std::string("UPDATE sessions SET end = ") + kNow +
                          ", num_cmds = ? WHERE session = ?");
  end.bind(nl::json::array({m_commands, m_session}));
  sqlite3_step(end.handle);
}

nl::json history_manager::query(const std::string& sql, const nl::json& params, bool output,
                                bool reverse) const {
  statement stmt(m_db, sql);
  if (!stmt.handle) return error_reply(sqlite3_errmsg(m_db));
  stmt.bind(params);
  nl::json history = nl::json::array();
  int rc = 0;
  while ((rc = sqlite3_step(stmt.handle)) == SQLITE_ROW) {
    nl::json input = text_column(stmt.handle, 2);
    nl::json entry = nl::json::array(
        {sqlite3_column_int(stmt.handle, 0), sqlite3_column_int(stmt.handle, 1)});
    if (output) {
      nl::json out = sqlite3_column_type(stmt.handle, 3) == SQLITE_NULL
                         ? nl::json(nullptr)
                         : nl::json(text_column(stmt.handle, 3));
      entry.push_back(nl::json::array({std::move(input), std::move(out)}));
    } else {
      entry.push_back(std::move(input));
    }
    history.push_back(std::move(entry));
  }
  if (rc != SQLITE_DONE) return error_reply(sqlite3_errmsg(m_db));
  // Newest-first queries (tail, search with a limit) are answered oldest-first, as IPython does.
  if (reverse) std::reverse(history.begin(), history.end());
  return {{"status", "ok"}, {"history", std::move(history)}};
}

namespace {

// SELECT list and FROM clause shared by the three kinds of request.
std::string select_from(bool raw, bool output) {
  std::string sql = "SELECT h.session, h.line, h.";
  sql += raw ? "source_raw" : "source";
  if (output) {
    sql += ", o.output FROM history h LEFT JOIN output_history o "
           "ON o.session = h.session AND o.line = h.line";
  } else {
    sql += " FROM history h";
  }
  return sql;
}

}  // namespace

nl::json history_manager::get_tail_impl(int n, bool raw, bool output) const {
  return query(select_from(raw, output) + " ORDER BY h.session DESC, h.line DESC LIMIT ?",
               nl::json::array({n}), output, true);
}

nl::json history_manager::get_range_impl(int session, int start, int stop, bool raw,
                                         bool output) const {
  // Like IPython: 0 is this session, negative numbers count back from it.
  const int absolute = session > 0 ? session : m_session + session;
  return query(select_from(raw, output) +
                   " WHERE h.session = ? AND h.line >= ? AND h.line < ? ORDER BY h.line",
               nl::json::array({absolute, start, stop}), output, false);
}

nl::json history_manager::search_impl(const std::string& pattern, bool raw, bool output, int n,
                                      bool unique) const {
  const std::string column = raw ? "source_raw" : "source";
  std::string sql = select_from(raw, output) + " WHERE h." + column + " GLOB ?1";
  if (unique) {
    // One entry per distinct input: its latest occurrence.
    sql += " AND h.rowid IN (SELECT MAX(rowid) FROM history WHERE " + column +
           " GLOB ?1 GROUP BY " + column + ")";
  }
  sql += " ORDER BY h.session DESC, h.line DESC LIMIT ?2";
  return query(sql, nl::json::array({pattern, n > 0 ? n : -1}), output, true);
}

}  // namespace terra::kernel
