// Graph generation: the symbolic graph the GraphRunner executes, built from a TraceGraph and its
// case assignment.
//
// Each switch-case becomes a `Segment`: the block's ops in order as a dataflow segment whose inputs
// are block-local values, slots (values produced in another segment), external tensors, feeds or
// constants. An input that had several producers in the recorded traces (a branch that re-converged)
// is a `Select` over candidates; the PythonRunner knows which candidate holds (the placeholder it
// was handed names its producer) and passes the choice along with the path. Feed points are where
// Python hands a value in, fetch points where Python waits for one. Every segment ends with its path
// decision: the key of the next op selects the next segment, or the end of the iteration.
//
// Guarantees: the SymbolicGraph is a snapshot that does not refer back to the TraceGraph, so the
// TraceGraph may keep growing while the graph runs. Every recorded trace replays through it
// (`replay`): the ops visited are exactly the trace's, in order, and every input reads the value
// the trace recorded. O(nodes + edges + inputs).
#pragma once

#include <string>
#include <vector>

#include "terra/case_assignment.h"
#include "terra/trace_graph.h"

namespace terra {

struct SegmentInput {
  enum class Kind : uint8_t {
    Local,     // output `output` of the op at index `id` of the same segment
    Slot,      // slot `id`, written by the segment that produced the value
    External,  // the caller's tensor identity `id`
    Feed,      // the caller's feed index `id`
    Constant,  // the caller's constant identity `id`
    Select,    // one of the candidates of `Segment::selects[id]`, chosen at run time
  };
  Kind kind = Kind::Constant;
  uint32_t output = 0;
  uint64_t id = 0;
};
const char* to_string(SegmentInput::Kind kind);

struct SegmentOp {
  NodeId node = kNone;
  LocationKey key;
  std::vector<SegmentInput> inputs;
  uint32_t num_outputs = 0;
};

struct Select {
  uint32_t op = 0;
  uint32_t input = 0;
  std::vector<SegmentInput> candidates;  // never of kind Select
};
struct SlotWrite {
  uint32_t op = 0;  // index in the segment
  uint32_t output = 0;
  uint32_t slot = 0;
};
struct FeedPoint {
  uint32_t op = 0;
  uint32_t input = 0;
  uint64_t feed = 0;  // the caller's feed index
};
struct FetchPoint {
  uint32_t op = 0;
  NodeId node = kNone;
};
struct PathTarget {
  LocationKey key;          // key of the next op; LocationKey::exit() for the end of the iteration
  uint32_t segment = kNone;  // kNone for the end of the iteration
  EdgeId edge = kNone;
};

struct Segment {
  std::vector<EdgeId> entering;
  std::vector<SegmentOp> ops;
  std::vector<Select> selects;
  std::vector<SlotWrite> writes;   // ordered by op
  std::vector<FeedPoint> feeds;    // direct feeds; feeds among Select candidates are in `selects`
  std::vector<FetchPoint> fetches;
  std::vector<PathTarget> next;
};

struct Slot {
  NodeId node = kNone;
  uint32_t output = 0;
  uint32_t segment = kNone;  // the segment that writes it
};

struct SymbolicGraph {
  std::vector<Segment> segments;  // in switch-case order
  std::vector<PathTarget> entry;  // path decision before the first op
  std::vector<Slot> slots;
  bool single_pass = true;        // false when some path goes back to an earlier case (see case_assignment.h)

  size_t op_count() const;
};

// The target for `next_key` among `targets`, or nullptr: the path left the graph.
const PathTarget* decide(const std::vector<PathTarget>& targets, const LocationKey& next_key);

SymbolicGraph generate(const TraceGraph& graph, const CaseAssignment& cases);

// Walks `trace` through the segments as the GraphRunner would, checking every op's key and every
// input's source against the trace. `ops` lists the keys visited; on failure `error` says where.
struct ReplayResult {
  bool ok = false;
  std::string error;
  std::vector<LocationKey> ops;
  std::vector<uint32_t> segments;  // segments taken, in order
  uint32_t passes = 0;             // passes over the ordered case list
};
ReplayResult replay(const SymbolicGraph& graph, const Trace& trace);

}  // namespace terra
