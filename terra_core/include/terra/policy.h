// Policy: every setting of the engine, in one table, and the decision it makes at each
// iteration start: trace, co-execute (the generated graph runs) or stay eager, and why.
//
// An iteration start is traced until `warmup` consecutive traced iterations added nothing to its
// graph; then it is co-executed. A start that left co-execution `max_divergences` times, or a
// graph past `max_nodes` nodes, stays eager: only that region, never the whole program. Every
// fallback to eager has a `FallbackReason` with text a user can read.
//
// Settings are key=value text, parsed here and nowhere else: `%terra config warmup=3`,
// `terra.config(warmup=3)` and the TERRA_* environment variables that set the defaults all go
// through `set`. Unknown keys and bad values are reported, never ignored; `configure` applies all
// or nothing.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "terra/trace_graph.h"

namespace terra {

struct Policy {
  // What the GraphRunner's idle OpenMP workers do while co-executing: Auto, with `adaptive`, times
  // both ways and keeps the faster; Spin as eager execution's do; Sleep soon after each region.
  enum class WorkerSpin : uint8_t { Auto, Spin, Sleep };

  uint32_t warmup = 1;           // traced iterations that add nothing before co-executing
  uint32_t max_divergences = 8;  // fallbacks at one iteration start before it stays eager
  uint32_t max_nodes = 200000;   // nodes past which a graph stays eager
  bool enabled = true;           // co-execution (off: trace only)
  // Time co-execution against eager execution and run whichever is faster (terra/payoff.h);
  // co-execution is kept while it takes at most (1 + payoff_margin) times eager's time, and the
  // faster mode is held long enough that re-timing the slower costs at most payoff_check_budget
  // of the time (Payoff::hold_for).
  bool adaptive = true;
  double payoff_margin = 0.0;
  double payoff_check_budget = 0.03;
  // A graph starts from the choice an earlier run's check made for its loop on this machine
  // (runtime/payoff_memory.h), and its checks' choices are kept for later runs.
  bool remember_payoff = true;
  bool replay = true;               // the GraphRunner replays recorded blocks below autograd
  bool accelerator_blocks = false;  // blocks on accelerator streams too (unchecked on a device)
  bool lanes = false;               // a waiting program thread runs replayed kernels (kernel_lanes.h)
  bool program_cache = true;        // the program thread's large CPU allocations are cached
  bool fast_path = true;            // hot entry points skip PyTorch's binding (python/fast_path.cpp)
  WorkerSpin worker_spin = WorkerSpin::Auto;
  uint32_t worker_nice = 10;  // nice steps below the GraphRunner its OpenMP workers run

  // The defaults, each changed by its environment variable (TERRA_ADAPTIVE=0, TERRA_WORKER_SPIN=
  // sleep, ...) where that holds a value `set` accepts; a bad one is ignored, as an unset one.
  static Policy from_environment();
  // Empty on success, else what was wrong (naming the key); the policy is unchanged on failure.
  std::string set(std::string_view key, std::string_view value);
  // Several "key=value" separated by spaces or commas; applies all or nothing.
  std::string configure(std::string_view text);
  // "warmup=1 max_divergences=8 ...": every setting, accepted by configure.
  std::string describe() const;

  // A setting as a person (or `%terra config`) reads it.
  enum class Kind : uint8_t { WholeNumber, Number, OnOff, Choice };
  struct Setting {
    const char* key;
    Kind kind;
    std::string value;  // as `set` accepts it: "8", "0.03", "on", "auto"
    const char* help;
    const char* env;    // the variable that sets its default
  };
  std::vector<Setting> settings() const;
  static const char* name(Kind kind);  // "whole number", "number", "on/off", "choice"

  static const char* name(WorkerSpin w);
};

enum class FallbackReason : uint8_t {
  Warmup,         // still tracing: not enough quiet iterations yet
  NewBranch,      // the program took a branch the graph had not seen
  NewOp,          // an op never seen at this location
  NewShape,       // a known op produced a new shape, dtype or device
  NewInput,       // an input came from somewhere it had not come from before
  NewArguments,   // a known op's arguments differ from every traced variant
  NewLeaves,      // a backward reached leaves its trace did not (a new model)
  NeverSteady,    // traced iterations in a row each met something new
  NodeCap,        // the graph grew past max_nodes
  DivergenceCap,  // the iteration start left co-execution max_divergences times
  EagerCall,      // a call Terra runs eagerly (autograd.grad, a custom Function, a thread start)
  Warning,        // an op raised a warning on the GraphRunner: it runs on the program thread
  AutogradRoute,  // a backward that runs Python (hooks, a custom Function) runs through autograd
  Disabled,       // co-execution is off (enabled=off): traced only
};
inline constexpr int kFallbackReasons = 14;
const char* to_string(FallbackReason reason);  // short name: "new_branch"
const char* describe(FallbackReason reason);   // a sentence for the user
// What `%terra explain` says of a fallback: the reason's sentence, then the detail if any.
std::string describe(FallbackReason reason, const std::string& detail);

// The divergence a merge revealed; only meaningful when result.first != Novelty::None.
FallbackReason reason_for(const MergeResult& result);

// One kind of fallback at one place of the program, counted.
struct Fallback {
  FallbackReason reason = FallbackReason::NewBranch;
  std::string detail;                        // what exactly differed (the latest occurrence's)
  std::shared_ptr<const SourceInfo> source;  // the op and where in the program; may be null
  uint64_t count = 0;
  uint32_t after = UINT32_MAX;  // the caller's id of the node the iteration followed last
  std::string text() const { return describe(reason, detail); }
};

// A graph's fallbacks: one entry per reason, op and user line (user_frame), so a loop that leaves
// co-execution at the same place a thousand times has one entry counted a thousand times; at most
// kMaxEntries places (counts per reason go on past that).
class FallbackLog {
 public:
  static constexpr size_t kMaxEntries = 256;

  Fallback* record(FallbackReason reason, std::string detail, std::shared_ptr<const SourceInfo> source,
                   uint32_t after = UINT32_MAX);
  uint64_t count(FallbackReason reason) const { return counts_[static_cast<int>(reason)]; }
  uint64_t total() const;
  const std::vector<Fallback>& entries() const { return entries_; }
  std::string explain() const;  // one line per reason seen, then each place

 private:
  std::array<uint64_t, kFallbackReasons> counts_{};
  std::vector<Fallback> entries_;
};

// Consecutive traced iterations that added nothing (no node, control edge, producer or shape).
struct Warmup {
  uint32_t quiet = 0;
  void observe(bool added_anything) { quiet = added_anything ? 0 : quiet + 1; }
  void observe(const MergeResult& result) { observe(result.added_anything()); }
};

// What the decision at an iteration start looks at.
struct RegionState {
  uint64_t nodes = 0;          // in its graph
  uint32_t quiet = 0;          // Warmup::quiet
  uint32_t divergences = 0;    // times co-execution left it for a path the graph had not seen
};

struct Decision {
  enum class Action : uint8_t { Trace, CoExecute, StayEager };
  Action action = Action::Trace;
  FallbackReason reason = FallbackReason::Warmup;  // why not CoExecute; meaningless for CoExecute
};
Decision decide(const Policy& policy, const RegionState& region);

}  // namespace terra
