// Elementwise kernels replayed through a kept TensorIterator (elementwise_replay.h): every result
// is compared bitwise with the operator called through the dispatcher, on the same inputs.
#include "elementwise_replay.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

namespace terra::runtime {
namespace {

c10::OperatorHandle handle(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The operator's result through the dispatcher (what replay ran before).
at::Tensor dispatched(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  op.callBoxed(&stack);
  return stack.at(0).toTensor();
}

void expect_same(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.sizes(), b.sizes());
  ASSERT_EQ(a.strides(), b.strides());
  ASSERT_EQ(a.scalar_type(), b.scalar_type());
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()));
}

// `alpha` is passed as an integer to integer tensors (a float one is refused, as the dispatcher does).
torch::jit::Stack args(const char* name, const at::Tensor& a, const at::Tensor& b, double alpha) {
  torch::jit::Stack s{a, b};
  if (std::string(name) == "aten::add" || std::string(name) == "aten::sub")
    s.emplace_back(a.is_floating_point() ? c10::Scalar(alpha) : c10::Scalar(static_cast<int64_t>(alpha)));
  return s;
}

TEST(ElementwiseReplay, CoversTheArithmeticOperatorsAndTheirInPlaceForms) {
  EXPECT_EQ(ElementwiseReplay::Op::Add, ElementwiseReplay::covered(handle("aten::add", "Tensor")));
  EXPECT_EQ(ElementwiseReplay::Op::Div, ElementwiseReplay::covered(handle("aten::div", "Tensor")));
  bool in_place = true;
  EXPECT_EQ(ElementwiseReplay::Op::Add, ElementwiseReplay::covered(handle("aten::add", "Tensor"), &in_place));
  EXPECT_FALSE(in_place);
  EXPECT_EQ(ElementwiseReplay::Op::Mul, ElementwiseReplay::covered(handle("aten::mul_", "Tensor"), &in_place));
  EXPECT_TRUE(in_place);
  EXPECT_EQ(ElementwiseReplay::Op::None, ElementwiseReplay::covered(handle("aten::add_", "Scalar")));
  EXPECT_EQ(ElementwiseReplay::Op::None, ElementwiseReplay::covered(handle("aten::div", "Tensor_mode")));
  EXPECT_EQ(ElementwiseReplay::Op::None, ElementwiseReplay::covered(handle("aten::mm", "")));
}

// Each operator, run several times with new data of the recorded geometry (broadcast, transposed,
// a strided slice), gives the dispatcher's bits and layout every time.
TEST(ElementwiseReplay, RepeatedRunsGiveTheDispatchersBits) {
  for (const char* name : {"aten::add", "aten::sub", "aten::mul", "aten::div"}) {
    for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
      if (std::string(name) == "aten::div" && dtype == at::kLong) continue;  // promotes: not covered
      const auto& op = handle(name, "Tensor");
      ElementwiseReplay replay(ElementwiseReplay::covered(op));
      at::manual_seed(7);
      for (int run = 0; run < 4; ++run) {
        auto make = [&](std::vector<int64_t> sizes) {
          at::Tensor t = at::randn(sizes, at::kDouble).mul(10);
          return dtype == at::kLong ? t.to(at::kLong).add(1) : t.to(dtype);
        };
        const at::Tensor a = make({33, 17}).t();      // transposed
        const at::Tensor b = make({33}).unsqueeze(0);  // broadcast along dim 0
        const double alpha = 0.5 * run + 1;
        const double alpha_for = dtype == at::kLong ? std::floor(alpha) : alpha;
        torch::jit::Stack stack = args(name, a, b, alpha_for);
        ASSERT_TRUE(replay.run(stack)) << name << " run " << run;
        ASSERT_EQ(1u, stack.size());
        expect_same(stack[0].toTensor(), dispatched(op, args(name, a, b, alpha_for)));
        const at::Tensor c = make({40, 34}).slice(1, 0, 34, 2);  // strided: another geometry
        const at::Tensor d = make({40, 17});
        torch::jit::Stack other = args(name, c, d, alpha_for);
        EXPECT_FALSE(replay.run(other)) << "another geometry must take the dispatcher";
        EXPECT_EQ(args(name, c, d, alpha_for).size(), other.size()) << "and leave its stack as it was";
      }
      EXPECT_EQ(4u, replay.runs()) << name;
    }
  }
}

