// Replayed kernels that write into their last result (a block's memory plan for small outputs).
//
// A functional kernel replayed below autograd allocates its result each time: a TensorImpl, a
// StorageImpl, the data from the runner allocator (runner_allocator.h), about 1,250 instructions
// of a 1x1 kernel's 4,200 (callgrind, elementwise_replay.h). Between two replays of one recorded
// kernel its result has the same geometry, and where the program and the block let the last one
// go (the GraphRunner released it after its last reader, no placeholder took its storage, no view
// or Python object refers to it) that tensor can be the next result, as if new.
//
// Only for operators whose functional and out= forms are one structured kernel (ATen's
// `structured_delegate`: the meta function computes the output's geometry, the same `impl` writes
// it; the functional form allocates what the meta function asks for, the out= form checks that the
// given output already has it and writes there), so the result's bits are the functional's. The
// pairs come from the native_functions.yaml of the LibTorch built against
// (generated/structured_ops.inc, made by terra_core/CMakeLists.txt). Other operators' out= forms
// may be the functional form followed by a copy (`autogen` ones): those allocate as before. One
// structured kernel is not quite enough (`mse_loss`'s meta function sizes its output for the
// unreduced loss first, so its out= form resizes a kept reduced result, with a warning): each
// kernel's first use is checked against the functional form (BlockReplayer::run_out_form).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>

#include <array>
#include <cstddef>
#include <vector>

#include "same_ints.h"

namespace terra::runtime {

// The out= form of `functional` where both are one structured kernel on the CPU, its arguments are
// the functional's followed by one output per return, and its output's shape cannot depend on
// the data (no `dynamic_output_shape` tag); null otherwise. Looked up once per operator.
const c10::OperatorHandle* structured_out_form(const c10::OperatorHandle& functional);

// Whether `kept`, an earlier result, may be written as a new one: only the caller references it
// (the impl, its storage and its version counter), no Python object, the version of a new tensor
// (counted or not, as inference mode now makes them), its data at the storage's start. Geometry is
// the caller's to compare. Autograd metadata (the stand-in grad_fn a replayed item output gets,
// block_replay.h) nothing else can see any more: forget_history drops it before the tensor is
// written as a new result. (Python hooks live in a Python object or a grad_fn the program holds:
// a tensor that had hooks and lost its Python object is not one only the caller references.)
inline bool result_free(const at::Tensor& kept) {
  if (!kept.defined()) return false;
  const c10::TensorImpl* impl = kept.unsafeGetTensorImpl();
  const c10::VariableVersion& version = impl->version_counter();
  if (kept.use_count() != 1 || kept.weak_use_count() != 1 || !impl->has_storage() ||
      kept.storage().use_count() != 1 || impl->pyobj_slot()->load_pyobj() ||
      (version.enabled() && (!version.unique() || version.current_version() != 0)) || kept.storage_offset() != 0)
    return false;
  // Inference mode decides whether a new tensor counts versions at all (asked last: a lookup of
  // the thread's state).
  return version.enabled() != c10::InferenceMode::is_enabled();
}
inline void forget_history(const at::Tensor& kept) {
  c10::TensorImpl* impl = kept.unsafeGetTensorImpl();
  if (impl->autograd_meta()) impl->set_autograd_meta(nullptr);
}

// Results kept for writing into again are at most this large: they stay allocated between
// iterations (eager execution frees them), and for larger ones the allocation is a small part of
// the kernel.
constexpr size_t kKeptResultBytes = 16 * 1024;

// A kernel's kept results: up to kSets sets of its `n` results, the oldest replaced by a new one.
// All kept results of the process together stay within kBudgetBytes: a program with many paths
// records a block per path (up to 32 per start), each kernel of each block keeping its own, and
// rnn_lengths (17 lengths) held 30 MB more than with none (396 MB against 366, eagerly 308).
// A copy starts empty (they are a cache: a copied kernel makes its own).
class KeptResults {
 public:
  static constexpr size_t kSets = 2;  // a result held in a loop variable is free one replay later
  static constexpr size_t kBudgetBytes = size_t{8} << 20;
  KeptResults() = default;
  KeptResults(const KeptResults&) {}
  KeptResults& operator=(const KeptResults& other) {
    if (this != &other) clear();
    return *this;
  }
  ~KeptResults() { clear(); }
  // The first set of `n` results that result_free finds free, each of `like`'s geometry where
  // given; null if none.
  const at::Tensor* free_set(size_t n, const c10::TensorImpl* like = nullptr) const;
  // Keeps `results` (`n` tensors, each at most kKeptResultBytes) as a set, in place of the oldest
  // where kSets are kept, if the process's budget allows.
  void keep(const at::Tensor* results, size_t n);
  void clear();
  size_t bytes() const {  // what its sets count against the budget
    size_t sum = 0;
    for (size_t b : set_bytes_) sum += b;
    return sum;
  }
  static size_t total_bytes();  // the process's

 private:
  std::vector<at::Tensor> tensors_;  // the sets, one after the other
  std::array<size_t, kSets> set_bytes_{};  // as counted when kept (a tensor may be resized since)
  size_t next_ = 0;  // the set a new one replaces
};

// Inline: asked at every replayed kernel that keeps results.
inline const at::Tensor* KeptResults::free_set(size_t n, const c10::TensorImpl* like) const {
  const at::Tensor* t = tensors_.data();
  for (size_t set = 0; n != 0 && set + n <= tensors_.size(); set += n) {
    bool free = true;
    for (size_t i = set; i < set + n && free; ++i)
      free = result_free(t[i]) && (!like || (same_ints(t[i].sizes(), like->sizes()) && same_ints(t[i].strides(), like->strides())));
    if (free) return t + set;
  }
  return nullptr;
}

}  // namespace terra::runtime
