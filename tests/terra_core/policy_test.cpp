#include "terra/policy.h"

#include "trace_builder.h"

namespace terra::test {
namespace {

TEST(Policy, DefaultsAndDescribe) {
  Policy p;
  EXPECT_EQ(p.warmup, 2u);
  EXPECT_EQ(p.describe(), "warmup=2 max_nodes=100000 max_paths=256");
}

TEST(Policy, ConfigureFromKeyValueText) {
  Policy p;
  EXPECT_EQ(p.configure("warmup=3, max_paths=64  max_nodes=500"), "");
  EXPECT_EQ(p.warmup, 3u);
  EXPECT_EQ(p.max_paths, 64u);
  EXPECT_EQ(p.max_nodes, 500u);
  Policy q;
  EXPECT_EQ(q.configure(p.describe()), "");
  EXPECT_EQ(q.describe(), p.describe());
}

TEST(Policy, BadOptionsAreReportedAndChangeNothing) {
  Policy p;
  EXPECT_NE(p.configure("warmup=5 colour=blue").find("unknown option 'colour'"), std::string::npos);
  EXPECT_EQ(p.warmup, 2u);  // all or nothing
  EXPECT_NE(p.set("warmup", "-1"), "");
  EXPECT_NE(p.set("warmup", "2x"), "");
  EXPECT_NE(p.set("warmup", ""), "");
  EXPECT_NE(p.set("max_paths", "0"), "");
  EXPECT_NE(p.configure("warmup"), "");
  EXPECT_EQ(p.describe(), Policy{}.describe());
  EXPECT_EQ(p.set("warmup", "0"), "");
  EXPECT_EQ(p.warmup, 0u);
}

Trace one(uint32_t line) {
  TraceBuilder b;
  b.op("op", site(line));
  return b.finish();
}

TEST(Policy, GenerateAfterWarmupQuietIterations) {
  Policy p;
  TraceGraph g;
  Warmup w;
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Trace);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Trace);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Trace);
  EXPECT_EQ(decide(p, g, w).reason, FallbackReason::Warmup);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Generate);
  w.observe(g.merge(one(2)));  // something new: warm up again
  EXPECT_EQ(w.quiet, 0u);
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Trace);
}

TEST(Policy, CapsKeepTheRegionEager) {
  Policy p;
  ASSERT_EQ(p.configure("max_nodes=3 max_paths=2"), "");
  TraceGraph g;
  Warmup w{10};
  g.merge(one(1));
  g.merge(one(2));
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::Generate);
  g.merge(one(3));
  EXPECT_EQ(decide(p, g, w).action, Decision::Action::StayEager);
  EXPECT_EQ(decide(p, g, w).reason, FallbackReason::PathCap);
  g.merge(one(4));
  EXPECT_EQ(decide(p, g, w).reason, FallbackReason::NodeCap);
}

TEST(Policy, ReasonForMergeNovelty) {
  MergeResult r;
  r.first = MergeResult::Novelty::ControlEdge;
  EXPECT_EQ(reason_for(r), FallbackReason::NewBranch);
  r.first = MergeResult::Novelty::Node;
  EXPECT_EQ(reason_for(r), FallbackReason::NewOp);
  r.first = MergeResult::Novelty::Shape;
  EXPECT_EQ(reason_for(r), FallbackReason::NewShape);
  r.first = MergeResult::Novelty::Producer;
  EXPECT_EQ(reason_for(r), FallbackReason::NewInput);
}

TEST(Policy, EveryReasonHasANameAndASentence) {
  for (int i = 0; i < kFallbackReasons; ++i) {
    auto r = static_cast<FallbackReason>(i);
    EXPECT_GT(std::string(to_string(r)).size(), 3u);
    EXPECT_GT(std::string(describe(r)).size(), 20u);
  }
}

TEST(FallbackLog, CountsAndExplains) {
  FallbackLog log;
  EXPECT_EQ(log.explain(), "no fallbacks\n");
  log.record(FallbackReason::NewBranch, "aten::relu at train.py:7 in step");
  log.record(FallbackReason::NewBranch);
  log.record(FallbackReason::Exception, "ValueError at train.py:9");
  EXPECT_EQ(log.count(FallbackReason::NewBranch), 2u);
  EXPECT_EQ(log.total(), 3u);
  std::string text = log.explain();
  EXPECT_NE(text.find("2 x new_branch"), std::string::npos) << text;
  EXPECT_NE(text.find("train.py:7"), std::string::npos) << text;
  for (int i = 0; i < 100; ++i) log.record(FallbackReason::NewShape, "x");
  EXPECT_EQ(log.recent().size(), FallbackLog::kRecent);
  EXPECT_EQ(log.count(FallbackReason::NewShape), 100u);
}

}  // namespace
}  // namespace terra::test
