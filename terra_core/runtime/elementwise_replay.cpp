// The stubs' call operators are inline and pass one function pointer per CPU capability that
// LibTorch was built with: on x86-64 the default, AVX512 and AVX2 kernels (its
// `DispatchStubImpl::get_call_ptr` takes those three). Elsewhere no operator is covered.
#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#define TERRA_ELEMENTWISE_STUBS 1
#endif
#include "elementwise_replay.h"
#include "out_form.h"
#include "placeholder.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StorageImpl.h>

#include <cstdlib>
#include <string>

namespace terra::runtime {

ElementwiseReplay::Op ElementwiseReplay::covered(const c10::OperatorHandle& op, bool* in_place) {
#ifndef TERRA_ELEMENTWISE_STUBS
  return Op::None;
#endif
  static const bool off = [] {  // TERRA_ELEMENTWISE=0: every kernel through the dispatcher (A/B runs)
    const char* v = std::getenv("TERRA_ELEMENTWISE");
    return v && std::string(v) == "0";
  }();
  if (off) return Op::None;
  struct Covered {
    std::string_view name, overload;
    Op op;
  };
  static constexpr Covered kCovered[] = {
      {"aten::add", "Tensor", Op::Add},  {"aten::sub", "Tensor", Op::Sub},        {"aten::mul", "Tensor", Op::Mul},
      {"aten::div", "Tensor", Op::Div},  {"aten::lerp", "Scalar", Op::Lerp},      {"aten::addcmul", "", Op::Addcmul},
      {"aten::addcdiv", "", Op::Addcdiv}, {"aten::sqrt", "", Op::Sqrt},
  };
  const c10::OperatorName& name = op.operator_name();
  std::string_view base = name.name;
  const bool writes = !base.empty() && base.back() == '_';
  if (writes) base.remove_suffix(1);
  for (const Covered& c : kCovered) {
    if (c.name == base && c.overload == name.overload_name) {
      if (in_place) *in_place = writes;
      return c.op;
    }
  }
  return Op::None;
}

int ElementwiseReplay::inputs(Op op) {
  switch (op) {
    case Op::Sqrt: return 1;
    case Op::Addcmul:
    case Op::Addcdiv: return 3;
    default: return 2;
  }
}

int ElementwiseReplay::number_arg(Op op) {
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Lerp: return 2;
    case Op::Addcmul:
    case Op::Addcdiv: return 3;
    default: return -1;
  }
}

namespace {

// What every operand must be: a plain strided CPU tensor with storage.
bool plain(const at::Tensor& t) {
  return t.defined() && t.layout() == c10::kStrided && t.device().is_cpu() && !t.is_conj() && !t.is_neg() &&
         t.has_storage() && !t.is_quantized();
}

}  // namespace

bool ElementwiseReplay::eligible(const at::Tensor& a, const at::Tensor& b) const {
  if (!plain(a) || !plain(b)) return false;
  // No promotion (the iterator would hold converted copies), except of a Python number: a wrapped
  // 0-dim double or long, whose converted copy each run writes again (write_converted).
  if (a.scalar_type() != b.scalar_type() &&
      !(b.unsafeGetTensorImpl()->is_wrapped_number() && b.dim() == 0 &&
        (b.scalar_type() == c10::ScalarType::Double || b.scalar_type() == c10::ScalarType::Long)))
    return false;
  switch (a.scalar_type()) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
      return true;
    default:
      return false;  // reduced floats: the stubs read scalar operands' values and remove them
  }
}

bool ElementwiseReplay::eligible_more(c10::ArrayRef<const at::Tensor*> in) const {
  const c10::ScalarType dtype = in[0]->scalar_type();
  if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::Double) return false;
  for (const at::Tensor* t : in)
    if (!plain(*t) || t->scalar_type() != dtype || t->unsafeGetTensorImpl()->is_wrapped_number()) return false;
  return true;
}

bool ElementwiseReplay::check_alpha(const c10::IValue& v, c10::ScalarType dtype) {
  // A replayed block passes the same recorded number at every call.
  if (v.isInt() ? alpha_kind_ == Alpha::Long && v.toInt() == long_alpha_
                : v.isDouble() && alpha_kind_ == Alpha::Double && v.toDouble() == double_alpha_)
    return true;
  // What the meta function's alpha_check refuses, the dispatcher refuses.
  if (!v.isScalar()) return false;
  c10::Scalar alpha = v.toScalar();
  if (alpha.isComplex() || alpha.isBoolean() ||
      (alpha.isFloatingPoint() && c10::isIntegralType(dtype, /*includeBool=*/true)))
    return false;
  if (v.isInt()) {
    alpha_kind_ = Alpha::Long;
    long_alpha_ = v.toInt();
  } else if (v.isDouble()) {
    alpha_kind_ = Alpha::Double;
    double_alpha_ = v.toDouble();
  } else {
    alpha_kind_ = Alpha::None;  // checked again at every call
  }
  alpha_ = std::move(alpha);
  return true;
}