// In place: the first argument is written and returned, as the in-place kernel does, on every run.
TEST(ElementwiseReplay, InPlaceRunsWriteTheirFirstArgumentAsTheDispatcherDoes) {
  for (const char* name : {"aten::add_", "aten::sub_", "aten::mul_", "aten::div_"}) {
    const auto& op = handle(name, "Tensor");
    bool in_place = false;
    const ElementwiseReplay::Op kind = ElementwiseReplay::covered(op, &in_place);
    ASSERT_TRUE(in_place) << name;
    ElementwiseReplay replay(kind, in_place);
    at::manual_seed(11);
    for (int run = 0; run < 3; ++run) {
      const at::Tensor self = at::randn({24, 16}).t();  // written through a transposed view
      const at::Tensor other = at::randn({24, 1}).t();  // broadcast
      const at::Tensor expected = self.clone();
      const std::string base = std::string(name).substr(0, std::string(name).size() - 1);
      torch::jit::Stack stack = args(base.c_str(), self, other, 0.25 * run + 0.5);
      ASSERT_TRUE(replay.run(stack)) << name << " run " << run;
      ASSERT_EQ(1u, stack.size());
      EXPECT_TRUE(stack[0].toTensor().is_same(self)) << "returns its first argument";
      dispatched(op, args(base.c_str(), expected, other, 0.25 * run + 0.5));
      expect_same(self, expected);
    }
    EXPECT_EQ(3u, replay.runs());
  }
  // x.add_(x) is exact overlap (allowed), x.add_(shifted view of x) partial (refused).
  const auto& add_ = handle("aten::add_", "Tensor");
  bool in_place = false;
  const ElementwiseReplay::Op kind = ElementwiseReplay::covered(add_, &in_place);
  ElementwiseReplay replay(kind, in_place);
  at::Tensor x = at::randn({8, 8});
  const at::Tensor doubled = x * 2;
  torch::jit::Stack exact{x, x, c10::Scalar(1.0)};
  ASSERT_TRUE(replay.run(exact));
  expect_same(x, doubled);
  at::Tensor buffer = at::randn({72});
  torch::jit::Stack partial{buffer.slice(0, 0, 64).view({8, 8}), buffer.slice(0, 8, 72).view({8, 8}), c10::Scalar(1.0)};
  EXPECT_FALSE(replay.run(partial));
  EXPECT_EQ(3u, partial.size()) << "stack untouched";
}

at::Tensor python_number(double v, at::ScalarType dtype) {
  at::Tensor t = at::scalar_tensor(v, dtype);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);  // what the binding makes of a Python number
  return t;
}

// A Python number (a wrapped 0-dim double or long) that changes from run to run: the iterator's
// converted copy of it is rewritten each run, bits as the dispatcher's.
TEST(ElementwiseReplay, PythonNumbersAreReadAgainEachRun) {
  struct Case { const char* name; at::ScalarType tensor, number; };
  for (const Case& c : {Case{"aten::mul", at::kFloat, at::kDouble}, Case{"aten::div", at::kFloat, at::kDouble},
                        Case{"aten::add", at::kDouble, at::kDouble}, Case{"aten::sub", at::kInt, at::kLong},
                        Case{"aten::mul_", at::kFloat, at::kDouble}, Case{"aten::add_", at::kLong, at::kLong}}) {
    const auto& op = handle(c.name, "Tensor");
    bool in_place = false;
    const ElementwiseReplay::Op kind = ElementwiseReplay::covered(op, &in_place);
    ElementwiseReplay replay(kind, in_place);
    const std::string functional = in_place ? std::string(c.name).substr(0, std::strlen(c.name) - 1) : c.name;
    for (int run = 0; run < 4; ++run) {
      const double v = c.number == at::kLong ? run * 3 - 4 : 0.1 * run + 1.0 / 3;
      const at::Tensor a = at::randn({5, 7}, at::kDouble).mul(9).to(c.tensor);
      const at::Tensor expected = a.clone();
      torch::jit::Stack stack = args(functional.c_str(), a, python_number(v, c.number), 1.0);
      ASSERT_TRUE(replay.run(stack)) << c.name << " run " << run;
      torch::jit::Stack reference = args(functional.c_str(), in_place ? expected : a, python_number(v, c.number), 1.0);
      const at::Tensor want = dispatched(op, reference);
      expect_same(stack[0].toTensor(), want);
    }
    EXPECT_EQ(4u, replay.runs()) << c.name;
  }
  // A float number with integer tensors makes a float result (the tensor converted too): refused.
  ElementwiseReplay mul(ElementwiseReplay::covered(handle("aten::mul", "Tensor")));
  torch::jit::Stack promotes{at::ones({3}, at::kLong), python_number(0.5, at::kDouble)};
  EXPECT_FALSE(mul.run(promotes));
}

