#include "terra/graph_gen.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace terra {
namespace {

class Generator {
 public:
  Generator(const TraceGraph& g, const CaseAssignment& c) : g_(g), c_(c) {}

  SymbolicGraph run() {
    out_.single_pass = c_.single_pass();
    out_.entry = targets(kEntryNode);
    out_.segments.resize(c_.cases.size());
    for (uint32_t s = 0; s < c_.cases.size(); ++s) build(s);
    for (uint32_t slot = 0; slot < out_.slots.size(); ++slot) {
      const Slot& sl = out_.slots[slot];
      out_.segments[sl.segment].writes.push_back({c_.index_in_block[sl.node], sl.output, slot});
    }
    for (Segment& seg : out_.segments)
      std::sort(seg.writes.begin(), seg.writes.end(), [](const SlotWrite& a, const SlotWrite& b) {
        return a.op != b.op ? a.op < b.op : a.output < b.output;
      });
    return std::move(out_);
  }

 private:
  std::vector<PathTarget> targets(NodeId last) const {
    std::vector<PathTarget> out;
    for (const Successor& s : g_.successors(last))
      out.push_back({s.key, s.node == kExitNode ? kNone : c_.block_of[s.node], s.edge});
    return out;
  }

  SegmentInput source(const Producer& p, uint32_t segment, uint32_t consumer) {
    switch (p.kind) {
      case ValueRef::Kind::External: return {SegmentInput::Kind::External, 0, p.id};
      case ValueRef::Kind::Feed: return {SegmentInput::Kind::Feed, 0, p.id};
      case ValueRef::Kind::Constant: return {SegmentInput::Kind::Constant, 0, p.id};
      case ValueRef::Kind::Op: break;
    }
    const NodeId producer = static_cast<NodeId>(p.id);
    if (c_.block_of[producer] == segment) {
      // A trace runs a block once, from its start, so a producer in the same block comes earlier.
      if (c_.index_in_block[producer] >= consumer) throw std::logic_error("generate: producer after consumer");
      return {SegmentInput::Kind::Local, p.output, c_.index_in_block[producer]};
    }
    auto [it, inserted] = slot_of_.emplace(uint64_t{producer} << 32 | p.output, out_.slots.size());
    if (inserted) out_.slots.push_back({producer, p.output, c_.block_of[producer]});
    return {SegmentInput::Kind::Slot, p.output, it->second};
  }

  void build(uint32_t s) {
    const SwitchCase& sc = c_.cases[s];
    Segment& seg = out_.segments[s];
    seg.entering = sc.entering;
    seg.ops.reserve(sc.block.nodes.size());
    for (uint32_t k = 0; k < sc.block.nodes.size(); ++k) {
      const NodeId id = sc.block.nodes[k];
      const Node& node = g_.node(id);
      SegmentOp op{id, node.key, {}, node.num_outputs()};
      for (uint32_t i = 0; i < node.inputs.size(); ++i) {
        const std::vector<Producer>& producers = node.inputs[i];
        if (producers.size() == 1) {
          op.inputs.push_back(source(producers[0], s, k));
          if (op.inputs.back().kind == SegmentInput::Kind::Feed) seg.feeds.push_back({k, i, producers[0].id});
          continue;
        }
        Select sel{k, i, {}};
        for (const Producer& p : producers) sel.candidates.push_back(source(p, s, k));
        op.inputs.push_back({SegmentInput::Kind::Select, 0, seg.selects.size()});
        seg.selects.push_back(std::move(sel));
      }
      if (node.fetch_count) seg.fetches.push_back({k, id});
      seg.ops.push_back(std::move(op));
    }
    seg.next = targets(sc.block.nodes.back());
  }

  const TraceGraph& g_;
  const CaseAssignment& c_;
  SymbolicGraph out_;
  std::unordered_map<uint64_t, uint32_t> slot_of_;
};

}  // namespace

const char* to_string(SegmentInput::Kind kind) {
  switch (kind) {
    case SegmentInput::Kind::Local: return "local";
    case SegmentInput::Kind::Slot: return "slot";
    case SegmentInput::Kind::External: return "external";
    case SegmentInput::Kind::Feed: return "feed";
    case SegmentInput::Kind::Constant: return "constant";
    case SegmentInput::Kind::Select: return "select";
  }
  return "?";
}

size_t SymbolicGraph::op_count() const {
  size_t n = 0;
  for (const Segment& s : segments) n += s.ops.size();
  return n;
}

const PathTarget* decide(const std::vector<PathTarget>& targets, const LocationKey& next_key) {
  for (const PathTarget& t : targets)
    if (t.key == next_key) return &t;
  return nullptr;
}

SymbolicGraph generate(const TraceGraph& graph, const CaseAssignment& cases) {
  return Generator(graph, cases).run();
}

}  // namespace terra
