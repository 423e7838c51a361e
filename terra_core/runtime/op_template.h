// OpTemplate: what the trace recorded about one intercepted call, and how a later call is checked
// against it.
//
// Arguments are classified once, from the operator schema, when the op is first traced:
//   tensors and tensor lists  -> their metadata is validated (it decides the outputs' metadata);
//   float/Scalar arguments and Python numbers wrapped as tensors -> feeds: their value may change
//     every iteration without a re-trace (learning rates, loop-dependent constants);
//   everything else (ints, int lists, bools, dtypes, devices, strings, None) -> structural
//     constants that must be equal, since they can change the outputs' shapes;
//   except the position of an indexed view (`x[i]`, `x[a:b]`, `x.narrow(d, a, n)` with Python
//     ints that change every iteration, as a loop's batch start does): feeds too, checked against
//     the input's size (out of range: the call diverges and raises as eager does) and against
//     the traced output's size, the view's storage offset computed for each call.
// Outputs record their metadata (placeholders are made from it) and whether they alias an input
// (in-place and out= ops return the very tensor they were given).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph_runner.h"
#include "placeholder.h"
#include "thread_state.h"
#include "python_stack.h"

namespace terra::runtime {

// Two structural constants of a call are the same (what validation requires of them).
bool same_constant(const c10::IValue& a, const c10::IValue& b);

// A list of Python numbers (no tensors): what a `Scalar[]` argument holds.
bool is_number_list(const c10::IValue& v);

// How a validated call is executed during co-execution.
enum class ExecMode : uint8_t {
  Graph,      // issued to the GraphRunner; the program gets placeholders
  PythonNow,  // no tensor inputs and no randomness (empty, zeros, arange...): run at once, real
  Fetch,      // Python needs concrete values (item, nonzero, data-dependent shapes...): wait, run
};

struct ArgSpec {
  enum class Kind : uint8_t { Tensor, TensorList, Feed, Numbers, Storage, Constant } kind = Kind::Constant;
  c10::IValue constant;            // Constant
  uint8_t feed_tag = 0;            // Feed: the Python number's kind (int/float/complex/bool)
  // Numbers: a list of Python numbers in a `Scalar[]` argument (a foreach optimizer's per-parameter
  // step sizes and bias corrections, new every step): feeds, validated by length and kinds.
  std::vector<uint8_t> feed_tags;
  // Storage: an input like a tensor (a DataLoader batch rebuilt onto the shared-memory storage a
  // worker sent), validated by device and size, never by identity.
  c10::Device storage_device = c10::Device(c10::kCPU);
  size_t storage_nbytes = 0;
  std::vector<TensorMeta> metas;   // Tensor (one) or TensorList (one per element); empty if None
  std::vector<bool> present;       // TensorList of optional tensors: which entries are tensors
  std::vector<bool> wrapped;       // per tensor: a Python number wrapped as a 0-d tensor (a feed)
};

struct OutSpec {
  int alias_arg = -1;               // in-place/out= ops: index of the argument returned
  bool view = false;                // shares storage with input 0 (view ops)
  bool autograd_view = false;       // and eager made it an autograd view (`_base`; not detach's)
  bool none = false;                // an undefined tensor / None
  TensorMeta meta;
};

// The views whose position in their base comes from Python ints (see the top of this file).
enum class IndexedView : uint8_t { None, Select, Slice, Narrow };

struct OpTemplate {
  OpKind kind = OpKind::Aten;
  std::optional<c10::OperatorHandle> op;
  std::string name;                 // "aten::add.Tensor", "backward", ".grad", ".grad ="
  ExecMode mode = ExecMode::Graph;
  bool grad_mode = true;
  bool inference_mode = false;
  AutocastState autocast;           // thread_state.h
  GlobalState global;               // thread_state.h
  bool mutates_input = false;       // some argument is written (in-place / out=)
  // The arguments the op writes (bit i: argument i, for the first 64): those its schema marks
  // `(a!)`, and those it writes though its schema does not say so (batch_norm's and
  // instance_norm's running statistics: statistics_writes in op_template.cpp). Found once, when
  // traced: the program thread asks for every op it issues that writes (note_writes).
  uint64_t written_args = 0;
  bool writes_arg(size_t i) const { return i < 64 ? (written_args >> i & 1u) != 0 : writes_beyond(i); }
  bool writes_beyond(size_t i) const;  // an argument past the 64th, from the schema
  bool noop_alias = false;          // returns only its own arguments and writes nothing
  bool random = false;              // consumes the RNG (must stay in GraphRunner order)
  // For the random ops that draw nothing at a probability of 0 or outside training (dropout and
  // its kin; scaled_dot_product_attention on the CPU): the argument positions of that probability
  // and of the training flag (-1: none). See `draws`.
  int8_t random_p_arg = -1;
  int8_t random_train_arg = -1;
  bool random_cpu_only = false;     // the rule holds on the CPU only
  // Whether this call of a random op draws from the default generator: false where its
  // probability is 0 or it does not train (`p=0.0` dropouts of Hugging Face configs, and their
  // attention's `dropout_p=0.0`), so a later draw in the program thread need not wait for it.
  bool draws(const std::vector<c10::IValue>& args) const;
  bool scalar_outputs = false;      // every output is a 0-d tensor (host scalar candidate)
  // Some tensor argument is 0-d, on the CPU and outside autograd, not a wrapped Python number:
  // the call may read a host scalar (PythonRunner::issue scans the arguments for them only then,
  // or when the op writes an argument; a matching call's tensors have these metadata).
  bool host_scalar_args = false;
  // Bytes of the values its placeholders keep alive until its item is dropped (an in-place
  // result is its argument, which keeps nothing new alive; a view counts what it covers, a lower
  // bound of the storage it keeps): GraphRunner::reclaim batches items by it.
  uint64_t out_bytes = 0;
  // Some output is a view of an argument or an argument itself (the item may alias it).
  bool aliases_args = false;
  // May run as a host op in the program thread (PythonRunner::run_here), as far as the template
  // tells: writes no argument, CPU outputs up to kHostOpBytes, none aliasing an argument or
  // requiring grad. The arguments decide the rest, per call.
  bool host_candidate = false;
  static constexpr uint64_t kHostOpBytes = 64 * 1024;
  IndexedView indexed_view = IndexedView::None;
  // Its output placeholder may be kept and handed out again (placeholder.h, PlaceholderPool): one small
  // new tensor, not a view, from an ATen op.
  bool reuses_out = false;
  // Its output's PlaceholderPool::class_of, found at its first issue (program thread only).
  static constexpr uint32_t kNoPoolClass = UINT32_MAX - 1;
  mutable uint32_t pool_class = kNoPoolClass;
  static constexpr uint64_t kReuseBytes = 16 * 1024;
  std::vector<ArgSpec> args;
  std::vector<OutSpec> outs;        // flattened tensor outputs, in return order
  std::vector<int> return_sizes;    // per return: -1 tensor, n list of n, -2 None, -3 other
  // The op and where the program called it (made once, when traced; shared with the views and the
  // fallbacks at it).
  std::shared_ptr<const terra::SourceInfo> source;
  // The accelerator its tensor arguments live on (the first non-CPU one), if any: the GraphRunner
  // enqueues the op on the stream the program thread had current for it (streams.h).
  std::optional<c10::Device> accelerator;
  // Backward only: the leaves (of those the program reads .grad of) whose gradient it created or
  // accumulated when traced, and whether that set was the same in every trace.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> grads_after;
  // The leaves whose gradient it saw (the program had read or written it) in its last trace, by
  // target like `grads_after`: one seen and not reached keeps its gradient through this backward.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> grads_seen;
  bool backward_traced = false;
  bool grads_after_stable = true;
  // Co-executed runs created a gradient of a leaf not in `grads_after` (another model than the
  // traced one) in two iterations (`unpredicted`: such leaves seen once; a leaf made anew every
  // iteration, a perturbation with requires_grad=True, is never seen twice): the next run is
  // traced again to learn the new set (PythonRunner::coexec_op). Off for good where a relearning
  // is asked for again within kRelearnSpan iterations (models alternating every few steps).
  bool relearn = false;
  bool relearn_off = false;
  uint64_t relearned_iteration = 0;  // PythonRunner::iteration_serial_ of the last one (0: none)
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> unpredicted;
  static constexpr uint64_t kRelearnSpan = 16;
  // Backward only: it runs Python code (hooks, a custom Function's backward), so during
  // co-execution it runs in the program's thread after the GraphRunner has caught up.
  bool runs_python = false;

  // Records a call (arguments before execution) as a new template; outputs come later.
  static OpTemplate record(OpKind kind, const c10::OperatorHandle* op, const std::string& name,
                           const torch::jit::Stack& args);
  void record_outputs(const torch::jit::Stack& returns);
  // Output `out` was the very tensor passed as argument `arg` (seen when tracing).
  void mark_same_as_input(size_t out, int arg);
  // Does this call (same op, stack position) match the template? On mismatch `why` says how.
  bool matches(const torch::jit::Stack& args, std::string* why) const;
  std::string label() const;  // op name and output shapes, for export and explain
  // Indexed views: the output's storage offset for this (matching) call.
  int64_t view_offset(const torch::jit::Stack& args) const;

 private:
  void derive_from_aliases();  // noop_alias, out_bytes, aliases_args, host_candidate, from outs
};

// Identity of an op for LocationKeys: the schema's address for ATen ops, small ids otherwise.
uint64_t op_identity(OpKind kind, const c10::OperatorHandle* op);

}  // namespace terra::runtime
