#include "block_replay.h"

#include "backward_hooks.h"
#include "elementwise_replay.h"
#include "graph_runner.h"
#include "op_template.h"
#include "openmp_team.h"
#include "out_form.h"
#include "placeholder.h"
#include "terra/location_key.h"
#include "verdicts.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/function.h>  // Node (node.h of its own from torch 2.12 on)
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <typeinfo>
#include <unordered_set>

namespace terra::runtime {

namespace {

// The hook's key: a functionality key below autograd and ADInplaceOrView (and below the Python
// key), above the backends, that nothing in PyTorch registers kernels for.
constexpr c10::DispatchKey kRecordKey = c10::DispatchKey::Fake;

thread_local BlockRecorder* t_recorder = nullptr;
// The recorder of a backward being recorded, for the autograd engine's device thread: an
// accelerator's backward runs there, not on the GraphRunner thread that called it (the engine
// carries the GraphRunner's dispatch-key TLS over, so the hook runs there, without `t_recorder`).
// Set while the GraphRunner waits in a backward with an accelerator's nodes (RecordingScope);
// its kernels reach the recorder one at a time under `g_backward_mutex`. A CPU backward runs on
// the GraphRunner thread alone and takes neither.
std::atomic<BlockRecorder*> g_backward_recorder{nullptr};
std::mutex g_backward_mutex;
thread_local BlockReplayer* t_binder = nullptr;  // binding an item's kernels (BlockReplayer::bind)
thread_local int t_depth = 0;  // nesting of kernel calls under the recorded one

// Whether the kernel that runs for `keys` (below the hook) is the op's CompositeImplicitAutograd
// one, which calls other ops. A kernel of the backend itself, or a CompositeExplicitAutograd one,
// wins over it: silu_backward has both a CompositeImplicitAutograd kernel (for other backends) and
// a CPU one, and on the CPU it is one kernel.
bool decomposes(const c10::OperatorHandle& op, c10::DispatchKeySet keys) {
  using c10::DispatchKey;
  const DispatchKey backend =
      (keys - c10::DispatchKeySet({DispatchKey::BackendSelect, DispatchKey::Python})).highestPriorityTypeId();
  // Known answers by operator and backend (recording and binding only).
  thread_local std::unordered_map<uint64_t, bool> known;
  const uint64_t key = terra::hash_combine(reinterpret_cast<uintptr_t>(&op.schema()),
                                           static_cast<uint64_t>(backend));
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  const bool d = op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) &&
                 !op.hasKernelForDispatchKey(backend) &&
                 !op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) &&
                 !op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional);
  known.emplace(key, d);
  return d;
}

// Whether a kernel with these arguments runs on the CPU: no argument is a tensor or a device of
// an accelerator (a factory's device argument; a CPU scalar tensor with a CUDA one runs on CUDA).
bool on_cpu(c10::ArrayRef<c10::IValue> args) {
  auto off_cpu = [](const c10::IValue& v) {
    if (v.isTensor()) return v.toTensor().defined() && !v.toTensor().is_cpu();
    if (v.isDevice()) return !v.toDevice().is_cpu();
    return false;
  };
  for (const c10::IValue& v : args) {
    if (off_cpu(v)) return false;
    if (v.isList()) {  // tensor lists too
      const auto list = v.toList();
      for (size_t e = 0; e < list.size(); ++e)
        if (off_cpu(list.get(e))) return false;
    }
  }
  return true;
}

// Whether the autograd engine runs `n` on an accelerator's device thread: a gradient it receives
// lives on an accelerator (its input metadata's device).
bool node_on_accelerator(const torch::autograd::Node& n) {
  for (uint32_t i = 0; i < n.num_inputs(); ++i)
    if (!n.input_metadata(i).device().is_cpu()) return true;
  return false;
}

// Whether a kernel with these arguments is known to give the program's bits with one thread
// (verdicts.h).
bool known_one_thread(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const torch::jit::Stack& stack);

// A warning handler that drops what it is given: for kernels run again to check them.
c10::WarningHandler& discarded_warnings() {
  struct Discard : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  static Discard discard;
  return discard;
}
bool large_for_threads(const c10::IValue& v);

// Whether a kernel run with more than one intra-op thread opens a parallel region the program
// thread should yield its core to (TeamRegion): a large one, or one whose bits need the thread
// count, which splits its work by thread whatever its size (layer_norm's backward on 16k
// elements, below the grain size `large` is measured by).
bool opens_region(const RecordedKernel& k) { return k.large || !k.one_thread; }

// A kernel call the hook handles: the calls it makes pass through.
struct Nested {
  Nested() { ++t_depth; }
  ~Nested() { --t_depth; }
};

// One intra-op thread while it lives, where `on` and the program has more.
class OneThread {
 public:
  explicit OneThread(bool on) : restore_(on && at::get_num_threads() > 1 ? at::get_num_threads() : 0) {
    if (restore_) set_intraop_threads(1);
  }
  bool active() const { return restore_ != 0; }  // it took the thread count down to one
  ~OneThread() {
    if (restore_) set_intraop_threads(restore_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int restore_;
};

void record_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRecordKey);
  // An op that decomposes (its CompositeImplicitAutograd kernel runs: reached here when it is
  // called below autograd) is not a kernel: what it calls is bound, recorded or chosen for
  // instead. Its schema need not say what its parts write (batch_norm's running statistics).
  const bool kernel = t_depth == 0 && !decomposes(op, below);
  if (BlockReplayer* b = t_binder; b && kernel) {
    Nested nested;
    b->bind_kernel(op, below, stack);
    return;
  }
  BlockRecorder* r = t_recorder;
  const bool device_thread = !r && (r = g_backward_recorder.load(std::memory_order_acquire)) != nullptr;
  if (!r) {
    // An item run op by op outside a recording (a RecordingScope without a recorder): a kernel
    // that a recording found to give the same bits with one thread runs with one, as replayed.
    if (!kernel) {
      op.redispatchBoxed(below, stack);  // a decomposition's parts are chosen for one by one
      return;
    }
    if (!known_one_thread(op, below, *stack)) {
      if (at::get_num_threads() > 1 && std::any_of(stack->begin(), stack->end(), large_for_threads))
        note_parallel_region();
      op.redispatchBoxed(below, stack);
      return;
    }
    Nested nested;
    OneThread threads(true);
    op.redispatchBoxed(below, stack);
    return;
  }
  if (!kernel) {
    op.redispatchBoxed(below, stack);
    return;
  }
  // Held while the kernel runs: the calls it makes pass through (Nested) without taking it.
  std::unique_lock<std::mutex> serial(g_backward_mutex, std::defer_lock);
  if (r->device_backward()) serial.lock();
  if (r->refused()) {
    if (serial.owns_lock()) serial.unlock();  // what it calls comes back here as kernels
    op.redispatchBoxed(below, stack);
    return;
  }
  Nested nested;
  r->kernel_begin(op, below, *stack, device_thread);
  const auto start = std::chrono::steady_clock::now();
  {
    OneThread threads(r->one_thread_known());
    op.redispatchBoxed(below, stack);
  }
  r->kernel_end(*stack, std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - start).count());
  r->check_one_thread(op, below, *stack);
}

// Dispatch keys of tensors whose kernels the hook would not see as eager runs them.
const c10::DispatchKeySet kUnreplayableKeys({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative,
                                             c10::DispatchKey::ZeroTensor, c10::DispatchKey::Python,
                                             c10::DispatchKey::Functionalize,
                                             c10::DispatchKey::PythonTLSSnapshot});

// Two Python numbers (or constants) of a call are the same argument: floats bitwise (-0.0 is not
// 0.0, a kernel may tell them apart), everything else as validation compares constants.
// A list argument whose elements the block names one by one (tensors, or None among them): not
// the lists of numbers and constants a kernel takes by value.
bool holds_tensors(const c10::IValue& v) {
  return v.isTensorList() ||
         (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList() && !is_number_list(v));
}

bool same_number(const c10::IValue& a, const c10::IValue& b) {
  if (a.isDouble() && b.isDouble()) {
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  if (a.isComplexDouble() && b.isComplexDouble()) {
    const auto x = a.toComplexDouble(), y = b.toComplexDouble();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  if (a.isDouble() != b.isDouble() || a.isComplexDouble() != b.isComplexDouble()) return false;
  if (is_number_list(a) && is_number_list(b)) {  // a foreach op's step sizes: bit for bit too
    auto la = a.toList(), lb = b.toList();
    if (la.size() != lb.size()) return false;
    for (size_t i = 0; i < la.size(); ++i)
      if (!same_number(la.get(i), lb.get(i))) return false;
    return true;
  }
  return same_constant(a, b);
}

struct StorageKey {
  const c10::StorageImpl* storage;
  int64_t offset;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  bool operator<(const StorageKey& o) const {
    return std::tie(storage, offset, dtype, sizes, strides) <
           std::tie(o.storage, o.offset, o.dtype, o.sizes, o.strides);
  }
  static StorageKey of(const at::Tensor& t) {
    return {t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.scalar_type(),
            t.sizes().vec(), t.strides().vec()};
  }
};

// Where a backward from `roots` starts: their grad_fn, or a leaf root's gradient accumulator.
std::vector<torch::autograd::Node*> root_nodes(const std::vector<at::Tensor>& roots) {
  std::vector<torch::autograd::Node*> nodes;
  for (const at::Tensor& r : roots) {
    auto edge = torch::autograd::impl::gradient_edge(r);
    if (edge.function) nodes.push_back(edge.function.get());
  }
  return nodes;
}

// Copies of the tensors of `s`, each made by `make`, keeping what a kernel reads besides the values:
// a tensor passed twice is one copy passed twice (AMSGrad's `torch.maximum(a, b, out=a)`: with two
// copies the kernel no longer writes its input, and the check called the block unfit for one
// thread), and a wrapped number (a Python scalar the binding made a 0-dim tensor) stays one, as
// type promotion reads it (a 0-dim float64 tensor in its place promoted clip_grad_norm_'s `1e-6`
// additions to float64).
template <typename Make>
torch::jit::Stack copy_stack(const torch::jit::Stack& s, Make&& make) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> made;
  auto one = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    auto [it, fresh] = made.try_emplace(t.unsafeGetTensorImpl());
    if (fresh) {
      it->second = make(t);
      c10::TensorImpl* c = it->second.unsafeGetTensorImpl();
      if (c != t.unsafeGetTensorImpl() && t.unsafeGetTensorImpl()->is_wrapped_number())
        c->set_wrapped_number(true);
    }
    return it->second;
  };
  torch::jit::Stack out;
  for (const c10::IValue& v : s) out.push_back(map_tensors(v, one));
  return out;
}

