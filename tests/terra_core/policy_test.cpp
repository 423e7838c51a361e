#include "terra/policy.h"

#include <cstdlib>

#include "trace_builder.h"

namespace terra::test {
namespace {

TEST(Policy, DescribeListsEverySettingAndReadsBack) {
  Policy p;
  const std::string text = p.describe();
  EXPECT_EQ(text.rfind("warmup=1 max_divergences=8 max_nodes=200000 enabled=on adaptive=on", 0), 0u) << text;
  EXPECT_NE(text.find("payoff_check_budget=0.03"), std::string::npos) << text;
  EXPECT_NE(text.find("worker_spin=auto worker_nice=10"), std::string::npos) << text;
  EXPECT_NE(text.find("payoff_check_budget=0.03 remember_payoff=on"), std::string::npos) << text;
  EXPECT_EQ(p.settings().size(), 15u);
  Policy q;
  ASSERT_EQ(q.configure("warmup=3 adaptive=off payoff_margin=0.125 worker_spin=sleep worker_nice=4"), "");
  Policy r;
  EXPECT_EQ(r.configure(q.describe()), "");
  EXPECT_EQ(r.describe(), q.describe());
  EXPECT_EQ(r.warmup, 3u);
  EXPECT_FALSE(r.adaptive);
  EXPECT_EQ(r.payoff_margin, 0.125);
  EXPECT_EQ(r.worker_spin, Policy::WorkerSpin::Sleep);
}

TEST(Policy, ConfigureFromKeyValueTextOfEveryKind) {
  Policy p;
  EXPECT_EQ(p.configure("warmup=3, max_nodes=500  fast_path=false replay=0 lanes=ON payoff_check_budget=0.5"), "");
  EXPECT_EQ(p.warmup, 3u);
  EXPECT_EQ(p.max_nodes, 500u);
  EXPECT_FALSE(p.fast_path);
  EXPECT_FALSE(p.replay);
  EXPECT_TRUE(p.lanes);
  EXPECT_EQ(p.payoff_check_budget, 0.5);
  for (const Policy::Setting& s : p.settings()) {
    EXPECT_GT(std::string(s.help).size(), 20u) << s.key;
    EXPECT_EQ(std::string(s.env).rfind("TERRA_", 0), 0u) << s.key;
  }
}

TEST(Policy, BadSettingsAreReportedAndChangeNothing) {
  Policy p;
  EXPECT_NE(p.configure("warmup=5 colour=blue").find("unknown setting 'colour'"), std::string::npos);
  EXPECT_EQ(p.warmup, 1u);  // all or nothing
  EXPECT_NE(p.set("warmup", "-1").find("not a whole number"), std::string::npos);
  EXPECT_NE(p.set("warmup", "2x"), "");
  EXPECT_NE(p.set("warmup", ""), "");
  EXPECT_NE(p.set("warmup", "99999999999"), "");
  EXPECT_NE(p.set("max_nodes", "0").find("max_nodes must be at least 1"), std::string::npos);
  EXPECT_EQ(p.set("worker_nice", "20"), "worker_nice must be 0 to 19, not 20");
  EXPECT_NE(p.set("adaptive", "maybe").find("expected on/off"), std::string::npos);
  EXPECT_NE(p.set("worker_spin", "fast").find("one of auto, spin, sleep"), std::string::npos);
  EXPECT_NE(p.set("payoff_margin", "nan").find("not a number"), std::string::npos);
  EXPECT_NE(p.set("payoff_check_budget", "0"), "");
  EXPECT_NE(p.configure("warmup"), "");
  EXPECT_EQ(p.describe(), Policy{}.describe());
  EXPECT_EQ(p.set("warmup", "0"), "");
  EXPECT_EQ(p.warmup, 0u);
}

TEST(Policy, TheEnvironmentSetsDefaultsAndABadValueIsIgnored) {
  setenv("TERRA_ADAPTIVE", "0", 1);
  setenv("TERRA_WORKER_NICE", "25", 1);
  setenv("TERRA_WORKER_SPIN", "sleep", 1);
  const Policy p = Policy::from_environment();
  unsetenv("TERRA_ADAPTIVE");
  unsetenv("TERRA_WORKER_NICE");
  unsetenv("TERRA_WORKER_SPIN");
  EXPECT_FALSE(p.adaptive);
  EXPECT_EQ(p.worker_nice, 10u);
  EXPECT_EQ(p.worker_spin, Policy::WorkerSpin::Sleep);
  EXPECT_TRUE(Policy::from_environment().adaptive);
}

Trace one(uint32_t line) {
  TraceBuilder b;
  b.op("op", site(line));
  return b.finish();
}

TEST(Policy, CoExecuteAfterWarmupQuietIterations) {
  Policy p;
  ASSERT_EQ(p.configure("warmup=2"), "");
  TraceGraph g;
  Warmup w;
  auto state = [&] { return RegionState{g.size(), w.quiet, 0}; };
  EXPECT_EQ(decide(p, state()).action, Decision::Action::Trace);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, state()).action, Decision::Action::Trace);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, state()).action, Decision::Action::Trace);
  EXPECT_EQ(decide(p, state()).reason, FallbackReason::Warmup);
  w.observe(g.merge(one(1)));
  EXPECT_EQ(decide(p, state()).action, Decision::Action::CoExecute);
  w.observe(g.merge(one(2)));  // something new: warm up again
  EXPECT_EQ(w.quiet, 0u);
  EXPECT_EQ(decide(p, state()).action, Decision::Action::Trace);
  ASSERT_EQ(p.configure("enabled=off warmup=0"), "");
  EXPECT_EQ(decide(p, state()).reason, FallbackReason::Disabled);
}

