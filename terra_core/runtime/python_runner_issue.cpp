// PythonRunner, issue: a validated op becomes a work item for the GraphRunner with placeholders
// for its outputs, or runs here (views of real tensors, host scalars, ops on memory only the
// program reaches), or waits for its inputs (a fetch).
#include "python_runner.h"

#include "backward_hooks.h"
#include "openmp_team.h"
#include "runner_allocator.h"
#include "terra/location_key.h"
#include "timeline.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <pthread.h>

#include "python_runner_parts.h"

namespace terra::runtime {

using namespace runner_parts;

namespace {

// A real tensor that only the program thread can reach: the op's stack and one owner (the
// caller) hold its TensorImpl, and no other tensor shares its storage. No pending item reads or
// writes it, and no autograd node saved it (each would hold a reference), so an op that changes
// it in place needs nothing from the GraphRunner: `torch.tensor(data)` ends with `detach_()` on
// the tensor it just made, which Hugging Face models call in every forward (an empty key/value
// cache per layer), and that fetch waited for everything issued (hf_llama: 2 waits of 1-4 ms
// per step).
bool program_only(const at::Tensor& x, const torch::jit::Stack& stack, bool returned) {
  if (!x.defined() || as_placeholder(x)) return false;
  size_t refs = 1 + returned;  // the caller's, and PythonRunner::keep_returned's
  for (const c10::IValue& v : stack)
    refs += v.isTensor() && v.toTensor().unsafeGetTensorImpl() == x.unsafeGetTensorImpl();
  return x.use_count() == refs && (!x.has_storage() || x.storage().use_count() == 1);
}

// Memory the program can change without a PyTorch op: a tensor made over a buffer it does not
// own (`torch.from_numpy`, `torch.frombuffer`, DLPack: ATen's from_blob with a deleter). The
// program writes it through NumPy at any time (an RL observation buffer filled in place each
// step), so an op reading it reads it when issued, as eagerly, never when the GraphRunner runs.
const c10::DeleterFnPtr kFromBlobDeleter =
    c10::InefficientStdFunctionContext::makeDataPtr(nullptr, [](void*) {}, c10::Device(c10::kCPU)).get_deleter();

bool from_blob(const at::Tensor& x) {  // x: not a placeholder
  return x.defined() && x.has_storage() && x.storage().data_ptr().get_deleter() == kFromBlobDeleter;
}

// No two elements of `t` share memory (ATen's has_internal_overlap answers "too hard" for any
// tensor that is not dense): dims ordered by stride, each stride passes the span of the smaller.
bool non_overlapping(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return true;
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the largest offset the smaller dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return false;
    span += stride * (size - 1);
  }
  return true;
}

}  // namespace

// Issuing an op, in steps: wait out a parallel region of the GraphRunner's, prepare the
// arguments, take a free work item and fill it, note the writes and host scalars, make the
// outputs' placeholders, hand the item over, and keep pace with the GraphRunner.
void PythonRunner::issue(uint32_t node_id, const OpTemplate& t, torch::jit::Stack* stack) {
  if (t.noop_alias) {  // the op returns arguments unchanged: nothing to run
    torch::jit::Stack returns;
    for (const OutSpec& o : t.outs) returns.push_back((*stack)[static_cast<size_t>(o.alias_arg)]);
    *stack = std::move(returns);
    return;
  }
  if (TeamRegion::is_open()) yield_to_parallel_region();
  bool wait_done = prepare_arguments(t, stack);
  // A backward reads saved memory the program may change next (python_memory_saved_).
  if (t.kind == OpKind::Backward) wait_done = wait_done || std::exchange(python_memory_saved_, false);
  if (!own_made_.empty()) forget_own_made(t, *stack);
  GraphRunner& r = runner();
  // The fast path holds the GIL; the dispatcher route is asked (it usually runs without).
  const bool gil = fast_ || PyGILState_Check();
  dead_.check(r.lightened(), gil);  // what the program dropped since the last issue
  WorkItem& item = free_item(r);
  const uint64_t seq = r.issued() + 1;
  fill_item(item, node_id, t, *stack, seq);
  note_writes(node_id, t, *stack, seq);
  make_outputs(item, node_id, t, *stack, seq, /*reuse=*/gil && t.reuses_out);
  // Buffers circulate instead of being allocated: the item takes the arguments' vector, the
  // caller's stack takes the returns' (scratch) vector, scratch takes the item's old empty one.
  item.args.clear();
  item.args.swap(*stack);
  stack->swap(scratch_);
  dead_.watch(item.args, seq);
  r.issue(t.out_bytes);
  if (wait_done) {
    // The op writes or aliases memory the program may change itself: it runs now, and its
    // outputs are real tensors over that memory, which later ops then see as such.
    wait_for(seq, t.name);
    for (const c10::IValue& v : *stack) for_each_tensor(v, [&](const at::Tensor& x) { fill(x); });
  }
  keep_pace(r, gil);
}