// Copies of arguments for a kernel to write without touching the originals: tensors cloned with
// their strides (so the kernel takes the same path); tensors with internal overlap, which no
// kernel may write, and everything else shared.
torch::jit::Stack deep_copy_all(const torch::jit::Stack& s) {
  return copy_stack(s, [](const at::Tensor& t) {
    if (at::has_internal_overlap(t) == at::MemOverlap::Yes) return t;
    at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
    c.copy_(t);
    return c;
  });
}

// Copies of `s` whose floating-point tensors hold generic values (uniform in [0.25, 0.75): inexact
// sums, valid probabilities, positive for roots and logarithms); other tensors (indices, masks)
// keep theirs. Drawn from a generator of its own.
// `wide`: magnitudes spread over 2^-20..2^20 too (2^-6..2^6 for 16-bit floats) (still positive: log, sqrt and the like stay
// finite), so that sums in another order round differently more often.
torch::jit::Stack generic_copy(const torch::jit::Stack& s, bool wide) {
  static at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12345);
  return copy_stack(s, [&](const at::Tensor& t) {
    if (!t.is_floating_point() || at::has_internal_overlap(t) == at::MemOverlap::Yes) return t;
    at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
    c.uniform_(0.25, 0.75, gen);  // (takes the generator's lock)
    const double e = c.element_size() < 4 ? 6 : 20;  // float16 ends at 65504
    if (wide) c.mul_(at::empty_like(c).uniform_(-e, e, gen).exp2_());
    return c;
  });
}

// Same metadata and the same bits (a NaN anywhere counts as a difference: conservative).
bool bitwise_equal(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() && b.isTensor()) {
    const at::Tensor &x = a.toTensor(), &y = b.toTensor();
    if (x.defined() != y.defined()) return false;
    if (!x.defined()) return true;
    return x.sizes() == y.sizes() && x.strides() == y.strides() && x.scalar_type() == y.scalar_type() &&
           at::equal(x, y);
  }
  if (a.isTensorList() && b.isTensorList()) {
    auto x = a.toTensorList(), y = b.toTensorList();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!bitwise_equal(x.get(i), y.get(i))) return false;
    return true;
  }
  if (a.isTensor() || b.isTensor() || a.isTensorList() || b.isTensorList()) return false;
  if (a.isList() && b.isList()) {  // e.g. Tensor?[]
    auto x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!bitwise_equal(x.get(i), y.get(i))) return false;
    return true;
  }
  return same_number(a, b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Recording

struct BlockRecorder::Impl {
  Block block;
  // The running view kernel's input geometry, completed by kernel_end (AliasGeometry).
  std::shared_ptr<AliasGeometry> alias;
  const c10::StorageImpl* alias_storage = nullptr;
  std::unordered_map<const c10::TensorImpl*, Ref> by_impl;
  std::map<StorageKey, Ref> by_storage;
  // Weak references keep every recorded TensorImpl and StorageImpl address from being reused
  // while the iteration records, without changing a reference count eager execution reads
  // (AccumulateGrad steals a gradient only when nothing else holds it).
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> kept;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> kept_storage;
  std::vector<bool> is_load;  // by table index: re-read from an item (not made by a kernel)
  std::vector<std::pair<uint32_t, uint32_t>> load_at;  // by table index: (item, load) of a load
  // Tensors a kernel made or an item returned, and the items whose placeholders the program may
  // hold for each: the item whose kernel made it, and every item that returned it as a new
  // output (`contiguous` of a contiguous tensor returns its input); kOutside where it existed
  // before the iteration (an item returned a tensor from outside). A kernel's in-place output is
  // its argument, made before: not listed.
  std::unordered_map<const c10::TensorImpl*, std::vector<int32_t>> made;
  void returned_by_item(const at::Tensor& t) {
    auto [it, fresh] = made.try_emplace(t.unsafeGetTensorImpl());
    if (fresh) it->second.push_back(ItemPlan::Load::kOutside);
    if (std::find(it->second.begin(), it->second.end(), static_cast<int32_t>(index)) == it->second.end())
      it->second.push_back(static_cast<int32_t>(index));
  }

  // The last read of each table entry: by item `item`, in its kernel `kernel` (-1: after its
  // kernels, as an output or a gradient effect). Reads come in order, so the last one wins.
  struct Read {
    int64_t item = -1, kernel = -1;
  };
  std::vector<Read> last_read;

  // The one-thread check of the kernel being recorded (check_one_thread): copies of its arguments,
  // and, for a random kernel, the CPU generator's state before it ran (undefined otherwise).
  bool checking = false;
  bool cpu_kernel = true;  // the kernel being recorded runs on the CPU (on_cpu)
  uint64_t check_key = 0;  // the kernel's signature (verdicts.h)
  uint64_t ran_ns = 0;     // how long the kernel being checked ran when recorded (kernel_end)
  uint64_t checked = 0, reused = 0;
  torch::jit::Stack copies;
  torch::jit::Stack originals;  // its arguments, as the kernel leaves them
  at::Tensor rng_before;

  // The item being recorded.
  const WorkItem* item = nullptr;
  uint32_t index = 0;
  bool item_autograd = false;
  bool first_kernel = true;
  std::vector<uint32_t> feeds;  // argument positions the item's own kernel re-reads
  std::optional<c10::Stream> stream;  // the accelerator stream of the block's items, if any
  bool accelerators = false;          // items on accelerator streams are recorded

  // Between before_backward and after_backward of a backward with an accelerator's nodes (written
  // by the GraphRunner thread only while no backward runs); whether a kernel of it came from the
  // engine's device thread.
  bool device_backward = false;
  bool device_kernels = false;

  // Autograd histories made by items (item index, output index, its grad_fn), until a backward
  // consumes them.
  struct Pending {
    uint32_t item, out;
    NodePtr node;
    bool retained = false;  // reached by a backward that kept the graph (retain_graph=True)
  };
  std::vector<Pending> pending;
  bool retain_graph = false;  // the current backward's
  // The current backward: its leaves (index into block.leaves) and their gradients before it.
  struct LeafGrad {
    uint32_t leaf;
    at::Tensor variable;
    const c10::TensorImpl* before;  // kept from reuse by `kept`
  };
  std::vector<LeafGrad> leaves;
  std::unordered_set<const torch::autograd::Node*> reached;

  uint32_t new_id(bool load) {
    is_load.push_back(load);
    last_read.emplace_back();
    return block.table_size++;
  }

  void remember(const at::Tensor& t, const Ref& r) {
    kept.emplace_back(t.getIntrusivePtr());
    by_impl[t.unsafeGetTensorImpl()] = r;
    if (t.has_storage() && t.storage().unsafeGetStorageImpl()) {
      kept_storage.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
          t.storage().unsafeGetStorageImpl()));
      by_storage[StorageKey::of(t)] = r;
    }
  }

  void read(const Ref& r, int64_t kernel) {
    if (r.kind == Ref::Kind::Value) {
      last_read[r.id] = {index, kernel};
    } else if (r.kind == Ref::Kind::Grad) {
      read(block.leaves[r.id], kernel);
    } else if (r.kind == Ref::Kind::List) {
      for (const Ref& e : r.list) read(e, kernel);
    }
  }

  // What a tensor read by a kernel (or an item's output) is; false: nothing the block can name.
  bool ref_of(const at::Tensor& t, Ref* out) {
    if (!t.defined()) {
      *out = Ref{};
      out->constant = c10::IValue(at::Tensor());
      return true;
    }
    auto it = by_impl.find(t.unsafeGetTensorImpl());
    if (it != by_impl.end()) {
      *out = it->second;
      return true;
    }
    if (t.has_storage() && t.storage().unsafeGetStorageImpl()) {
      auto s = by_storage.find(StorageKey::of(t));
      if (s != by_storage.end()) {
        *out = s->second;
        return true;
      }
    }
    return false;
  }
};

BlockRecorder::BlockRecorder(uint64_t graph, bool accelerators) : impl_(std::make_unique<Impl>()) {
  impl_->block.graph = graph;
  impl_->accelerators = accelerators;
}

BlockRecorder::~BlockRecorder() = default;


void BlockRecorder::refuse(std::string why) {
  if (why_.empty()) why_ = std::move(why);
}

void BlockRecorder::begin_item(const WorkItem& item, const torch::jit::Stack& args, bool autograd) {
  if (refused()) return;
  Impl& m = *impl_;
  if (item.stream) {
    if (!m.accelerators)
      return refuse("an accelerator stream (not yet checked on a device: terra.config(accelerator_blocks=True))");
    // Replayed on the stream of the item being replayed: one stream for the whole block.
    if (m.stream && *m.stream != *item.stream) return refuse("items on more than one stream");
    m.stream = item.stream;
  }
  m.item = &item;
  m.index = static_cast<uint32_t>(m.block.items.size());
  m.item_autograd = autograd;
  m.first_kernel = true;
  m.feeds.clear();
  ItemPlan p;
  p.kind = item.kind;
  p.node = item.node;
  p.op = item.op;
  p.inference_mode = item.inference_mode;
  p.autocast = item.autocast;
  p.kernels_begin = p.kernels_end = static_cast<uint32_t>(m.block.kernels.size());
  // Every tensor argument is re-read from the item at replay: the item names it, whatever made it.
  auto load = [&](const at::Tensor& t, uint32_t arg, int32_t elem) {
    if (!t.defined()) return;
    if (t.key_set().has_any(kUnreplayableKeys)) return refuse("a tensor subclass or a conjugate/negative view");
    ItemPlan::Load l;
    l.arg = arg;
    l.elem = elem;
    // A filled placeholder (a fetch made it real) is read as itself: what made it is its value's.
    const c10::TensorImpl* key = t.unsafeGetTensorImpl();
    if (const PlaceholderImpl* filled = placeholder_impl(key); filled && filled->slot() && filled->slot()->value.defined())
      key = filled->slot()->value.unsafeGetTensorImpl();
    if (auto made = m.made.find(key); made != m.made.end()) l.made_by = made->second;
    auto known = m.by_impl.find(t.unsafeGetTensorImpl());
    // A tensor from outside the iteration that an earlier item also read (one made inside it is
    // one value by construction): this load shares that load's table entry, which the replay
    // writes again only where this item's tensor is another one (BlockReplayer::load).
    if (known != m.by_impl.end() && !m.made.count(t.unsafeGetTensorImpl()) &&
        known->second.kind == Ref::Kind::Value &&
        known->second.elem < 0 && m.is_load[known->second.id]) {
      const auto [item_index, load_index] = m.load_at[known->second.id];
      if (item_index != m.index) {
        l.same_item = static_cast<int32_t>(item_index);
        l.same_load = load_index;
        l.id = known->second.id;
        m.read(known->second, -1);  // kept in the table until this item checks it
      }
    }
    if (l.same_item < 0) l.id = m.new_id(true);
    m.load_at.resize(m.block.table_size);
    m.load_at[l.id] = {m.index, static_cast<uint32_t>(p.loads.size())};
    Ref r;
    r.kind = Ref::Kind::Value;
    r.id = l.id;
    m.remember(t, r);
    p.loads.push_back(l);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const auto arg = static_cast<uint32_t>(i);
    if (v.isTensor()) {
      load(v.toTensor(), arg, -1);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t e = 0; e < list.size(); ++e) load(list[e], arg, static_cast<int32_t>(e));
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t e = 0; e < list.size(); ++e) {
        const c10::IValue x = list[e];
        if (x.isTensor()) load(x.toTensor(), arg, static_cast<int32_t>(e));
      }
    } else if (v.isGenerator()) {
      return refuse("a generator argument");
    } else if (v.isObject() || v.isCapsule() || v.isPyObject()) {
      return refuse("an object argument");
    }
  }
  m.block.items.push_back(std::move(p));
}

