// Placeholders: the tensors the PythonRunner hands to the program during co-execution.
//
// A placeholder is a real at::Tensor with the sizes, strides, dtype, device and requires_grad the
// trace recorded, but no storage: its data lives in a `Slot` that the GraphRunner fills when it
// has executed the producing op. Metadata queries from Python need no synchronisation. Any path
// that reaches the data of an unfilled placeholder throws a clear error instead of reading
// garbage (storage access is disabled), so a missed synchronisation can never be a segfault.
// Python-level fetches (`.item()`, printing, `.numpy()`) wait for the slot and then fill the
// placeholder with the real tensor's storage, after which it is an ordinary tensor.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "block_pool.h"
#include "same_ints.h"
#include "terra/trace.h"

namespace terra::runtime {

// Groups of tensors that share storage (a placeholder and the views made from it). An in-place op
// on any member records its sequence number here, so a fetch waits for the last writer too.
struct AliasGroup {
  uint64_t last_write = 0;
};

// Where the GraphRunner puts the value of one op output. Written once by the GraphRunner thread
// before it publishes item `seq` done through its completion counter; read by the Python thread only
// after waiting for that counter.
struct Slot {
  // What the program thread writes per op comes first, on the line of the reference counts,
  // which std::allocate_shared puts just before the slot and which the program thread also
  // writes per op (copies of the slot and its alias group); what the GraphRunner writes (`value`)
  // comes a line later. On one line, the program thread's count updates after the GraphRunner
  // filled `value` each fetched the line from the other core: 5% of its samples on a 1x1 add chain.
  uint64_t seq = 0;  // sequence number of the work item that produces it
  // The alias group of an output that starts one (not a view): kept inside the slot so that one
  // allocation serves both (see `own_group`).
  AliasGroup group;
  // `value` is a kernel's output, allocated in the GraphRunner thread: when the slot dies in a
  // thread with a value graveyard, the value goes there instead of being freed at once.
  bool runner_allocated = false;
  // The counts (libstdc++: 16 bytes, at the start of the pooled block, kBlockAlign) and the three
  // fields above (the bool padded to `value`'s alignment) fill the block's first line; `value`
  // starts the next (BlockPool.ASlotsValueIsOnTheLineAfterItsFirstFields checks it).
  static constexpr size_t kCountsBytes = 16;
  char apart_from_the_counts_[kBlockAlign - kCountsBytes - sizeof(seq) - sizeof(group) - alignof(at::Tensor)] = {};
  at::Tensor value;
  // The item after which the GraphRunner drops `value`: the last item that reads it, once nothing
  // but that item can reach the value any more (DeadValueWatch). 0: not known.
  std::atomic<uint64_t> release_after{0};
  // Made new again for a kept placeholder (PlaceholderPool): the value goes as ~Slot lets it go.
  void retire();
  ~Slot();
};

// Values of runner-allocated slots that die in the calling thread are moved into `graveyard`
// (nullptr: freed at once). The PythonRunner hands the graveyard to the GraphRunner with the next
// work item, so memory is freed by the thread that allocated it: freeing another thread's glibc
// arena chunks takes that arena's lock, which the allocating thread holds as it allocates.
void set_value_graveyard(std::vector<at::Tensor>* graveyard);

// The alias group stored in `slot`, sharing the slot's ownership (no allocation of its own).
inline std::shared_ptr<AliasGroup> own_group(const std::shared_ptr<Slot>& slot) {
  return std::shared_ptr<AliasGroup>(slot, &slot->group);
}

class PlaceholderImpl final : public c10::TensorImpl {
 public:
  PlaceholderImpl(std::shared_ptr<Slot> slot, std::shared_ptr<AliasGroup> group,
                  c10::DispatchKeySet keys, caffe2::TypeMeta dtype, c10::Device device,
                  bool detached);

  static void* operator new(size_t size) { return pool_allocate(size); }
  static void operator delete(void* p, size_t size) { pool_free(p, size); }

  const std::shared_ptr<Slot>& slot() const { return slot_; }
  const std::shared_ptr<AliasGroup>& group() const { return group_; }
  // `.data`/`.detach()`-style shallow copies keep the slot but read it detached.
  bool detached() const { return detached_; }
  // Turns this placeholder into an ordinary tensor aliasing `real` (its computed value): same
  // storage and version counter, and the same autograd edge, so the program can go on using it
  // eagerly. Called in the Python thread once the value is ready.
  void become(const at::Tensor& real);
  bool filled() const { return filled_; }
  // Made with requires_grad from its op's traced outputs. A placeholder that requires grad
  // without that was made a leaf by the program after its op returned: `torch.randn(...,
  // requires_grad=True)` and every factory's requires_grad= set it on the op's result, outside the
  // dispatcher, where the GraphRunner's value never sees it (PythonRunner::issue fills it first).
  bool born_requiring_grad() const { return born_requiring_grad_; }
  void set_born_requiring_grad() { born_requiring_grad_ = true; }
  // The last work item issued with this placeholder among its arguments (Python thread only).
  uint64_t last_use() const { return last_use_; }
  void set_last_use(uint64_t seq) { last_use_ = seq; }