void PythonRunner::yield_to_parallel_region() {  // a parallel region of the GraphRunner's wants this core
  const int64_t start = now_ns();
  {
    GilReleased unlocked;
    TeamRegion::wait_out();
  }
  ++graph_->yields_to_parallel_regions;
  graph_->yielded_seconds += static_cast<double>(now_ns() - start) * 1e-9;
}

WorkItem& PythonRunner::free_item(GraphRunner& r) {
  if (r.has_room()) return r.next_item();
  GilReleased unlocked;  // the ring is full: never wait holding the GIL
  return r.next_item();
}

void PythonRunner::fill_item(WorkItem& item, uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args,
                             uint64_t seq) {
  if (t.draws(args)) {
    last_random_item_ = seq;
    random_item_iteration_ = iteration_serial_;
  }
  item.kind = t.kind;
  item.op = t.op ? &*t.op : nullptr;
  item.grad_mode = t.grad_mode;
  item.inference_mode = t.inference_mode;
  item.autocast = t.autocast;
  item.node = node_id;
  item.expect = &t.outs;
  item.sequence_floor = at::sequence_number::peek();
  item.num_threads = at::get_num_threads();  // as the program has it now (thread_state.h)
  item.iteration = iteration_serial_;
  item.graph = graph_->serial;
  item.stream = t.accelerator ? current_stream(*t.accelerator) : std::nullopt;
  item.garbage.swap(graveyard_);  // emptied by the GraphRunner: the vectors circulate
}

void PythonRunner::note_writes(uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args, uint64_t seq) {
  // Record writes (so a later fetch waits for them) and which host scalars the GraphRunner uses,
  // in one pass over the arguments.
  if (t.kind == OpKind::Backward || t.kind == OpKind::GradWrite) {
    last_external_write_ = seq;
    last_write_backward_ = t.kind == OpKind::Backward ? node_id : kNoNode;
    if (t.kind == OpKind::Backward) {
      previous_backward_ = last_backward_;
      last_backward_ = seq;
      last_backward_node_ = node_id;
    }
  }
  if (!t.op || !(t.mutates_input || t.host_scalar_args)) return;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool writes = t.mutates_input && t.writes_arg(i);  // a bit test: this runs per op
    // Host scalars inside tensor lists count too: `_foreach_add_(state_steps, 1)` writes
    // Adam's `step` tensors, which the optimizer then reads with `.item()`.
    for_each_tensor(args[i], [&](const at::Tensor& x) {
      if (host_scalar(x)) {
        ScalarUse& use = scalar_use_[x.storage().unsafeGetStorageImpl()];
        (writes ? use.write : use.read) = seq;
      }
      if (!writes) return;
      auto* p = as_placeholder(x);
      // The program sees the version an in-place op gives its tensor at once, as eagerly (the
      // GraphRunner's op bumps the value's counter, which the placeholder takes when filled).
      // A view of a real tensor shares no counter with it (make_output).
      if (p && p->version_counter().enabled()) p->bump_version();
      if (p && p->group()) {
        p->group()->last_write = seq;
      } else {
        last_external_write_ = seq;
        last_write_backward_ = kNoNode;
      }
    });
  }
}

