#include "terra/case_assignment.h"

#include "trace_builder.h"

namespace terra::test {
namespace {

Trace lines(std::vector<uint32_t> ls) {
  TraceBuilder b;
  for (uint32_t l : ls) b.op("op", site(l));
  return b.finish();
}

std::vector<std::vector<LocationKey>> block_keys(const TraceGraph& g, const CaseAssignment& c) {
  std::vector<std::vector<LocationKey>> out;
  for (const SwitchCase& sc : c.cases) {
    out.emplace_back();
    for (NodeId id : sc.block.nodes) out.back().push_back(g.node(id).key);
  }
  return out;
}

TEST(CaseAssignment, EmptyGraphHasNoCases) {
  TraceGraph g;
  g.merge(Trace{});
  CaseAssignment c = assign_cases(g);
  EXPECT_TRUE(c.cases.empty());
  EXPECT_TRUE(c.single_pass());
}

TEST(CaseAssignment, OneTraceIsOneBlock) {
  TraceGraph g;
  Trace t = lines({1, 2, 3, 4});
  g.merge(t);
  CaseAssignment c = assign_cases(g);
  ASSERT_EQ(c.cases.size(), 1u);
  EXPECT_EQ(c.cases[0].block.nodes, (std::vector<NodeId>{2, 3, 4, 5}));
  ASSERT_EQ(c.cases[0].entering.size(), 1u);
  EXPECT_EQ(g.edge(c.cases[0].entering[0]).from, kEntryNode);
  EXPECT_EQ(c.block_of[4], 0u);
  EXPECT_EQ(c.index_in_block[4], 2u);
  EXPECT_EQ(c.block_of[kEntryNode], kNone);
}

TEST(CaseAssignment, DiamondGivesFourBlocksInTopologicalOrder) {
  TraceGraph g;
  Trace a = lines({1, 2, 3, 5, 6}), b = lines({1, 2, 4, 5, 6});
  g.merge(a);
  g.merge(b);
  CaseAssignment c = assign_cases(g);
  auto keys = block_keys(g, c);
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(keys[0], (std::vector<LocationKey>{a.ops[0].key, a.ops[1].key}));
  EXPECT_EQ(keys[3], (std::vector<LocationKey>{a.ops[3].key, a.ops[4].key}));
  EXPECT_EQ(c.cases[3].entering.size(), 2u);  // the join is entered from either side
  EXPECT_TRUE(c.single_pass());
}

TEST(CaseAssignment, TraceEndingMidChainSplitsTheBlock) {
  TraceGraph g;
  g.merge(lines({1, 2, 3, 4}));
  Trace cut = lines({1, 2});
  cut.end = TraceEnd::Exception;
  g.merge(cut);
  CaseAssignment c = assign_cases(g);
  ASSERT_EQ(c.cases.size(), 2u);
  EXPECT_EQ(c.cases[0].block.nodes.size(), 2u);
  EXPECT_EQ(c.cases[1].block.nodes.size(), 2u);
}

TEST(CaseAssignment, ConflictingOrdersBecomeBackEdges) {
  TraceGraph g;
  Trace ab = lines({1, 2}), ba = lines({2, 1});
  g.merge(ab);
  g.merge(ba);
  CaseAssignment c = assign_cases(g);
  EXPECT_EQ(c.cases.size(), 2u);
  ASSERT_EQ(c.back_edges.size(), 1u);
  SymbolicGraph sg = generate(g, c);
  EXPECT_FALSE(sg.single_pass);
  uint32_t passes = replay(sg, ab).passes + replay(sg, ba).passes;
  EXPECT_EQ(passes, 3u);  // one trace in one pass, the other in two
  expect_replays(sg, {ab, ba});
}

TEST(CaseAssignment, BlocksCoverEveryNodeOnce) {
  TraceGraph g;
  for (auto ls : std::vector<std::vector<uint32_t>>{{1, 2, 3, 4, 5}, {1, 3, 5}, {1, 2, 4}, {6, 3, 4, 5}})
    g.merge(lines(ls));
  CaseAssignment c = assign_cases(g);
  std::vector<int> seen(g.size(), 0);
  for (const SwitchCase& sc : c.cases)
    for (NodeId id : sc.block.nodes) seen[id]++;
  EXPECT_EQ(seen[kEntryNode], 0);
  EXPECT_EQ(seen[kExitNode], 0);
  for (NodeId id = 2; id < g.size(); ++id) EXPECT_EQ(seen[id], 1) << id;
}

}  // namespace
}  // namespace terra::test
