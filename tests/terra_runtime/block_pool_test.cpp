#include "block_pool.h"
#include "placeholder.h"

#include <gtest/gtest.h>

#include <thread>

namespace terra::runtime {
namespace {

TEST(BlockPool, AFreedBlockIsReusedOnTheSameThread) {
  void* a = pool_allocate(96);
  pool_free(a, 96);
  EXPECT_EQ(pool_allocate(96), a);
  void* other = pool_allocate(200);  // another size: another list
  EXPECT_NE(other, a);
  pool_free(other, 200);
  pool_free(a, 96);
}

TEST(BlockPool, BlocksFreedOnAnotherThreadServeThatThread) {
  void* a = pool_allocate(112);
  void* reused = nullptr;
  std::thread t([&] {
    pool_free(a, 112);
    reused = pool_allocate(112);
  });
  t.join();
  EXPECT_EQ(reused, a);
  pool_free(reused, 112);
}

TEST(BlockPool, SlotsAndPlaceholdersComeFromThePool) {
  auto make = [] {
    auto slot = std::allocate_shared<Slot>(PoolAllocator<Slot>());
    TensorMeta meta;
    meta.sizes = {2, 3};
    meta.strides = {3, 1};
    at::Tensor p = make_placeholder(meta, slot, own_group(slot));
    return std::make_pair(static_cast<void*>(slot.get()), static_cast<void*>(p.unsafeGetTensorImpl()));
  };
  const auto first = make();   // both die here
  const auto second = make();  // and their blocks come back
  EXPECT_EQ(first.first, second.first);
  EXPECT_EQ(first.second, second.second);
}

TEST(BlockPool, BlocksStartOnACacheLine) {
  for (size_t size : {24, 80, 200, 264}) {
    void* a = pool_allocate(size);
    void* b = pool_allocate(size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u) << size;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u) << size;
    pool_free(b, size);
    pool_free(a, size);
  }
}

// The GraphRunner writes a slot's value; the program thread writes its reference counts (which
// std::allocate_shared puts just before the slot) and its first fields.
TEST(BlockPool, ASlotsValueIsOnTheLineAfterItsFirstFields) {
  auto slot = std::allocate_shared<Slot>(PoolAllocator<Slot>());
  const auto first = reinterpret_cast<uintptr_t>(slot.get());
  const auto value = reinterpret_cast<uintptr_t>(&slot->value);
  EXPECT_EQ(value % 64, 0u);
  EXPECT_EQ(value / 64, first / 64 + 1);
}

}  // namespace
}  // namespace terra::runtime
