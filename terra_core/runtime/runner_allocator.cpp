#include "runner_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace terra::runtime {

namespace {

constexpr size_t kAlign = 64;  // as c10's own CPU allocations

// What the calling thread takes from the cache: read by every CPU allocation in the process, so
// one thread-local byte, not one flag per kind of thread.
enum class Use : uint8_t { None, All, Large };
thread_local Use t_use = Use::None;
RunnerAllocator* g_allocator = nullptr;

// Nearby sizes share a free list: small blocks by 64 bytes, larger ones by 4 KiB, large ones by
// 64 KiB (a little waste, and a batch whose last dimension changes by one still reuses memory).
size_t round_size(size_t n) {
  const size_t step = n <= 4096 ? 64 : n <= (size_t{1} << 20) ? 4096 : size_t{65536};
  return (n + step - 1) / step * step;
}

// A size class the program thread takes from the cache (allocate's Use::Large), rounded.
bool program_sized(size_t size) {
  return size >= RunnerAllocator::kProgramMinBytes && size <= round_size(RunnerAllocator::kProgramMaxBytes);
}

}  // namespace

RunnerAllocator& RunnerAllocator::install() {
  static RunnerAllocator* allocator = [] {
    // Never destroyed: blocks it handed out may be freed at any time up to process exit.
    auto* a = new RunnerAllocator(c10::GetCPUAllocator());
    g_allocator = a;
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

bool RunnerAllocator::installed() { return g_allocator != nullptr; }

void RunnerAllocator::set_cached_thread(bool cached) { t_use = cached ? Use::All : Use::None; }

void RunnerAllocator::set_program_thread(bool cached) {
  if (t_use != Use::All) t_use = cached ? Use::Large : Use::None;
}

c10::DataPtr RunnerAllocator::allocate(size_t n) {
  const Use use = t_use;
  if (use == Use::None || n == 0 || (use == Use::Large && (n < kProgramMinBytes || n > kProgramMaxBytes)))
    return next_->allocate(n);
  const size_t size = round_size(n);
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= size;
      ++stats_.hits;
      live_.emplace(data, size);
    } else {
      ++stats_.misses;
    }
  }
  if (!data) {
    if (posix_memalign(&data, kAlign, size) != 0) data = nullptr;
    TORCH_CHECK(data, "Terra: out of memory allocating ", n, " bytes (its caching CPU allocator)");
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, size);
  }
  // data == context, as raw_allocate (oneDNN's scratch memory) requires.
  return {data, data, &RunnerAllocator::deallocate, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr RunnerAllocator::raw_deleter() const {
  return next_->raw_deleter() ? &RunnerAllocator::deallocate : nullptr;
}

void RunnerAllocator::deallocate(void* data) {
  RunnerAllocator& a = *g_allocator;
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(a.mutex_);
    auto it = a.live_.find(data);
    if (it != a.live_.end()) {
      ours = true;
      const size_t size = it->second;
      a.live_.erase(it);
      if (a.keeps(size)) {
        a.free_[size].push_back(data);
        a.cached_bytes_ += size;
        return;
      }
    }
  }
  if (ours) {
    std::free(data);
  } else {
    a.next_->raw_deleter()(data);  // raw_deallocate of a block the wrapped allocator made
  }
}

void RunnerAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

void RunnerAllocator::release() {
  std::unordered_map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(free_);
    cached_bytes_ = 0;
    active_ = false;
    idle_ = false;
  }
  for (auto& [size, list] : blocks)
    for (void* base : list) std::free(base);
}

bool RunnerAllocator::keeps(size_t size) const {
  if (!active_) return false;
  if (!idle_) return cached_bytes_ + size <= kMaxCachedBytes;
  return program_sized(size) && cached_bytes_ + size <= kIdleCachedBytes;
}

void RunnerAllocator::idle() {
  std::vector<void*> freed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_ = true;
    // Sizes the program thread never takes, then the largest, down to the idle budget.
    std::vector<size_t> sizes;
    for (auto& [size, list] : free_) sizes.push_back(size);
    std::sort(sizes.begin(), sizes.end(), [](size_t a, size_t b) {
      return program_sized(a) != program_sized(b) ? !program_sized(a) : a > b;
    });
    for (size_t size : sizes) {
      std::vector<void*>& list = free_[size];
      while (!list.empty() && (!program_sized(size) || cached_bytes_ > kIdleCachedBytes)) {
        freed.push_back(list.back());
        list.pop_back();
        cached_bytes_ -= size;
      }
      if (list.empty()) free_.erase(size);
    }
  }
  for (void* base : freed) std::free(base);
}

void RunnerAllocator::after_fork_in_child() {
  if (!g_allocator) return;
  new (&g_allocator->mutex_) std::mutex();
  g_allocator->active_ = false;
  t_use = Use::None;
}

void RunnerAllocator::activate() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = true;
  idle_ = false;
}

RunnerAllocator::Stats RunnerAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.cached_bytes = cached_bytes_;
  for (const auto& [size, list] : free_)
    if (!list.empty()) s.cached_sizes.push_back(size);
  return s;
}

}  // namespace terra::runtime
