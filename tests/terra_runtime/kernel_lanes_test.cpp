// Kernel lanes (kernel_lanes.h): which kernels of an item wait for which, and a second thread
// taking free kernels while the owner runs the rest, every dependency and barrier respected.
#include "kernel_lanes.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace terra::runtime {
namespace {

using Ids = std::vector<std::vector<uint32_t>>;

std::vector<uint32_t> deps_of(const LanePlan& p, uint32_t i) {
  return {p.deps.begin() + p.dep_offsets[i], p.deps.begin() + p.dep_offsets[i + 1]};
}

// `n` kernels, kernel i reading entry i (made by kernel i - 1 where `chain`) and making i + 1.
struct Item {
  Ids reads, outs, drops;
  std::vector<bool> free, helped, parallel;
  explicit Item(uint32_t n, bool chain = false) : reads(n), outs(n), drops(n), free(n, true), helped(n, true), parallel(n) {
    for (uint32_t i = 0; i < n; ++i) {
      if (chain) reads[i] = {i};
      outs[i] = {i + 1};
    }
  }
  std::unique_ptr<LanePlan> plan() const { return make_lane_plan(reads, outs, drops, free, helped, parallel); }
};

TEST(KernelLanes, PlansWaitForTheKernelsThatMadeTheirArguments) {
  Item item(20);
  item.reads[5] = {3, 4};   // made by kernels 2 and 3
  item.reads[9] = {100};    // made before the item: ready
  auto plan = item.plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(20u, plan->size());
  EXPECT_EQ(20u, plan->free);
  EXPECT_EQ((std::vector<uint32_t>{2, 3}), deps_of(*plan, 5));
  EXPECT_TRUE(deps_of(*plan, 9).empty());
  EXPECT_TRUE(deps_of(*plan, 0).empty());
}

TEST(KernelLanes, KernelsAfterABarrierWaitForItAndADropWaitsForEveryReader) {
  Item item(20);
  item.free[6] = item.helped[6] = false;  // writes an argument, say
  item.reads[2] = {50};
  item.reads[4] = {50};
  item.drops[8] = {50};  // kernel 8 reads entry 50 last and drops it
  item.reads[8] = {50};
  auto plan = item.plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_TRUE(plan->barrier[6]);
  EXPECT_EQ(19u, plan->free);
  EXPECT_EQ((std::vector<uint32_t>{6}), deps_of(*plan, 7));
  EXPECT_EQ((std::vector<uint32_t>{2, 4, 6}), deps_of(*plan, 8));
  EXPECT_TRUE(deps_of(*plan, 5).empty());
}

TEST(KernelLanes, NoPlanForSmallItemsOrFewKernelsWorthHelping) {
  EXPECT_EQ(nullptr, Item(LanePlan::kMinKernels - 1).plan());
  Item few(40);
  for (uint32_t i = LanePlan::kMinFree - 1; i < 40; ++i) few.helped[i] = false;
  EXPECT_EQ(nullptr, few.plan());
  few.helped[30] = true;
  EXPECT_NE(nullptr, few.plan());
}

// Runs `item` on this thread while a second one helps, and checks that each kernel ran once,
// after its dependencies and barriers, never beside a barrier, and that the helper ran some.
void expect_ordered_run(const Item& item, std::vector<int>* ran_on_helper = nullptr) {
  auto plan = item.plan();
  ASSERT_NE(plan, nullptr);
  const uint32_t n = plan->size();
  KernelLanes lanes;
  std::vector<std::atomic<int>> runs(n);
  std::vector<std::atomic<int64_t>> started(n), ended(n);
  std::atomic<int64_t> clock{0};
  std::atomic<int> running{0}, barrier_overlap{0}, helper_runs{0};
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    uint64_t seen = 0;
    const std::function<bool()> waiting = [&] { return !stop.load(); };
    while (!stop.load()) lanes.help(waiting, seen);
  });
  const uint32_t helped = lanes.run(*plan, c10::impl::tls_local_dispatch_key_set(), [&](uint32_t i, bool on_helper) {
    started[i] = ++clock;
    if (running.fetch_add(1) > 0 && plan->barrier[i]) ++barrier_overlap;
    if (on_helper) {
      ++helper_runs;
      if (ran_on_helper) (*ran_on_helper)[i] = 1;
    }
    EXPECT_FALSE(on_helper && !plan->helped[i]) << i;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ++runs[i];
    running.fetch_sub(1);
    ended[i] = ++clock;
  });
  stop = true;
  helper.join();
  EXPECT_EQ(static_cast<uint32_t>(helper_runs.load()), helped);
  EXPECT_GT(helper_runs.load(), 0);
  EXPECT_EQ(0, barrier_overlap.load());
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(1, runs[i].load()) << i;
    for (uint32_t d : deps_of(*plan, i)) EXPECT_LT(ended[d].load(), started[i].load()) << d << " before " << i;
    if (plan->barrier[i]) {
      for (uint32_t j = 0; j < i; ++j) EXPECT_LT(ended[j].load(), started[i].load()) << j << " before barrier " << i;
    }
  }
}

