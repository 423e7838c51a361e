#include "terra/policy.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <variant>
#include <vector>

namespace terra {
namespace {

// One row per setting: its key, where it lives in Policy, the range a number may take, the
// variable that sets its default, and what it does.
using Field = std::variant<uint32_t Policy::*, double Policy::*, bool Policy::*, Policy::WorkerSpin Policy::*>;
struct Option {
  const char* key;
  Field field;
  double lo, hi;  // a number's range; `lo` itself excluded where `above`
  const char* env;
  const char* help;
  bool above = false;
};
constexpr double kNoLimit = 1e18;
const Option kOptions[] = {
    {"warmup", &Policy::warmup, 0, kNoLimit, "TERRA_WARMUP",
     "traced iterations that add nothing before an iteration is co-executed"},
    {"max_divergences", &Policy::max_divergences, 0, kNoLimit, "TERRA_MAX_DIVERGENCES",
     "fallbacks at one iteration start before it stays eager"},
    {"max_nodes", &Policy::max_nodes, 1, kNoLimit, "TERRA_MAX_NODES",
     "TraceGraph nodes past which a graph stays eager"},
    {"enabled", &Policy::enabled, 0, 0, "TERRA_ENABLED", "co-execute stable loops (off: trace only)"},
    {"adaptive", &Policy::adaptive, 0, 0, "TERRA_ADAPTIVE",
     "time co-execution against eager execution and run the faster"},
    {"payoff_margin", &Policy::payoff_margin, -1, kNoLimit, "TERRA_PAYOFF_MARGIN",
     "co-execution is kept while it takes at most 1 + margin times eager's time"},
    {"payoff_check_budget", &Policy::payoff_check_budget, 0, kNoLimit, "TERRA_PAYOFF_CHECK_BUDGET",
     "the share of the time re-timing the slower mode may cost", /*above=*/true},
    {"remember_payoff", &Policy::remember_payoff, 0, 0, "TERRA_REMEMBER_PAYOFF",
     "start from the faster mode an earlier run measured for the loop, and keep this run's"},
    {"replay", &Policy::replay, 0, 0, "TERRA_REPLAY", "replay recorded iterations below autograd in the GraphRunner"},
    {"accelerator_blocks", &Policy::accelerator_blocks, 0, 0, "TERRA_ACCELERATOR_BLOCKS",
     "replay blocks of items on accelerator streams too (not yet checked on a device)"},
    {"lanes", &Policy::lanes, 0, 0, "TERRA_LANES",
     "a program thread waiting for the GraphRunner runs independent kernels of the replayed backward"},
    {"program_cache", &Policy::program_cache, 0, 0, "TERRA_PROGRAM_CACHE",
     "the program thread's CPU allocations of 64 KiB to 32 MiB come from Terra's caching allocator"},
    {"fast_path", &Policy::fast_path, 0, 0, "TERRA_FAST_PATH",
     "hot Tensor methods and torch functions skip PyTorch's binding while co-executing"},
    {"worker_spin", &Policy::worker_spin, 0, 0, "TERRA_WORKER_SPIN",
     "the GraphRunner's idle OpenMP workers: spin, sleep, or auto (time both, keep the faster)"},
    {"worker_nice", &Policy::worker_nice, 0, 19, "TERRA_WORKER_NICE",
     "how far below the GraphRunner its OpenMP workers run (a spinning worker yields its core)"},
};
constexpr Policy::WorkerSpin kSpins[] = {Policy::WorkerSpin::Auto, Policy::WorkerSpin::Spin,
                                         Policy::WorkerSpin::Sleep};

std::string number_text(double v) {  // the shortest text that reads back as `v`
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string range_text(const Option& o) {
  if (o.hi < kNoLimit) return number_text(o.lo) + " to " + number_text(o.hi);
  return (o.above ? "above " : "at least ") + number_text(o.lo);
}

bool in_range(const Option& o, double v) { return (o.above ? v > o.lo : v >= o.lo) && v <= o.hi; }

// The option's value in `p`, as `set` accepts it.
std::string value_text(const Policy& p, const Option& o) {
  return std::visit(
      [&](auto field) -> std::string {
        using T = std::decay_t<decltype(p.*field)>;
        if constexpr (std::is_same_v<T, bool>) return p.*field ? "on" : "off";
        else if constexpr (std::is_same_v<T, Policy::WorkerSpin>) return Policy::name(p.*field);
        else if constexpr (std::is_same_v<T, double>) return number_text(p.*field);
        else return std::to_string(p.*field);
      },
      o.field);
}

// Parses `value` into `o`'s field of `p`: empty on success, else why not (and `p` unchanged).
std::string parse_into(Policy& p, const Option& o, std::string_view value) {
  const std::string key(o.key), text(value);
  return std::visit(
      [&](auto field) -> std::string {
        using T = std::decay_t<decltype(p.*field)>;
        if constexpr (std::is_same_v<T, bool>) {
          std::string v;
          for (char c : text) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (v == "on" || v == "true" || v == "1" || v == "yes") {
            p.*field = true;
            return {};
          }
          if (v == "off" || v == "false" || v == "0" || v == "no") {
            p.*field = false;
            return {};
          }
          return key + ": expected on/off, got '" + text + "'";
        } else if constexpr (std::is_same_v<T, Policy::WorkerSpin>) {
          for (Policy::WorkerSpin w : kSpins)
            if (text == Policy::name(w)) {
              p.*field = w;
              return {};
            }
          return key + " is one of auto, spin, sleep; got '" + text + "'";
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
          if (text.empty() || *end != '\0' || !std::isfinite(v)) return key + ": '" + text + "' is not a number";
          if (!in_range(o, static_cast<double>(v))) return key + " must be " + range_text(o) + ", not " + text;
          p.*field = v;
          return {};
        } else {
          uint64_t v = 0;
          auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v > UINT32_MAX)
            return key + ": '" + text + "' is not a whole number";
          if (!in_range(o, static_cast<double>(v))) return key + " must be " + range_text(o) + ", not " + text;
          p.*field = static_cast<uint32_t>(v);
          return {};
        }
      },
      o.field);
}

Policy::Kind kind_of(const Option& o) {
  return std::visit(
      [](auto field) {
        using T = std::decay_t<decltype(std::declval<Policy&>().*field)>;
        if constexpr (std::is_same_v<T, bool>) return Policy::Kind::OnOff;
        else if constexpr (std::is_same_v<T, Policy::WorkerSpin>) return Policy::Kind::Choice;
        else if constexpr (std::is_same_v<T, double>) return Policy::Kind::Number;
        else return Policy::Kind::WholeNumber;
      },
      o.field);
}

struct ReasonText {
  const char* name;
  const char* sentence;
};
constexpr ReasonText kReasons[kFallbackReasons] = {
    {"warmup", "still tracing: the loop needs more iterations that add nothing new"},
    {"new_branch", "a branch the trace has not taken"},
    {"new_op", "an op the trace has not seen at this point of the program"},
    {"new_shape", "an op produced a new shape, dtype or device"},
    {"new_input", "an op input came from a value it had not come from before"},
    {"new_arguments", "the arguments differ from the trace"},
    {"new_leaves", "the leaves this backward reaches are not the traced ones (a new model?)"},
    {"never_steady", "never steady: traced iterations in a row each met an op the trace had not seen, "
                     "so the loop is traced rather than co-executed"},
    {"node_cap", "node cap: the graph holds max_nodes nodes, so the rest runs eagerly (raise max_nodes)"},
    {"divergence_cap", "the loop left co-execution for new paths max_divergences times, so it stays eager "
                       "(raise max_divergences)"},
    {"eager_call", "left co-execution for a call it runs eagerly"},
    {"warning", "it raised a warning while run by the GraphRunner: from now on it runs on the program "
                "thread (a fetch), so its warnings come at its call, as eagerly"},
    {"autograd_route", "its backward runs Python (a tensor or module hook, a custom autograd.Function): "
                       "it runs through autograd on the program thread, in program order, and is never "
                       "replayed below autograd (the GraphRunner replays the rest of the iteration)"},
    {"disabled", "co-execution is off (enabled=off): the loop is traced, never co-executed"},
};

}  // namespace

const char* Policy::name(Kind kind) {
  switch (kind) {
    case Kind::WholeNumber: return "whole number";
    case Kind::Number: return "number";
    case Kind::OnOff: return "on/off";
    case Kind::Choice: return "choice";
  }
  return "?";
}

const char* Policy::name(WorkerSpin w) {
  return w == WorkerSpin::Spin ? "spin" : w == WorkerSpin::Sleep ? "sleep" : "auto";
}

Policy Policy::from_environment() {
  Policy p;
  for (const Option& o : kOptions) {
    // parse_into changes the field only when the value is valid: a bad one leaves the default
    if (const char* value = std::getenv(o.env); value && *value) parse_into(p, o, value);
  }
  return p;
}

std::string Policy::set(std::string_view key, std::string_view value) {
  for (const Option& o : kOptions) {
    if (key == o.key) return parse_into(*this, o, value);  // unchanged unless valid
  }
  std::string known;
  for (const Option& o : kOptions) known += std::string(known.empty() ? "" : ", ") + o.key;
  return "unknown setting '" + std::string(key) + "' (known: " + known + ")";
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
    if (eq == std::string_view::npos) return "expected key=value, got '" + std::string(item) + "'";
    if (std::string error = next.set(item.substr(0, eq), item.substr(eq + 1)); !error.empty()) return error;
  }
  *this = next;
  return {};
}

