#include "terra/location_key.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace terra {
namespace {

TEST(LocationKey, OpIdentityDependsOnNameOverloadAndAttributes) {
  EXPECT_EQ(op_identity("aten::add", "Tensor"), op_identity("aten::add", "Tensor"));
  EXPECT_NE(op_identity("aten::add", "Tensor"), op_identity("aten::add", "Scalar"));
  EXPECT_NE(op_identity("aten::sum", "", {1}), op_identity("aten::sum", "", {0}));
  EXPECT_NE(op_identity("aten::sum", "", {0, 1}), op_identity("aten::sum", "", {1, 0}));
  EXPECT_NE(op_identity("ab", "c"), op_identity("a", "bc"));
}

TEST(LocationKey, StackHashIsOrderSensitive) {
  EXPECT_EQ(stack_hash({{1, 10}, {2, 20}}), stack_hash({{1, 10}, {2, 20}}));
  EXPECT_NE(stack_hash({{1, 10}, {2, 20}}), stack_hash({{2, 20}, {1, 10}}));
  EXPECT_NE(stack_hash({{1, 10}}), stack_hash({{1, 12}}));
  EXPECT_NE(stack_hash({}), stack_hash({{0, 0}}));
}

TEST(LocationKey, EqualityHashAndOrder) {
  LocationKey a{1, 2, 0}, b{1, 2, 1}, c{1, 2, 0};
  EXPECT_EQ(a, c);
  EXPECT_NE(a, b);
  EXPECT_TRUE(a < b);
  EXPECT_EQ(LocationKeyHash{}(a), LocationKeyHash{}(c));
  std::unordered_set<LocationKey, LocationKeyHash> set{a, b, c};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_NE(LocationKey::entry(), LocationKey::exit());
  EXPECT_EQ(sizeof(LocationKey), 24u);
  EXPECT_EQ(to_string(LocationKey{0xab, 0xcd, 3}), "00000000000000ab:00000000000000cd#3");
}

TEST(LocationKey, OccurrenceCounterCountsPerOpAndStackAndResets) {
  OccurrenceCounter c;
  EXPECT_EQ(c.key(7, 1).occurrence, 0u);
  EXPECT_EQ(c.key(7, 1).occurrence, 1u);
  EXPECT_EQ(c.key(7, 2).occurrence, 0u);  // another call site
  EXPECT_EQ(c.key(8, 1).occurrence, 0u);  // another op at the same site
  EXPECT_EQ(c.key(7, 1), (LocationKey{7, 1, 2}));
  c.reset();
  EXPECT_EQ(c.key(7, 1).occurrence, 0u);
}

TEST(LocationKey, SourceDescribeNamesTheInnermostFrame) {
  SourceInfo s{"aten::addmm", {{"train.py", 3, "<module>"}, {"model.py", 12, "forward"}}};
  EXPECT_EQ(describe(s), "aten::addmm at model.py:12 in forward");
  EXPECT_EQ(describe(SourceInfo{"aten::relu", {}}), "aten::relu");
}

}  // namespace
}  // namespace terra