namespace {

// An operator by its name, the same in every process (a schema's address is not).
uint64_t operator_hash(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, uint64_t> known;
  auto [it, added] = known.try_emplace(&op.schema(), 0);
  if (added) it->second = std::hash<std::string>{}(c10::toString(op.operator_name()));
  return it->second;
}

// What a kernel's one-thread check depends on: the operator and its dispatch keys, the thread
// count it is compared with, the process-wide settings that choose kernels (deterministic
// algorithms, oneDNN on or off), and each argument's type and geometry (dtype, device, sizes,
// strides) or value (numbers, flags, dims); not the tensors' data (see Block::one_thread).
// The same in every process (verdicts.h keeps verdicts across processes): operators by name.
uint64_t kernel_signature(const c10::OperatorHandle& op, c10::DispatchKeySet keys, int threads,
                          c10::ArrayRef<c10::IValue> args) {
  uint64_t h = terra::hash_combine(operator_hash(op), keys.raw_repr());
  h = terra::hash_combine(h, static_cast<uint64_t>(threads));
  const auto& context = at::globalContext();
  h = terra::hash_combine(h, (context.deterministicAlgorithms() ? 1u : 0u) |
                                 (context.userEnabledMkldnn() ? 2u : 0u));
  auto tensor = [&](const at::Tensor& t) {
    h = terra::hash_combine(h, t.defined() ? 1 + static_cast<uint64_t>(t.scalar_type()) : 0);
    if (!t.defined()) return;
    h = terra::hash_combine(h, static_cast<uint64_t>(t.device().type()) << 8 |
                                   static_cast<uint8_t>(t.device().index()));
    for (int64_t s : t.sizes()) h = terra::hash_combine(h, static_cast<uint64_t>(s));
    h = terra::hash_combine(h, 0x5157);
    for (int64_t s : t.strides()) h = terra::hash_combine(h, static_cast<uint64_t>(s));
  };
  auto value = [&](const c10::IValue& v) {
    if (!(v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString() || v.isDevice() ||
          v.isComplexDouble()))
      return false;
    if (v.isComplexDouble()) {  // IValue::hash refuses complex numbers ("unhashable type")
      const c10::complex<double> c = v.toComplexDouble();
      h = terra::hash_combine(h, 8);
      h = terra::hash_combine(h, std::hash<double>{}(c.real()));
      h = terra::hash_combine(h, std::hash<double>{}(c.imag()));
      return true;
    }
    h = terra::hash_combine(h, v.isNone() ? 3 : v.isInt() ? 4 : v.isDouble() ? 5 : v.isBool() ? 6 : 7);
    h = terra::hash_combine(h, c10::IValue::hash(v));
    return true;
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      h = terra::hash_combine(h, 1);
      tensor(v.toTensor());
    } else if (v.isList()) {
      h = terra::hash_combine(h, 2);
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          tensor(e.toTensor());
        } else if (!value(e)) {
          return 0;
        }
      }
    } else if (!value(v)) {
      return 0;  // something without a value hash here (a generator...): checked every time
    }
  }
  return h == 0 ? 1 : h;
}

bool known_one_thread(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  const uint64_t key = kernel_signature(op, keys, at::get_num_threads(),
                                        c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - n));
  return Verdicts::process().find(key).value_or(false);
}

// As many elements as ATen's intra-op grain size: an elementwise kernel or a reduction this size
// runs a parallel region when it has more than one thread.
bool large_for_threads(const c10::IValue& v) {
  bool large = false;
  for_each_tensor(v, [&](const at::Tensor& t) { large = large || (t.defined() && t.numel() >= at::internal::GRAIN_SIZE); });
  return large;
}

// Python numbers that a kernel inside a decomposition takes from the item's argument of the same
// name and that no backward takes (so an autograd item's replay may re-read them; other numbers
// of an autograd item are guarded: its backward's kernels may hold them as constants).
// BatchNorm's momentum only updates the running statistics; with `momentum=None` nn.BatchNorm
// passes 1 / num_batches_tracked, a new number every step, and as a guard it left the block every
// iteration (corpus p13).
constexpr std::pair<std::string_view, std::string_view> kForwardOnlyNumbers[] = {
    {"aten::native_batch_norm", "momentum"},
    {"aten::_native_batch_norm_legit", "momentum"},
};

// The argument of `item` that kernel argument `i` (value `v`) is, by kForwardOnlyNumbers; -1: none.
int passed_number(const WorkItem& item, const c10::FunctionSchema& kernel, size_t i, const c10::IValue& v) {
  if (!v.isDouble() || !item.op) return -1;
  const std::string& arg = kernel.arguments()[i].name();
  const auto listed = [&](const auto& entry) { return entry.first == kernel.name() && entry.second == arg; };
  if (std::none_of(std::begin(kForwardOnlyNumbers), std::end(kForwardOnlyNumbers), listed)) return -1;
  const auto& args = item.op->schema().arguments();
  for (size_t a = 0; a < args.size() && a < item.args.size(); ++a) {
    const c10::IValue& x = item.args[a];
    if (args[a].name() == arg && x.isDouble() && same_number(x, v)) return static_cast<int>(a);
  }
  return -1;
}

}  // namespace

void BlockRecorder::kernel_begin(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                 const torch::jit::Stack& stack, bool device_thread) {
  if (refused()) return;
  Impl& m = *impl_;
  if (!m.item) return refuse("a kernel outside an item");
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  TORCH_INTERNAL_ASSERT(stack.size() >= n);
  if (m.device_backward) {
    // Its kernels run on the device thread, after the gradients the engine makes for the roots on
    // the GraphRunner's. Kernels of the GraphRunner's after the device thread's would be a
    // backward on two devices, whose order between the threads is not fixed (refused before it
    // starts: before_backward).
    if (device_thread) m.device_kernels = true;
    else if (m.device_kernels) return refuse("a backward on two threads");
  }
  RecordedKernel k;
  k.op = &op;
  k.keys = keys;
  // Intra-op threads decide nothing for an accelerator's kernel: never checked, never spread.
  m.cpu_kernel = on_cpu(c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - n, n));
  bool in_place = false;
  if (const auto e = ElementwiseReplay::covered(op, &in_place);
      e != ElementwiseReplay::Op::None && keys.highestPriorityTypeId() == c10::DispatchKey::CPU)
    k.elementwise = std::make_shared<ElementwiseReplay>(e, in_place);
  // A factory (torch.rand) is recorded above its backend, at BackendSelect; RandomFill makes only
  // CPU tensors.
  if (const auto r = RandomFill::covered(op);
      keys.highestPriorityTypeId() == c10::DispatchKey::CPU ||
      (r == RandomFill::Op::Rand && keys.highestPriorityTypeId() == c10::DispatchKey::BackendSelect))
    k.random = r;
  for (size_t i = stack.size() - n; i < stack.size() && m.cpu_kernel; ++i)
    k.spread = k.spread || large_for_threads(stack[i]);
  const auto kernel_index = static_cast<int64_t>(m.block.kernels.size());
  // The item's own op, first: its Python numbers are re-read from the item (feeds), unless
  // autograd may have kept them for the backward (then they are guarded instead).
  const bool own = m.first_kernel && m.item->op && *m.item->op == op && !m.item_autograd &&
                   m.item->kind == OpKind::Aten && m.item->args.size() == n;
  m.first_kernel = false;
  auto tensor_ref = [&](const at::Tensor& t, Ref* r) {
    if (t.defined() && t.key_set().has_any(kUnreplayableKeys)) {
      refuse("a tensor subclass or a conjugate/negative view");
      return false;
    }
    if (!m.ref_of(t, r)) {
      refuse(std::string("reads a tensor from outside the iteration (") + schema.name() + ")");
      return false;
    }
    return true;
  };
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[stack.size() - n + i];
    Ref r;
    if (v.isTensor()) {
      if (!tensor_ref(v.toTensor(), &r)) return;
    } else if (holds_tensors(v)) {
      auto list = v.toList();
      r.kind = Ref::Kind::List;
      r.element_type = list.elementType();
      for (size_t e = 0; e < list.size(); ++e) {
        const c10::IValue x = list[e];
        Ref er;
        if (x.isTensor()) {
          if (!tensor_ref(x.toTensor(), &er)) return;
        } else if (x.isNone()) {
          er.constant = x;
        } else {
          return refuse(std::string("a list argument it cannot name (") + schema.name() + ")");
        }
        r.list.push_back(std::move(er));
      }
    } else if (v.isGenerator() && !v.isNone()) {
      return refuse("a generator argument");
    } else if (v.isObject() || v.isCapsule() || v.isPyObject() || v.isFuture() || v.isTuple()) {
      return refuse(std::string("an argument it cannot name (") + schema.name() + ")");
    } else if (const int from = own ? static_cast<int>(i) : passed_number(*m.item, schema, i, v); from >= 0) {
      // A Python number or constant of the item: re-read from the item's argument.
      ItemPlan& p = m.block.items.back();
      ItemPlan::Load l;
      l.arg = static_cast<uint32_t>(from);
      l.id = m.new_id(true);
      m.load_at.resize(m.block.table_size);
      m.load_at[l.id] = {m.index, static_cast<uint32_t>(p.loads.size())};
      p.loads.push_back(l);
      r.kind = Ref::Kind::Value;
      r.id = l.id;
      m.feeds.push_back(l.arg);
    } else {
      r.constant = v;
    }
    m.read(r, kernel_index);
    const auto* info = schema.arguments()[i].alias_info();
    if (info && info->isWrite()) k.written.push_back(static_cast<uint32_t>(i));
    k.args.push_back(std::move(r));
  }
  const auto& returns = schema.returns();
  k.view = !returns.empty() && returns[0].alias_info() && !returns[0].alias_info()->isWrite() &&
           n > 0 && schema.arguments()[0].alias_info() && !schema.arguments()[0].alias_info()->isWrite();
  k.outs = static_cast<uint32_t>(returns.size());
  // A structured functional kernel on the CPU writes into its kept results where they are free
  // again (out_form.h); one that reads no tensor (a factory) allocates, as its results' geometry
  // may follow a number fed anew.
  const bool reads_tensor = std::any_of(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end(),
                                        [](const c10::IValue& v) { return v.isTensor() || holds_tensors(v); });
  if (keys.highestPriorityTypeId() == c10::DispatchKey::CPU && !k.view && k.written.empty() &&
      k.random == RandomFill::Op::None && reads_tensor)
    k.out_form = structured_out_form(op);
  m.alias.reset();
  const c10::IValue& first = stack[stack.size() - n];
  bool numbers_only = true;  // besides the input: constants, or numbers re-read from the item
  for (size_t i = 1; i < n && numbers_only; ++i) {
    const c10::IValue& v = stack[stack.size() - n + i];
    numbers_only = !v.isTensor() && !holds_tensors(v) &&
                   (k.args[i].kind == Ref::Kind::Const || (k.args[i].kind == Ref::Kind::Value && k.args[i].elem < 0));
  }
  if (k.view && k.outs == 1 && first.isTensor() && first.toTensor().defined() && k.args[0].kind == Ref::Kind::Value &&
      k.args[0].elem < 0 && numbers_only) {
    const at::Tensor& in = first.toTensor();
    m.alias = std::make_shared<AliasGeometry>();
    for (size_t i = 1; i < n; ++i)
      if (k.args[i].kind == Ref::Kind::Value) m.alias->numbers.emplace_back(static_cast<uint32_t>(i), stack[stack.size() - n + i]);
    m.alias->in_sizes = in.sizes().vec();
    m.alias->in_strides = in.strides().vec();
    m.alias->in_offset = in.storage_offset();
    m.alias->in_keys = in.key_set();
    m.alias->dtype = in.scalar_type();
    m.alias_storage = in.has_storage() ? in.storage().unsafeGetStorageImpl() : nullptr;
  }
  // Whether the kernel computes the same with one intra-op thread is checked on copies of its
  // arguments (check_one_thread), kernel by kernel: a replay runs each with one thread or with
  // the program's count, as its check found. A kernel that only allocates (its output's bits are
  // whatever the memory held) has nothing to compare and nothing to split.
  m.checking = m.cpu_kernel && m.item->num_threads > 1 && !only_allocates(op);
  m.check_key = 0;
  if (m.checking) {
    m.check_key = kernel_signature(op, keys, m.item->num_threads,
                                   c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - n, n));
    if (const auto same = Verdicts::process().find(m.check_key)) {
      m.checking = false;
      ++m.reused;
      k.one_thread = *same;
    }
  }
  if (m.checking) {
    // Every argument is copied (what a kernel writes is not always in its schema:
    // native_batch_norm's running statistics), except tensors with internal overlap (expanded),
    // which no kernel may write; afterwards each copy must match what the kernel left.
    m.originals.assign(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
    m.copies = deep_copy_all(m.originals);
    m.rng_before = at::Tensor();
    if (op.hasTag(at::Tag::nondeterministic_seeded)) {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      m.rng_before = generator.get_state();
    }
  }
  m.block.kernels.push_back(std::move(k));
}

