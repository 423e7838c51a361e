// Hand-built traces of small training programs, run through merge, case assignment, generation and
// replay. Each test names the Python it stands for.
#include <algorithm>

#include "trace_builder.h"

namespace terra::test {
namespace {

using V = ValueRef;

// for step:                      (cond alternates)
//   h = linear(x, W)             line 1
//   if cond: h = relu(h)         line 2
//   else:    h = tanh(h)         line 3
//   loss = h.sum(); loss.item()  line 4
Trace if_else(bool cond) {
  TraceBuilder b;
  auto h = b.op("linear", site(1), {V::feed(0), V::external(100)});
  h = b.op(cond ? "relu" : "tanh", site(cond ? 2 : 3), {b.out(h)});
  b.op("sum", site(4), {b.out(h)}, /*fetch=*/true, {meta({})});
  return b.finish();
}

TEST(Scenarios, IfElseReconvergesIntoSharedTail) {
  std::vector<Trace> traces{if_else(true), if_else(false), if_else(true)};
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.size(), 2u + 4u);  // linear, relu, tanh and one shared sum
  const NodeId sum = node_of(p.graph, traces[0], 2);
  EXPECT_EQ(sum, node_of(p.graph, traces[1], 2));
  EXPECT_EQ(p.graph.node(sum).count, 3u);
  EXPECT_EQ(p.graph.node(sum).predecessors.size(), 2u);
  // sum's input came from relu on one path and from tanh on the other.
  ASSERT_EQ(p.graph.node(sum).inputs.size(), 1u);
  EXPECT_EQ(p.graph.node(sum).inputs[0].size(), 2u);
  EXPECT_EQ(p.cases.cases.size(), 4u);
  EXPECT_TRUE(p.cases.single_pass());
  // The branch point is the end of linear's block; its path decision names both sides.
  const Segment& first = p.symbolic.segments[p.cases.block_of[node_of(p.graph, traces[0], 0)]];
  EXPECT_EQ(first.next.size(), 2u);
  const Segment& tail = p.symbolic.segments[p.cases.block_of[sum]];
  ASSERT_EQ(tail.selects.size(), 1u);
  EXPECT_EQ(tail.selects[0].candidates.size(), 2u);
  ASSERT_EQ(tail.fetches.size(), 1u);
  EXPECT_EQ(first.feeds.size(), 1u);
}

// h = x
// for i in range(trips): h = relu(mm(h, W))    lines 10, 11 (same frames every iteration)
// loss = h.sum()                                line 12
Trace loop(int trips) {
  TraceBuilder b;
  V h = V::feed(0);
  for (int i = 0; i < trips; ++i) {
    auto m = b.op("mm", site(10), {h, V::external(200)});
    h = b.out(b.op("relu", site(11), {b.out(m)}));
  }
  b.op("sum", site(12), {h}, true, {meta({})});
  return b.finish();
}

TEST(Scenarios, LoopsWithVaryingTripCountsUnrollByOccurrence) {
  std::vector<Trace> traces{loop(3), loop(5), loop(2), loop(3)};
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.size(), 2u + 5u * 2 + 1);  // mm#0..4, relu#0..4, sum
  // Blocks: [mm0 relu0 mm1 relu1] [mm2 relu2] [mm3 relu3 mm4 relu4] [sum].
  ASSERT_EQ(p.cases.cases.size(), 4u);
  EXPECT_EQ(p.cases.cases[0].block.nodes.size(), 4u);
  const NodeId sum = node_of(p.graph, traces[0], traces[0].ops.size() - 1);
  EXPECT_EQ(p.graph.node(sum).predecessors.size(), 3u);
  EXPECT_EQ(p.graph.node(sum).inputs[0].size(), 3u);
  EXPECT_TRUE(p.cases.single_pass());
  EXPECT_EQ(p.graph.path_count(), 3u);
}

// for i in range(len(inner)):
//   for j in range(inner[i]): h = conv(h)      line 20
//   h = pool(h)                                 line 21
Trace nested(const std::vector<int>& inner) {
  TraceBuilder b;
  V h = V::feed(0);
  for (int n : inner) {
    for (int j = 0; j < n; ++j) h = b.out(b.op("conv", site(20), {h, V::external(300)}));
    h = b.out(b.op("pool", site(21), {h}));
  }
  return b.finish();
}

TEST(Scenarios, NestedLoops) {
  std::vector<Trace> traces{nested({2, 1}), nested({1, 2}), nested({2, 1, 0}), nested({3})};
  Pipeline p = run_pipeline(traces);
  // Occurrences run per site across the outer loop: conv#0..#2 and pool#0..#2 are all the nodes.
  EXPECT_EQ(p.graph.size(), 2u + 3u + 3u);
  // {2,1} runs conv#1 -> pool#0 and {1,2} runs pool#0 -> conv#1: no case order suits both, so
  // some control edges go back, and a trace taking one makes a second pass over the case list.
  EXPECT_FALSE(p.cases.single_pass());
  EXPECT_FALSE(p.cases.back_edges.empty());
  uint32_t most = 0;
  for (const Trace& t : traces) most = std::max(most, replay(p.symbolic, t).passes);
  EXPECT_EQ(most, 2u);
}

TEST(Scenarios, NestedLoopsWithFixedInnerCountStaySinglePass) {
  std::vector<Trace> traces{nested({2, 2}), nested({2, 2, 2}), nested({2})};
  Pipeline p = run_pipeline(traces);
  EXPECT_TRUE(p.cases.single_pass());
}

