// The idle OpenMP pool that limits how long the GraphRunner's workers spin (openmp_team.h).
#include "openmp_team.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iterator>
#include <thread>

namespace terra::runtime {
namespace {

size_t threads() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return static_cast<size_t>(std::distance(begin(tasks), end(tasks)));
}

// The limiter's thread does its work asynchronously: wait up to 10 s for it.
bool eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

TEST(OpenMPTeam, LimitingSpinningHoldsAnIdlePoolUntilLifted) {
  const size_t before = threads();
  limit_openmp_spinning(true);
  EXPECT_TRUE(openmp_spinning_limited());
  // The limiter's thread and the worker of its two-thread pool: the process now holds more
  // OpenMP threads than this 2-core machine has CPUs, which shortens every worker's spin.
  EXPECT_TRUE(eventually([&] { return threads() == before + 2; })) << threads() << " vs " << before;
  limit_openmp_spinning(false);
  EXPECT_FALSE(openmp_spinning_limited());
  // The pool is released (its worker exits); the limiter's thread sleeps until needed again.
  EXPECT_TRUE(eventually([&] { return threads() == before + 1; })) << threads() << " vs " << before;
  limit_openmp_spinning(true);
  EXPECT_TRUE(eventually([&] { return threads() == before + 2; })) << threads() << " vs " << before;
  limit_openmp_spinning(true);  // already on: nothing more
  EXPECT_TRUE(eventually([&] { return threads() == before + 2; })) << threads() << " vs " << before;
  limit_openmp_spinning(false);
  EXPECT_TRUE(eventually([&] { return threads() == before + 1; })) << threads() << " vs " << before;
}

}  // namespace
}  // namespace terra::runtime