bool BlockRecorder::one_thread_known() const {
  // Not being checked (known from a verdict, or it only allocates) and found the same.
  return !refused() && impl_->cpu_kernel && !impl_->checking && impl_->block.kernels.back().one_thread;
}

bool BlockRecorder::only_allocates(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.name == "aten::empty" || name.name == "aten::empty_like" ||
         name.name == "aten::empty_strided" || name.name == "aten::new_empty" ||
         name.name == "aten::new_empty_strided";
}
uint64_t BlockRecorder::kernels_checked() const { return impl_->checked; }
uint64_t BlockRecorder::verdicts_reused() const { return impl_->reused; }

void BlockRecorder::check_one_thread(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                     const torch::jit::Stack& stack) {
  Impl& m = *impl_;
  if (refused() || !m.checking) return;
  m.checking = false;
  ++m.checked;
  const RecordedKernel& k = m.block.kernels.back();
  // Only a random kernel has the generator rewound for its runs again (and set back after them):
  // the program thread draws from it too (host ops, python_runner.h), after every random item
  // issued before, but while later items' kernels are checked. (Known by the op's tag, as in
  // kernel_begin: a change of the generator's state since the kernel began may be the program
  // thread's draw.)
  const bool drew = m.rng_before.defined();
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor rng_after;
  if (drew) {
    std::lock_guard<std::mutex> g(generator.mutex());
    rng_after = generator.get_state();
  }
  const int threads = at::get_num_threads();
  // Runs the kernel on `args` with `n` threads from the generator state before it; its returns.
  // The fastest one-thread run: what the kernel costs the GraphRunner alone (RecordedKernel::spread).
  uint64_t one_thread_ns = UINT64_MAX;
  auto run = [&](torch::jit::Stack args, int n) {
    if (drew) {
      std::lock_guard<std::mutex> g(generator.mutex());
      generator.set_state(m.rng_before);
    }
    set_intraop_threads(n);
    // A check, not the program's call: its warnings are not the program's (the program's own
    // call raised them already).
    c10::WarningUtils::WarningHandlerGuard quiet(&discarded_warnings());
    const auto t0 = std::chrono::steady_clock::now();
    op.redispatchBoxed(keys, &args);
    if (n == 1) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
      one_thread_ns = std::min<uint64_t>(one_thread_ns, static_cast<uint64_t>(ns.count()));
    }
    return args;
  };
  auto outs_equal = [&](const torch::jit::Stack& a, const torch::jit::Stack& b) {
    for (uint32_t o = 0; o < k.outs; ++o)
      if (!bitwise_equal(a[a.size() - k.outs + o], b[b.size() - k.outs + o])) return false;
    return true;
  };
  auto args_equal = [](const torch::jit::Stack& a, const torch::jit::Stack& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!bitwise_equal(a[i], b[i])) return false;
    return true;
  };
  bool same = true;
  try {
    // The recorded data, with one thread, against what the kernel just computed.
    const torch::jit::Stack one = run(m.copies, 1);
    if (drew) {
      std::lock_guard<std::mutex> g(generator.mutex());
      same = generator.get_state().equal(rng_after);
    }
    same = same && args_equal(m.copies, m.originals) && outs_equal(one, stack);
    // Generic data of the same shapes, with both thread counts: recorded data can be special
    // (zeros, small integers) so that another summation order gives the same bits anyway. And
    // generic data too, by chance: a sum over 65536 floats split over 2 threads gave the bits of
    // one thread for 43-65% of random inputs (uniform, or spread over 2^-60..2^60), so one sample
    // let such a reduction be replayed with one thread (results differing from eager's in some
    // iterations, test_a_tensor_made_from_python_data_does_not_wait_for_the_graph_runner with a
    // cached verdict). Up to kGenericSamples samples, stopping at the first difference: a kernel
    // that differs shows it within a few; one that runs long when recorded gets fewer (the check
    // is part of the first co-executed iteration; its verdict is cached, verdicts.h).
    constexpr int kGenericSamples = 20, kLongSamples = 8;
    constexpr uint64_t kLongNs = 200'000;
    const int samples = m.ran_ns < kLongNs ? kGenericSamples : kLongSamples;
    for (int i = 0; same && i < samples; ++i) {
      const torch::jit::Stack generic = generic_copy(m.copies, /*wide=*/i % 2 == 1);
      torch::jit::Stack a = deep_copy_all(generic), b = deep_copy_all(generic);
      const torch::jit::Stack ra = run(a, threads), rb = run(b, 1);
      same = args_equal(a, b) && outs_equal(ra, rb);
    }
  } catch (...) {
    same = false;
  }
  set_intraop_threads(threads);
  if (drew) {
    std::lock_guard<std::mutex> g(generator.mutex());
    generator.set_state(rng_after);
  }
  m.copies.clear();
  m.originals.clear();
  RecordedKernel& checked = m.block.kernels.back();
  checked.one_thread = same;
  // The recorded run alone can take 10x its usual time (its outputs' pages touched for the first
  // time, the other core busy): a 256x256 add's 5 us measured 50 in some runs, and spreading it
  // woke the OpenMP worker, which then spun beside the program (1x1-to-256x256 chains, bench/per_op.py:
  // 14.7 us of CPU per op where 7.1 without). The fastest of the one-thread runs decides too.
  if (one_thread_ns != UINT64_MAX) {
    checked.spread = checked.spread && one_thread_ns >= RecordedKernel::kSpreadNs;
    checked.ran_ns = static_cast<uint32_t>(std::min<uint64_t>(checked.ran_ns, one_thread_ns));
  }
  if (m.check_key != 0) Verdicts::process().store(m.check_key, same);
}

