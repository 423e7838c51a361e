// Replayed kernels writing into their kept results (out_form.h): which operators have an out=
// form sharing their structured kernel, that form's bits against the functional form's on the
// same inputs, and when a kept result is free to be written again.
#include "out_form.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace terra::runtime {
namespace {

c10::OperatorHandle handle(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

std::string out_form_of(const char* name, const char* overload) {
  const c10::OperatorHandle* out = structured_out_form(handle(name, overload));
  if (!out) return "";
  return out->operator_name().name + "." + out->operator_name().overload_name;
}

TEST(OutForm, FoundForStructuredFunctionalOperatorsOnly) {
  EXPECT_EQ("aten::mm.out", out_form_of("aten::mm", ""));
  EXPECT_EQ("aten::addmm.out", out_form_of("aten::addmm", ""));
  EXPECT_EQ("aten::sum.IntList_out", out_form_of("aten::sum", "dim_IntList"));
  EXPECT_EQ("aten::max.dim_max", out_form_of("aten::max", "dim"));  // two results
  EXPECT_EQ("aten::threshold_backward.grad_input", out_form_of("aten::threshold_backward", ""));
  EXPECT_EQ("aten::_softmax.out", out_form_of("aten::_softmax", ""));
  // Not structured: its out= form (autogen) is the functional form and a copy.
  EXPECT_EQ("", out_form_of("aten::native_layer_norm", ""));
  // In place (returns its argument), a view, a shape that depends on the data.
  EXPECT_EQ("", out_form_of("aten::add_", "Tensor"));
  EXPECT_EQ("", out_form_of("aten::transpose", "int"));
  EXPECT_EQ("", out_form_of("aten::nonzero", ""));
}

void expect_same(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.sizes(), b.sizes());
  ASSERT_EQ(a.strides(), b.strides());
  ASSERT_EQ(a.scalar_type(), b.scalar_type());
  EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()));
}

struct Call {
  const char* name;
  const char* overload;
  std::function<torch::jit::Stack(uint64_t seed)> args;  // the same geometry for every seed
};

at::Tensor randn(uint64_t seed, at::IntArrayRef sizes) {
  at::manual_seed(seed);
  return at::randn(sizes);
}

TEST(OutForm, WritesTheFunctionalFormsBitsIntoAnEarlierResult) {
  // Sizes that split over two threads (ATen's grain size, 32768 elements) where the operator
  // parallelises, odd ones, transposed inputs.
  const std::vector<Call> calls = {
      {"aten::mm", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {33, 70}), randn(s + 1, {70, 17})}; }},
      {"aten::addmm", "",
       [](uint64_t s) {
         return torch::jit::Stack{randn(s, {17}), randn(s + 1, {33, 70}), randn(s + 2, {17, 70}).t(),
                                  c10::Scalar(0.5), c10::Scalar(1.5)};
       }},
      {"aten::bmm", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {4, 9, 13}), randn(s + 1, {4, 13, 5})}; }},
      {"aten::_softmax", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {257, 129}), int64_t{1}, false}; }},
      {"aten::_log_softmax", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {129, 257}).t(), int64_t{0}, false}; }},
      {"aten::sum", "dim_IntList",
       [](uint64_t s) {
         return torch::jit::Stack{randn(s, {65, 33, 31}), std::vector<int64_t>{0, 2}, false, c10::IValue()};
       }},
      {"aten::mean", "dim",
       [](uint64_t s) { return torch::jit::Stack{randn(s, {300, 301}), std::vector<int64_t>{1}, true, c10::IValue()}; }},
      {"aten::max", "dim", [](uint64_t s) { return torch::jit::Stack{randn(s, {301, 300}).t(), int64_t{1}, false}; }},
      {"aten::cat", "",
       [](uint64_t s) {
         return torch::jit::Stack{c10::List<at::Tensor>({randn(s, {7, 5}), randn(s + 1, {3, 5})}), int64_t{0}};
       }},
      {"aten::gelu", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {301, 300}).t(), std::string("none")}; }},
      {"aten::threshold_backward", "",
       [](uint64_t s) { return torch::jit::Stack{randn(s, {257, 200}), randn(s + 1, {257, 200}), c10::Scalar(0.0)}; }},
      {"aten::_softmax_backward_data", "",
       [](uint64_t s) {
         return torch::jit::Stack{randn(s, {129, 257}), randn(s + 1, {129, 257}), int64_t{1}, at::ScalarType::Float};
       }},
      {"aten::cumsum", "", [](uint64_t s) { return torch::jit::Stack{randn(s, {40, 1000}), int64_t{1}, c10::IValue()}; }},
  };
  const int threads_before = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (const Call& c : calls) {
      SCOPED_TRACE(std::string(c.name) + "." + c.overload + " with " + std::to_string(threads) + " threads");
      const c10::OperatorHandle op = handle(c.name, c.overload);
      const c10::OperatorHandle* out = structured_out_form(op);
      ASSERT_NE(nullptr, out);
      torch::jit::Stack expected = c.args(1);
      op.callBoxed(&expected);
      // An earlier result of the same call on other data, written again through the out= form.
      torch::jit::Stack earlier = c.args(7);
      op.callBoxed(&earlier);
      torch::jit::Stack stack = c.args(1);
      std::vector<const c10::TensorImpl*> kept;
      for (const c10::IValue& r : earlier) {
        stack.push_back(r);
        kept.push_back(r.toTensor().unsafeGetTensorImpl());
      }
      out->callBoxed(&stack);
      ASSERT_EQ(expected.size(), stack.size());
      for (size_t i = 0; i < stack.size(); ++i) {
        EXPECT_EQ(kept[i], stack[i].toTensor().unsafeGetTensorImpl());  // written where it was
        expect_same(expected[i].toTensor(), stack[i].toTensor());
      }
    }
  }
  at::set_num_threads(threads_before);
}

