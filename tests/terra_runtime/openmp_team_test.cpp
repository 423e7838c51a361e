// The idle OpenMP pool that limits how long the GraphRunner's workers spin (openmp_team.h).
#include "openmp_team.h"

#include <dlfcn.h>
#include <pthread.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>

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
  std::array<int, 2> made{}, lowered{}, released{}, less{}, off{}, other{};
  size_t before = 0, unmade = 0;
  std::thread graph_runner([&] {
    pthread_setname_np(pthread_self(), "lowering-test");
    before = threads();
    lower_openmp_workers(6);
    set_intraop_threads(2);
    lower_openmp_workers(6);  // an iteration's start with no parallel region run yet
    unmade = threads();       // lowering made no pool
    made = region_nices();    // the region makes the worker, at the thread's priority
    lower_openmp_workers(6);  // the next iteration's start lowers it
    lowered = region_nices();
    release_openmp_team();    // its worker exits; the same count's next region makes a new one
    released = region_nices();
    lower_openmp_workers(6);
    released = region_nices();
    lower_openmp_workers(2);  // less: a worker's priority cannot be raised back, so a new pool
    less = region_nices();
    lower_openmp_workers(2);
    less = region_nices();
    lower_openmp_workers(0);
    off = region_nices();
  });
  graph_runner.join();
  std::thread program([&] {     // a thread that never lowered its workers
    set_intraop_threads(2);
    other = region_nices();
  });
  program.join();
  EXPECT_EQ(unmade, before);
  EXPECT_EQ(made, (std::array<int, 2>{base, base}));
  EXPECT_EQ(lowered, (std::array<int, 2>{base, std::min(19, base + 6)}));
  EXPECT_EQ(released, (std::array<int, 2>{base, std::min(19, base + 6)}));
  EXPECT_EQ(less, (std::array<int, 2>{base, std::min(19, base + 2)}));
  EXPECT_EQ(off, (std::array<int, 2>{base, base}));
  EXPECT_EQ(other, (std::array<int, 2>{base, base}));
}

// Burns the calling thread's CPU for `seconds` of its own CPU time.
double burn(double seconds) {
  timespec t{};
  volatile double x = 0;
  for (;;) {
    for (int i = 0; i < 100000; ++i) x = x + 1.0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    const double used = static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    if (used >= seconds) return used;
  }
}

// Waits asleep (a waiting thread's CPU would count where it is a worker).
void wait_until(const std::atomic<int>& stage, int at_least) {
  while (stage.load() < at_least) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

TEST(OpenMPTeam, WorkerCpuCountsTheThreadsItsOwnerMadeAndNoOthers) {
  // The owner stands for the GraphRunner, its worker for an OpenMP worker it made (a thread
  // made by it carries its name), and `other` for any other thread of the process. Each burns
  // 50 ms of CPU; all live until read.
  std::atomic<int> stage{0}, burnt{0};
  std::atomic<pid_t> owner_tid{0};
  double worker_cpu = 0;
  std::thread worker;
  std::thread owner([&] {
    pthread_setname_np(pthread_self(), "wcc-owner");
    owner_tid = static_cast<pid_t>(syscall(SYS_gettid));
    wait_until(stage, 1);
    worker = std::thread([&] {
      stage = 2;
      wait_until(stage, 3);
      worker_cpu = burn(0.05);
      ++burnt;
      wait_until(stage, 4);
    });
    wait_until(stage, 3);
    burn(0.05);
    ++burnt;
    wait_until(stage, 4);
  });
  std::thread other([&] {
    wait_until(stage, 3);
    burn(0.05);
    ++burnt;
    wait_until(stage, 4);
  });
  while (owner_tid.load() == 0) std::this_thread::yield();
  WorkerCpuClock clock;
  bool changed = false;
  EXPECT_EQ(clock.seconds(owner_tid, changed), 0.0);  // no worker yet
  EXPECT_TRUE(changed);                               // listed the first time
  stage = 1;
  wait_until(stage, 2);
  const double before = clock.seconds(owner_tid, changed);
  EXPECT_TRUE(changed);  // the worker appeared
  EXPECT_FALSE((clock.seconds(owner_tid, changed), changed));  // the same threads
  stage = 3;
  wait_until(burnt, 3);
  const double after = clock.seconds(owner_tid, changed);
  EXPECT_FALSE(changed);
  stage = 4;
  owner.join();
  other.join();
  worker.join();
  // The worker's CPU and no more: not the owner's own, not the other thread's.
  EXPECT_NEAR(after, worker_cpu, 0.003);
  EXPECT_GE(after - before, 0.045);
  EXPECT_LT(after - before, 0.06);
}

TEST(OpenMPTeam, AProgramThreadSleepsThroughAnOpenRegionAndNoLonger) {
  TeamRegion::wait_out();  // none open: returns at once
  EXPECT_FALSE(TeamRegion::is_open());
  const uint64_t waits = TeamRegion::waits();
  std::atomic<int> stage{0};
  std::atomic<bool> closed{false}, returned{false};
  bool closed_when_returned = false;
  std::thread runner([&] {
    {
      TeamRegion region(true);
      stage = 1;
      wait_until(stage, 2);  // the program thread is on its way into wait_out
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      EXPECT_FALSE(returned.load());  // still asleep while the region is open
      closed = true;
    }
    EXPECT_FALSE(TeamRegion::is_open());
  });
  std::thread program([&] {
    wait_until(stage, 1);
    EXPECT_TRUE(TeamRegion::is_open());
    stage = 2;
    TeamRegion::wait_out();
    closed_when_returned = closed.load();
    returned = true;
  });
  runner.join();
  program.join();
  EXPECT_TRUE(closed_when_returned);
  EXPECT_EQ(TeamRegion::waits(), waits + 1);
  {
    TeamRegion none(false);  // a kernel on one thread opens nothing
    EXPECT_FALSE(TeamRegion::is_open());
  }
}

}  // namespace
}  // namespace terra::runtime
