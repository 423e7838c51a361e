// Policy: when a region's TraceGraph is stable enough to generate a symbolic graph, when it is too
// dynamic to be worth one, and why a region runs eagerly (for `%terra explain`).
//
// A region is traced eagerly until `warmup` consecutive iterations merged without adding anything
// (no node, control edge, producer or shape); then its graph is generated. A region whose
// TraceGraph grows past `max_nodes` nodes or `max_paths` distinct recorded paths (data-dependent
// loop counts, say) stays eager: only that region, never the whole program. Every fallback to eager
// has a `FallbackReason` with text a user can read, counted per graph.
//
// Options are key=value text so that a `%terra config warmup=3 max_paths=64` needs no parser of
// its own; unknown keys and bad values are reported, never ignored.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "terra/trace_graph.h"

namespace terra {

struct Policy {
  uint32_t warmup = 2;        // quiet iterations needed before generation
  uint32_t max_nodes = 100000;
  uint32_t max_paths = 256;

  // Empty on success, else what was wrong; the policy is unchanged on failure.
  std::string set(std::string_view key, std::string_view value);
  // Several "key=value" separated by spaces or commas; applies all or nothing.
  std::string configure(std::string_view text);
  std::string describe() const;  // "warmup=2 max_nodes=100000 max_paths=256", accepted by configure
};

enum class FallbackReason : uint8_t {
  Warmup,         // still tracing: not enough quiet iterations yet
  NewBranch,      // the program took a branch the graph had not seen
  NewOp,          // an op never seen at this location
  NewShape,       // a known op produced a new shape, dtype or device
  NewInput,       // an input came from somewhere it had not come from before
  NodeCap,        // the TraceGraph grew past max_nodes
  PathCap,        // more distinct paths than max_paths
  UnsupportedOp,  // an op the GraphRunner cannot replay
  Exception,      // the iteration raised
  Interrupt,      // KeyboardInterrupt
  EngineError,    // a fault inside Terra, degraded to eager
};
inline constexpr int kFallbackReasons = 11;
const char* to_string(FallbackReason reason);  // short name: "new_branch"
const char* describe(FallbackReason reason);   // a sentence for the user

// The divergence a merge revealed; only meaningful when result.first != Novelty::None.
FallbackReason reason_for(const MergeResult& result);

// Counts per reason for one graph, and the latest few occurrences with their details (which op,
// where in the user's code), bounded so a flapping region cannot grow memory.
class FallbackLog {
 public:
  struct Entry {
    FallbackReason reason;
    std::string detail;
  };
  static constexpr size_t kRecent = 16;

  void record(FallbackReason reason, std::string detail = {});
  uint64_t count(FallbackReason reason) const { return counts_[static_cast<int>(reason)]; }
  uint64_t total() const;
  const std::deque<Entry>& recent() const { return recent_; }
  std::string explain() const;  // one line per reason seen, then the recent details

 private:
  std::array<uint64_t, kFallbackReasons> counts_{};
  std::deque<Entry> recent_;
};

// Consecutive merges that added nothing.
struct Warmup {
  uint32_t quiet = 0;
  void observe(const MergeResult& result) { quiet = result.added_anything() ? 0 : quiet + 1; }
};

struct Decision {
  enum class Action : uint8_t { Trace, Generate, StayEager };
  Action action = Action::Trace;
  FallbackReason reason = FallbackReason::Warmup;  // why not Generate; meaningless for Generate
};
Decision decide(const Policy& policy, const TraceGraph& graph, const Warmup& warmup);

}  // namespace terra