TEST(ElementwiseReplay, RefusesPromotionAndReducedFloats) {
  const auto& op = handle("aten::mul", "Tensor");
  ElementwiseReplay replay(ElementwiseReplay::covered(op));
  torch::jit::Stack mixed{at::ones({4}), at::ones({4}, at::kDouble)};
  EXPECT_FALSE(replay.run(mixed));
  torch::jit::Stack half{at::ones({4}, at::kBFloat16), at::ones({4}, at::kBFloat16)};
  EXPECT_FALSE(replay.run(half));
  // A 0-dim double tensor that is not a Python number promotes as a tensor: refused.
  torch::jit::Stack zero_dim{at::ones({4}), at::scalar_tensor(2.0, at::kDouble)};
  EXPECT_FALSE(replay.run(zero_dim));
  EXPECT_EQ(0u, replay.runs());
  // alpha as the meta function checks it: a float alpha for integer tensors is the dispatcher's error.
  ElementwiseReplay add(ElementwiseReplay::covered(handle("aten::add", "Tensor")));
  torch::jit::Stack float_alpha{at::ones({4}, at::kLong), at::ones({4}, at::kLong), c10::Scalar(0.5)};
  EXPECT_FALSE(add.run(float_alpha));
  torch::jit::Stack int_alpha{at::ones({4}, at::kLong), at::ones({4}, at::kLong), c10::Scalar(int64_t{3})};
  ASSERT_TRUE(add.run(int_alpha));
  EXPECT_EQ(4, int_alpha[0].toTensor()[0].item<int64_t>());
  // The check of the last alpha is kept for the same number only.
  torch::jit::Stack float_again{at::ones({4}, at::kLong), at::ones({4}, at::kLong), c10::Scalar(3.0)};
  EXPECT_FALSE(add.run(float_again));
  torch::jit::Stack int_again{at::ones({4}, at::kLong), at::ones({4}, at::kLong), c10::Scalar(int64_t{3})};
  ASSERT_TRUE(add.run(int_again));
  EXPECT_EQ(4, int_again[0].toTensor()[0].item<int64_t>());
}

// Once built, an input of the built geometry and dtype whose dispatch keys differ is asked again
// in full: a negative view (its values are negated when read) is the dispatcher's.
TEST(ElementwiseReplay, RefusesANegativeViewOfTheBuiltGeometry) {
  const auto& op = handle("aten::mul", "Tensor");
  ElementwiseReplay replay(ElementwiseReplay::covered(op));
  torch::jit::Stack plain{at::full({4}, 2.0), at::full({4}, 3.0)};
  ASSERT_TRUE(replay.run(plain));
  const at::Tensor negative = at::_neg_view(at::full({4}, 3.0));
  ASSERT_TRUE(negative.is_neg());
  torch::jit::Stack with_negative{at::full({4}, 2.0), negative};
  EXPECT_FALSE(replay.run(with_negative));
  EXPECT_EQ(1u, replay.runs());
}

// The kept iterator holds no reference to, and no memory of, any run's inputs; of the results,
// only the last one, and only where it is small (kKeptBytes, 16 KiB).
TEST(ElementwiseReplay, KeepsNoInputAliveAndOnlyASmallLastResult) {
  const auto& op = handle("aten::add", "Tensor");
  for (const int64_t n : {128, 4}) {  // 64 KiB, 64 bytes
    ElementwiseReplay replay(ElementwiseReplay::covered(op));
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
    torch::jit::Stack stack{a, b, c10::Scalar(1.0)};
    ASSERT_TRUE(replay.run(stack));
    at::Tensor result = stack[0].toTensor();
    stack.clear();
    EXPECT_EQ(1u, a.use_count());
    EXPECT_EQ(1u, b.use_count());
    EXPECT_EQ(n == 4 ? 2u : 1u, result.use_count()) << n;
    EXPECT_EQ(1u, result.storage().use_count());
  }
}