TEST(Policy, CapsKeepTheRegionEager) {
  Policy p;
  ASSERT_EQ(p.configure("max_nodes=3 max_divergences=2"), "");
  EXPECT_EQ(decide(p, {2, 5, 1}).action, Decision::Action::CoExecute);
  EXPECT_EQ(decide(p, {2, 5, 2}).action, Decision::Action::StayEager);
  EXPECT_EQ(decide(p, {2, 5, 2}).reason, FallbackReason::DivergenceCap);
  EXPECT_EQ(decide(p, {3, 5, 0}).reason, FallbackReason::NodeCap);
  EXPECT_EQ(decide(p, {3, 0, 0}).action, Decision::Action::StayEager);  // caps before warm-up
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

std::shared_ptr<const SourceInfo> at(const char* op, std::vector<SourceFrame> frames) {
  return std::make_shared<const SourceInfo>(SourceInfo{op, std::move(frames)});
}

TEST(FallbackLog, OneEntryPerReasonOpAndUserLineCountedWithTheLatestDetail) {
  FallbackLog log;
  EXPECT_EQ(log.explain(), "no fallbacks\n");
  const SourceFrame step{"/home/u/train.py", 7, "step"}, lib{"/x/site-packages/torch/nn/functional.py", 80, "relu"};
  log.record(FallbackReason::NewBranch, "", at("aten::relu", {step, lib}), 3);
  log.record(FallbackReason::NewBranch, "", at("aten::relu", {step}));  // same user line
  log.record(FallbackReason::NewArguments, "element 0 is Float[3]", at("aten::relu", {step}));
  log.record(FallbackReason::NewArguments, "element 0 is Float[4]", at("aten::relu", {step}));
  log.record(FallbackReason::NewBranch, "", at("aten::relu", {{"/home/u/train.py", 9, "step"}}));
  EXPECT_EQ(log.count(FallbackReason::NewBranch), 3u);
  EXPECT_EQ(log.total(), 5u);
  ASSERT_EQ(log.entries().size(), 3u);
  EXPECT_EQ(log.entries()[0].count, 2u);
  EXPECT_EQ(log.entries()[0].after, 3u);
  EXPECT_EQ(log.entries()[1].text(), "the arguments differ from the trace: element 0 is Float[4]");
  const std::string text = log.explain();
  EXPECT_NE(text.find("3 x new_branch"), std::string::npos) << text;
  EXPECT_NE(text.find("2 x aten::relu at /home/u/train.py:7 in step: a branch"), std::string::npos) << text;
  for (uint32_t i = 0; i < 2 * FallbackLog::kMaxEntries; ++i)
    log.record(FallbackReason::NewShape, "x", at("aten::add", {{"f.py", static_cast<int>(i), "g"}}));
  EXPECT_EQ(log.entries().size(), FallbackLog::kMaxEntries);  // bounded; counts go on
  EXPECT_EQ(log.count(FallbackReason::NewShape), 2 * FallbackLog::kMaxEntries);
}

TEST(SourceInfo, TheUserFrameIsTheInnermostOutsideTorchAndTerra) {
  const SourceFrame cell{"/tmp/ipykernel/123.py", 4, "<module>"}, fit{"/home/u/train.py", 12, "fit"};
  const SourceFrame lib{"/usr/lib/python3/site-packages/torch/optim/sgd.py", 90, "step"};
  const SourceFrame kernel{"/usr/lib/python3/site-packages/terra_kernel/coexec.py", 5, "run"};
  const SourceInfo source{"aten::add_", {cell, fit, lib}};
  ASSERT_NE(user_frame(source), nullptr);
  EXPECT_EQ(user_frame(source)->line, 12);
  EXPECT_EQ(describe(source), "aten::add_ at /home/u/train.py:12 in fit");
  const SourceInfo library_only{"aten::mul", {kernel, lib}};
  EXPECT_EQ(user_frame(library_only)->line, 90);  // none of the user's: the innermost
  EXPECT_EQ(user_frame(SourceInfo{"aten::mul", {}}), nullptr);
}

}  // namespace
}  // namespace terra::test