void BlockRecorder::kernel_end(const torch::jit::Stack& stack, uint64_t ran_ns) {
  if (refused()) return;
  Impl& m = *impl_;
  RecordedKernel& k = m.block.kernels.back();
  TORCH_INTERNAL_ASSERT(stack.size() >= k.outs);
  // From kernel_begin, k.spread says whether an argument is large.
  for (uint32_t i = 0; i < k.outs; ++i) k.spread = k.spread || large_for_threads(stack[stack.size() - k.outs + i]);
  k.large = k.spread;
  k.spread = k.spread && ran_ns >= RecordedKernel::kSpreadNs;
  k.ran_ns = static_cast<uint32_t>(std::min<uint64_t>(ran_ns, UINT32_MAX));
  m.ran_ns = ran_ns;
  k.first_out = m.block.table_size;
  for (uint32_t i = 0; i < k.outs; ++i) {
    const c10::IValue& v = stack[stack.size() - k.outs + i];
    const uint32_t id = m.new_id(false);
    Ref r;
    r.kind = Ref::Kind::Value;
    r.id = id;
    if (v.isTensor()) {
      if (v.toTensor().defined()) {
        const bool existed = m.by_impl.count(v.toTensor().unsafeGetTensorImpl()) != 0;  // in place
        m.remember(v.toTensor(), r);
        if (!existed) m.made.try_emplace(v.toTensor().unsafeGetTensorImpl(), std::vector<int32_t>{static_cast<int32_t>(m.index)});
      }
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t e = 0; e < list.size(); ++e) {
        Ref er = r;
        er.elem = static_cast<int32_t>(e);
        const at::Tensor t = list[e];
        const bool existed = m.by_impl.count(t.unsafeGetTensorImpl()) != 0;  // in place
        m.remember(t, er);
        if (!existed) m.made.try_emplace(t.unsafeGetTensorImpl(), std::vector<int32_t>{static_cast<int32_t>(m.index)});
      }
    } else if (!v.isNone()) {
      // A host value (a Scalar, a bool) inside a decomposition: what follows may depend on it.
      return refuse(std::string("a kernel returns a host value (") + k.op->schema().name() + ")");
    }
  }
  // A view's result as its kernel made it: kept to be made again directly (AliasGeometry).
  if (m.alias && k.outs == 1 && stack.back().isTensor() && m.alias_storage) {
    const at::Tensor& out = stack.back().toTensor();
    const c10::TensorImpl* impl = out.defined() ? out.unsafeGetTensorImpl() : nullptr;
    if (impl && typeid(*impl) == typeid(c10::TensorImpl) && impl->has_storage() &&
        out.storage().unsafeGetStorageImpl() == m.alias_storage && impl->key_set() == m.alias->in_keys &&
        out.scalar_type() == m.alias->dtype && impl->allow_tensor_metadata_change() &&
        !impl->is_wrapped_number() && out.layout() == c10::kStrided && !out.is_nested()) {
      m.alias->out_sizes = out.sizes().vec();
      m.alias->out_strides = out.strides().vec();
      m.alias->out_offset = out.storage_offset();
      m.alias->out_bytes = at::detail::computeStorageNbytes(out.sizes(), out.strides(), out.itemsize(),
                                                            static_cast<size_t>(out.storage_offset()));
      k.alias = std::move(m.alias);
    }
  }
  m.alias.reset();
  m.block.items.back().kernels_end = static_cast<uint32_t>(m.block.kernels.size());
}

void BlockRecorder::before_backward(const std::vector<at::Tensor>& roots, bool retain_graph,
                                    bool create_graph) {
  if (refused()) return;
  if (create_graph) return refuse("create_graph");
  Impl& m = *impl_;
  m.retain_graph = retain_graph;
  m.leaves.clear();
  m.reached.clear();
  bool cpu_nodes = false, device_nodes = false;
  walk_autograd_graph(root_nodes(roots), [&](torch::autograd::Node& n) {
    m.reached.insert(&n);
    // The engine runs a node on the thread of its gradients' device: the CPU's on the calling
    // thread, an accelerator's on that device's thread.
    (node_on_accelerator(n) ? device_nodes : cpu_nodes) = true;
    // Retain-grad hooks too: they store a non-leaf's gradient, an effect the replay would lack.
    if (node_runs_python(n) || !n.retains_grad_hooks().empty()) {
      refuse("a hook or Python code in the backward");
      return false;
    }
    auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(&n);
    if (!acc) return true;
    const at::Tensor& v = acc->variable;
    Ref leaf;
    if (!m.ref_of(v, &leaf) || leaf.kind != Ref::Kind::Value || leaf.elem >= 0 || !m.is_load[leaf.id]) {
      refuse("a leaf no item names");
      return false;
    }
    Impl::LeafGrad g;
    g.leaf = static_cast<uint32_t>(m.block.leaves.size());
    g.variable = v;
    const at::Tensor& grad = v.grad();
    g.before = grad.defined() ? grad.unsafeGetTensorImpl() : nullptr;
    if (grad.defined()) m.kept.emplace_back(grad.getIntrusivePtr());
    m.block.leaves.push_back(leaf);
    m.block.leaf_loads.push_back(m.load_at[leaf.id]);
    if (grad.defined() && !m.by_impl.count(g.before)) {
      Ref r;
      r.kind = Ref::Kind::Grad;
      r.id = g.leaf;
      m.remember(grad, r);
    }
    m.leaves.push_back(std::move(g));
    return true;
  });
  if (refused()) return;
  if (cpu_nodes && device_nodes) return refuse("a backward on the CPU and an accelerator");
  m.device_backward = device_nodes;
  m.device_kernels = false;
}

bool BlockRecorder::device_backward() const { return impl_->device_backward; }