void PythonRunner::make_outputs(WorkItem& item, uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args,
                                uint64_t seq, bool reuse) {
  Outputs out{item, node_id, t, args, seq, reuse, /*inference=*/false, /*base_group=*/nullptr};
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      if (auto* p = as_placeholder(v.toTensor())) out.base_group = &p->group();
      break;
    }
  }
  item.outs.assign(t.outs.size(), nullptr);
  // An ATen op's template matched the call, inference mode included: no thread-state lookup.
  out.inference = t.kind == OpKind::Aten ? t.inference_mode : c10::InferenceMode::is_enabled();
  torch::jit::Stack& returns = scratch_;
  returns.clear();
  size_t k = 0;
  for (int n : t.return_sizes) {
    if (n == -1) {
      returns.emplace_back(make_output(out, k++));
    } else if (n >= 0) {
      c10::List<at::Tensor> list;
      for (int i = 0; i < n; ++i) list.push_back(make_output(out, k++));
      returns.emplace_back(std::move(list));
    } else {
      ++k;
      returns.emplace_back();
    }
  }
}

at::Tensor PythonRunner::make_output(const Outputs& out, size_t index) {
  const OpTemplate& t = out.t;
  const torch::jit::Stack& args = out.args;
  const OutSpec& o = t.outs[index];
  if (o.alias_arg >= 0) return args[static_cast<size_t>(o.alias_arg)].toTensor();
  if (o.none) return at::Tensor();
  // Dropped placeholders are reused with the GIL only (the C fast path): the pool works with
  // Python objects, and a node issued through the dispatcher route (the GIL released) would fill
  // it with what it never takes.
  if (out.reuse) {  // an ATen op's new output (OpTemplate::reuses_out), with a slot of its own
    std::shared_ptr<Slot> slot;
    if (t.pool_class == OpTemplate::kNoPoolClass) t.pool_class = pool_.class_of(o.meta);
    if (at::Tensor p = pool_.take(t.pool_class, o.meta, out.inference, out.seq, &slot); p.defined()) {
      ++graph_->placeholders_reused;
      out.item.outs[index] = std::move(slot);
      return p;  // still in live_
    }
  }
  auto slot = std::allocate_shared<Slot>(PoolAllocator<Slot>());
  slot->seq = out.seq;
  slot->runner_allocated = t.kind == OpKind::Aten;
  std::shared_ptr<AliasGroup> group;
  if (t.kind == OpKind::Aten) group = !o.view ? own_group(slot) : out.base_group ? *out.base_group : nullptr;
  // In inference mode a view of a normal tensor is a normal tensor, as eager makes it (a
  // placeholder made there would be an inference tensor, without a version counter to share).
  const bool normal_view = o.view && out.inference && !args.empty() && args[0].isTensor() &&
                           !args[0].toTensor().is_inference();
  std::optional<c10::InferenceMode> not_inference;
  if (normal_view) not_inference.emplace(false);
  at::Tensor p = make_placeholder(o.meta, slot, std::move(group));
  not_inference.reset();
  // A view of a placeholder shares its version counter, as eagerly (outside inference mode).
  // Not one of a real tensor: the GraphRunner's ops bump that counter themselves.
  if (o.view && !out.inference && !args.empty() && args[0].isTensor() && args[0].toTensor().defined()) {
    const PlaceholderImpl* base = as_placeholder(args[0].toTensor());
    if (base && base->version_counter().enabled())
      p.unsafeGetTensorImpl()->set_version_counter(base->version_counter());
  }
  if (o.autograd_view && !args.empty() && args[0].isTensor() && args[0].toTensor().defined()) {
    // `_base` as eager's autograd view gives it: the root of the input's views.
    const at::Tensor& in = args[0].toTensor();
    const PlaceholderImpl* in_p = placeholder_impl(in);
    at::Tensor root = in;
    if (in_p && in_p->view_base().defined()) root = in_p->view_base();
    else if (!in_p && in.is_view()) root = at::Tensor(in._base());
    static_cast<PlaceholderImpl*>(p.unsafeGetTensorImpl())->set_view_base(std::move(root));
  }
  if (t.indexed_view != IndexedView::None) p.unsafeGetTensorImpl()->set_storage_offset(t.view_offset(args));
  if (out.reuse) static_cast<PlaceholderImpl*>(p.unsafeGetTensorImpl())->set_reuse_class(t.pool_class);
  out.item.outs[index] = std::move(slot);
  live_.emplace_back(p.getIntrusivePtr());
  return p;
}

