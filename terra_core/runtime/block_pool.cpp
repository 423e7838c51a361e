#include "block_pool.h"

#include <new>
#include <vector>

namespace terra::runtime {

namespace {

// Per thread and size: a free list that is never destroyed (a block freed while a thread exits
// must still find it).
struct FreeList {
  size_t size = 0;
  std::vector<void*> blocks;
};
thread_local std::vector<FreeList>* t_free_lists = nullptr;

FreeList& free_list(size_t size) {
  if (!t_free_lists) t_free_lists = new std::vector<FreeList>();
  for (FreeList& l : *t_free_lists)
    if (l.size == size) return l;
  t_free_lists->push_back(FreeList{size, {}});
  return t_free_lists->back();
}

}  // namespace

void* pool_allocate(size_t size) {
  FreeList& l = free_list(size);
  if (l.blocks.empty()) return ::operator new(size);
  void* block = l.blocks.back();
  l.blocks.pop_back();
  return block;
}

void pool_free(void* block, size_t size) {
  FreeList& l = free_list(size);
  if (l.blocks.size() < kPoolBlocks) {
    l.blocks.push_back(block);
  } else {
    ::operator delete(block);
  }
}

}  // namespace terra::runtime