void BlockRecorder::after_backward() {
  Impl& m = *impl_;
  m.device_backward = false;
  if (refused()) return;
  ItemPlan& p = m.block.items.back();
  for (const Impl::LeafGrad& g : m.leaves) {
    const at::Tensor& grad = g.variable.grad();
    p.leaf_states.push_back({g.leaf, g.before != nullptr, grad.defined()});
    if (!grad.defined()) continue;
    if (grad.unsafeGetTensorImpl() == g.before) continue;  // accumulated in place (or untouched)
    ItemPlan::GradEffect e;
    e.leaf = g.leaf;
    if (!m.ref_of(grad, &e.value) || e.value.kind == Ref::Kind::Const)
      return refuse("a gradient the block cannot name");
    m.read(m.block.leaves[g.leaf], -1);
    m.read(e.value, -1);
    p.effects.push_back(std::move(e));
  }
  // The histories this backward consumed.
  auto& pending = m.pending;
  for (auto it = pending.begin(); it != pending.end();) {
    if (m.reached.count(it->node.get())) {
      ItemPlan& made = m.block.items[it->item];
      if (made.covered_by != m.index) made.consumed_outs.clear();  // a later backward's, if any
      made.covered_by = m.index;
      made.consumed_outs.push_back(it->out);
      if (m.retain_graph) {  // still there for a later backward: consumed by the last one
        it->retained = true;
        ++it;
        continue;
      }
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
  m.leaves.clear();
  m.reached.clear();
}

void BlockRecorder::end_item(const WorkItem& item, const std::vector<at::Tensor>& returns) {
  if (refused()) return;
  Impl& m = *impl_;
  ItemPlan& p = m.block.items.back();
  if (item.kind == OpKind::GradRead) {
    if (!returns.empty() && returns[0].defined()) {
      const uint32_t id = m.new_id(false);
      p.out_table = static_cast<int32_t>(id);
      Ref r;
      r.kind = Ref::Kind::Value;
      r.id = id;
      m.remember(returns[0], r);
      m.returned_by_item(returns[0]);  // the program's tensor is this item's placeholder
      p.outs.push_back(r);
      m.read(r, -1);
    }
  } else if (item.kind == OpKind::Aten) {
    bool history = false;
    for (size_t k = 0; k < returns.size(); ++k) {
      const at::Tensor& t = returns[k];
      Ref r;
      if (!m.ref_of(t, &r)) return refuse("an output the block cannot name");
      // Made by this item, as a later item's argument shows it: the program holds this item's
      // placeholder for it, even where the kernel returned its input (`contiguous` of a
      // contiguous tensor). Not an argument the op writes and returns (its placeholder is the
      // argument's).
      const bool returns_argument = item.expect && k < item.expect->size() && (*item.expect)[k].alias_arg >= 0;
      if (t.defined() && !returns_argument) m.returned_by_item(t);
      if (t.defined() && m.item_autograd) {
        auto fn = torch::autograd::impl::grad_fn_unsafe(t);
        if (fn) {
          // Not grad_fn(): that accessor re-checks views made under no_grad and may raise.
          m.pending.push_back({m.index, static_cast<uint32_t>(k), node_ptr(fn)});
          history = true;
          auto& names = m.block.grad_fn_names;
          const std::string name = fn->name();
          auto at = std::find(names.begin(), names.end(), name);
          if (at == names.end()) at = names.insert(names.end(), name);
          p.grad_fns.resize(p.outs.size() + 1, -1);
          p.grad_fns.back() = static_cast<int32_t>(at - names.begin());
        } else if (t.requires_grad() && r.kind == Ref::Kind::Value && !m.is_load[r.id]) {
          return refuse("makes a leaf that requires grad");
        }
      }
      m.read(r, -1);
      p.outs.push_back(std::move(r));
    }
    p.autograd = history;
  }
  // Python numbers of the item that no kernel re-reads must be as recorded.
  for (size_t i = 0; i < item.args.size(); ++i) {
    const c10::IValue& v = item.args[i];
    if (v.isTensor() || holds_tensors(v))
      continue;
    const auto arg = static_cast<uint32_t>(i);
    if (std::find(m.feeds.begin(), m.feeds.end(), arg) != m.feeds.end()) continue;
    p.guards.emplace_back(arg, v);
  }
  m.item = nullptr;
}

namespace {

void table_reads(const Block& block, const Ref& r, std::vector<uint32_t>& out) {
  switch (r.kind) {
    case Ref::Kind::Value: out.push_back(r.id); break;
    case Ref::Kind::Grad: table_reads(block, block.leaves[r.id], out); break;
    case Ref::Kind::List:
      for (const Ref& e : r.list) table_reads(block, e, out);
      break;
    case Ref::Kind::Const: break;
  }
}

// A LanePlan (kernel_lanes.h) for each item with enough independent kernels.
void plan_lanes(Block& block) {
  for (ItemPlan& p : block.items) {
    const uint32_t n = p.kernels_end - p.kernels_begin;
    if (n < LanePlan::kMinKernels) continue;
    std::vector<std::vector<uint32_t>> reads(n), outs(n), drops(n);
    std::vector<bool> free(n), helped(n), parallel(n);
    for (uint32_t i = 0; i < n; ++i) {
      const RecordedKernel& k = block.kernels[p.kernels_begin + i];
      for (const Ref& a : k.args) table_reads(block, a, reads[i]);
      for (uint32_t o = 0; o < k.outs; ++o) outs[i].push_back(k.first_out + o);
      drops[i] = k.release;
      free[i] = k.written.empty() && k.one_thread && k.random == RandomFill::Op::None &&
                k.keys.highestBackendKey() == c10::BackendComponent::CPUBit &&
                !k.op->hasTag(at::Tag::nondeterministic_seeded);  // draws keep their order (as OpTemplate::random)
      helped[i] = free[i] && k.ran_ns >= LanePlan::kHelpNs;
      parallel[i] = !k.one_thread;
    }
    p.lanes = make_lane_plan(reads, outs, drops, free, helped, parallel);
  }
}

}  // namespace

std::unique_ptr<Block> BlockRecorder::finish() {
  Impl& m = *impl_;
  // A history whose last backward kept the graph (retain_graph=True) is still eager's to use
  // after the iteration: the item is bound each time, its graph made and kept as eagerly.
  for (const Impl::Pending& left : m.pending)
    if (left.retained) m.block.items[left.item].covered_by = ItemPlan::kNoBackward;
  for (const Impl::Pending& left : m.pending) {
    ItemPlan& made = m.block.items[left.item];
    if (made.covered_by == 0 || made.covered_by == ItemPlan::kNoBackward) {
      made.covered_by = ItemPlan::kNoBackward;
    } else if (!made.partial) {  // consumed in part: see ItemPlan::partial
      made.partial = true;
      m.block.items[made.covered_by].partial_items.push_back(left.item);
    }
  }
  if (!refused() && m.block.items.empty()) refuse("an empty iteration");
  if (refused()) return nullptr;
  auto block = std::make_unique<Block>(std::move(m.block));
  for (const RecordedKernel& k : block->kernels) {
    if (k.large && (!k.one_thread || k.spread)) ++block->parallel_large;
    if (!k.large && !k.one_thread) ++block->parallel_small;
    if (k.one_thread) continue;
    if (block->one_thread) block->not_one_thread = k.op->operator_name().name;
    block->one_thread = false;
    ++block->program_count_kernels;
  }
  // Each table entry is dropped after its last reader (or at once where nothing reads it), so a
  // replayed iteration holds no more memory than the recorded one did.
  for (uint32_t id = 0; id < block->table_size; ++id) {
    const Impl::Read& r = m.last_read[id];
    if (r.kernel >= 0) {
      block->kernels[static_cast<size_t>(r.kernel)].release.push_back(id);
    } else if (r.item >= 0) {
      block->items[static_cast<size_t>(r.item)].release.push_back(id);
    }
  }
  // Entries nobody reads: released by the item that made them.
  for (uint32_t i = 0; i < block->items.size(); ++i) {
    ItemPlan& p = block->items[i];
    for (const ItemPlan::Load& l : p.loads)
      if (m.last_read[l.id].item < 0) p.release.push_back(l.id);
    for (uint32_t k = p.kernels_begin; k < p.kernels_end; ++k) {
      const RecordedKernel& rk = block->kernels[k];
      for (uint32_t o = 0; o < rk.outs; ++o)
        if (m.last_read[rk.first_out + o].item < 0) p.release.push_back(rk.first_out + o);
    }
  }
  index_large_work(*block);
  plan_lanes(*block);
  return block;
}

void index_large_work(Block& block) {
  block.large_ns.assign(block.kernels.size() + 1, 0);
  for (size_t i = 0; i < block.kernels.size(); ++i) {
    const RecordedKernel& k = block.kernels[i];
    block.large_ns[i + 1] = block.large_ns[i] + (k.large && k.one_thread ? k.ran_ns : 0);
  }
}

uint64_t large_work(const Block& block, uint32_t kernel, uint32_t last_item) {
  const uint32_t end = block.items.at(last_item).kernels_end;
  return end > kernel ? block.large_ns.at(end) - block.large_ns.at(kernel) : 0;
}

bool BlockReplayer::spread(const RecordedKernel& k, int threads) const {
  if (!k.one_thread || threads <= 1 || openmp_spinning_limited() || !program_waits_) return false;
  const uint64_t waited = program_waits_();
  if (waited == 0) return false;
  if (k.spread || openmp_workers_spinning()) return true;
  if (!k.large) return false;
  // The last item waited for, as if every item issued meanwhile were the block's (those it lacks,
  // a `.grad` read run in its place, a cleared gradient, make this an estimate).
  const Block& b = *block_;
  const auto last = static_cast<uint32_t>(std::min<uint64_t>(item_ + waited - 1, b.items.size() - 1));
  return large_work(b, static_cast<uint32_t>(&k - b.kernels.data()), last) >= kSpreadBacklogNs;
}

// ---------------------------------------------------------------------------------------------
// The hook

void install_record_hook() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  auto* lib = new torch::Library(torch::Library::IMPL, "_", kRecordKey, __FILE__, __LINE__);
  lib->fallback(torch::CppFunction::makeFromBoxedFunction<&record_fallback>());
}

struct RecordingScope::Impl {
  c10::impl::IncludeDispatchKeyGuard include{kRecordKey};
  BlockRecorder* previous = t_recorder;
  bool shared = false;  // made this recorder the device thread's (g_backward_recorder)
};

RecordingScope::RecordingScope(BlockRecorder* r) : impl_(std::make_unique<Impl>()) {
  t_recorder = r;
  if (r && r->device_backward()) {
    g_backward_recorder.store(r, std::memory_order_release);
    impl_->shared = true;
  }
}

RecordingScope::~RecordingScope() {
  t_recorder = impl_->previous;
  if (impl_->shared) {
    // A device-thread kernel still between begin and end holds the mutex (a backward that threw).
    std::lock_guard<std::mutex> lock(g_backward_mutex);
    g_backward_recorder.store(nullptr, std::memory_order_release);
  }
}

// ---------------------------------------------------------------------------------------------
// Replay

namespace {

// The grad_fn of a replayed output that eager execution would have given one: the backward that
// consumed eager's graph has run (replayed), so reaching it again is eager's error.
struct ReplayedHistory final : torch::autograd::Node {
  explicit ReplayedHistory(std::string name) : Node(/*sequence_nr=*/0), name_(std::move(name)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    TORCH_CHECK(false,
                "Trying to backward through the graph a second time (or directly access saved "
                "tensors after they have already been freed). Terra replayed this iteration below "
                "autograd, and its backward has already run.");
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;  // the node eager execution made (Python shows `grad_fn=<MulBackward0>`)
};

// Whether `v` is a placeholder the GraphRunner has not filled yet: a value of the iteration being
// replayed (every earlier iteration's have been filled), which the replay makes as recorded.
bool unfilled(const c10::IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined()) return false;
  const PlaceholderImpl* p = as_placeholder(v.toTensor());
  return p && !p->slot()->value.defined();
}

// Whether argument `arg` of `item` (element `elem` of a list argument) is unfilled, a whole
// argument read in place: a copy of the program's placeholder writes its reference count, a line
// of the program thread's, twice per check (each item that follows a block had two).
bool unfilled_arg(const WorkItem& item, uint32_t arg, int32_t elem) {
  const c10::IValue& v = item.args.at(arg);
  return elem < 0 ? unfilled(v) : unfilled(v.toList().get(static_cast<size_t>(elem)));
}

c10::IValue resolved(const c10::IValue& v) {
  return v.isTensor() ? c10::IValue(resolve_placeholder(v.toTensor())) : v;
}

c10::IValue item_arg(const WorkItem& item, uint32_t arg, int32_t elem) {
  // A whole argument is read in place: a copy of the program's placeholder would write its
  // reference count, a line of the program thread's, which it writes again when it drops it.
  const c10::IValue& v = item.args.at(arg);
  return elem < 0 ? resolved(v) : resolved(v.toList().get(static_cast<size_t>(elem)));
}

// The tensor an argument reads, by identity, without copying it (a copy of the program's
// placeholder writes its reference count twice): a placeholder's value, nullptr for anything
// but a tensor, kDetachedRead for a detached placeholder's read (a new tensor every time).
const c10::TensorImpl* const kDetachedRead = reinterpret_cast<const c10::TensorImpl*>(&kDetachedRead);

const c10::TensorImpl* read_impl(const c10::IValue& v) {
  if (!v.isTensor()) return nullptr;
  const at::Tensor& t = v.toTensor();
  const PlaceholderImpl* p = t.defined() ? as_placeholder(t) : nullptr;
  if (!p) return t.unsafeGetTensorImpl();
  return p->detached() ? kDetachedRead : p->slot()->value.unsafeGetTensorImpl();
}

// Argument `arg` of `item`, read in place; element `elem` of a list argument is copied into `hold`.
const c10::IValue& arg_ref(const WorkItem& item, uint32_t arg, int32_t elem, c10::IValue& hold) {
  const c10::IValue& v = item.args.at(arg);
  if (elem < 0) return v;
  hold = v.toList().get(static_cast<size_t>(elem));
  return hold;
}

// read_impl of argument `arg` of `item` (element `elem` of a list argument, copied into `hold`).
const c10::TensorImpl* arg_impl(const WorkItem& item, uint32_t arg, int32_t elem, c10::IValue& hold) {
  return read_impl(arg_ref(item, arg, elem, hold));
}

}  // namespace

void BlockReplayer::start(const Block& block) {
  block_ = &block;
  next_ = 0;
  table_.assign(block.table_size, c10::IValue());
  freed_.assign(block.grad_fn_names.size() + 1, {});
}

void BlockReplayer::finish() {
  block_ = nullptr;
  next_ = 0;
  table_.clear();
  freed_.clear();
}

c10::IValue BlockReplayer::value(const Ref& r) const {
  switch (r.kind) {
    case Ref::Kind::Const: return r.constant;
    case Ref::Kind::Value: {
      const c10::IValue& v = table_[r.id];
      if (r.elem < 0) return v;
      return v.toTensorList().get(static_cast<size_t>(r.elem));
    }
    case Ref::Kind::Grad: return tensor(r);
    case Ref::Kind::List: {
      c10::impl::GenericList out(r.element_type);
      out.reserve(r.list.size());
      for (const Ref& e : r.list) out.push_back(value(e));
      return out;
    }
  }
  return c10::IValue();
}

at::Tensor BlockReplayer::tensor(const Ref& r) const {
  if (r.kind == Ref::Kind::Grad) return value(block_->leaves[r.id]).toTensor().grad();
  if (r.kind == Ref::Kind::Value && r.elem < 0) return table_[r.id].toTensor();  // no copy of the IValue
  return value(r).toTensor();
}

at::Tensor BlockReplayer::leaf_tensor(uint32_t leaf,
                                      const std::function<const WorkItem*(uint32_t)>& earlier) const {
  const auto [j, l] = block_->leaf_loads[leaf];
  const ItemPlan::Load& load = block_->items[j].loads[l];
  if (j < next_) return table_[load.id].isTensor() ? table_[load.id].toTensor() : at::Tensor();
  const WorkItem* w = earlier(j);
  if (!w) return at::Tensor();
  const c10::IValue v = item_arg(*w, load.arg, load.elem);
  return v.isTensor() ? v.toTensor() : at::Tensor();
}

bool BlockReplayer::grads_as_recorded(uint32_t index, const std::function<const WorkItem*(uint32_t)>& earlier,
                                      const ClearedBefore& cleared) const {
  const Block& block = *block_;
  // Gradient presence by leaf, as the items before `index` leave it.
  std::unordered_map<const c10::TensorImpl*, bool> defined;
  auto state = [&](const at::Tensor& leaf) {
    auto it = defined.find(leaf.unsafeGetTensorImpl());
    return it != defined.end() ? it->second : leaf.grad().defined();
  };
  std::vector<const c10::TensorImpl*> none;
  for (uint32_t k = next_; k <= index; ++k) {
    if (!cleared(k, none)) return false;
    for (const c10::TensorImpl* leaf : none) defined[leaf] = false;
    const ItemPlan& p = block.items[k];
    if (p.kind == OpKind::GradWrite) {
      const WorkItem* w = earlier(k);
      if (!w) return false;
      const c10::IValue& target = w->args.at(0);
      if (!target.isTensor() || unfilled(target)) return false;
      defined[resolve_placeholder(target.toTensor()).unsafeGetTensorImpl()] = !w->args.at(1).isNone();
    } else if (p.kind == OpKind::Backward) {
      for (const ItemPlan::LeafState& s : p.leaf_states) {
        const at::Tensor leaf = leaf_tensor(s.leaf, earlier);
        if (!leaf.defined()) return false;
        if (k == index && state(leaf) != s.before) return false;
        defined[leaf.unsafeGetTensorImpl()] = s.after;
      }
    }
  }
  return true;
}

bool BlockReplayer::follows(uint32_t index, const WorkItem& item, uint64_t seq, const std::vector<uint64_t>& seqs,
                            const std::function<const WorkItem*(uint32_t)>& earlier) const {
  const Block& block = *block_;
  if (index >= block.items.size() || item.graph != block.graph) return false;
  const ItemPlan& p = block.items[index];
  if (item.kind != p.kind || item.node != p.node || item.op != p.op) return false;
  if (item.autocast != p.autocast || item.inference_mode != p.inference_mode || item.stream) return false;
  for (const auto& [arg, recorded] : p.guards)
    if (arg >= item.args.size() || !same_number(item.args[arg], recorded)) return false;
  if ((p.autograd || p.kind == OpKind::Backward) && !made_as_recorded(p, item, seq, seqs)) return false;
  for (const ItemPlan::Load& l : p.loads) {
    if (l.same_item < 0) continue;
    const auto j = static_cast<uint32_t>(l.same_item);
    const ItemPlan::Load& o = block.items[j].loads[l.same_load];
    c10::IValue hold_before, hold_now;  // list elements only
    const c10::TensorImpl* before = nullptr;
    if (j < next_) {
      before = read_impl(table_[o.id]);
    } else if (const WorkItem* w = earlier(j)) {
      if (unfilled_arg(*w, o.arg, o.elem)) continue;
      before = arg_impl(*w, o.arg, o.elem, hold_before);
    }
    if (unfilled_arg(item, l.arg, l.elem)) continue;
    const c10::TensorImpl* now = arg_impl(item, l.arg, l.elem, hold_now);
    if (!before || before == kDetachedRead || before != now) return false;
  }
  return true;
}

bool BlockReplayer::made_as_recorded(const ItemPlan& p, const WorkItem& item, uint64_t seq,
                                     const std::vector<uint64_t>& seqs) const {
  // The recorded backward routes each gradient along the recorded history: a tensor read from
  // outside the iteration then must be one now, and one an earlier item made must be that item's
  // (`(h * s)` with `s = w` recorded and `s = h` now, or the backward of another loss of the same
  // shape, replayed the recorded gradients). Told by the item that made a placeholder (its
  // slot's sequence number): one from before this iteration's first item is from outside.
  const uint64_t first = seqs.empty() ? seq : seqs[0];
  for (const ItemPlan::Load& l : p.loads) {
    c10::IValue hold;  // list elements only
    const c10::IValue& a = arg_ref(item, l.arg, l.elem, hold);
    uint64_t made = 0;  // the item that made it; 0: a real tensor (or not a tensor)
    if (a.isTensor() && a.toTensor().defined()) {
      const PlaceholderImpl* ph = placeholder_impl(a.toTensor().unsafeGetTensorImpl());  // filled or not
      made = ph && ph->slot() ? ph->slot()->seq : 0;
    }
    const bool inside = made >= first;
    bool as_recorded = l.made_by.empty() && !inside;  // from outside then and now
    for (int32_t j : l.made_by) {
      if (j == ItemPlan::Load::kOutside) {
        as_recorded = as_recorded || !inside;
      } else {
        as_recorded = as_recorded || (inside && static_cast<size_t>(j) < seqs.size() && made == seqs[static_cast<size_t>(j)]);
      }
    }
    if (!as_recorded) return false;
  }
  return true;
}

void BlockReplayer::load(const ItemPlan& p, WorkItem& item) {
  for (const ItemPlan::Load& l : p.loads) {
    // A load sharing an earlier item's entry (BlockRecorder) is not copied again where this
    // item's tensor is the one already there: the copy would write the reference count of a
    // tensor the program thread counts too (a parameter, the `y` of a `z = z + y` chain), a cache
    // line moving between the two cores at every op. Another tensor takes the entry (the
    // kernels after this item read this item's tensor there, as recorded).
    if (l.same_item >= 0) {
      c10::IValue hold;  // list elements only
      const c10::TensorImpl* now = arg_impl(item, l.arg, l.elem, hold);
      if (now && now != kDetachedRead && now == read_impl(table_[l.id])) continue;
    }
    table_[l.id] = item_arg(item, l.arg, l.elem);
  }
}

void BlockReplayer::bind_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                torch::jit::Stack* stack) {
  if (!bind_ok_ || bind_cursor_ >= bind_end_ || !(*block_->kernels[bind_cursor_].op == op)) {
    bind_ok_ = false;
    op.redispatchBoxed(keys, stack);
    return;
  }
  const RecordedKernel& k = block_->kernels[bind_cursor_++];
  {
    // With one thread where its recording found the same bits so, as when replayed (a bound
    // forward with the program's count ran parallel regions whose spinning OpenMP worker took
    // the core the program's Python runs on), and as when replayed a long one with the
    // program's count while the program thread waits.
    const bool spreads = spread(k, at::get_num_threads());  // the item's count (GraphRunner::bind)
    counts_.spread += spreads;
    OneThread threads(k.one_thread && !spreads);
    counts_.bound_one_thread += threads.active();
    const bool parallel = !threads.active() && at::get_num_threads() > 1;
    if (parallel && k.large) note_parallel_region();
    TeamRegion region(parallel && opens_region(k));
    op.redispatchBoxed(keys, stack);
  }
  for (uint32_t o = 0; o < k.outs; ++o) table_[k.first_out + o] = (*stack)[stack->size() - k.outs + o];
  for (uint32_t id : k.release) table_[id] = c10::IValue();
}

