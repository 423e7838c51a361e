#include "terra/trace_graph.h"

#include <stdexcept>

namespace terra {
namespace {

// Successor lists longer than this are searched through the indexes instead of scanned, so that a
// pathological fan-out cannot make merge quadratic.
constexpr size_t kScanLimit = 8;

uint64_t edge_slot(NodeId from, NodeId to) { return uint64_t{from} << 32 | to; }

}  // namespace

TraceGraph::TraceGraph() {
  nodes_.resize(2);
  nodes_[kEntryNode].key = LocationKey::entry();
  nodes_[kExitNode].key = LocationKey::exit();
  index_.emplace(LocationKey::entry(), kEntryNode);
  index_.emplace(LocationKey::exit(), kExitNode);
  stamp_.assign(2, 0);
}

NodeId TraceGraph::find(const LocationKey& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? kNone : it->second;
}

const Successor* TraceGraph::find_successor(NodeId id, const LocationKey& key) const {
  const std::vector<Successor>& succ = nodes_[id].successors;
  if (succ.size() <= kScanLimit) {
    for (const Successor& s : succ)
      if (s.key == key) return &s;
    return nullptr;
  }
  NodeId to = find(key);
  if (to == kNone) return nullptr;
  auto it = edge_index_.find(edge_slot(id, to));
  if (it == edge_index_.end()) return nullptr;
  for (const Successor& s : succ)  // rare: only nodes of large fan-out get here
    if (s.edge == it->second) return &s;
  return nullptr;
}

EdgeId TraceGraph::find_edge(NodeId from, NodeId to) const {
  const std::vector<Successor>& succ = nodes_[from].successors;
  if (succ.size() <= kScanLimit) {
    for (const Successor& s : succ)
      if (s.node == to) return s.edge;
    return kNone;
  }
  auto it = edge_index_.find(edge_slot(from, to));
  return it == edge_index_.end() ? kNone : it->second;
}

NodeId TraceGraph::add(const LocationKey& key, std::shared_ptr<const SourceInfo> source,
                       std::vector<TensorMeta> outputs) {
  if (key.op == kReservedOp) throw std::invalid_argument("TraceGraph::add: the reserved op identity");
  const auto id = static_cast<NodeId>(nodes_.size());
  if (!index_.emplace(key, id).second)
    throw std::invalid_argument("TraceGraph::add: key " + to_string(key) + " is in the graph already");
  nodes_.emplace_back();
  Node& n = nodes_.back();
  n.key = key;
  n.source = std::move(source);
  const uint64_t h = meta_hash(outputs);
  n.metas.push_back({h, std::move(outputs), 0});
  stamp_.push_back(0);
  return id;
}

bool TraceGraph::take(NodeId from, NodeId to, EdgeId* edge) {
  EdgeId e = find_edge(from, to);
  const bool added = e == kNone;
  if (added) e = add_edge(from, to);
  retake(e);
  if (edge) *edge = e;
  return added;
}

void TraceGraph::retake(EdgeId e) {
  ControlEdge& edge = edges_[e];
  edge.count++;
  if (edge.from == kEntryNode) nodes_[kEntryNode].count++;
  nodes_[edge.to].count++;
}

bool TraceGraph::end_path(const std::vector<NodeId>& path, TraceEnd end) {
  take(path.empty() ? kEntryNode : path.back(), kExitNode);
  ends_[static_cast<int>(end)]++;
  uint64_t h = path.size();
  for (NodeId id : path) h = hash_combine(h, id);
  return paths_.insert(h).second;
}

EdgeId TraceGraph::add_edge(NodeId from, NodeId to) {
  EdgeId e = static_cast<EdgeId>(edges_.size());
  edges_.push_back({from, to, 0});
  std::vector<Successor>& succ = nodes_[from].successors;
  succ.push_back({nodes_[to].key, to, e});
  nodes_[to].predecessors.push_back(e);
  // Only nodes past the scan limit are looked up through edge_index_; index them from then on.
  if (succ.size() == kScanLimit + 1)
    for (const Successor& s : succ) edge_index_.emplace(edge_slot(from, s.node), s.edge);
  else if (succ.size() > kScanLimit + 1)
    edge_index_.emplace(edge_slot(from, to), e);
  return e;
}

void TraceGraph::fail(const std::string& message) {
  for (const LocationKey& k : added_keys_) index_.erase(k);
  added_keys_.clear();
  throw std::invalid_argument("TraceGraph::merge: " + message);
}

MergeResult TraceGraph::merge(const Trace& trace) {
  const size_t n = trace.ops.size();
  const NodeId known = static_cast<NodeId>(nodes_.size());
  ++serial_;

  // Phase 1 resolves every op to a node and every step to an existing edge (or kNone), and checks
  // the trace; the only change it makes, claiming ids for new keys, is undone by fail().
  resolved_.resize(n);
  entering_.resize(n + 1);
  added_keys_.clear();
  NodeId next_id = known;
  NodeId prev = kEntryNode;
  for (size_t j = 0; j < n; ++j) {
    const OpRecord& op = trace.ops[j];
    if (op.key.op == kReservedOp) fail("op " + std::to_string(j) + " uses the reserved op identity");
    if (std::string error = check_inputs(trace, j); !error.empty()) fail(error);
    NodeId id = kNone;
    EdgeId edge = kNone;
    bool fresh = false;
    if (const Successor* s = prev < known ? find_successor(prev, op.key) : nullptr) {
      id = s->node;
      edge = s->edge;
    } else if (auto [it, inserted] = index_.emplace(op.key, next_id); inserted) {
      added_keys_.push_back(op.key);
      id = next_id++;
      fresh = true;
    } else {
      id = it->second;
    }
    // Ids >= known were claimed earlier in this same trace; known ones carry this merge's stamp.
    bool repeated = !fresh && (id >= known || stamp_[id] == serial_);
    if (repeated) fail("op " + std::to_string(j) + " repeats key " + to_string(op.key) + " within one trace");
    if (id < known && nodes_[id].inputs.size() != op.inputs.size())
      fail("op " + std::to_string(j) + " (" + to_string(op.key) + ") has " + std::to_string(op.inputs.size()) +
           " inputs where earlier traces had " + std::to_string(nodes_[id].inputs.size()) +
           "; arity must be part of the op identity");
    if (id < known) stamp_[id] = serial_;
    resolved_[j] = id;
    entering_[j] = edge;
    prev = id;
  }
  const Successor* last = prev < known ? find_successor(prev, LocationKey::exit()) : nullptr;
  entering_[n] = last ? last->edge : kNone;

  // Phase 2 records the trace; nothing in it can fail.
  MergeResult result;
  auto note = [&](MergeResult::Novelty what, size_t position) {
    if (result.first == MergeResult::Novelty::None) {
      result.first = what;
      result.first_position = static_cast<uint32_t>(position);
    }
  };
  nodes_.resize(next_id);
  stamp_.resize(next_id, serial_);
  uint64_t path = trace.ops.size();
  prev = kEntryNode;
  nodes_[kEntryNode].count++;
  for (size_t j = 0; j <= n; ++j) {
    const NodeId id = j < n ? resolved_[j] : kExitNode;
    Node& node = nodes_[id];
    if (id >= known) {
      node.key = trace.ops[j].key;
      result.new_nodes++;
      note(MergeResult::Novelty::Node, j);
    }
    EdgeId edge = entering_[j];
    if (edge == kNone) {
      edge = add_edge(prev, id);
      result.new_control_edges++;
      note(MergeResult::Novelty::ControlEdge, j);
    }
    edges_[edge].count++;
    node.count++;
    prev = id;
    if (j == n) break;

    const OpRecord& op = trace.ops[j];
    path = hash_combine(path, id);
    if (op.is_fetch) node.fetch_count++;
    if (!node.source && op.source) node.source = op.source;
    node.inputs.resize(op.inputs.size());  // a no-op but for new nodes: phase 1 checked the arity
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const ValueRef& in = op.inputs[i];
      Producer p{in.kind, in.output, in.kind == ValueRef::Kind::Op ? resolved_[in.id] : in.id, 1};
      std::vector<Producer>& producers = node.inputs[i];
      Producer* found = nullptr;
      for (Producer& q : producers)
        if (q.same_source(p)) {
          found = &q;
          break;
        }
      if (found) {
        found->count++;
      } else {
        producers.push_back(p);
        result.new_producers++;
        note(MergeResult::Novelty::Producer, j);
      }
    }
    const uint64_t h = meta_hash(op.outputs);
    MetaVariant* variant = nullptr;
    for (MetaVariant& v : node.metas)
      if (v.hash == h) {
        variant = &v;
        break;
      }
    if (variant) {
      variant->count++;
    } else {
      if (!node.metas.empty()) {
        result.new_shapes++;
        note(MergeResult::Novelty::Shape, j);
      }
      node.metas.push_back({h, op.outputs, 1});
    }
  }
  ends_[static_cast<int>(trace.end)]++;
  result.new_path = paths_.insert(path).second;
  added_keys_.clear();
  return result;
}

std::vector<DataEdge> TraceGraph::data_edges() const {
  std::vector<DataEdge> out;
  for (NodeId to = 0; to < nodes_.size(); ++to) {
    const auto& inputs = nodes_[to].inputs;
    for (uint32_t i = 0; i < inputs.size(); ++i)
      for (const Producer& p : inputs[i])
        if (p.kind == ValueRef::Kind::Op) out.push_back({static_cast<NodeId>(p.id), p.output, to, i, p.count});
  }
  return out;
}

}  // namespace terra
