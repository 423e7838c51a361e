// The idle OpenMP pool that limits how long the GraphRunner's workers spin (openmp_team.h).
#include "openmp_team.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>

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

int own_nice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

// The nice value of each thread of a parallel region of the calling thread's pool, at its
// intra-op count (two here): [0] the calling thread, [1] its worker. libgomp's entry points, found
// as Terra finds them: this binary is built without OpenMP (at::parallel_for would run serially).
std::array<int, 2> region_nices() {
  using Parallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const auto parallel = reinterpret_cast<Parallel>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
  static const auto thread_num = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_thread_num"));
  std::array<int, 2> nice{-100, -100};
  if (!parallel || !thread_num) return nice;
  parallel(
      [](void* p) {
        const int i = thread_num();
        if (i < 2) (*static_cast<std::array<int, 2>*>(p))[static_cast<size_t>(i)] = own_nice();
      },
      &nice, 0, 0);  // 0: the thread's nthreads ICV
  return nice;
}

TEST(OpenMPTeam, LoweredWorkersRunBelowTheirThreadAndNoOtherThreadsDo) {
  const int base = own_nice();
  std::array<int, 2> lowered{}, released{}, less{}, off{}, other{};
  std::thread graph_runner([&] {
    lower_openmp_workers(6);
    set_intraop_threads(2);
    lowered = region_nices();
    release_openmp_team();       // its worker exits; the same count's next region makes a new one
    ready_openmp_workers(2);
    released = region_nices();
    lower_openmp_workers(2);     // less: a worker's priority cannot be raised back, so a new pool
    set_intraop_threads(2);
    less = region_nices();
    lower_openmp_workers(0);
    set_intraop_threads(2);
    off = region_nices();
  });
  graph_runner.join();
  std::thread program([&] {     // a thread that never lowered its workers
    set_intraop_threads(2);
    other = region_nices();
  });
  program.join();
  EXPECT_EQ(lowered, (std::array<int, 2>{base, std::min(19, base + 6)}));
  EXPECT_EQ(released, (std::array<int, 2>{base, std::min(19, base + 6)}));
  EXPECT_EQ(less, (std::array<int, 2>{base, std::min(19, base + 2)}));
  EXPECT_EQ(off, (std::array<int, 2>{base, base}));
  EXPECT_EQ(other, (std::array<int, 2>{base, base}));
}

}  // namespace
}  // namespace terra::runtime
