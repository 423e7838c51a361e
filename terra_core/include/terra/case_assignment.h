// Case assignment: cutting a TraceGraph into basic blocks and ordering them as switch-cases.
//
// A basic block is a maximal linear chain of nodes: only its first node may have several (or
// virtual) predecessors, only its last node several successors (or the exit). Every trace enters a
// block at its first node and leaves it at its last, because any place where some trace branched,
// joined, started or stopped is a node with another predecessor or successor. A switch-case is a
// block together with the control edges entering it: at run time the case is taken when the path
// arrives by one of those edges (paper, section on case assignment).
//
// Guarantees of assign_cases:
// - Blocks do not overlap and together cover every node except the virtual entry and exit.
// - The cases are ordered by a reverse postorder of the block graph from the entry, so every
//   recorded trace visits its blocks in increasing case order whenever the graph is acyclic, which
//   is the usual case (loops are unrolled by occurrence counts). Control edges that go back to a
//   case not after the one they leave are listed in `back_edges`: executing the ordered list again
//   from the top for each of them still covers every trace.
// - Case order and block contents are a function of the graph alone; O(nodes + edges).
#pragma once

#include <vector>

#include "terra/trace_graph.h"

namespace terra {

using BlockId = uint32_t;

struct BasicBlock {
  std::vector<NodeId> nodes;  // in control order
};

struct SwitchCase {
  BasicBlock block;
  std::vector<EdgeId> entering;  // control edges into block.nodes.front()
};

struct CaseAssignment {
  std::vector<SwitchCase> cases;    // in execution order; a block's BlockId is its case index
  std::vector<BlockId> block_of;    // per NodeId; kNone for entry and exit
  std::vector<uint32_t> index_in_block;  // per NodeId; kNone for entry and exit
  std::vector<EdgeId> back_edges;

  bool single_pass() const { return back_edges.empty(); }
};

CaseAssignment assign_cases(const TraceGraph& graph);

}  // namespace terra