  // The metadata class (PlaceholderPool::class_of) of the output this placeholder is, where its
  // template lets the output be reused (OpTemplate::reuses_out; PlaceholderPool); kNoReuse
  // otherwise.
  static constexpr uint32_t kNoReuse = UINT32_MAX;
  uint32_t reuse_class() const { return reuse_class_; }
  void set_reuse_class(uint32_t cls) { reuse_class_ = cls; }
  bool has_extra_meta() const { return extra_meta_ != nullptr; }
  // What `_base` shows (the root of a view op's input, as eager's autograd view records it);
  // undefined for a placeholder that is not such a view. Held, as eager's view holds its base.
  const at::Tensor& view_base() const { return view_base_; }
  void set_view_base(at::Tensor base) { view_base_ = std::move(base); }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  // The last strong reference is gone while weak ones remain (the PythonRunner's list of the
  // placeholders it handed out, pruned only past 4096 entries): the slot and its value go now.
  // Kept until the object itself died, they held every value of a nested loop's inner iterations
  // until the list was pruned: a loop of 24 ops on 4 MB tensors per inner loop grew by 290 MB per
  // outer iteration, to 8 GB in 30 (eager: 318 MB).
  void release_resources() override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;

 private:
  const char* tensorimpl_type_name() const override { return "terra::PlaceholderImpl"; }
  c10::intrusive_ptr<c10::TensorImpl> copy_detached(bool allow_tensor_metadata_change) const;

  std::shared_ptr<Slot> slot_;
  std::shared_ptr<AliasGroup> group_;
  bool detached_;
  bool filled_ = false;
  bool born_requiring_grad_ = false;
  uint32_t reuse_class_ = kNoReuse;
  uint64_t last_use_ = 0;
  at::Tensor view_base_;
  friend class PlaceholderPool;
};

// The core's terra::TensorMeta (trace.h), read from and compared with ATen tensors: placeholders
// are made from it.
TensorMeta meta_of(const at::Tensor& t);
inline c10::ScalarType scalar_type_of(const TensorMeta& m) { return static_cast<c10::ScalarType>(m.dtype); }
inline c10::Device device_of(const TensorMeta& m) {
  return c10::Device(static_cast<c10::DeviceType>(m.device_type), m.device_index);
}
// Same sizes, strides, dtype, device and requires_grad (what decides the outputs' metadata; not
// the storage offset). Inline: every co-executed op asks it of each tensor argument.
inline bool matches(const TensorMeta& m, const at::Tensor& t) {
  const c10::Device d = t.device();
  return static_cast<int8_t>(t.scalar_type()) == m.dtype && static_cast<int8_t>(d.type()) == m.device_type &&
         d.index() == m.device_index && t.requires_grad() == m.requires_grad && same_ints(t.sizes(), m.sizes) &&
         same_ints(t.strides(), m.strides);
}
// "Float[3, 4]", with the device where not the CPU and " requires_grad".
std::string describe(const TensorMeta& m);

at::Tensor make_placeholder(const TensorMeta& meta, std::shared_ptr<Slot> slot,
                            std::shared_ptr<AliasGroup> group);

// A placeholder filled or not (as_placeholder: not filled yet).
inline PlaceholderImpl* placeholder_impl(const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  return typeid(*impl) == typeid(PlaceholderImpl) ? static_cast<PlaceholderImpl*>(impl) : nullptr;
}

inline PlaceholderImpl* as_placeholder(const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  // A placeholder has no storage until it is filled (and then is not one): most tensors are told
  // apart by that load alone. The type check compares type names with strcmp where the type_info
  // objects differ, as they do for every other tensor: 1.5-2% of the program thread's time on a
  // 1x1 add chain, where each op asks this of its arguments several times.
  if (impl->unsafe_storage()) return nullptr;
  if (typeid(*impl) != typeid(PlaceholderImpl)) return nullptr;
  auto* p = static_cast<PlaceholderImpl*>(impl);
  return p->filled() ? nullptr : p;
}

// `t`'s TensorImpl as a placeholder, filled or not (its slot still names the item that made it);
// nullptr for any other tensor.
inline const PlaceholderImpl* placeholder_impl(const c10::TensorImpl* impl) {
  return typeid(*impl) == typeid(PlaceholderImpl) ? static_cast<const PlaceholderImpl*>(impl) : nullptr;
}

// The real tensor behind a filled placeholder (detached if the placeholder is a detached copy).
at::Tensor placeholder_value(const PlaceholderImpl& p);
// A tensor, or the value of the placeholder it is (ready).
at::Tensor resolve_placeholder(const at::Tensor& t);
// Calls `f` on every tensor in `v` (alone, in a tensor list, in a list such as Tensor?[]), read in
// place: no reference count moves.
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) f(e.toTensor());
  }
}

// `v` with every tensor in it (alone, in a tensor list, in a list such as Tensor?[]) replaced by
// `f(tensor)`; anything else as it is.
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) out.push_back(map_tensors(e, f));
    return out;
  }
  return v;
}

