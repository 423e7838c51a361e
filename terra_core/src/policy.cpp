#include "terra/policy.h"

#include <charconv>
#include <vector>

namespace terra {
namespace {

struct Option {
  const char* key;
  uint32_t Policy::*field;
  uint32_t min;
};
constexpr Option kOptions[] = {
    {"warmup", &Policy::warmup, 0},
    {"max_nodes", &Policy::max_nodes, 1},
    {"max_paths", &Policy::max_paths, 1},
};

struct ReasonText {
  const char* name;
  const char* sentence;
};
constexpr ReasonText kReasons[kFallbackReasons] = {
    {"warmup", "still tracing: the region needs more iterations that add nothing new"},
    {"new_branch", "the program took a branch the graph had not seen; it was traced and merged"},
    {"new_op", "an op ran at a location the graph had not seen; it was traced and merged"},
    {"new_shape", "an op produced a new shape, dtype or device; it was traced and merged"},
    {"new_input", "an op input came from a value it had not come from before; it was traced and merged"},
    {"node_cap", "the region has more ops than max_nodes allows, so it stays eager (raise max_nodes)"},
    {"path_cap", "the region took more distinct paths than max_paths allows, so it stays eager (raise max_paths)"},
    {"unsupported_op", "an op the graph runner cannot replay; this region runs eagerly"},
    {"exception", "the iteration raised an exception; it finished eagerly"},
    {"interrupt", "the iteration was interrupted; it finished eagerly"},
    {"engine_error", "an internal Terra error; the region fell back to eager (please report it)"},
};

}  // namespace

std::string Policy::set(std::string_view key, std::string_view value) {
  for (const Option& o : kOptions) {
    if (key != o.key) continue;
    uint32_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      return std::string(key) + ": '" + std::string(value) + "' is not a non-negative integer";
    if (v < o.min) return std::string(key) + ": must be at least " + std::to_string(o.min);
    this->*o.field = v;
    return {};
  }
  std::string known;
  for (const Option& o : kOptions) known += std::string(known.empty() ? "" : ", ") + o.key;
  return "unknown option '" + std::string(key) + "' (known: " + known + ")";
}

std::string Policy::configure(std::string_view text) {
  Policy next = *this;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',' || text[i] == '\t') {
      ++i;
      continue;
    }
    size_t end = text.find_first_of(" ,\t", i);
    std::string_view item = text.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i);
    i = end == std::string_view::npos ? text.size() : end;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) return "'" + std::string(item) + "' is not key=value";
    if (std::string error = next.set(item.substr(0, eq), item.substr(eq + 1)); !error.empty()) return error;
  }
  *this = next;
  return {};
}

std::string Policy::describe() const {
  std::string out;
  for (const Option& o : kOptions)
    out += std::string(out.empty() ? "" : " ") + o.key + "=" + std::to_string(this->*o.field);
  return out;
}

const char* to_string(FallbackReason reason) { return kReasons[static_cast<int>(reason)].name; }
const char* describe(FallbackReason reason) { return kReasons[static_cast<int>(reason)].sentence; }

FallbackReason reason_for(const MergeResult& result) {
  switch (result.first) {
    case MergeResult::Novelty::Node: return FallbackReason::NewOp;
    case MergeResult::Novelty::ControlEdge: return FallbackReason::NewBranch;
    case MergeResult::Novelty::Producer: return FallbackReason::NewInput;
    case MergeResult::Novelty::Shape: return FallbackReason::NewShape;
    case MergeResult::Novelty::None: break;
  }
  return FallbackReason::Warmup;
}

void FallbackLog::record(FallbackReason reason, std::string detail) {
  counts_[static_cast<int>(reason)]++;
  if (recent_.size() == kRecent) recent_.pop_front();
  recent_.push_back({reason, std::move(detail)});
}

uint64_t FallbackLog::total() const {
  uint64_t n = 0;
  for (uint64_t c : counts_) n += c;
  return n;
}

std::string FallbackLog::explain() const {
  if (total() == 0) return "no fallbacks\n";
  std::string out;
  for (int r = 0; r < kFallbackReasons; ++r)
    if (counts_[r])
      out += std::to_string(counts_[r]) + " x " + kReasons[r].name + ": " + kReasons[r].sentence + "\n";
  for (const Entry& e : recent_)
    if (!e.detail.empty()) out += "  latest " + std::string(to_string(e.reason)) + ": " + e.detail + "\n";
  return out;
}

Decision decide(const Policy& policy, const TraceGraph& graph, const Warmup& warmup) {
  using Action = Decision::Action;
  if (graph.size() - 2 > policy.max_nodes) return {Action::StayEager, FallbackReason::NodeCap};
  if (graph.path_count() > policy.max_paths) return {Action::StayEager, FallbackReason::PathCap};
  if (graph.trace_count() == 0 || warmup.quiet < policy.warmup) return {Action::Trace, FallbackReason::Warmup};
  return {Action::Generate, FallbackReason::Warmup};
}

}  // namespace terra