// A run writes into the kept last result only where nothing else holds it (a tensor, a view's
// storage), and that result then reads as a new one would.
TEST(ElementwiseReplay, WritesIntoTheKeptResultOnlyWhenNothingHoldsIt) {
  ElementwiseReplay replay(ElementwiseReplay::covered(handle("aten::mul", "Tensor")));
  const at::Tensor a = at::randn({3, 5}), b = at::randn({3, 5});
  auto run = [&] {
    torch::jit::Stack stack{a, b};
    EXPECT_TRUE(replay.run(stack));
    return stack[0].toTensor();
  };
  at::Tensor first = run();
  const at::Tensor expected = first.clone();
  at::Tensor second = run();  // `first` is held: a new tensor
  EXPECT_NE(first.data_ptr(), second.data_ptr());
  EXPECT_EQ(0u, replay.reused());
  void* memory = second.data_ptr();
  at::Tensor view = second.view(-1);  // a view holds the storage
  second = at::Tensor();
  at::Tensor third = run();
  EXPECT_NE(memory, third.data_ptr());
  EXPECT_EQ(0u, replay.reused());
  memory = third.data_ptr();
  third.unsafeGetTensorImpl()->bump_version();  // a version a new tensor would not have
  third = at::Tensor();
  at::Tensor fourth = run();
  EXPECT_NE(memory, fourth.data_ptr());
  memory = fourth.data_ptr();
  fourth = at::Tensor();
  at::Tensor fifth = run();  // nothing holds the kept one: written again
  EXPECT_EQ(memory, fifth.data_ptr());
  EXPECT_EQ(1u, replay.reused());
  EXPECT_EQ(0u, fifth.unsafeGetTensorImpl()->version_counter().current_version());
  EXPECT_TRUE(at::equal(fifth, expected));
  EXPECT_TRUE(at::equal(first, expected));
  EXPECT_TRUE(at::equal(view.view({3, 5}), expected));
}

// Adam's and AdamW's other per-parameter kernels: lerp_ (the first moment), addcmul_ (the second),
// sqrt, addcdiv_ (the update), and their out-of-place forms. Each run gets new data of the recorded
// geometry (transposed, broadcast, a strided slice) and a new number, and gives the dispatcher's
// bits, layout and returned tensor.
TEST(ElementwiseReplay, AdamsOtherKernelsGiveTheDispatchersBits) {
  struct Case {
    const char* name;
    const char* overload;
    int tensors;    // inputs
    bool number;    // a Python number last (lerp's weight, addcmul's and addcdiv's value)
  };
  for (const Case& c : {Case{"aten::lerp", "Scalar", 2, true}, Case{"aten::lerp_", "Scalar", 2, true},
                        Case{"aten::addcmul", "", 3, true}, Case{"aten::addcmul_", "", 3, true},
                        Case{"aten::addcdiv", "", 3, true}, Case{"aten::addcdiv_", "", 3, true},
                        Case{"aten::sqrt", "", 1, false}, Case{"aten::sqrt_", "", 1, false}}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      const auto& op = handle(c.name, c.overload);
      bool in_place = false;
      const ElementwiseReplay::Op kind = ElementwiseReplay::covered(op, &in_place);
      ASSERT_NE(ElementwiseReplay::Op::None, kind) << c.name;
      EXPECT_EQ(in_place, std::string(c.name).back() == '_') << c.name;
      ElementwiseReplay replay(kind, in_place);
      at::manual_seed(5);
      for (int run = 0; run < 4; ++run) {
        // sqrt of positive numbers (a NaN would compare unequal to itself in at::equal).
        auto make = [&](std::vector<int64_t> sizes) { return at::rand(sizes, at::kDouble).add(0.1).mul(3).to(dtype); };
        const std::vector<at::Tensor> inputs{make({21, 13}).t(), make({21}).unsqueeze(1).t(), make({1, 21})};
        const at::Tensor expected_self = inputs[0].clone();
        const double number = 0.1 * run + 1.0 / 7;
        auto stack_of = [&](const at::Tensor& self) {
          torch::jit::Stack s{self};
          for (int i = 1; i < c.tensors; ++i) s.emplace_back(inputs[static_cast<size_t>(i)]);
          if (c.number) s.emplace_back(c10::Scalar(number));
          return s;
        };
        torch::jit::Stack stack = stack_of(inputs[0]);
        ASSERT_TRUE(replay.run(stack)) << c.name << " run " << run;
        ASSERT_EQ(1u, stack.size());
        const at::Tensor want = dispatched(op, stack_of(expected_self));
        expect_same(stack[0].toTensor(), want);
        if (in_place) {
          EXPECT_TRUE(stack[0].toTensor().is_same(inputs[0])) << "returns its first argument";
          expect_same(inputs[0], expected_self);
        }
        const at::Tensor strided = make({26, 42}).slice(1, 0, 42, 2);  // another geometry
        torch::jit::Stack other{strided};
        for (int i = 1; i < c.tensors; ++i) other.emplace_back(make({26, 21}));
        if (c.number) other.emplace_back(c10::Scalar(number));
        const size_t size = other.size();
        EXPECT_FALSE(replay.run(other)) << c.name << ": another geometry must take the dispatcher";
        EXPECT_EQ(size, other.size()) << "and leave its stack as it was";
      }
      EXPECT_EQ(4u, replay.runs()) << c.name;
    }
  }
}

