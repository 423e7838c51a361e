#include "runner_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace terra::runtime {
namespace {

struct CachedThread {
  CachedThread() { RunnerAllocator::set_cached_thread(true); }
  ~CachedThread() { RunnerAllocator::set_cached_thread(false); }
};

class RunnerAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    alloc_ = &RunnerAllocator::install();
    alloc_->release();
    alloc_->activate();
  }
  void TearDown() override { alloc_->release(); }
  RunnerAllocator* alloc_ = nullptr;
};

TEST_F(RunnerAllocatorTest, IsTheProcessCpuAllocator) {
  EXPECT_EQ(c10::GetCPUAllocator(), alloc_);
}

TEST_F(RunnerAllocatorTest, AFreedBlockIsHandedOutAgainOnTheCachedThread) {
  CachedThread cached;
  const auto before = alloc_->stats();
  void* first;
  {
    at::Tensor t = at::empty({256, 256});
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);  // aligned like c10's own blocks
  }
  EXPECT_EQ(alloc_->stats().cached_bytes, 256u * 256u * 4u);
  at::Tensor again = at::empty({256, 256});
  EXPECT_EQ(again.data_ptr(), first);
  // A nearby size shares the size class (rounded to 4 KiB).
  again.reset();
  at::Tensor nearby = at::empty({256 * 256 - 3});
  EXPECT_EQ(nearby.data_ptr(), first);
  const auto after = alloc_->stats();
  EXPECT_EQ(after.hits - before.hits, 2u);
  EXPECT_EQ(after.misses - before.misses, 1u);
}

TEST_F(RunnerAllocatorTest, OtherThreadsUseTheWrappedAllocatorUnchanged) {
  const auto before = alloc_->stats();
  at::Tensor t = at::empty({1000});
  EXPECT_NE(t.storage().data_ptr().get_deleter(), nullptr);
  t.reset();
  const auto after = alloc_->stats();
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);
  EXPECT_EQ(after.cached_bytes, 0u);
}

TEST_F(RunnerAllocatorTest, BlocksFreedOnAnotherThreadComeBackToTheCache) {
  at::Tensor made;
  std::thread runner([&] {
    CachedThread cached;
    made = at::ones({64, 64});
  });
  runner.join();
  void* p = made.data_ptr();
  made.reset();  // freed here, on a thread that does not cache
  EXPECT_EQ(alloc_->stats().cached_bytes, 64u * 64u * 4u);
  CachedThread cached;
  EXPECT_EQ(at::empty({64, 64}).data_ptr(), p);
}

struct ProgramThread {
  ProgramThread() { RunnerAllocator::set_program_thread(true); }
  ~ProgramThread() { RunnerAllocator::set_program_thread(false); }
};

TEST_F(RunnerAllocatorTest, TheProgramThreadCachesOnlyLargeBlocks) {
  ProgramThread program;
  const auto before = alloc_->stats();
  const int64_t large = RunnerAllocator::kProgramMinBytes / 4;  // floats
  void* first;
  {
    at::Tensor t = at::empty({large});
    first = t.data_ptr();
  }
  EXPECT_EQ(alloc_->stats().cached_bytes, static_cast<size_t>(large) * 4u);
  at::Tensor again = at::empty({large});
  EXPECT_EQ(again.data_ptr(), first);
  // Below the threshold or above the largest size: the wrapped allocator, no cache traffic.
  at::empty({large - 1}).reset();
  at::empty({static_cast<int64_t>(RunnerAllocator::kProgramMaxBytes / 4) + 1}).reset();
  const auto after = alloc_->stats();
  EXPECT_EQ(after.hits - before.hits, 1u);
  EXPECT_EQ(after.misses - before.misses, 1u);
  EXPECT_EQ(after.cached_bytes, 0u);
}

TEST_F(RunnerAllocatorTest, AProgramThreadNoLongerCachingFreesItsBlocksIntoTheCacheButTakesNone) {
  at::Tensor kept;
  {
    ProgramThread program;
    kept = at::empty({RunnerAllocator::kProgramMinBytes / 4});
  }
  const auto before = alloc_->stats();
  kept.reset();  // a cached block, wherever it dies
  EXPECT_GT(alloc_->stats().cached_bytes, 0u);
  at::Tensor plain = at::empty({RunnerAllocator::kProgramMinBytes / 4});
  const auto after = alloc_->stats();
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);  // not from the cache
  EXPECT_GT(after.cached_bytes, 0u);
}

TEST_F(RunnerAllocatorTest, ReleaseFreesTheCacheAndStopsCachingUntilActivated) {
  CachedThread cached;
  at::Tensor a = at::empty({4096});
  at::Tensor b = at::empty({4096});
  a.reset();
  EXPECT_GT(alloc_->stats().cached_bytes, 0u);
  alloc_->release();
  EXPECT_EQ(alloc_->stats().cached_bytes, 0u);
  b.reset();  // dies between sessions: freed for real
  EXPECT_EQ(alloc_->stats().cached_bytes, 0u);
  alloc_->activate();
  at::empty({4096}).reset();
  EXPECT_GT(alloc_->stats().cached_bytes, 0u);
}