// for i in range(10):
//   h = f(h)                           line 30
//   if h.sum().item() < t: break       line 31 (fetch)
// out = head(h)                        line 32
Trace early_break(int stop_at, TraceEnd end = TraceEnd::Normal) {
  TraceBuilder b;
  V h = V::feed(0);
  for (int i = 0; i < 10; ++i) {
    h = b.out(b.op("f", site(30), {h}));
    b.op("sum", site(31), {h}, true, {meta({})});
    if (i == stop_at) break;
  }
  if (end == TraceEnd::Normal) b.op("head", site(32), {h});
  return b.finish(end);
}

TEST(Scenarios, EarlyBreakJoinsTheCodeAfterTheLoop) {
  std::vector<Trace> traces{early_break(9), early_break(2), early_break(5), early_break(2)};
  Pipeline p = run_pipeline(traces);
  const NodeId head = node_of(p.graph, traces[1], traces[1].ops.size() - 1);
  EXPECT_EQ(p.graph.node(head).predecessors.size(), 3u);
  EXPECT_EQ(p.graph.node(head).count, 4u);
  EXPECT_TRUE(p.cases.single_pass());
}

TEST(Scenarios, BreakOutOfTheIterationLoopEndsTheTrace) {
  std::vector<Trace> traces{early_break(9), early_break(3, TraceEnd::Break)};
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.end_count(TraceEnd::Break), 1u);
  EXPECT_EQ(p.graph.end_count(TraceEnd::Normal), 1u);
  // sum#3 may now end an iteration: it is a branch point with the exit among its successors.
  const NodeId sum3 = node_of(p.graph, traces[1], traces[1].ops.size() - 1);
  EXPECT_NE(p.graph.find_successor(sum3, LocationKey::exit()), nullptr);
  EXPECT_EQ(p.graph.successors(sum3).size(), 2u);
}

// forward (4 ops), then the iteration raises between backward and step.
Trace train_step(bool raises) {
  TraceBuilder b;
  auto x = b.op("linear", site(40), {V::feed(0), V::external(1)});
  auto y = b.op("relu", site(41), {b.out(x)});
  auto l = b.op("mse", site(42), {b.out(y), V::feed(1)});
  b.op("backward", site(43), {b.out(l)}, false, {});
  if (!raises) {
    b.op("sgd_update", site(44), {V::external(1), V::external(2)}, false, {});
    b.op("zero_grad", site(45), {V::external(2)}, false, {});
  }
  return b.finish(raises ? TraceEnd::Exception : TraceEnd::Normal);
}

TEST(Scenarios, ExceptionCutsTheIterationShort) {
  std::vector<Trace> traces{train_step(false), train_step(true), train_step(false)};
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.end_count(TraceEnd::Exception), 1u);
  const NodeId backward = node_of(p.graph, traces[0], 3);
  EXPECT_EQ(p.graph.successors(backward).size(), 2u);
  ASSERT_EQ(p.cases.cases.size(), 2u);  // [linear relu mse backward] [sgd_update zero_grad]
  EXPECT_EQ(p.cases.cases[0].block.nodes.back(), backward);
  ReplayResult r = replay(p.symbolic, traces[1]);
  EXPECT_EQ(r.segments.size(), 1u);
}

// GAN-style: even steps update D, odd steps update G, through the same Adam.step code called from
// two call sites; Adam loops over the parameters (occurrence per parameter).
constexpr uint64_t kAdamCode = 77;
Trace gan_step(int step) {
  TraceBuilder b;
  const bool d = step % 2 == 0;
  const uint32_t caller_line = d ? 50 : 51;
  auto loss = b.op(d ? "d_loss" : "g_loss", site(d ? 52 : 53), {V::feed(0), V::external(d ? 10 : 20)});
  b.op("backward", site({{1, caller_line - 10}}), {b.out(loss)}, false, {});
  for (uint64_t param = 0; param < 3; ++param) {
    uint64_t p = (d ? 10 : 20) + param;
    auto m = b.op("lerp_", site({{1, caller_line}, {kAdamCode, 5}}), {V::external(1000 + p), V::external(2000 + p)});
    b.op("addcdiv_", site({{1, caller_line}, {kAdamCode, 6}}), {V::external(p), b.out(m), V::feed(1)});
  }
  return b.finish();
}

TEST(Scenarios, TwoAlternatingOptimizers) {
  std::vector<Trace> traces;
  for (int s = 0; s < 6; ++s) traces.push_back(gan_step(s));
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.size(), 2u + 2 * (2 + 6));
  EXPECT_EQ(p.graph.successors(kEntryNode).size(), 2u);
  EXPECT_EQ(p.cases.cases.size(), 2u);  // one block per optimizer's iteration
  EXPECT_EQ(p.graph.path_count(), 2u);
  for (const Trace& t : traces) EXPECT_FALSE(p.graph.merge(t).added_anything());
}

// def block(x): return relu(linear(x))          lines 61, 62 of code 9
// a = block(x)                                   line 70
// b = block(a)                                   line 71
TEST(Scenarios, SameFunctionFromTwoCallSitesGivesDistinctNodes) {
  TraceBuilder b;
  V h = V::feed(0);
  for (uint32_t call : {70u, 71u}) {
    auto l = b.op("linear", site({{1, call}, {9, 61}}), {h});
    h = b.out(b.op("relu", site({{1, call}, {9, 62}}), {b.out(l)}));
  }
  std::vector<Trace> traces{b.finish()};
  Pipeline p = run_pipeline(traces);
  EXPECT_EQ(p.graph.size(), 2u + 4u);
  for (NodeId id = 2; id < p.graph.size(); ++id) EXPECT_EQ(p.graph.node(id).key.occurrence, 0u);
  ASSERT_EQ(p.cases.cases.size(), 1u);
  EXPECT_EQ(p.symbolic.slots.size(), 0u);  // one block: every value is local
}

}  // namespace
}  // namespace terra::test