// Spread over the program's two intra-op threads (BlockReplayer::run_kernel while the program
// waits), a kernel on tensors above ATen's grain size splits its iterator's range as the
// dispatched operator does at that count: the same bits, the ragged end of each thread's part
// included (an odd element count, a transposed input).
TEST(ElementwiseReplay, TwoThreadsSplitTheRangeAsTheDispatcherDoes) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  struct Case {
    const char* name;
    const char* overload;
    int tensors;
    bool number;
  };
  for (const Case& c : {Case{"aten::add", "Tensor", 2, false}, Case{"aten::mul", "Tensor", 2, false},
                        Case{"aten::div", "Tensor", 2, false}, Case{"aten::lerp", "Scalar", 2, true},
                        Case{"aten::addcdiv", "", 3, true}, Case{"aten::sqrt", "", 1, false}}) {
    const auto& op = handle(c.name, c.overload);
    ElementwiseReplay replay(ElementwiseReplay::covered(op));
    at::manual_seed(11);
    for (int run = 0; run < 3; ++run) {
      auto make = [](std::vector<int64_t> sizes) { return at::rand(sizes, at::kFloat).add(0.1f).mul(3); };
      const std::vector<at::Tensor> inputs{make({257, 301}).t(), make({301, 257}), make({301, 257})};
      auto stack_of = [&] {
        torch::jit::Stack st;
        for (int i = 0; i < c.tensors; ++i) st.emplace_back(inputs[static_cast<size_t>(i)]);
        if (std::string(c.name) == "aten::add") st.emplace_back(c10::Scalar(1.0));
        if (c.number) st.emplace_back(c10::Scalar(0.3 + run));
        return st;
      };
      torch::jit::Stack stack = stack_of();
      ASSERT_TRUE(replay.run(stack)) << c.name << " run " << run;
      expect_same(stack[0].toTensor(), dispatched(op, stack_of()));
    }
  }
  at::set_num_threads(threads);
}

// The new operators take no promotion at all: integer tensors, mixed dtypes and a Python number
// among the tensors are the dispatcher's; so is a complex value.
TEST(ElementwiseReplay, AdamsOtherKernelsRefuseEveryPromotion) {
  ElementwiseReplay addcmul(ElementwiseReplay::covered(handle("aten::addcmul", "")));
  torch::jit::Stack longs{at::ones({4}, at::kLong), at::ones({4}, at::kLong), at::ones({4}, at::kLong), c10::Scalar(int64_t{2})};
  EXPECT_FALSE(addcmul.run(longs));
  torch::jit::Stack mixed{at::ones({4}), at::ones({4}, at::kDouble), at::ones({4}), c10::Scalar(2.0)};
  EXPECT_FALSE(addcmul.run(mixed));
  torch::jit::Stack wrapped{at::ones({4}), python_number(2.0, at::kDouble), at::ones({4}), c10::Scalar(2.0)};
  EXPECT_FALSE(addcmul.run(wrapped));
  torch::jit::Stack complex{at::ones({4}), at::ones({4}), at::ones({4}), c10::Scalar(c10::complex<double>(1.0, 2.0))};
  EXPECT_FALSE(addcmul.run(complex));
  ElementwiseReplay sqrt(ElementwiseReplay::covered(handle("aten::sqrt", "")));
  torch::jit::Stack ints{at::ones({4}, at::kInt)};  // sqrt of integers makes floats: a promotion
  EXPECT_FALSE(sqrt.run(ints));
  EXPECT_EQ(0u, addcmul.runs());
  EXPECT_EQ(0u, sqrt.runs());
  EXPECT_EQ(ElementwiseReplay::Op::None, ElementwiseReplay::covered(handle("aten::lerp", "Tensor")));
  EXPECT_EQ(ElementwiseReplay::Op::None, ElementwiseReplay::covered(handle("aten::addcmul", "out")));
}

}  // namespace
}  // namespace terra::runtime
