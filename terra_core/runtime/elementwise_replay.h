// Elementwise kernels replayed without rebuilding their TensorIterator.
//
// A replayed 1x1 `add` cost the GraphRunner about 6,500 instructions (callgrind, 1x1 chain), 4,200
// of them in the kernel's call: the boxed redispatch, the structured kernel's meta function building
// a TensorIterator (shapes, type promotion, strides, dimension coalescing: about 2,000), the
// output's allocation (1,250), and 450 in the loop that adds. Between two replays of one recorded
// kernel its inputs have the same sizes, strides and dtype, so its TensorIterator would come out
// the same: `ElementwiseReplay` builds it once, the way the operator's meta function does, and
// later replays only point its operands at the new data and call the operator's stub (the
// function the operator's own implementation calls with that iterator).
//
// Covered: `add.Tensor`, `sub.Tensor`, `mul.Tensor` and `div.Tensor` and their in-place forms
// (`add_.Tensor`...: an optimizer's updates of its buffers and parameters) on CPU where
// every tensor has one dtype (float, double, int, long) or the second argument is a Python number
// (a wrapped 0-dim double or long, whose converted copy inside the iterator each run writes
// again): no other type promotion, so the iterator holds no other converted copy of an input,
// and none of the stubs' special cases for reduced-precision
// scalars (which read an input's value while the iterator is built, or remove an operand). Any
// other call, or inputs whose geometry differs from the iterator's, take the dispatcher as before.
// And the rest of what Adam's and AdamW's single-tensor step (the CPU default) runs per parameter:
// `lerp.Scalar`, `addcmul`, `addcdiv` (out of place or in place) and `sqrt`, on float or double
// tensors of one dtype (no Python number among the tensors): with every operand of one dtype the
// meta function's promotion and casting flags change nothing, so the iterator built here comes
// out as the operator's own (its shape, strides, order and coalescing do not depend on those
// flags). Adam's step is 9 kernels per parameter, 4 of them these: an MLP step with Adam
// (bench/replay.py) ran 24 of its ~30 uncovered TensorIterator kernels through the dispatcher.
// The iterator's operands are stand-ins that own no memory: its inputs view the first replay's
// inputs through non-owning storage, and the output it allocated gives its memory back at once;
// each replay re-points them (the stand-ins' storage too, so anything reading an operand's tensor
// reads the current data). Its result is a fresh tensor of the output's geometry, as the structured
// kernel allocates it, or, in place, the first argument. GraphRunner thread only.
#pragma once

#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "out_form.h"

#include <memory>

namespace terra::runtime {

class ElementwiseReplay {
 public:
  enum class Op : uint8_t { None, Add, Sub, Mul, Div, Lerp, Addcmul, Addcdiv, Sqrt };
  // The covered operator `op` is (None: not covered); `in_place`: its in-place form (`add_`...).
  static Op covered(const c10::OperatorHandle& op, bool* in_place = nullptr);
  explicit ElementwiseReplay(Op op, bool in_place = false)
      : op_(op), in_place_(in_place), inputs_(inputs(op)), number_at_(number_arg(op)) {}
  // Runs the kernel on `stack` (its arguments in, its result out, as a boxed call leaves it).
  // False, with `stack` untouched: these arguments are not covered (run the kernel as usual).
  bool run(torch::jit::Stack& stack);
  // The same on arguments read where they are (`args`: the schema's, in order), the result into
  // `*result`: no copy of an argument, whose reference count a copy would write.
  bool run(c10::ArrayRef<const c10::IValue*> args, at::Tensor* result);
  uint64_t runs() const { return runs_; }  // calls that ran through the kept iterator

 private:
  bool eligible(const at::Tensor& a, const at::Tensor& b) const;
  // The eligibility of inputs whose dispatch keys are the built ones': everything eligible() asks
  // but the dtypes is in the keys (layout, device, conjugate and negative bits, quantized), so one
  // compare each, and their storage.
  bool eligible_as_built(c10::ArrayRef<const at::Tensor*> in) const {
    for (size_t i = 0; i < in.size(); ++i) {
      const c10::TensorImpl* t = in[i]->unsafeGetTensorImpl();
      if (t->key_set() != keys_[i] || !t->unsafe_storage()) return false;
    }
    return true;
  }
  template <int n>
  bool run_inputs(c10::ArrayRef<const c10::IValue*> args, at::Tensor* result);  // run with n inputs
  // The tensors the operator reads (1 to 3) and where its Python number is (-1: none): add's and
  // sub's alpha, lerp's weight, addcmul's and addcdiv's value.
  static int inputs(Op op);
  static int number_arg(Op op);
  // Checks the call's number as the meta function would (add's alpha_check; for the others a real
  // number) and keeps it in alpha_ (false: refused); a call with the last one's is not checked again.
  bool check_alpha(const c10::IValue& v, c10::ScalarType dtype);
  // The other inputs of lerp, addcmul, addcdiv and sqrt: a tensor of the first's dtype (and
  // geometry kinds eligible() accepts), float or double.
  bool eligible_more(c10::ArrayRef<const at::Tensor*> in) const;
  void build(c10::ArrayRef<const at::Tensor*> in);
  void call_stub(const c10::Scalar& alpha);
  static void point(c10::TensorImpl* stand_in, void* data);
  static void write_converted(const at::Tensor& number, c10::TensorImpl* to);

  Op op_;
  bool in_place_;          // writes its first argument (the iterator's output is that argument)
  int inputs_;             // inputs(op_), number_arg(op_): asked at every run
  int number_at_;
  bool given_up_ = false;  // the iterator changed under a stub, or could not be built
  // The second argument is a Python number (a wrapped 0-dim tensor) of this dtype, which the
  // iterator converts to the first's into a copy of its own; Undefined: a tensor of the first's.
  c10::ScalarType number_from_ = c10::ScalarType::Undefined;
  std::unique_ptr<at::TensorIterator> iter_;
  // The iterator's operands (output, then the inputs), which live as long as it.
  static constexpr int kMaxOperands = 4;
  c10::TensorImpl* operand_[kMaxOperands] = {};
  c10::DispatchKeySet keys_[kMaxOperands - 1];  // the built inputs' (eligible_as_built)
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;  // its operands' (the first input's)
  // The last alpha that passed the check, and what it was: an int (long_alpha_), a double
  // (double_alpha_), or None (none yet, or another kind of number, checked at every call).
  enum class Alpha : uint8_t { None, Long, Double } alpha_kind_ = Alpha::None;
  int64_t long_alpha_ = 0;
  double double_alpha_ = 0;
  c10::Scalar alpha_;
  uint64_t runs_ = 0;
  // Its last small results (KeptResults, out_form.h): the next run writes into one instead of a
  // new tensor where nothing else holds it any more (result_free: the GraphRunner released it
  // after its last reader, no placeholder took its storage, no view shares it). Making the result
  // tensor was a fifth of the GraphRunner's instructions per op on a 1x1 add chain.
  KeptResults kept_;
  uint64_t reused_ = 0;

 public:
  uint64_t reused() const { return reused_; }  // results written into the kept one
};

}  // namespace terra::runtime