void PythonRunner::keep_pace(GraphRunner& r, bool gil) {
  // Drop executed items soon: their outputs die, so the allocator reuses warm memory.
  r.reclaim(/*all=*/false, gil ? &pool_ : nullptr);
  const uint64_t done = r.done();  // one load of the line the GraphRunner writes per item
  const uint64_t ahead = r.issued() - done;
  if (ahead > kAheadHigh || (ahead > 1 && r.pending_bytes(done) > kAheadBytes)) {
    // Far ahead of the GraphRunner: sleep until it has caught up halfway, leaving the cores to
    // it (and its intra-op threads) instead of competing with them for work Python cannot use yet.
    GilReleased unlocked;
    r.wait_for(r.issued() - std::min(kAheadLow, ahead / 2), /*spin=*/false);
  }
}

bool PythonRunner::prepare_arguments(const OpTemplate& t, torch::jit::Stack* stack) {
  // Two things the GraphRunner cannot see happen to arguments outside the dispatcher, checked in
  // one pass over them:
  // - A placeholder the program made a leaf (`torch.randn(..., requires_grad=True)`; see
  //   PlaceholderImpl::born_requiring_grad) is filled now: the GraphRunner then records the op's
  //   history on the leaf itself, so its `.grad` is the one the program reads, in co-execution and
  //   after a divergence alike. Given the value, it ran the op without history (an error: the
  //   output was traced requiring grad).
  // - An argument over memory the program changes without ops (python_memory) is read as it is
  //   now: a copy goes to the GraphRunner. A written argument, one an output aliases, one in a
  //   list, one whose elements overlap (an expanded one) or a large one (a dataset from
  //   from_numpy indexed each step: a copy would be a pass over all of it per op) is not copied;
  //   the op runs before the program goes on (returns true). The copy an op that records
  //   autograd history gets (an output requires grad) may be saved by autograd (`y * shared`
  //   saves `shared`), and eager's backward reads the memory as it is when the backward runs:
  //   python_copies_ keeps it until the next Backward item, which brings it up to date first
  //   where the program changed the memory since (refresh_python_copies); such an op that runs
  //   at once has the memory itself saved, and the next Backward item then runs before the
  //   program goes on too (python_memory_saved_).
  constexpr size_t kCopyBytes = size_t{1} << 20;
  bool run_now = false;
  // Whether the op records autograd history: asked only for such memory, which few ops read.
  auto records_history = [&t] {
    return std::any_of(t.outs.begin(), t.outs.end(), [](const OutSpec& o) { return o.meta.requires_grad; });
  };
  for (size_t i = 0; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) {
        for_each_tensor(v, [&](const at::Tensor& x) {
          if (as_placeholder(x) || !python_memory(x)) return;
          run_now = true;
          python_memory_saved_ = python_memory_saved_ || records_history();
        });
      }
      continue;
    }
    const at::Tensor& x = v.toTensor();
    if (const auto* p = as_placeholder(x)) {
      if (!p->born_requiring_grad() && !p->detached() && p->requires_grad()) fill(x);
      continue;
    }
    if (!python_memory(x)) continue;
    bool aliased = !t.op || alias_info(t, i);
    for (const OutSpec& o : t.outs) aliased = aliased || o.view || o.alias_arg == static_cast<int>(i);
    // The copy has the tensor's sizes and strides (as validated), over a buffer of its own: a
    // column slice of a batch too (detector_numpy_nms's box targets, `t[..., 1:3]`, made every
    // loss op wait for all the work before it).
    const bool history = records_history();
    if (aliased || (history && python_copies_.size() >= kMaxPythonCopies) || !non_overlapping(x) ||
        at::detail::computeStorageNbytes(x.sizes(), x.strides(), x.itemsize()) > kCopyBytes) {
      python_memory_saved_ = python_memory_saved_ || history;
      run_now = true;
      continue;
    }
    c10::impl::ExcludeDispatchKeyGuard below(kTerraKey);
    at::Tensor copy = at::empty_strided(x.sizes(), x.strides(), x.options()).copy_(x);
    if (history) python_copies_.emplace_back(copy, x);
    v = std::move(copy);
  }
  return run_now;
}

