// Block pools: blocks of one size kept for reuse on the thread that freed them.
//
// The runtime makes a few small objects per co-executed op (a placeholder, its slot, the
// GraphRunner allocator's record of a block) and the previous iteration's died: with a pool they
// cost no malloc in steady state. A block freed on another thread joins that thread's list; each
// list keeps at most kPoolBlocks blocks and frees the rest.
#pragma once

#include <cstddef>
#include <memory>

namespace terra::runtime {

void* pool_allocate(size_t size);
void pool_free(void* block, size_t size);
constexpr size_t kPoolBlocks = 4096;
// Every pooled block starts on a cache line and fills whole lines (block_pool.cpp): layouts that
// keep what the two threads write on lines apart (Slot) count on it.
constexpr size_t kBlockAlign = 64;

// std::allocator-like: single objects from the pool (allocate_shared<Slot>(PoolAllocator<Slot>())
// puts a slot and its control block in one pooled block; a node-based container's nodes), arrays
// from std::allocator.
template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    return n == 1 ? static_cast<T*>(pool_allocate(sizeof(T))) : std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) {
    if (n == 1) {
      pool_free(p, sizeof(T));
    } else {
      std::allocator<T>().deallocate(p, n);
    }
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const PoolAllocator<U>&) const { return false; }
};

}  // namespace terra::runtime
