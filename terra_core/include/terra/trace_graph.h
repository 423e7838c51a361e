// TraceGraph: every recorded iteration of a region, merged into one graph.
//
// Nodes are identified by LocationKey: an op met again at the same location is the same node, so
// traces that diverge (if/else, loops of different trip counts, an early break) and later
// re-converge share their common tail without any alignment step. Consecutive ops of a trace are
// joined by control edges, including edges from the virtual entry node and into the virtual exit
// node; a node with several successors is a branch point. For every input of a node the graph keeps
// the set of producers seen (another node's output, an external tensor, a feed, a constant), because
// after a branch re-converges the same input may come from either side. Nodes, control edges and
// producers carry counts of how often they were taken.
//
// Guarantees:
// - Node ids are dense, stable and append-only (entry is 0, exit is 1), so the runtime can keep
//   per-node payload vectors indexed by NodeId. Edge ids likewise.
// - merge() is linear in the trace length (plus the size of what it adds), and atomic: a malformed
//   trace (see check_trace; also an op whose arity differs from its node's) throws
//   std::invalid_argument and leaves the graph unchanged.
// - Merging a trace that was already merged adds nothing (only counts change).
// - successors(n) is a small contiguous array of (key, node, edge): validation of the next op is a
//   scan of a few 24-byte keys.
// - Built op by op (add, take, end_path), as the runtime builds it while the program runs, the
//   graph holds the same nodes, control edges, counts and paths as merging each path's trace
//   would give, but for producers and meta variants' counts: those come only from merged traces
//   (a node's outputs are the ones `add` was given; counting them per visit would cost every op
//   two more cache lines).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "terra/location_key.h"
#include "terra/trace.h"

namespace terra {

using NodeId = uint32_t;
using EdgeId = uint32_t;
inline constexpr NodeId kEntryNode = 0;
inline constexpr NodeId kExitNode = 1;
inline constexpr uint32_t kNone = ~uint32_t{0};

struct ControlEdge {
  NodeId from = kNone;
  NodeId to = kNone;
  uint64_t count = 0;
};

struct Successor {
  LocationKey key;  // the successor's key, kept here so validation needs no second lookup
  NodeId node = kNone;
  EdgeId edge = kNone;
};

// One source of one node input. For kind Op, `id` is the producing NodeId (not a trace position).
struct Producer {
  ValueRef::Kind kind = ValueRef::Kind::Constant;
  uint32_t output = 0;
  uint64_t id = 0;
  uint64_t count = 0;

  bool same_source(const Producer& p) const { return kind == p.kind && output == p.output && id == p.id; }
};

// A data edge between nodes, derived from the producers of kind Op.
struct DataEdge {
  NodeId from = kNone;
  uint32_t output = 0;
  NodeId to = kNone;
  uint32_t input = 0;
  uint64_t count = 0;
};

// One distinct set of output metadata a node produced; the first one seen comes first.
struct MetaVariant {
  uint64_t hash = 0;
  std::vector<TensorMeta> outputs;
  uint64_t count = 0;
};

struct Node {
  LocationKey key;
  uint64_t count = 0;
  uint64_t fetch_count = 0;
  std::vector<Successor> successors;
  std::vector<EdgeId> predecessors;           // control edges entering this node
  std::vector<std::vector<Producer>> inputs;  // per input, the distinct producers seen
  std::vector<MetaVariant> metas;
  std::shared_ptr<const SourceInfo> source;   // from the first trace that had it

  uint32_t num_outputs() const { return metas.empty() ? 0 : static_cast<uint32_t>(metas[0].outputs.size()); }
};

// What a merge added. `first` and `first_position` say where the trace first left what the graph
// knew (position == trace length means the edge into exit): the runtime's divergence point.
struct MergeResult {
  enum class Novelty : uint8_t { None, Node, ControlEdge, Producer, Shape };
  uint32_t new_nodes = 0;
  uint32_t new_control_edges = 0;
  uint32_t new_producers = 0;  // data sources, data edges included, that a node input had not seen
  uint32_t new_shapes = 0;     // output meta variants added to nodes that already existed
  bool new_path = false;       // this exact sequence of nodes was not recorded before
  Novelty first = Novelty::None;
  uint32_t first_position = kNone;

  // A new path made of known edges is covered by the generated graph already, hence not counted.
  bool added_anything() const { return new_nodes || new_control_edges || new_producers || new_shapes; }
};

class TraceGraph {
 public:
  TraceGraph();

  MergeResult merge(const Trace& trace);

  // Op by op. The runtime meets each op before it knows the rest of its iteration (and validates it
  // against the graph there and then), so it cannot merge whole traces. A path is
  // take(kEntryNode, a), take(a, b), ... and end_path({a, b, ...}); `add` makes a node first where
  // an op is new. add throws std::invalid_argument for a key already in the graph or a reserved op.
  NodeId add(const LocationKey& key, std::shared_ptr<const SourceInfo> source,
             std::vector<TensorMeta> outputs = {});
  // Counts the control edge from -> to (adding it if new) and a visit of `to` (and of the entry,
  // where a path starts); true if the edge is new. `edge`: where to store the edge's id, for
  // retake.
  bool take(NodeId from, NodeId to, EdgeId* edge = nullptr);
  // take() of the edge `e` (an id take stored): no search of its source's successors, which a
  // co-executed op would do per op otherwise.
  void retake(EdgeId e);
  // A path ended after its last node (the edge into exit is taken); true if this sequence of nodes
  // was not recorded before.
  bool end_path(const std::vector<NodeId>& path, TraceEnd end = TraceEnd::Normal);
  EdgeId find_edge(NodeId from, NodeId to) const;  // kNone when absent

  size_t size() const { return nodes_.size(); }  // virtual entry and exit included
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  const std::vector<ControlEdge>& edges() const { return edges_; }
  const ControlEdge& edge(EdgeId id) const { return edges_[id]; }
  std::vector<DataEdge> data_edges() const;

  NodeId find(const LocationKey& key) const;  // kNone when absent
  const std::vector<Successor>& successors(NodeId id) const { return nodes_[id].successors; }
  const Successor* find_successor(NodeId id, const LocationKey& key) const;  // nullptr when absent

  uint64_t trace_count() const { return nodes_[kEntryNode].count; }
  uint64_t end_count(TraceEnd end) const { return ends_[static_cast<int>(end)]; }
  size_t path_count() const { return paths_.size(); }

 private:
  EdgeId add_edge(NodeId from, NodeId to);
  void fail(const std::string& message);

  std::vector<Node> nodes_;
  std::vector<ControlEdge> edges_;
  std::unordered_map<LocationKey, NodeId, LocationKeyHash> index_;
  std::unordered_map<uint64_t, EdgeId> edge_index_;  // (from, to) -> edge, only for nodes of large fan-out
  std::unordered_set<uint64_t> paths_;                // hashes of the node sequences recorded
  std::array<uint64_t, kTraceEndKinds> ends_{};

  // Scratch of merge(), kept to avoid reallocating per trace.
  std::vector<NodeId> resolved_;
  std::vector<EdgeId> entering_;
  std::vector<uint64_t> stamp_;  // per node: the merge serial that last visited it
  std::vector<LocationKey> added_keys_;
  uint64_t serial_ = 0;
};

}  // namespace terra