void PythonRunner::refresh_python_copies(const torch::jit::Stack& backward_args) {
  c10::impl::ExcludeDispatchKeyGuard below(kTerraKey);
  bool changed = false;
  for (const auto& [copy, memory] : python_copies_) changed = changed || !at::equal(copy, memory);
  if (changed) {
    // The ops that read the copies must have run first: they read the values of their time.
    if (runner_) {
      wait_for(runner_->issued(), "backward");
      raise_if_failed();
    }
    // Below ADInplaceOrView: no version bump, which autograd would take for an in-place change
    // of what it saved (eager's saved tensor changed without one too: the memory under it).
    at::AutoDispatchBelowADInplaceOrView no_version_bump;
    for (auto& [copy, memory] : python_copies_) copy.copy_(memory);
  }
  // A graph kept for another backward (retain_graph) keeps its copies watched.
  const bool retain = backward_args.size() > 2 && backward_args[2].isBool() && backward_args[2].toBool();
  if (!retain) python_copies_.clear();
}

uint64_t PythonRunner::needed_seq(const c10::IValue& v) const {
  uint64_t need = 0;
  for_each_tensor(v, [&](const at::Tensor& t) {
    if (auto* p = as_placeholder(t)) {
      need = std::max({need, p->slot()->seq, p->group() ? p->group()->last_write : last_external_write_});
    } else if (host_scalar(t)) {
      auto it = scalar_use_.find(t.storage().unsafeGetStorageImpl());
      if (it != scalar_use_.end()) need = std::max(need, it->second.write);
    } else if (!own_made(t)) {
      need = std::max(need, last_external_write_);
    }
  });
  return need;
}

bool PythonRunner::own_made(const at::Tensor& x) const {
  if (own_made_.empty() || !x.defined() || as_placeholder(x)) return false;
  const c10::StorageImpl* s = x.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  return s && own_made_.count(s) != 0;
}

void PythonRunner::note_own_made(const OpTemplate& t, const torch::jit::Stack& returns, bool inputs_own_made) {
  if (mode_ != Mode::CoExec) return;
  if (own_made_.size() > own_made_prune_at_) {
    for (auto pos = own_made_.begin(); pos != own_made_.end();)
      pos = pos->second.expired() ? own_made_.erase(pos) : std::next(pos);
    own_made_prune_at_ = std::max(kOwnMadePruneAt, 2 * own_made_.size());
  }
  size_t k = 0;
  for (const c10::IValue& r : returns) {
    for_each_tensor(r, [&](const at::Tensor& x) {
      const size_t index = k++;
      // An output that may alias an argument is new memory only where every tensor argument was
      // own-made (an alias of one then shares its storage, already noted).
      if (!inputs_own_made && index < t.outs.size() && (t.outs[index].view || t.outs[index].alias_arg >= 0))
        return;
      if (!x.defined() || as_placeholder(x) || !x.device().is_cpu() || x.is_sparse()) return;
      const c10::Storage& storage = x.unsafeGetTensorImpl()->unsafe_storage();
      if (!storage) return;
      own_made_.try_emplace(storage.unsafeGetStorageImpl(),
                            c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()));
    });
    if (r.isNone()) ++k;
  }
}

void PythonRunner::forget_own_made(const OpTemplate& t, const torch::jit::Stack& args) {
  if (!t.mutates_input && !t.aliases_args && t.op && t.kind == OpKind::Aten) return;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& x) {
      if (!x.defined() || as_placeholder(x)) return;
      own_made_.erase(x.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
    });
  }
}