bool BlockReplayer::bind(WorkItem& item, const std::function<void(WorkItem&)>& execute) {
  const Block& block = *block_;
  const ItemPlan& p = block.items[next_];
  item_ = next_;
  load(p, item);
  bind_cursor_ = p.kernels_begin;
  bind_end_ = p.kernels_end;
  bind_ok_ = true;
  {
    c10::impl::IncludeDispatchKeyGuard include(kRecordKey);
    BlockReplayer* previous = t_binder;
    t_binder = this;
    struct Restore {
      BlockReplayer* previous;
      ~Restore() { t_binder = previous; }
    } restore{previous};
    execute(item);
  }
  ++next_;
  if (!bind_ok_ || bind_cursor_ != bind_end_) return false;
  if (p.kind == OpKind::GradRead && p.out_table >= 0 && !item.outs.empty() && item.outs[0])
    table_[static_cast<uint32_t>(p.out_table)] = item.outs[0]->value;
  for (uint32_t id : p.release) table_[id] = c10::IValue();
  return true;
}

void BlockReplayer::release_graph(const std::vector<at::Tensor>& roots) { release_nodes(root_nodes(roots)); }

void BlockReplayer::release_nodes(std::vector<torch::autograd::Node*> starts) {
  walk_autograd_graph(std::move(starts), [](torch::autograd::Node& n) {
    n.release_variables();
    return true;
  });
}

bool BlockReplayer::run_elementwise(const RecordedKernel& k, bool alone, bool* tried) {
  constexpr size_t kMaxArgs = 4;  // addcmul's: self, tensor1, tensor2, value
  if (k.view || k.random != RandomFill::Op::None || k.outs != 1 || k.args.size() > kMaxArgs)
    return false;
  const c10::IValue* args[kMaxArgs];
  c10::IValue owned[kMaxArgs];  // a list element or a leaf's gradient, which have no place to be read in
  for (size_t i = 0; i < k.args.size(); ++i) {
    const Ref& r = k.args[i];
    if (r.kind == Ref::Kind::Const) {
      args[i] = &r.constant;
    } else if (r.kind == Ref::Kind::Value && r.elem < 0) {
      args[i] = &table_[r.id];
    } else {
      owned[i] = value(r);
      args[i] = &owned[i];
    }
  }
  *tried = true;
  const uint64_t reused = k.elementwise->reused();
  at::Tensor result;
  if (!k.elementwise->run(c10::ArrayRef<const c10::IValue*>(args, k.args.size()), &result)) return false;
  if (alone && k.elementwise->reused() != reused) ++counts_.results_reused;
  for (uint32_t w : k.written)  // as ADInplaceOrView does (run_kernel)
    if (args[w]->isTensor() && args[w]->toTensor().defined()) args[w]->toTensor().unsafeGetTensorImpl()->bump_version();
  table_[k.first_out] = std::move(result);
  for (uint32_t id : k.release) table_[id] = c10::IValue();
  return true;
}

bool BlockReplayer::run_alias(const RecordedKernel& k) {
  const c10::IValue& v = table_[k.args[0].id];  // a table value (kernel_begin)
  if (!v.isTensor() || !v.toTensor().defined()) return false;
  const at::Tensor& in = v.toTensor();
  const c10::TensorImpl* impl = in.unsafeGetTensorImpl();
  const AliasGeometry& g = *k.alias;
  // The storage must hold the result, as the kernel checks (an as_strided may reach past its
  // input's extent; another input of the same geometry may sit on a smaller storage).
  if (impl->key_set() != g.in_keys || in.scalar_type() != g.dtype || !impl->has_storage() ||
      impl->storage_offset() != g.in_offset || !same_ints(in.sizes(), g.in_sizes) ||
      !same_ints(in.strides(), g.in_strides) || impl->unsafe_storage().nbytes() < g.out_bytes)
    return false;
  for (const auto& [arg, recorded] : g.numbers)
    if (!same_number(table_[k.args[arg].id], recorded)) return false;
  // What as_strided and alias_with_sizes_and_strides make.
  auto out = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(in.storage()), impl->key_set(),
                                                  in.dtype());
  out->set_sizes_and_strides(g.out_sizes, g.out_strides, g.out_offset);
  out->set_version_counter(impl->version_counter());  // a view shares its base's (run_kernel)
  table_[k.first_out] = at::Tensor(std::move(out));
  for (uint32_t id : k.release) table_[id] = c10::IValue();
  return true;
}

