// RunnerAllocator: the GraphRunner's CPU memory, reused from one iteration to the next.
//
// A co-executed iteration allocates the same buffers as the one before it (same ops, same
// shapes), but the GraphRunner runs ahead of the frees: a value dies when the program drops its
// placeholder, after the GraphRunner has already allocated the next iteration's. With glibc's
// malloc that meant a fresh, cold buffer for every op above the mmap threshold: a chain of
// 256x256 adds took 5-8 minor page faults and 28 us of GraphRunner CPU per op against eager's 6 us.
//
// So the process's CPU allocator is wrapped once: allocations of the GraphRunner thread come from
// per-size free lists of blocks that GraphRunner allocations left (whichever thread frees them),
// and everything else goes to the allocator it wraps, unchanged (eager ops and the program
// thread pay one thread-local check). Blocks are freed for real when the cache would exceed
// kMaxCachedBytes. Values are unaffected: ops never read memory they have not written.
//
// After a session, the program thread's large blocks still come from the cache (`idle`: only the
// sizes it takes are kept, at most kIdleCachedBytes). Freeing the whole cache at the session's end
// (what `release` does, and did there until session 51) left glibc's heap so that eager steps
// after it grew and trimmed the heap's top by more each step: 2-3x the page faults of the same
// steps before the session (resnet 400-600 -> 1,000-1,800 per step) and 10-25% more time, in
// every eager cell that followed a co-executed one (bench/results/s51_eager_after.md).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "block_pool.h"

namespace terra::runtime {

class RunnerAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  // Installs the wrapper as the CPU allocator (once) and returns it.
  static RunnerAllocator& install();
  static bool installed();
  // Whether the calling thread's CPU allocations come from the cache (the GraphRunner thread).
  static void set_cached_thread(bool cached);
  // Whether the calling thread's allocations from kProgramMinBytes to kProgramMaxBytes come from
  // the cache (the program thread while a session is open; see PythonRunner::enter). Smaller ones
  // are served by glibc's own free lists without the cache's lock; larger ones are left to it so
  // that a cached block of one huge size never sits beside a fresh one of another.
  static void set_program_thread(bool cached);
  static constexpr size_t kProgramMinBytes = size_t{64} << 10;
  static constexpr size_t kProgramMaxBytes = size_t{32} << 20;

  c10::DataPtr allocate(size_t n) override;
  // Frees GraphRunner blocks and, for raw_deallocate, the wrapped allocator's own.
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // Frees every cached block; blocks in use are freed for real when they die, until the next
  // `activate` (a session starts).
  void release();
  // A session ended: keeps only blocks of the sizes the program thread takes
  // (kProgramMinBytes..kProgramMaxBytes), at most kIdleCachedBytes of them (the largest freed
  // first), until the next `activate`; other blocks are freed for real when they die.
  void idle();
  static constexpr size_t kIdleCachedBytes = size_t{256} << 20;
  void activate();
  // In a child made by fork(): the mutex may have been held by a thread that did not come
  // along; the child caches nothing.
  static void after_fork_in_child();

  struct Stats {
    uint64_t hits = 0, misses = 0;
    size_t cached_bytes = 0;
    std::vector<size_t> cached_sizes;  // the size classes holding cached blocks
  };
  Stats stats();

 private:
  explicit RunnerAllocator(c10::Allocator* next) : next_(next) {}
  static void deallocate(void* data);

  c10::Allocator* next_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by rounded size
  // Blocks handed out, with their rounded sizes. Data and context are the same pointer (oneDNN
  // allocates through raw_allocate, which requires it), so the size is kept here.
  // The map's nodes come from a block pool: recording a block costs no malloc in steady state.
  std::unordered_map<void*, size_t, std::hash<void*>, std::equal_to<void*>,
                     PoolAllocator<std::pair<void* const, size_t>>>
      live_;
  size_t cached_bytes_ = 0;
  bool active_ = true;
  bool idle_ = false;  // between sessions (idle)
  // Whether a freed block of `size` goes back to the cache (mutex_ held).
  bool keeps(size_t size) const;
  Stats stats_;
};

}  // namespace terra::runtime