bool PythonRunner::run_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  if (!t.host_candidate || (own_made_.empty() && !t.random)) return false;
  bool here = true;
  for (const c10::IValue& v : *stack) {
    if (v.isGenerator()) return false;
    for_each_tensor(v, [&](const at::Tensor& x) {
      if (!here || !x.defined() || x.unsafeGetTensorImpl()->is_wrapped_number()) return;
      // Inputs as small as the outputs: below ATen's grain size, so no parallel region starts
      // in the program thread while the GraphRunner may hold the OpenMP team (openmp_team.h).
      here = own_made(x) && !x.requires_grad() && x.device().is_cpu() && x.nbytes() <= OpTemplate::kHostOpBytes;
    });
    if (!here) return false;
  }
  // The default generator is drawn in program order: a random op runs here after every random
  // item issued before it has run, so only where waiting for them leaves the GraphRunner work:
  // none issued in this iteration yet, and at least kRandomLead items issued after the last one
  // (a step's first draw waits for the previous step's last dropout while its backward and update
  // are queued). Waiting for a random item near the end of the queue cost more than it saved
  // (corpus p32: 30 waits of 3.5 ms at a small randn, for a large one at the previous step's end).
  // Item counts, not times: which ops run here depends on the program alone (block replay needs
  // a step's items to be the same from step to step).
  if (t.random && last_random_item_ != 0) {
    if (random_item_iteration_ == iteration_serial_ || runner().issued() - last_random_item_ < kRandomLead)
      return false;
    wait_for(last_random_item_, t.name);
    raise_if_failed();
  }
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  note_own_made(t, *stack, /*inputs_own_made=*/true);
  return true;
}

bool PythonRunner::run_view_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  if (t.mutates_input || t.random || t.outs.empty()) return false;
  for (const OutSpec& o : t.outs)
    if (!o.view) return false;
  bool python = false;
  for (const c10::IValue& v : *stack) {
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) return false;
      continue;
    }
    const at::Tensor& x = v.toTensor();
    // Without autograd history: the view's own (an autograd view node) would be made here.
    if (!x.defined() || as_placeholder(x) || x.requires_grad() || !x.device().is_cpu()) return false;
    python = python || python_memory(x);
  }
  if (!python) return false;
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  return true;
}

bool PythonRunner::run_on_host(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  uint64_t need = 0;
  bool any = false;
  for (size_t i = 0; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) return false;
      continue;
    }
    const at::Tensor& x = v.toTensor();
    if (x.unsafeGetTensorImpl()->is_wrapped_number()) continue;
    if (!host_scalar(x)) return false;
    any = true;
    auto it = scalar_use_.find(x.storage().unsafeGetStorageImpl());
    if (t.writes_arg(i) && it != scalar_use_.end()) return false;  // the runner uses it
    if (it != scalar_use_.end()) need = std::max(need, it->second.write);
  }
  if (!any) return false;
  wait_for(need, t.name);
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  return true;
}

void PythonRunner::run_fetch(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  // What the op reads must have been computed; what it changes in place must no longer be read
  // by a pending item: only a tensor the program alone holds is known not to be.
  uint64_t need = 0;
  bool writes_shared = false;
  for (size_t i = 0; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && program_only(v.toTensor(), *stack, is_returned(v.toTensor()))) continue;
    need = std::max(need, needed_seq(v));
    writes_shared = writes_shared || !t.op || t.writes_arg(i);
  }
  if (t.mutates_input && writes_shared) need = runner().issued();
  wait_for(need, t.name);
  raise_if_failed();
  for (c10::IValue& v : *stack) v = resolve_placeholders(v);
  advance_sequence(runner().sequence());
  exec(stack);
}

bool PythonRunner::python_memory(const at::Tensor& x) const {  // x: not a placeholder
  if (from_blob(x)) return true;
  if (exposed_.empty() || !x.defined() || !x.has_storage()) return false;
  auto it = exposed_.find(x.storage().unsafeGetStorageImpl());
  return it != exposed_.end() && it->second.storage.lock().get() == it->first;
}

}  // namespace terra::runtime
