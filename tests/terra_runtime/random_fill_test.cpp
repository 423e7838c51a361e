// Bernoulli masks with inlined draws (random_fill.h): every fill is compared bitwise with the operator
// called through the dispatcher from the same generator state, and the generator's state after
// both must be the same.
#include "random_fill.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <cstring>

namespace terra::runtime {
namespace {

c10::OperatorHandle handle(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Fills `shape` of `dtype` through the dispatcher and through RandomFill from one state of the
// default generator, and expects the same bits and the same state after.
void expect_as_dispatched(at::IntArrayRef shape, at::ScalarType dtype, double p) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_current_seed(1234);
  const at::Tensor theirs = at::empty(shape, dtype);
  torch::jit::Stack s{theirs, p, c10::IValue()};
  handle("aten::bernoulli_", "float").callBoxed(&s);
  const at::Tensor after_theirs = gen.get_state();

  gen.set_current_seed(1234);
  const at::Tensor mine = at::empty(shape, dtype);
  torch::jit::Stack m{mine, p, c10::IValue()};
  ASSERT_TRUE(RandomFill::run(RandomFill::Op::Bernoulli, m));
  ASSERT_EQ(1u, m.size());
  EXPECT_TRUE(m[0].toTensor().is_same(mine));  // returns self, as the in-place operator does
  EXPECT_EQ(0, std::memcmp(mine.data_ptr(), theirs.data_ptr(), mine.nbytes()));
  EXPECT_TRUE(at::equal(after_theirs, gen.get_state()));
}

TEST(RandomFill, CoversBernoulliWithAScalarPUniformAndRand) {
  EXPECT_EQ(RandomFill::Op::Bernoulli, RandomFill::covered(handle("aten::bernoulli_", "float")));
  EXPECT_EQ(RandomFill::Op::Uniform, RandomFill::covered(handle("aten::uniform_", "")));
  EXPECT_EQ(RandomFill::Op::Rand, RandomFill::covered(handle("aten::rand", "")));
  EXPECT_EQ(RandomFill::Op::None, RandomFill::covered(handle("aten::rand", "generator")));
  EXPECT_EQ(RandomFill::Op::None, RandomFill::covered(handle("aten::bernoulli_", "Tensor")));
  EXPECT_EQ(RandomFill::Op::None, RandomFill::covered(handle("aten::normal_", "")));
}

TEST(RandomFill, MatchesATenInThisProcess) { EXPECT_TRUE(RandomFill::matches_aten()); }

TEST(RandomFill, GivesTheDispatchersBitsAndLeavesItsGeneratorState) {
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1}, {5, 7}, {8, 4, 32, 32}, {100003}}) {
      for (const double p : {0.0, 0.1, 0.5, 0.9, 1.0}) expect_as_dispatched(shape, dtype, p);
    }
  }
}

// uniform_(0, 1) and rand (torch.rand: a fresh tensor filled so), through the dispatcher and
// through RandomFill from one generator state: the same bits and the same state after.
TEST(RandomFill, UniformFromZeroToOneAndRandGiveTheDispatchersBits) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const auto uniform = handle("aten::uniform_", ""), rand = handle("aten::rand", "");
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1}, {5, 7}, {8, 4, 32, 32}, {100003}}) {
      gen.set_current_seed(99);
      const at::Tensor theirs = at::empty(shape, dtype);
      torch::jit::Stack s{theirs, 0.0, 1.0, c10::IValue()};
      uniform.callBoxed(&s);
      torch::jit::Stack r{c10::IValue(shape), c10::IValue(dtype), c10::IValue(), c10::IValue(), c10::IValue()};
      rand.callBoxed(&r);
      const at::Tensor theirs_rand = r[0].toTensor();
      const at::Tensor after_theirs = gen.get_state();

      gen.set_current_seed(99);
      const at::Tensor mine = at::empty(shape, dtype);
      torch::jit::Stack m{mine, 0.0, 1.0, c10::IValue()};
      ASSERT_TRUE(RandomFill::run(RandomFill::Op::Uniform, m));
      torch::jit::Stack q{c10::IValue(shape), c10::IValue(dtype), c10::IValue(), c10::IValue(), c10::IValue()};
      ASSERT_TRUE(RandomFill::run(RandomFill::Op::Rand, q));
      const at::Tensor mine_rand = q.at(0).toTensor();
      EXPECT_EQ(0, std::memcmp(mine.data_ptr(), theirs.data_ptr(), mine.nbytes()));
      ASSERT_EQ(theirs_rand.sizes(), mine_rand.sizes());
      ASSERT_EQ(theirs_rand.strides(), mine_rand.strides());
      ASSERT_EQ(theirs_rand.scalar_type(), mine_rand.scalar_type());
      EXPECT_EQ(0, std::memcmp(mine_rand.data_ptr(), theirs_rand.data_ptr(), mine_rand.nbytes()));
      EXPECT_TRUE(at::equal(after_theirs, gen.get_state()));
    }
  }
}

// What it does not cover is left to the dispatcher, the stack untouched: ATen then raises where
// it raises (a p outside [0, 1]) or draws in its own order (strided memory, another generator).
TEST(RandomFill, LeavesOtherCallsToTheDispatcher) {
  const at::Tensor x = at::empty({6, 4});
  const auto untouched = [](RandomFill::Op op, torch::jit::Stack s) {
    const size_t n = s.size();
    const bool ran = RandomFill::run(op, s);
    return !ran && s.size() == n;
  };
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x, 1.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x, -0.1, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x.t(), 0.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x.slice(1, 0, 4, 2), 0.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {at::empty({0}), 0.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {at::empty({3}, at::kHalf), 0.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {at::empty({3}, at::kLong), 0.5, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x, 0.5, at::detail::createCPUGenerator(7)}));
  EXPECT_TRUE(untouched(RandomFill::Op::Bernoulli, {x, 0.5}));
  // Another range: x * (to - from) + from rounds as the build's kernel does (fused or not).
  EXPECT_TRUE(untouched(RandomFill::Op::Uniform, {x, -1.0, 1.0, c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Uniform, {x.t(), 0.0, 1.0, c10::IValue()}));
  const c10::IValue size(std::vector<int64_t>{3, 4});
  EXPECT_TRUE(untouched(RandomFill::Op::Rand, {size, c10::IValue(at::kHalf), c10::IValue(), c10::IValue(), c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::Rand, {size, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue(true)}));
  const c10::IValue empty(std::vector<int64_t>{0, 3});  // no draws: ATen's own empty tensor
  EXPECT_TRUE(untouched(RandomFill::Op::Rand, {empty, c10::IValue(), c10::IValue(), c10::IValue(), c10::IValue()}));
  EXPECT_TRUE(untouched(RandomFill::Op::None, {x, 0.5, c10::IValue()}));
}

}  // namespace
}  // namespace terra::runtime
