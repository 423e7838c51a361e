#include "terra/case_assignment.h"

#include <algorithm>

namespace terra {
namespace {

bool starts_block(const TraceGraph& g, NodeId id) {
  const Node& node = g.node(id);
  if (node.predecessors.size() != 1) return true;
  NodeId pred = g.edge(node.predecessors[0]).from;
  return pred == kEntryNode || g.node(pred).successors.size() != 1;
}

// The chain that starts at `first`: follow single successors that are not themselves block starts.
std::vector<NodeId> chain_from(const TraceGraph& g, NodeId first) {
  std::vector<NodeId> chain{first};
  for (NodeId cur = first;;) {
    const auto& succ = g.node(cur).successors;
    if (succ.size() != 1 || succ[0].node == kExitNode || starts_block(g, succ[0].node)) break;
    cur = succ[0].node;
    if (cur == first) break;  // only a cycle no trace can reach gets here; cut it anywhere
    chain.push_back(cur);
  }
  return chain;
}

// Reverse postorder of the blocks from the entry, iterative so deep graphs cannot overflow the stack.
std::vector<BlockId> reverse_postorder(const TraceGraph& g, const std::vector<std::vector<NodeId>>& blocks,
                                       const std::vector<BlockId>& block_of) {
  const size_t nb = blocks.size();
  std::vector<uint8_t> seen(nb, 0);
  std::vector<BlockId> post;
  post.reserve(nb);
  std::vector<std::pair<BlockId, uint32_t>> stack;  // (block, next successor to look at)
  auto visit_from = [&](const std::vector<Successor>& roots) {
    for (const Successor& root : roots) {
      if (root.node == kExitNode || seen[block_of[root.node]]) continue;
      seen[block_of[root.node]] = 1;
      stack.push_back({block_of[root.node], 0});
      while (!stack.empty()) {
        auto& [b, next] = stack.back();
        const auto& succ = g.node(blocks[b].back()).successors;
        if (next < succ.size()) {
          NodeId to = succ[next++].node;
          if (to != kExitNode && !seen[block_of[to]]) {
            seen[block_of[to]] = 1;
            stack.push_back({block_of[to], 0});
          }
        } else {
          post.push_back(b);
          stack.pop_back();
        }
      }
    }
  };
  visit_from(g.successors(kEntryNode));
  // Every node lies on a trace from the entry, so nothing is left; kept total for safety.
  std::vector<Successor> rest;
  for (BlockId b = 0; b < nb; ++b)
    if (!seen[b]) rest.push_back({LocationKey{}, blocks[b].front(), kNone});
  visit_from(rest);
  std::reverse(post.begin(), post.end());
  return post;
}

}  // namespace

CaseAssignment assign_cases(const TraceGraph& g) {
  const size_t n = g.size();
  std::vector<std::vector<NodeId>> blocks;
  std::vector<BlockId> block_of(n, kNone);
  auto add_block = [&](NodeId first) {
    blocks.push_back(chain_from(g, first));
    for (NodeId id : blocks.back()) block_of[id] = static_cast<BlockId>(blocks.size() - 1);
  };
  for (NodeId id = kExitNode + 1; id < n; ++id)
    if (starts_block(g, id)) add_block(id);
  for (NodeId id = kExitNode + 1; id < n; ++id)
    if (block_of[id] == kNone) add_block(id);

  CaseAssignment out;
  out.block_of.assign(n, kNone);
  out.index_in_block.assign(n, kNone);
  std::vector<BlockId> order = reverse_postorder(g, blocks, block_of);
  out.cases.reserve(order.size());
  for (BlockId b : order) {
    SwitchCase c;
    c.block.nodes = std::move(blocks[b]);
    c.entering = g.node(c.block.nodes.front()).predecessors;
    for (uint32_t i = 0; i < c.block.nodes.size(); ++i) {
      out.block_of[c.block.nodes[i]] = static_cast<BlockId>(out.cases.size());
      out.index_in_block[c.block.nodes[i]] = i;
    }
    out.cases.push_back(std::move(c));
  }
  for (const SwitchCase& c : out.cases)
    for (EdgeId e : c.entering) {
      NodeId from = g.edge(e).from;
      if (from != kEntryNode && out.block_of[from] >= out.block_of[c.block.nodes.front()]) out.back_edges.push_back(e);
    }
  return out;
}

}  // namespace terra