bool BlockReplayer::run_out_form(const RecordedKernel& k, torch::jit::Stack& stack) {
  const size_t n = stack.size();
  const at::Tensor* free = k.kept.free_set(k.outs);
  if (!free) return false;
  // Same geometry as the last results: the meta function computes the output's from the inputs'
  // (which follow the block's) and the constants, so the out= form writes them as they are.
  for (uint32_t o = 0; o < k.outs; ++o) {
    forget_history(free[o]);
    stack.emplace_back(free[o]);
  }
  if (k.out_checked) {
    k.out_form->redispatchBoxed(k.keys, &stack);
    return true;
  }
  // The first time: the functional form on the same arguments as well. The out= form must give
  // its bits and geometry, in the kept results where they are, without a word (mse_loss's meta
  // function sizes its output for the unreduced loss first: the out= form resizes a kept
  // reduced result, with a warning, and its storage moves).
  torch::jit::Stack functional(stack.begin(), stack.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<at::Tensor> kept;
  std::vector<const void*> data;
  for (size_t i = n; i < stack.size(); ++i) {
    kept.push_back(stack[i].toTensor());
    data.push_back(kept.back().const_data_ptr());
  }
  struct Warned : c10::WarningHandler {
    bool any = false;
    void process(const c10::Warning&) override { any = true; }
  } warned;
  bool failed = false;  // an error of the out= form alone (the functional form's own comes next)
  {
    c10::WarningUtils::WarningHandlerGuard capture(&warned);
    try {
      k.out_form->redispatchBoxed(k.keys, &stack);
    } catch (const std::exception&) {
      failed = true;
    }
  }
  k.op->redispatchBoxed(k.keys, &functional);
  bool same = !failed && !warned.any && stack.size() == k.outs && functional.size() == k.outs;
  for (uint32_t o = 0; o < k.outs && same; ++o) {
    const at::Tensor& got = stack[o].toTensor();
    const at::Tensor& want = functional[o].toTensor();
    same = got.unsafeGetTensorImpl() == kept[o].unsafeGetTensorImpl() && got.const_data_ptr() == data[o] &&
           got.scalar_type() == want.scalar_type() && same_ints(got.sizes(), want.sizes()) &&
           same_ints(got.strides(), want.strides()) && got.is_non_overlapping_and_dense() &&
           std::memcmp(got.const_data_ptr(), want.const_data_ptr(), got.nbytes()) == 0;
  }
  if (same) {
    k.out_checked = true;
  } else {
    k.out_form = nullptr;  // allocates its results from now on; these are the functional form's
    k.kept.clear();
    stack = std::move(functional);
  }
  return true;
}

void BlockReplayer::keep_results(const RecordedKernel& k, c10::ArrayRef<c10::IValue> outs) {
  c10::SmallVector<at::Tensor, 2> results;
  for (const c10::IValue& v : outs) {
    if (!v.isTensor()) return;
    results.push_back(v.toTensor());
  }
  k.kept.keep(results.data(), results.size());
}

void BlockReplayer::run_kernel(const RecordedKernel& k, torch::jit::Stack& stack, int num_threads, bool alone) {
  if (k.alias && run_alias(k)) {
    counts_.views_remade += alone;  // counters: the GraphRunner's own thread only
    return;
  }
  const bool spreads = alone && spread(k, num_threads);
  if (spreads) ++counts_.spread;
  const int threads = k.one_thread && !spreads ? 1 : num_threads;
  if (threads > 0 && at::get_num_threads() != threads) set_intraop_threads(threads);
  if (threads > 1 && k.large) note_parallel_region();
  // A kernel marked for spreading that runs on one thread is timed: one that ran in under
  // half of RecordedKernel::kSpreadNs was slow when recorded only by accident (a verdict
  // from the cache file skips the recording's own one-thread runs) and is spread no more.
  const bool timed = alone && k.spread && threads == 1;
  const bool region = alone && threads > 1 && opens_region(k);  // a TeamRegion around the kernel
  // An elementwise kernel reads its arguments in place: copies of them would write the reference
  // counts of tensors the program thread holds and counts too (a parameter, a batch, the `y` of a
  // `z = z + y` chain), a cache line moving between the two cores at every op. Spread (the
  // program's count while the program waits), it runs through its kept iterator too, its parallel
  // region split as eager execution splits it: same partition, same bits.
  bool tried = false;  // run_elementwise asked the ElementwiseReplay already
  if (k.elementwise && !timed) {
    TeamRegion open(region);
    if (run_elementwise(k, alone, &tried)) {
      counts_.spread_elementwise += spreads;
      return;
    }
  }
  stack.clear();
  stack.reserve(k.args.size());
  for (const Ref& a : k.args) stack.push_back(value(a));
  c10::SmallVector<at::Tensor, 2> written;
  for (uint32_t w : k.written) {
    const c10::IValue& v = stack[w];
    if (v.isTensor()) {
      written.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) written.push_back(t);
    }
  }
  at::Tensor base = k.view && stack[0].isTensor() ? stack[0].toTensor() : at::Tensor();
  const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  const bool filled = k.random != RandomFill::Op::None && RandomFill::run(k.random, stack);
  if (filled) ++counts_.random_fills;  // a barrier: never on a helping thread
  const uint64_t reused = k.elementwise ? k.elementwise->reused() : 0;
  const bool ran = filled || (k.elementwise && threads == 1 && !tried && k.elementwise->run(stack));
  if (alone && k.elementwise && k.elementwise->reused() != reused) ++counts_.results_reused;
  if (!ran) {
    at::AutoDispatchBelowADInplaceOrView below;
    TeamRegion open(region);
    if (k.out_form && run_out_form(k, stack)) {  // (most kernels have none: no call)
      counts_.outputs_kept += alone;
    } else {
      k.op->redispatchBoxed(k.keys, &stack);
      if (k.out_form) keep_results(k, c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - k.outs));
    }
  }
  if (timed && std::chrono::steady_clock::now() - t0 < std::chrono::nanoseconds(RecordedKernel::kSpreadNs / 2))
    k.spread = false;
  // What eager's ADInplaceOrView does around the kernel: bump the version of what it
  // wrote; a view shares its base's version counter.
  for (const at::Tensor& w : written)
    if (w.defined()) w.unsafeGetTensorImpl()->bump_version();
  for (uint32_t o = 0; o < k.outs; ++o) {
    c10::IValue& out = stack[stack.size() - k.outs + o];
    if (base.defined()) {
      const auto& counter = base.unsafeGetTensorImpl()->version_counter();
      if (out.isTensor()) {
        out.toTensor().unsafeGetTensorImpl()->set_version_counter(counter);
      } else if (out.isTensorList()) {
        for (const at::Tensor& t : out.toTensorList()) t.unsafeGetTensorImpl()->set_version_counter(counter);
      }
    }
    table_[k.first_out + o] = std::move(out);
  }
  for (uint32_t id : k.release) table_[id] = c10::IValue();
}

void BlockReplayer::run(WorkItem& item) {
  const Block& block = *block_;
  item_ = next_;
  const ItemPlan& p = block.items[next_++];
  load(p, item);
  switch (p.kind) {
    case OpKind::GradRead: {
      run_grad_read(item);
      if (p.out_table >= 0) table_[static_cast<uint32_t>(p.out_table)] = item.outs.at(0)->value;
      break;
    }
    case OpKind::GradWrite: run_grad_write(item); break;
    default: {
      // Only while the GraphRunner's OpenMP workers sleep (openmp_team.h): where they spin, a
      // helping program thread shares a core with one, and a long kernel is spread over them
      // while the program waits instead (forced co-execution with spinning workers: hf_llama
      // 5.38 -> 6.21 ms per step; bert, payoff check on, 6.4-7.2 -> 7.0-7.9).
      if (p.lanes && lanes_ && openmp_spinning_limited()) {
        // A helping thread runs kernels with this thread's dispatch keys, less the recording hook.
        c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
        keys.included_ = keys.included_.remove(kRecordKey);
        counts_.helped += lanes_->run(*p.lanes, keys, [&](uint32_t i, bool) {
          thread_local torch::jit::Stack scratch;  // one per thread that runs kernels
          run_kernel(block.kernels[p.kernels_begin + i], scratch, item.num_threads, p.lanes->barrier[i]);
          scratch.clear();  // holds no tensor past its kernel
        });
        counts_.kernels += p.kernels_end - p.kernels_begin;
      } else {
        // Reused by the item's kernels and by the next items' (a vector per item was an
        // allocation and a free per replayed item); holds no tensor past the item, even one
        // whose kernel failed.
        struct Clear {
          torch::jit::Stack& stack;
          ~Clear() { stack.clear(); }
        } clear{scratch_};
        for (uint32_t ki = p.kernels_begin; ki < p.kernels_end; ++ki) {
          run_kernel(block.kernels[ki], scratch_, item.num_threads, /*alone=*/true);
          ++counts_.kernels;
        }
      }
      break;
    }
  }
  for (const ItemPlan::GradEffect& e : p.effects) {
    at::Tensor leaf = value(block.leaves[e.leaf]).toTensor();
    item.released.push_back(std::exchange(leaf.mutable_grad(), tensor(e.value)));
  }
  if (p.kind == OpKind::Aten) {
    for (size_t k = 0; k < item.outs.size() && k < p.outs.size(); ++k) {
      if (!item.outs[k]) continue;
      at::Tensor v = tensor(p.outs[k]);
      if (item.expect && (*item.expect)[k].meta.requires_grad && !v.requires_grad()) {
        const int32_t name = k < p.grad_fns.size() ? p.grad_fns[k] : -1;
        const auto& names = block_->grad_fn_names;
        auto& node = freed_[name < 0 ? names.size() : static_cast<size_t>(name)];
        if (!node) {
          node = make_node<ReplayedHistory>(name < 0 ? "TerraReplayedBackward"
                                                     : names[static_cast<size_t>(name)]);
        }
        const uint32_t nr = node->add_input_metadata(v);
        torch::autograd::impl::set_gradient_edge(v, torch::autograd::Edge(node, nr));
      }
      fill_output(item, k, v);
    }
  }
  for (uint32_t id : p.release) table_[id] = c10::IValue();
}

}  // namespace terra::runtime