void ElementwiseReplay::build(c10::ArrayRef<const at::Tensor*> in) {
  const auto stand_in = [](const at::Tensor& t) {
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
  };
  const at::Tensor& a = *in[0];
  at::Tensor s[3];
  for (size_t i = 0; i < in.size(); ++i) s[i] = stand_in(*in[i]);
  // Undefined: the iterator allocates it as the structured kernel does; in place: the first
  // argument, as the in-place kernel's meta function passes it.
  at::TensorBase out = in_place_ ? at::TensorBase(s[0]) : at::TensorBase();
  std::unique_ptr<at::TensorIterator> iter;
  switch (op_) {
    case Op::Div: iter = std::make_unique<at::TensorIterator>(at::TensorIterator::binary_float_op(out, s[0], s[1])); break;
    case Op::Sqrt: iter = std::make_unique<at::TensorIterator>(at::TensorIterator::unary_float_op(out, s[0])); break;
    case Op::Lerp:  // lerp_Scalar's meta function
      iter = std::make_unique<at::TensorIterator>(at::TensorIteratorConfig()
                                                      .allow_cpu_scalars(true)
                                                      .add_owned_output(out)
                                                      .add_owned_const_input(s[0])
                                                      .add_owned_const_input(s[1])
                                                      .build());
      break;
    case Op::Addcmul:
    case Op::Addcdiv:  // their meta functions' ternary op
      iter = std::make_unique<at::TensorIterator>(at::TensorIteratorConfig()
                                                      .allow_cpu_scalars(true)
                                                      .promote_inputs_to_common_dtype(true)
                                                      .cast_common_dtype_to_outputs(true)
                                                      .enforce_safe_casting_to_output(true)
                                                      .add_owned_output(out)
                                                      .add_owned_const_input(s[0])
                                                      .add_owned_const_input(s[1])
                                                      .add_owned_const_input(s[2])
                                                      .build());
      break;
    default: iter = std::make_unique<at::TensorIterator>(at::TensorIterator::binary_op(out, s[0], s[1]));
  }
  const int n = static_cast<int>(in.size());
  const at::TensorBase& o = iter->output_base(0);
  if (iter->ntensors() != n + 1 || o.scalar_type() != a.scalar_type() || o.storage_offset() != 0) return;
  // An input converted into a copy of the iterator's own: not covered (but a Python number's).
  for (int i = 0; i < n; ++i) {
    const at::TensorBase& input = iter->input_base(i);
    if (input.is_same(s[i])) continue;
    const at::Tensor& b = *in[i];
    if (i != 1 || b.scalar_type() == a.scalar_type() || input.scalar_type() != a.scalar_type() || input.dim() != 0)
      return;
    number_from_ = b.scalar_type();
  }
  if (!in_place_) point(o.unsafeGetTensorImpl(), nullptr);  // its memory goes back now: each run points it at that run's result
  operand_[0] = o.unsafeGetTensorImpl();
  for (int i = 0; i < n; ++i) {
    operand_[i + 1] = iter->input_base(i).unsafeGetTensorImpl();
    keys_[i] = in[i]->unsafeGetTensorImpl()->key_set();
  }
  dtype_ = a.scalar_type();
  iter_ = std::move(iter);
}

void ElementwiseReplay::write_converted(const at::Tensor& number, c10::TensorImpl* to) {
  // As the iterator's `to(common dtype)` converts it (c10::convert: a static_cast).
  const auto put = [&](auto v) {
    void* d = to->mutable_data();
    switch (c10::typeMetaToScalarType(to->dtype())) {
      case c10::ScalarType::Float: *static_cast<float*>(d) = static_cast<float>(v); break;
      case c10::ScalarType::Double: *static_cast<double*>(d) = static_cast<double>(v); break;
      case c10::ScalarType::Int: *static_cast<int32_t*>(d) = static_cast<int32_t>(v); break;
      case c10::ScalarType::Long: *static_cast<int64_t*>(d) = static_cast<int64_t>(v); break;
      default: TORCH_INTERNAL_ASSERT(false, "ElementwiseReplay: unexpected dtype");
    }
  };
  if (number.scalar_type() == c10::ScalarType::Double) {
    put(*static_cast<const double*>(number.const_data_ptr()));
  } else {
    put(*static_cast<const int64_t*>(number.const_data_ptr()));
  }
}

void ElementwiseReplay::point(c10::TensorImpl* stand_in, void* data) {
  stand_in->unsafe_storage().unsafeGetStorageImpl()->set_data_ptr_noswap(
      at::DataPtr(data, c10::Device(c10::kCPU)));
}

void ElementwiseReplay::call_stub(const c10::Scalar& alpha) {
  // What each operator's implementation does with the iterator its meta function built
  // (ATen/native/BinaryOps.cpp; add's is generated from its ufunc).
#ifdef TERRA_ELEMENTWISE_STUBS
  switch (op_) {
    case Op::Add: at::native::add_stub(c10::kCPU, *iter_, alpha); break;
    case Op::Sub: at::native::add_stub(c10::kCPU, *iter_, -alpha); break;
    case Op::Mul: at::native::mul_stub(c10::kCPU, *iter_); break;
    case Op::Div: at::native::div_true_stub(c10::kCPU, *iter_); break;
    case Op::Lerp: at::native::lerp_kernel_scalar_weight(c10::kCPU, *iter_, alpha); break;
    case Op::Addcmul: at::native::addcmul_stub(c10::kCPU, *iter_, alpha); break;
    case Op::Addcdiv: at::native::addcdiv_stub(c10::kCPU, *iter_, alpha); break;
    case Op::Sqrt: at::native::sqrt_stub(c10::kCPU, *iter_); break;
    case Op::None: break;
  }
#endif
}