TEST(OutForm, AResultIsFreeOnlyWhileNothingElseCanSeeIt) {
  at::Tensor t = at::empty({4, 4});  // (at::ones fills in place: version 1)
  EXPECT_TRUE(result_free(t));
  {
    at::Tensor copy = t;  // another reference to the impl
    EXPECT_FALSE(result_free(t));
  }
  {
    at::Tensor view = t.view(-1);  // the storage, and the version counter
    EXPECT_FALSE(result_free(t));
  }
  EXPECT_TRUE(result_free(t));
  {
    c10::weak_intrusive_ptr<c10::TensorImpl> weak(t.getIntrusivePtr());
    EXPECT_FALSE(result_free(t));
  }
  at::Tensor bumped = at::empty({4});
  bumped.add_(1);  // a version no new tensor has
  EXPECT_FALSE(result_free(bumped));
  at::Tensor with_grad_fn = at::ones({3}, at::requires_grad()).mul(2);
  EXPECT_TRUE(result_free(with_grad_fn));  // its history goes with forget_history
  forget_history(with_grad_fn);
  EXPECT_FALSE(with_grad_fn.requires_grad());
  EXPECT_EQ(nullptr, with_grad_fn.grad_fn());
  at::Tensor slice = at::empty({8}).narrow(0, 2, 4);  // its data past the storage's start
  EXPECT_FALSE(result_free(slice));
  {
    c10::InferenceMode guard;  // a new tensor here counts no versions: a counting one is not new
    EXPECT_FALSE(result_free(t));
    EXPECT_TRUE(result_free(at::empty({2})));
  }
}

TEST(OutForm, KeptResultsRotateTheirSetsAndStayWithinTheProcesssBudget) {
  const size_t before = KeptResults::total_bytes();
  {
    KeptResults kept;
    at::Tensor a = at::empty({4}), b = at::empty({4}), c = at::empty({4});
    const c10::TensorImpl* a_impl = a.unsafeGetTensorImpl();
    kept.keep(&a, 1);
    kept.keep(&b, 1);
    EXPECT_EQ(2 * a.nbytes(), kept.bytes());
    EXPECT_EQ(before + kept.bytes(), KeptResults::total_bytes());
    EXPECT_EQ(nullptr, kept.free_set(1));  // `a` and `b` are still held here
    a.reset();
    const at::Tensor* free = kept.free_set(1);
    ASSERT_NE(nullptr, free);
    EXPECT_EQ(a_impl, free->unsafeGetTensorImpl());
    EXPECT_EQ(nullptr, kept.free_set(1, at::empty({2, 2}).unsafeGetTensorImpl()));  // other geometry
    kept.keep(&c, 1);  // in place of the oldest set (the first)
    EXPECT_EQ(2 * c.nbytes(), kept.bytes());
    b.reset();
    free = kept.free_set(1);
    ASSERT_NE(nullptr, free);  // `b`: the only one free now
    EXPECT_NE(c.unsafeGetTensorImpl(), free->unsafeGetTensorImpl());
    const KeptResults copy = kept;  // a cache: a copy starts empty
    EXPECT_EQ(0u, copy.bytes());
    EXPECT_EQ(nullptr, copy.free_set(1));
    at::Tensor large = at::empty({static_cast<int64_t>(kKeptResultBytes / sizeof(float)) + 1});
    KeptResults other;
    other.keep(&large, 1);  // larger than a kept result may be
    EXPECT_EQ(0u, other.bytes());
  }
  EXPECT_EQ(before, KeptResults::total_bytes());  // given back when they go
  {
    std::vector<KeptResults> many(KeptResults::kBudgetBytes / kKeptResultBytes + 16);
    for (KeptResults& k : many) {
      at::Tensor t = at::empty({static_cast<int64_t>(kKeptResultBytes / sizeof(float))});
      k.keep(&t, 1);
    }
    EXPECT_LE(KeptResults::total_bytes(), KeptResults::kBudgetBytes);
    EXPECT_GT(KeptResults::total_bytes(), KeptResults::kBudgetBytes - kKeptResultBytes - before);
    EXPECT_EQ(0u, many.back().bytes());  // over the budget: not kept
  }
  EXPECT_EQ(before, KeptResults::total_bytes());
}

}  // namespace
}  // namespace terra::runtime
