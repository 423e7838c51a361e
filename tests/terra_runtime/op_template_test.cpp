// OpTemplate on real ATen operators: how a traced call classifies its arguments, and which later
// calls validate against it (op_template.h). Until now only the Python suites exercised this.
#include "op_template.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

namespace terra::runtime {
namespace {

c10::OperatorHandle op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Records the call `args` to `o` as traced (outputs from actually running it) and returns it.
OpTemplate traced(const c10::OperatorHandle& o, torch::jit::Stack args) {
  OpTemplate t = OpTemplate::record(OpKind::Aten, &o, c10::toString(o.operator_name()), args);
  o.callBoxed(&args);
  t.record_outputs(args);
  return t;
}

TEST(OpTemplate, TensorsAreValidatedByMetadataNotValues) {
  const auto add = op("aten::add", "Tensor");
  const OpTemplate t = traced(add, {at::ones({2, 3}), at::ones({2, 3}), 1.0});
  ASSERT_EQ(t.args.size(), 3u);
  EXPECT_EQ(t.args[0].kind, ArgSpec::Kind::Tensor);
  EXPECT_EQ(t.args[2].kind, ArgSpec::Kind::Feed);  // alpha: a Python number
  EXPECT_EQ(t.mode, ExecMode::Graph);
  ASSERT_EQ(t.outs.size(), 1u);
  EXPECT_EQ(t.outs[0].meta.sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.outs[0].alias_arg, -1);

  std::string why;
  EXPECT_TRUE(t.matches({at::randn({2, 3}), at::zeros({2, 3}), 1.0}, &why)) << why;
  EXPECT_TRUE(t.matches({at::ones({2, 3}), at::ones({2, 3}), 0.5}, &why)) << why;  // a new alpha
  EXPECT_FALSE(t.matches({at::ones({3, 2}), at::ones({2, 3}), 1.0}, &why));
  EXPECT_NE(why.find("argument 0"), std::string::npos) << why;
  EXPECT_FALSE(t.matches({at::ones({2, 3}, at::kDouble), at::ones({2, 3}), 1.0}, nullptr));
  EXPECT_FALSE(t.matches({at::ones({2, 3}).t().contiguous().t(), at::ones({2, 3}), 1.0}, nullptr))
      << "other strides";
  EXPECT_FALSE(t.matches({at::ones({2, 3}).requires_grad_(), at::ones({2, 3}), 1.0}, nullptr));
  EXPECT_FALSE(t.matches({at::ones({2, 3}), at::ones({2, 3}), int64_t{1}}, &why))
      << "a float feed that became an int";
  EXPECT_NE(why.find("number type"), std::string::npos) << why;
}

TEST(OpTemplate, StructuralConstantsMustBeEqual) {
  const auto sum = op("aten::sum", "dim_IntList");
  const OpTemplate t =
      traced(sum, {at::ones({4, 5}), std::vector<int64_t>{1}, false, c10::IValue()});
  EXPECT_EQ(t.args[1].kind, ArgSpec::Kind::Constant);
  EXPECT_EQ(t.args[2].kind, ArgSpec::Kind::Constant);
  std::string why;
  EXPECT_TRUE(t.matches({at::zeros({4, 5}), std::vector<int64_t>{1}, false, c10::IValue()}, &why)) << why;
  EXPECT_FALSE(t.matches({at::zeros({4, 5}), std::vector<int64_t>{0}, false, c10::IValue()}, &why));
  EXPECT_NE(why.find("argument 1"), std::string::npos) << why;
  EXPECT_FALSE(t.matches({at::zeros({4, 5}), std::vector<int64_t>{1}, true, c10::IValue()}, nullptr))
      << "keepdim changes the output's shape";
}

TEST(OpTemplate, WrappedNumbersAreFeeds) {
  // `x * 0.5` reaches ATen as mul.Tensor with a wrapped 0-d tensor: its value may change.
  const auto mul = op("aten::mul", "Tensor");
  auto wrapped = [](double v) {
    at::Tensor s = at::scalar_tensor(v, at::kDouble);
    s.unsafeGetTensorImpl()->set_wrapped_number(true);
    return s;
  };
  const OpTemplate t = traced(mul, {at::ones({3}), wrapped(0.5)});
  ASSERT_EQ(t.args[1].wrapped.size(), 1u);
  EXPECT_TRUE(t.args[1].wrapped[0]);
  std::string why;
  EXPECT_TRUE(t.matches({at::ones({3}), wrapped(0.25)}, &why)) << why;
  // A real 0-d tensor is not a Python number: not the traced call.
  EXPECT_FALSE(t.matches({at::ones({3}), at::scalar_tensor(0.25, at::kDouble)}, nullptr));
}

TEST(OpTemplate, NumberListsOfForeachOpsAreFeeds) {
  // Adam's foreach step passes one step size per parameter (`Scalar[]`), new every step: values
  // are fed, the list's length and number types are validated. `int[]` stays structural.
  const auto addcdiv = op("aten::_foreach_addcdiv_", "ScalarList");
  auto tensors = [] { return std::vector<at::Tensor>{at::ones({3}), at::ones({2})}; };
  auto numbers = [](std::vector<c10::IValue> v) {
    c10::impl::GenericList l(c10::NumberType::get());
    for (auto& x : v) l.push_back(std::move(x));
    return l;
  };
  const OpTemplate t =
      traced(addcdiv, {tensors(), tensors(), tensors(), numbers({-0.1, -0.2})});
  ASSERT_EQ(t.args.size(), 4u);
  EXPECT_EQ(t.args[3].kind, ArgSpec::Kind::Numbers);
  std::string why;
  EXPECT_TRUE(t.matches({tensors(), tensors(), tensors(), numbers({-0.3, 0.5})}, &why)) << why;
  EXPECT_FALSE(t.matches({tensors(), tensors(), tensors(), numbers({-0.3})}, &why))
      << "one number for two tensors";
  EXPECT_NE(why.find("number list argument 3"), std::string::npos) << why;
  EXPECT_FALSE(t.matches({tensors(), tensors(), tensors(), numbers({int64_t{1}, -0.5})}, nullptr))
      << "an int where a float was traced (type promotion differs)";
}

TEST(OpTemplate, InPlaceOpsReturnTheirArgument) {
  const auto add_ = op("aten::add_", "Tensor");
  const OpTemplate t = traced(add_, {at::ones({2}), at::ones({2}), 1.0});
  EXPECT_TRUE(t.mutates_input);
  ASSERT_EQ(t.outs.size(), 1u);
  EXPECT_EQ(t.outs[0].alias_arg, 0);
  EXPECT_FALSE(t.noop_alias);  // it writes: it must be issued
  // A view shares its input's storage.
  const OpTemplate v = traced(op("aten::view", ""), {at::ones({2, 3}), std::vector<int64_t>{6}});
  ASSERT_EQ(v.outs.size(), 1u);
  EXPECT_TRUE(v.outs[0].view);
  EXPECT_EQ(v.outs[0].alias_arg, -1);
}

// `d[:, idx]`: PyTorch's indexing boxes the dims it does not index as undefined tensors in the
// `Tensor?[]` list (other callers as None); both are absent elements, validated as such.
TEST(OpTemplate, UndefinedTensorsInOptionalTensorListsAreAbsentElements) {
  const auto index = op("aten::index", "Tensor");
  auto indices = [](c10::IValue first, const at::Tensor& second) {
    c10::impl::GenericList list(c10::OptionalType::create(c10::TensorType::get()));
    list.push_back(std::move(first));
    list.push_back(second);
    return list;
  };
  const at::Tensor idx = at::arange(2);
  const OpTemplate t = traced(index, {at::ones({5, 5}), indices(at::Tensor(), idx)});
  ASSERT_EQ(t.args[1].kind, ArgSpec::Kind::TensorList);
  EXPECT_EQ(t.args[1].present, (std::vector<bool>{false, true}));
  EXPECT_EQ(t.outs[0].meta.sizes, (std::vector<int64_t>{5, 2}));
  std::string why;
  EXPECT_TRUE(t.matches({at::zeros({5, 5}), indices(at::Tensor(), idx + 1)}, &why)) << why;
  EXPECT_TRUE(t.matches({at::zeros({5, 5}), indices(c10::IValue(), idx)}, &why)) << why;
  EXPECT_FALSE(t.matches({at::zeros({5, 5}), indices(idx, idx)}, &why));
  EXPECT_NE(why.find("element 0"), std::string::npos) << why;
}

// batch_norm updates its running statistics in place though its schema does not mark them.
TEST(OpTemplate, BatchNormWritesItsRunningStatistics) {
  const auto bn = op("aten::batch_norm", "");
  const OpTemplate t = traced(bn, {at::rand({4, 3, 2}), c10::IValue(), c10::IValue(), at::zeros({3}), at::ones({3}),
                                   true, 0.1, 1e-5, false});
  EXPECT_TRUE(t.mutates_input);
  EXPECT_FALSE(t.writes_arg(0));
  EXPECT_TRUE(t.writes_arg(3));
  EXPECT_TRUE(t.writes_arg(4));
  const OpTemplate add = traced(op("aten::add_", "Tensor"), {at::ones({2}), at::ones({2}), 1.0});
  EXPECT_TRUE(add.writes_arg(0));
  EXPECT_FALSE(add.writes_arg(1));
}

TEST(OpTemplate, OutputBytesCountWhatThePlaceholdersKeepAlive) {
  // A new tensor: its own size.
  EXPECT_EQ(traced(op("aten::add", "Tensor"), {at::ones({64, 64}), at::ones({64, 64}), 1}).out_bytes,
            64u * 64u * 4u);
  // An in-place result is its argument: nothing new.
  EXPECT_EQ(traced(op("aten::add_", "Tensor"), {at::ones({64, 64}), at::ones({64, 64}), 1.0}).out_bytes, 0u);
  // A view keeps its base's storage: counted by what it covers.
  EXPECT_EQ(traced(op("aten::select", "int"), {at::ones({64, 64}, at::kDouble), int64_t{0}, int64_t{3}})
                .out_bytes,
            64u * 8u);
}

TEST(OpTemplate, ExecutionModesFollowTheSchemaAndTags) {
  // No tensor input, no randomness: run at once in the program's thread.
  const OpTemplate zeros = traced(op("aten::zeros", ""),
                                  {std::vector<int64_t>{2}, c10::IValue(), c10::IValue(),
                                   c10::IValue(), c10::IValue()});
  EXPECT_EQ(zeros.mode, ExecMode::PythonNow);
  // Random: stays in the GraphRunner's issue order, so the generator is consumed as eagerly.
  const OpTemplate rand = traced(op("aten::rand", ""),
                                 {std::vector<int64_t>{2}, c10::IValue(), c10::IValue(),
                                  c10::IValue(), c10::IValue()});
  EXPECT_TRUE(rand.random);
  EXPECT_EQ(rand.mode, ExecMode::Graph);
  // A data-dependent output shape: the program needs the value now.
  const OpTemplate nonzero = traced(op("aten::nonzero", ""), {at::ones({3})});
  EXPECT_EQ(nonzero.mode, ExecMode::Fetch);
  // A Python value returned (a Scalar): fetched.
  const OpTemplate item = traced(op("aten::_local_scalar_dense", ""), {at::ones({})});
  EXPECT_EQ(item.mode, ExecMode::Fetch);
}

TEST(OpTemplate, GradModeIsPartOfTheCall) {
  const auto add = op("aten::add", "Tensor");
  const OpTemplate t = traced(add, {at::ones({2}), at::ones({2}), 1.0});
  c10::AutoGradMode off(false);
  std::string why;
  EXPECT_FALSE(t.matches({at::ones({2}), at::ones({2}), 1.0}, &why));
  EXPECT_NE(why.find("grad mode"), std::string::npos) << why;
}

}  // namespace
}  // namespace terra::runtime
