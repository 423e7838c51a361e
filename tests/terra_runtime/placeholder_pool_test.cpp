// PlaceholderPool: dropped output placeholders kept by metadata class and handed out again.
#include "placeholder.h"

#include <gtest/gtest.h>

namespace terra::runtime {
namespace {

TensorMeta meta_2x3() {
  TensorMeta meta;
  meta.sizes = {2, 3};
  meta.strides = {3, 1};
  return meta;
}

// A placeholder as an executed item holds it once the program dropped it: the item's reference
// and the PythonRunner's weak one (no Python object: these tests run without the interpreter).
struct Dropped {
  c10::IValue arg;
  c10::weak_intrusive_ptr<c10::TensorImpl> live;
  c10::TensorImpl* impl;
};

Dropped dropped_output(const TensorMeta& meta, uint32_t cls) {
  auto slot = std::allocate_shared<Slot>(PoolAllocator<Slot>());
  at::Tensor p = make_placeholder(meta, slot, own_group(slot));
  static_cast<PlaceholderImpl*>(p.unsafeGetTensorImpl())->set_reuse_class(cls);
  Dropped d{c10::IValue(), c10::weak_intrusive_ptr<c10::TensorImpl>(p.getIntrusivePtr()), p.unsafeGetTensorImpl()};
  d.arg = c10::IValue(std::move(p));
  return d;
}

TEST(PlaceholderPool, EqualMetadataIsOneClassAndOtherMetadataAnother) {
  PlaceholderPool pool;
  const uint32_t a = pool.class_of(meta_2x3());
  EXPECT_EQ(pool.class_of(meta_2x3()), a);
  TensorMeta transposed = meta_2x3();
  transposed.strides = {1, 2};
  TensorMeta grad = meta_2x3();
  grad.requires_grad = true;
  const uint32_t b = pool.class_of(transposed), c = pool.class_of(grad);
  EXPECT_NE(b, a);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(pool.class_of(transposed), b);
}

TEST(PlaceholderPool, ADroppedOutputIsHandedOutAsAnyOutputOfItsClassWithANewSlot) {
  PlaceholderPool pool;
  const uint32_t cls = pool.class_of(meta_2x3());
  Dropped d = dropped_output(meta_2x3(), cls);
  pool.offer(d.arg);
  EXPECT_TRUE(d.arg.isNone());  // the item's reference went into the pool
  std::shared_ptr<Slot> slot;
  TensorMeta other = meta_2x3();
  other.strides = {1, 2};
  EXPECT_FALSE(pool.take(pool.class_of(other), other, false, 7, &slot).defined());
  at::Tensor again = pool.take(cls, meta_2x3(), false, 7, &slot);  // whichever node asks
  ASSERT_TRUE(again.defined());
  EXPECT_EQ(again.unsafeGetTensorImpl(), d.impl);
  ASSERT_TRUE(slot);
  EXPECT_EQ(slot->seq, 7u);
  EXPECT_FALSE(pool.take(cls, meta_2x3(), false, 8, &slot).defined());  // it had one
}

TEST(PlaceholderPool, APlaceholderSomethingElseHoldsIsNotKept) {
  PlaceholderPool pool;
  const uint32_t cls = pool.class_of(meta_2x3());
  Dropped d = dropped_output(meta_2x3(), cls);
  at::Tensor held = d.arg.toTensor();  // the program still has it
  pool.offer(d.arg);
  std::shared_ptr<Slot> slot;
  EXPECT_FALSE(pool.take(cls, meta_2x3(), false, 7, &slot).defined());
}

}  // namespace
}  // namespace terra::runtime