bool ElementwiseReplay::run(torch::jit::Stack& stack) {
  const c10::IValue* args[kMaxOperands];
  if (stack.size() > kMaxOperands) return false;
  for (size_t i = 0; i < stack.size(); ++i) args[i] = &stack[i];
  at::Tensor result;
  if (!run(c10::ArrayRef<const c10::IValue*>(args, stack.size()), &result)) return false;
  stack.clear();
  stack.emplace_back(std::move(result));
  return true;
}

bool ElementwiseReplay::run(c10::ArrayRef<const c10::IValue*> args, at::Tensor* out) {
  // One body per input count, so that its loops unroll: a 1x1 add's replay costs the GraphRunner
  // no more than the two-input code it had before lerp, addcmul, addcdiv and sqrt were covered.
  switch (inputs_) {
    case 1: return run_inputs<1>(args, out);
    case 2: return run_inputs<2>(args, out);
    default: return run_inputs<3>(args, out);
  }
}

template <int n>
bool ElementwiseReplay::run_inputs(c10::ArrayRef<const c10::IValue*> args, at::Tensor* out) {
  const int number_at = number_at_;
  if (given_up_ || args.size() != static_cast<size_t>(n + (number_at >= 0 ? 1 : 0))) return false;
  const at::Tensor* in[n];
  for (int i = 0; i < n; ++i) {
    if (!args[i]->isTensor()) return false;
    in[i] = &args[i]->toTensor();
  }
  const c10::ArrayRef<const at::Tensor*> tensors(in, static_cast<size_t>(n));
  const at::Tensor& a = *in[0];
  const bool arithmetic = n == 2 && (op_ == Op::Add || op_ == Op::Sub || op_ == Op::Mul || op_ == Op::Div);
  if (!(iter_ && eligible_as_built(tensors)) && !(arithmetic ? eligible(a, *in[n - 1]) : eligible_more(tensors)))
    return false;
  if (number_at >= 0 && !check_alpha(*args[static_cast<size_t>(number_at)], a.scalar_type())) return false;
  if (!iter_) {
    build(tensors);
    if (!iter_) {
      given_up_ = true;
      return false;
    }
  }
  // The iterator's operands keep the geometry and dtype it was built for (its stand-ins; for a
  // Python number, its converted copy).
  const auto same_geometry = [](const at::Tensor& t, const c10::TensorImpl* was) {
    return same_ints(t.sizes(), was->sizes()) && same_ints(t.strides(), was->strides());
  };
  const c10::ScalarType dtype = dtype_;
  const bool number = number_from_ != c10::ScalarType::Undefined;
  for (int i = 0; i < n; ++i) {
    const at::Tensor& t = *in[i];
    if (!same_geometry(t, operand_[i + 1])) return false;
    if ((i == 1 && number) ? t.scalar_type() != number_from_ || !t.unsafeGetTensorImpl()->is_wrapped_number()
                         : t.scalar_type() != dtype)
      return false;
    // In place, an argument overlapping the written one other than exactly is the dispatcher's
    // error (or its copy of the argument, where it makes one).
    if (in_place_ && i > 0 && t.storage().is_alias_of(a.storage()) &&
        !(t.data_ptr() == a.data_ptr() && same_ints(t.sizes(), a.sizes()) && same_ints(t.strides(), a.strides())))
      return false;
  }
  const c10::TensorImpl* out_was = operand_[0];
  at::Tensor result;
  if (in_place_) {
    result = a;
  } else if (const at::Tensor* kept = kept_.free_set(1, out_was)) {
    forget_history(*kept);
    result = *kept;
    ++reused_;
  } else {
    result = at::Tensor(at::detail::empty_strided_cpu(out_was->sizes(), out_was->strides(), dtype));
    kept_.keep(&result, 1);
  }
  void* data[kMaxOperands] = {result.data_ptr()};
  for (int i = 0; i < n; ++i) data[i + 1] = in[i]->data_ptr();
  const int pointed = number ? n : n + 1;  // a Python number's operand is the iterator's own copy
  for (int i = 0; i < pointed; ++i) {
    point(operand_[i], data[i]);
    iter_->unsafe_replace_operand(i, data[i]);
  }
  if (number) write_converted(*in[n - 1], operand_[2]);  // the iterator's own copy, in place
  call_stub(number_at >= 0 ? alpha_ : c10::Scalar(1));
  if (iter_->ntensors() != n + 1) {  // a stub folded an operand into a constant: the result stands
    iter_.reset();
    given_up_ = true;
  }
  *out = std::move(result);
  ++runs_;
  return true;
}

}  // namespace terra::runtime
