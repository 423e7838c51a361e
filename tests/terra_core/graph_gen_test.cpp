#include "terra/graph_gen.h"

#include "trace_builder.h"

namespace terra::test {
namespace {

using V = ValueRef;

// h = linear(x); if c: h = relu(h); loss = mse(h, y); loss.item()
Trace step(bool relu, uint64_t label_feed = 1) {
  TraceBuilder b;
  auto h = b.op("linear", site(1), {V::feed(0), V::external(9)});
  if (relu) h = b.op("relu", site(2), {b.out(h)});
  b.op("mse", site(3), {b.out(h), V::feed(label_feed)}, true, {meta({})});
  return b.finish();
}

TEST(GraphGen, SegmentsHaveLocalsSlotsSelectsFeedsFetchesAndPaths) {
  TraceGraph g;
  std::vector<Trace> traces{step(true), step(false)};
  for (const Trace& t : traces) g.merge(t);
  CaseAssignment c = assign_cases(g);
  SymbolicGraph sg = generate(g, c);
  ASSERT_EQ(sg.segments.size(), 3u);  // [linear] [relu] [mse]
  EXPECT_EQ(sg.op_count(), 3u);
  ASSERT_EQ(sg.entry.size(), 1u);
  EXPECT_EQ(sg.entry[0].segment, 0u);

  const Segment& head = sg.segments[0];
  ASSERT_EQ(head.ops[0].inputs.size(), 2u);
  EXPECT_EQ(head.ops[0].inputs[0].kind, SegmentInput::Kind::Feed);
  EXPECT_EQ(head.ops[0].inputs[1].kind, SegmentInput::Kind::External);
  EXPECT_EQ(head.ops[0].inputs[1].id, 9u);
  ASSERT_EQ(head.feeds.size(), 1u);
  ASSERT_EQ(head.writes.size(), 1u);  // linear's output crosses into relu's and mse's segments
  EXPECT_EQ(head.next.size(), 2u);

  const Segment& relu = sg.segments[1];
  EXPECT_EQ(relu.ops[0].inputs[0].kind, SegmentInput::Kind::Slot);
  EXPECT_EQ(relu.next.size(), 1u);

  const Segment& tail = sg.segments[2];
  EXPECT_EQ(tail.ops[0].inputs[0].kind, SegmentInput::Kind::Select);
  EXPECT_EQ(tail.selects[0].candidates.size(), 2u);
  EXPECT_EQ(tail.fetches.size(), 1u);
  ASSERT_EQ(tail.next.size(), 1u);
  EXPECT_EQ(tail.next[0].segment, kNone);
  EXPECT_EQ(tail.next[0].key, LocationKey::exit());
  EXPECT_EQ(sg.slots.size(), 2u);
  expect_replays(sg, traces);
}

TEST(GraphGen, LocalValuesStayInTheSegment) {
  TraceGraph g;
  Trace t = step(true);
  g.merge(t);
  SymbolicGraph sg = generate(g, assign_cases(g));
  ASSERT_EQ(sg.segments.size(), 1u);
  EXPECT_EQ(sg.segments[0].ops[1].inputs[0].kind, SegmentInput::Kind::Local);
  EXPECT_EQ(sg.segments[0].ops[1].inputs[0].id, 0u);
  EXPECT_TRUE(sg.slots.empty());
}

TEST(GraphGen, ReplayRejectsWhatTheGraphDoesNotCover) {
  TraceGraph g;
  g.merge(step(true));
  SymbolicGraph sg = generate(g, assign_cases(g));
  ReplayResult branch = replay(sg, step(false));
  EXPECT_FALSE(branch.ok);
  EXPECT_NE(branch.error.find("segment expects"), std::string::npos) << branch.error;
  ReplayResult input = replay(sg, step(true, /*label_feed=*/5));
  EXPECT_FALSE(input.ok);
  EXPECT_NE(input.error.find("input 1"), std::string::npos) << input.error;
  Trace fetch = step(true);
  fetch.ops[0].is_fetch = true;
  EXPECT_FALSE(replay(sg, fetch).ok);
  Trace shorter = step(true);
  shorter.ops.pop_back();
  EXPECT_FALSE(replay(sg, shorter).ok);
}

TEST(GraphGen, SnapshotIsIndependentOfLaterMerges) {
  TraceGraph g;
  g.merge(step(true));
  SymbolicGraph sg = generate(g, assign_cases(g));
  g.merge(step(false));
  EXPECT_TRUE(replay(sg, step(true)).ok);
  EXPECT_FALSE(replay(sg, step(false)).ok);
}

}  // namespace
}  // namespace terra::test
