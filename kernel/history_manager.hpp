// The kernel's input history: an IPython-style SQLite store that answers history_request (tail,
// range, search, with or without output) and outlives the kernel process.
//
// The schema is IPython's (sessions, history, output_history), so IPython's HistoryAccessor can
// read the file. Each kernel process is one session; line numbers are the execution counts the
// frontend shows. The store lives in $TERRA_HISTORY_FILE, else
// ${XDG_DATA_HOME:-~/.local/share}/terra/history.sqlite; if it cannot be opened the kernel keeps
// history in memory for this session and says so on stderr.
//
// xeus 2.4 calls store_inputs() with session 0 and the request's (usually absent) execution count,
// so that hook is ignored: the interpreter calls record() with the real count instead.
#pragma once

#include <sqlite3.h>

#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "xeus/xhistory_manager.hpp"

namespace terra::kernel {

class history_manager final : public xeus::xhistory_manager {
 public:
  explicit history_manager(const std::string& path);
  ~history_manager() override;

  // Stores one executed cell: `source` is the Python IPython ran (magics transformed), `raw` the
  // cell as typed, `output` the text/plain of its result if it had one.
  void record(int line, const std::string& source, const std::string& raw,
              const std::optional<std::string>& output);
  // Stamps the session's end time and command count (on shutdown_request).
  void end_session();

  int session() const { return m_session; }
  const std::string& path() const { return m_path; }

  // Where the store lives when $TERRA_HISTORY_FILE is not set.
  static std::string default_path();

 private:
  void configure_impl() override {}
  void store_inputs_impl(int, int, const std::string&, const std::string&) override {}
  nl::json get_tail_impl(int n, bool raw, bool output) const override;
  nl::json get_range_impl(int session, int start, int stop, bool raw,
                          bool output) const override;
  nl::json search_impl(const std::string& pattern, bool raw, bool output, int n,
                       bool unique) const override;

  bool open(const std::string& path);
  bool exec(const char* sql) const;
  // Runs a query whose columns are (session, line, source[, output]) into a history_reply.
  nl::json query(const std::string& sql, const nl::json& params, bool output,
                 bool reverse) const;

  sqlite3* m_db = nullptr;
  std::string m_path;
  int m_session = 0;
  int m_commands = 0;
};

}  // namespace terra::kernel
