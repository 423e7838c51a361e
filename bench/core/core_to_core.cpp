// Core-to-core latency probe: two threads, each pinned to its own CPU, hand one cache line back
// and forth; prints the median round trip in nanoseconds over a few runs.
//
// Terra's two threads share lines per op (work items, slots, placeholders), so how long a line
// takes to move between the cores bounds its per-op cost. On the 2-core cloud host of sessions
// 31-34 that time changed between minutes of one hour (64-470 ns a round trip), and per-op
// timings with it: bench/per_op.py runs this before each round and reports it beside the round.
//
//     build/bench/core_to_core [round_trips]
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<int> turn{0};
};

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Nanoseconds per round trip of `n` hand-offs between CPU 0 (this thread) and CPU 1.
double round_trip_ns(long n) {
  Line line;
  std::thread other([&] {
    pin(1);
    for (long i = 0; i < n; ++i) {
      while (line.turn.load(std::memory_order_acquire) != 1) {
      }
      line.turn.store(0, std::memory_order_release);
    }
  });
  pin(0);
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    line.turn.store(1, std::memory_order_release);
    while (line.turn.load(std::memory_order_acquire) != 0) {
    }
  }
  const auto end = std::chrono::steady_clock::now();
  other.join();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  if (std::thread::hardware_concurrency() < 2) {
    std::printf("nan\n");  // one CPU: nothing to measure
    return 0;
  }
  const long n = argc > 1 ? std::max(1000L, std::atol(argv[1])) : 100000;
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) runs.push_back(round_trip_ns(n));
  std::sort(runs.begin(), runs.end());
  std::printf("%.0f\n", runs[runs.size() / 2]);
  return 0;
}