// Values the program dropped before the GraphRunner read them for the last time. Running ahead, the
// program drops `z` of `z = z + y` while the items that make and read it are still pending; the
// item that reads it then holds the placeholder, and the value lived until the program dropped
// that item after it ran, up to 64 items later: a chain of 256x256 adds cycled about 64 buffers
// of 256 KiB through the caches where eager execution reuses two or three. The program thread
// watches the placeholders among the arguments of the items it issues; one that only its last
// reading item still holds (no other C++ reference, no Python reference but the one the tensor
// keeps to its own object, no Python weak reference, no detached copy or view sharing its slot)
// can never be read again by anyone, so its slot is marked, and the GraphRunner drops the value
// right after that item ran, on its own thread, into its own allocator's cache.
class DeadValueWatch {
 public:
  // Python thread, after issuing item `seq` with `args`: watch the placeholders among them.
  void watch(const torch::jit::Stack& args, uint64_t seq);
  // Python thread, before the next issue: marks the slots of watched placeholders that only their
  // last reader still holds (Slot::release_after). `lightened`: the items up to it have been
  // dropped (GraphRunner::lightened), so their placeholders may be gone.
  void check(uint64_t lightened, bool gil);  // gil: this thread holds the GIL

 private:
  struct Entry {
    PlaceholderImpl* p = nullptr;  // held by item `seq` while seq > lightened
    uint64_t seq = 0;
    uint32_t checks = 0;
  };
  // A placeholder still in use after kChecks issues is left to the item's reclaim; at most kSize
  // are watched (the rest are too).
  static constexpr size_t kSize = 32;
  static constexpr uint32_t kChecks = 8;
  static bool only_reader_holds(PlaceholderImpl& p, uint64_t lightened);
  Entry entries_[kSize];
  size_t n_ = 0;
};

// Output placeholders the program has dropped, kept to be handed out again as their node's next
// output (OpTemplate::reuses_out): no new TensorImpl and Python object per op, none freed. On a
// 1x1 add chain, making a placeholder and its object and freeing them were about a quarter of
// what the program thread did per op. A placeholder is taken in when an executed item lets go of
// it as an argument and nothing else reaches it any more (the `z` of `z = z + y`, read by the
// next add): no Python reference, attribute, weak reference or hook, no autograd metadata, no
// other C++ reference than the PythonRunner's list of live placeholders. Its slot goes at once
// (the value is freed as it would have been), its object leaves the cyclic collector's lists
// (gc.get_objects() no more finds it than it would find a freed one) until it is handed out.
// Program thread only, GIL held (`clear` takes it). Without it (the dispatcher route: torch's
// bindings release it around the call, and another Python thread may run) the PythonRunner
// neither offers nor takes.
class PlaceholderPool {
 public:
  // Drops `v`, an executed item's argument, if it is a placeholder of a node whose outputs are
  // reused, and keeps it if nothing else reaches it any more.
  void offer(c10::IValue& v);
  // The class of outputs with `meta`: a kept placeholder is handed out as the next output of any
  // node with its metadata, not only of the node that made it. Kept by node, placeholders of nodes
  // on paths not taken again stayed in their lists while other nodes made new ones (a 50-op
  // chain of 1x1 adds: 92-95% of outputs reused by node, 95-96% by class; the rest are the
  // outputs that die unread, one per iteration there, and the pool's growth to the GraphRunner's
  // lag). kNoReuse past kMaxClasses classes.
  uint32_t class_of(const TensorMeta& meta);
  // A kept placeholder of class `cls`, renewed as make_placeholder(meta, slot, own_group(slot))
  // would make one now (`inference`: inference mode is on) with a slot for the output of item
  // `seq`, runner-allocated, stored in `*slot` (the one it kept, or a new one); undefined if none.
  at::Tensor take(uint32_t cls, const TensorMeta& meta, bool inference, uint64_t seq,
                  std::shared_ptr<Slot>* slot);
  void clear();  // the kept placeholders die

 private:
  // At most this many kept, about 300 bytes each: as many as the items a program thread running
  // ahead may have issued before the executed ones are dropped (python_runner.cpp, kAheadHigh),
  // in which a node's dropped outputs arrive in a burst.
  static constexpr size_t kMaxKept = 2048;
  static constexpr size_t kMaxClasses = size_t{1} << 16;
  std::vector<std::vector<c10::intrusive_ptr<PlaceholderImpl>>> by_class_;
  std::vector<TensorMeta> classes_;                                  // by class
  std::unordered_map<uint64_t, std::vector<uint32_t>> class_index_;  // meta_hash -> classes
  size_t kept_ = 0;
};

// GraphRunner thread, right after running item `seq`: drops the values of the placeholders among
// `args` marked for release after it; returns how many.
uint32_t release_dead_values(const torch::jit::Stack& args, uint64_t seq);

// An argument with every placeholder in it (also inside tensor lists) replaced by its value;
// the values must be ready.
c10::IValue resolve_placeholders(const c10::IValue& v);

}  // namespace terra::runtime