std::string Policy::describe() const {
  std::string out;
  for (const Option& o : kOptions) out += std::string(out.empty() ? "" : " ") + o.key + "=" + value_text(*this, o);
  return out;
}

std::vector<Policy::Setting> Policy::settings() const {
  std::vector<Setting> out;
  for (const Option& o : kOptions) out.push_back({o.key, kind_of(o), value_text(*this, o), o.help, o.env});
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

std::string describe(FallbackReason reason, const std::string& detail) {
  return detail.empty() ? describe(reason) : std::string(describe(reason)) + ": " + detail;
}

namespace {

bool same_place(const std::shared_ptr<const SourceInfo>& a, const std::shared_ptr<const SourceInfo>& b) {
  if (a == b) return true;  // one node's source, recorded again (each iteration, say): no string compares
  if (!a || !b) return false;
  if (a->op_name != b->op_name) return false;
  const SourceFrame* fa = user_frame(*a);
  const SourceFrame* fb = user_frame(*b);
  if (!fa || !fb) return fa == fb;
  return fa->file == fb->file && fa->line == fb->line;
}

}  // namespace

Fallback* FallbackLog::record(FallbackReason reason, std::string detail, std::shared_ptr<const SourceInfo> source,
                              uint32_t after) {
  counts_[static_cast<int>(reason)]++;
  for (Fallback& f : entries_) {
    if (f.reason == reason && same_place(f.source, source)) {
      f.detail = std::move(detail);
      ++f.count;
      return &f;
    }
  }
  if (entries_.size() == kMaxEntries) return nullptr;
  entries_.push_back({reason, std::move(detail), std::move(source), 1, after});
  return &entries_.back();
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
    if (counts_[r]) out += std::to_string(counts_[r]) + " x " + kReasons[r].name + "\n";
  for (const Fallback& f : entries_)
    out += "  " + std::to_string(f.count) + " x " + (f.source ? describe(*f.source) : std::string("?")) + ": " +
           f.text() + "\n";
  return out;
}

Decision decide(const Policy& policy, const RegionState& region) {
  using Action = Decision::Action;
  if (region.divergences >= policy.max_divergences) return {Action::StayEager, FallbackReason::DivergenceCap};
  if (region.nodes >= policy.max_nodes) return {Action::StayEager, FallbackReason::NodeCap};
  if (!policy.enabled) return {Action::Trace, FallbackReason::Disabled};
  if (region.quiet < policy.warmup) return {Action::Trace, FallbackReason::Warmup};
  return {Action::CoExecute, FallbackReason::Warmup};
}

}  // namespace terra