TEST(KernelLanes, AHelpingThreadTakesFreeKernelsInDependencyOrder) {
  Item item(40);
  for (uint32_t i = 10; i < 40; i += 2) item.reads[i] = {i};  // waits for kernel i - 1
  item.free[12] = item.helped[12] = false;
  item.free[25] = item.helped[25] = false;
  item.helped[30] = false;  // free, too short for the helper
  std::vector<int> on_helper(40);
  expect_ordered_run(item, &on_helper);
  EXPECT_EQ(0, on_helper[30]);
  EXPECT_EQ(0, on_helper[12]);
}

TEST(KernelLanes, AChainRunsInOrder) { expect_ordered_run([] {
    Item item(20, /*chain=*/true);
    for (uint32_t i = 10; i < 20; ++i) item.reads[i].clear();  // the second half independent
    return item;
  }());
}

TEST(KernelLanes, TheLowestFailingKernelsErrorIsRaisedAndLaterKernelsAreSkipped) {
  Item item(24);
  item.free[20] = item.helped[20] = false;  // a barrier after the failures
  auto plan = item.plan();
  ASSERT_NE(plan, nullptr);
  KernelLanes lanes;
  std::vector<int> ran(24);
  try {
    lanes.run(*plan, c10::impl::tls_local_dispatch_key_set(), [&](uint32_t i, bool) {
      ran[i] = 1;
      if (i == 7) throw std::runtime_error("kernel 7");
      if (i == 3) throw std::runtime_error("kernel 3");
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ("kernel 3", e.what());
  }
  EXPECT_EQ(0, ran[20]);  // the barrier waits for everything before it, then is skipped
  EXPECT_EQ(0, ran[23]);
}

// A helping thread runs kernels in the owner's thread-local state, not its own: a program thread
// that waits inside `torch.inference_mode()` made inference tensors of the outputs it computed,
// which the GraphRunner's next in-place kernel on them refused.
TEST(KernelLanes, AHelperRunsKernelsInTheOwnersThreadLocalState) {
  Item item(40);
  auto plan = item.plan();
  ASSERT_NE(plan, nullptr);
  KernelLanes lanes;
  std::atomic<bool> stop{false};
  std::atomic<int> helper_runs{0}, inference{0}, no_grad{0};
  std::thread helper([&] {
    c10::InferenceMode guard;  // as the waiting program thread may be
    uint64_t seen = 0;
    const std::function<bool()> waiting = [&] { return !stop.load(); };
    while (!stop.load()) lanes.help(waiting, seen);
  });
  lanes.run(*plan, c10::impl::tls_local_dispatch_key_set(), [&](uint32_t, bool on_helper) {
    const at::Tensor made = at::empty({2});
    if (on_helper) ++helper_runs;
    if (made.is_inference() || c10::InferenceMode::is_enabled()) ++inference;
    if (!at::GradMode::is_enabled()) ++no_grad;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  stop = true;
  helper.join();
  EXPECT_GT(helper_runs.load(), 0);
  EXPECT_EQ(0, inference.load());
  EXPECT_EQ(0, no_grad.load());
}

TEST(KernelLanes, NoHelpOutsideAJobOrAfterTheWaitEnds) {
  KernelLanes lanes;
  uint64_t seen = 0;
  int calls = 0;
  lanes.help([&] { ++calls; return true; }, seen);  // no job open: returns at once
  EXPECT_EQ(0, calls);
  EXPECT_FALSE(lanes.has_job(seen));
}

}  // namespace
}  // namespace terra::runtime
