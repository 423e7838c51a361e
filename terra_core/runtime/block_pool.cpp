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

// Blocks start on a cache line and fill whole lines: the GraphRunner writes what it fills in a
// block (a slot's value) while the program thread writes a neighbouring block's reference counts,
// and on a shared line each write fetched the line from the other core.
size_t whole_lines(size_t size) { return (size + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

}  // namespace

void* pool_allocate(size_t size) {
  FreeList& l = free_list(size);
  if (l.blocks.empty()) return ::operator new(whole_lines(size), std::align_val_t{kBlockAlign});
  void* block = l.blocks.back();
  l.blocks.pop_back();
  return block;
}

void pool_free(void* block, size_t size) {
  FreeList& l = free_list(size);
  if (l.blocks.size() < kPoolBlocks) {
    l.blocks.push_back(block);
  } else {
    ::operator delete(block, whole_lines(size), std::align_val_t{kBlockAlign});
  }
}

}  // namespace terra::runtime