TEST_F(RunnerAllocatorTest, IdleKeepsOnlyTheProgramThreadsSizesAndTheProgramThreadTakesThem) {
  const int64_t large = RunnerAllocator::kProgramMinBytes / 4;  // floats
  void* large_block;
  {
    CachedThread cached;  // a session's GraphRunner: a small block and a large one
    at::Tensor small = at::empty({1024});
    at::Tensor big = at::empty({large});
    large_block = big.data_ptr();
  }
  EXPECT_EQ(alloc_->stats().cached_bytes, 4096u + static_cast<size_t>(large) * 4u);
  alloc_->idle();  // the session ended
  const auto idle = alloc_->stats();
  EXPECT_EQ(idle.cached_bytes, static_cast<size_t>(large) * 4u);
  ASSERT_EQ(idle.cached_sizes.size(), 1u);
  EXPECT_EQ(idle.cached_sizes[0], static_cast<size_t>(large) * 4u);
  // The program thread's eager work after it takes the large block; a small block dying now is
  // freed for real.
  ProgramThread program;
  at::Tensor again = at::empty({large});
  EXPECT_EQ(again.data_ptr(), large_block);
  {
    CachedThread cached;
    at::empty({1024}).reset();
  }
  EXPECT_EQ(alloc_->stats().cached_bytes, 0u);
  again.reset();
  EXPECT_EQ(alloc_->stats().cached_bytes, static_cast<size_t>(large) * 4u);
}

TEST_F(RunnerAllocatorTest, IdleKeepsAtMostItsBudgetFreeingTheLargestFirst) {
  // Blocks of the program thread's largest and smallest sizes, more of them than the budget
  // holds: idle frees largest ones until the rest fits, and keeps the small ones.
  constexpr size_t kLarge = RunnerAllocator::kProgramMaxBytes, kSmall = RunnerAllocator::kProgramMinBytes;
  std::vector<at::Tensor> blocks;
  {
    CachedThread cached;
    for (size_t bytes : {kLarge, kLarge, kSmall, kSmall}) blocks.push_back(at::empty({static_cast<int64_t>(bytes)}, at::kByte));
  }
  // More than the budget: fill the cache past it with blocks of the largest size.
  const size_t fill = RunnerAllocator::kIdleCachedBytes / kLarge + 1;
  {
    CachedThread cached;
    for (size_t i = 0; i < fill; ++i) blocks.push_back(at::empty({static_cast<int64_t>(kLarge)}, at::kByte));
  }
  blocks.clear();
  ASSERT_GT(alloc_->stats().cached_bytes, RunnerAllocator::kIdleCachedBytes);
  alloc_->idle();
  const auto idle = alloc_->stats();
  EXPECT_LE(idle.cached_bytes, RunnerAllocator::kIdleCachedBytes);
  EXPECT_GT(idle.cached_bytes, RunnerAllocator::kIdleCachedBytes - kLarge - 1);  // only what it had to
  EXPECT_EQ(std::count(idle.cached_sizes.begin(), idle.cached_sizes.end(), kSmall), 1);  // kept
  // Freed past the budget: a block dying now is freed for real.
  at::Tensor more;
  {
    CachedThread cached;
    more = at::empty({static_cast<int64_t>(kLarge)}, at::kByte);
  }
  const size_t before = alloc_->stats().cached_bytes;
  more.reset();
  EXPECT_LE(alloc_->stats().cached_bytes, RunnerAllocator::kIdleCachedBytes);
  EXPECT_LE(alloc_->stats().cached_bytes, before + kLarge);
}

TEST_F(RunnerAllocatorTest, ActivateEndsIdling) {
  alloc_->idle();
  alloc_->activate();
  {
    CachedThread cached;
    at::empty({1024}).reset();  // a small block: cached again in a session
  }
  EXPECT_EQ(alloc_->stats().cached_bytes, 4096u);
}

TEST_F(RunnerAllocatorTest, RawAllocationsWorkOnEveryThread) {
  // oneDNN takes its memory through raw_allocate/raw_deallocate, on whichever thread runs a
  // convolution: both kinds of block must go back through the one raw deleter.
  ASSERT_NE(alloc_->raw_deleter(), nullptr);
  void* plain = alloc_->raw_allocate(10000);
  alloc_->raw_deallocate(plain);
  {
    CachedThread cached;
    void* block = alloc_->raw_allocate(10000);
    alloc_->raw_deallocate(block);
    EXPECT_EQ(alloc_->raw_allocate(10000), block);  // cached
    alloc_->raw_deallocate(block);
  }
  alloc_->raw_deallocate(alloc_->raw_allocate(10000));
}

TEST_F(RunnerAllocatorTest, ConvolutionOnTheCachedThreadMatchesOtherThreads) {
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 3, 16, 16}), w = at::randn({4, 3, 3, 3});
  at::Tensor expected = at::conv2d(x, w);
  CachedThread cached;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(at::conv2d(x, w), expected));
}

TEST_F(RunnerAllocatorTest, ValuesWrittenIntoReusedBlocksAreTheOps) {
  CachedThread cached;
  at::Tensor x = at::arange(1000, at::kFloat);
  at::Tensor expected = x * 3 + 1;
  for (int i = 0; i < 3; ++i) {
    at::Tensor y = x * 3 + 1;  // the intermediate's block is reused every round
    EXPECT_TRUE(at::equal(y, expected));
  }
}

}  // namespace
}  // namespace terra::runtime
