#include <Python.h>  // placeholders' objects: reference counts, weak references, attributes

#include "placeholder.h"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <sstream>

namespace terra::runtime {

namespace {
thread_local std::vector<at::Tensor>* value_graveyard = nullptr;
}  // namespace

void set_value_graveyard(std::vector<at::Tensor>* graveyard) { value_graveyard = graveyard; }

Slot::~Slot() {
  if (runner_allocated && value_graveyard && value.defined()) value_graveyard->push_back(std::move(value));
}

void Slot::retire() {
  if (runner_allocated && value_graveyard && value.defined()) value_graveyard->push_back(std::move(value));
  value.reset();
  seq = 0;
  group = AliasGroup{};
  runner_allocated = false;  // nothing to release (DeadValueWatch::only_reader_holds) until renewed
  release_after.store(0, std::memory_order_relaxed);
}

PlaceholderImpl::PlaceholderImpl(std::shared_ptr<Slot> slot, std::shared_ptr<AliasGroup> group,
                                 c10::DispatchKeySet keys, caffe2::TypeMeta dtype,
                                 c10::Device device, bool detached)
    : c10::TensorImpl(keys, dtype, device),
      slot_(std::move(slot)),
      group_(std::move(group)),
      detached_(detached) {
  // No storage until `become`: a kernel handed a placeholder raises PyTorch's "Cannot access data
  // pointer of Tensor that doesn't have storage". (A message of Terra's own would cost an
  // ExtraMeta and two strings, three mallocs, on every co-executed op.)
  storage_ = {};
  set_storage_access_should_throw();
}

void PlaceholderImpl::release_resources() {
  TensorImpl::release_resources();
  slot_.reset();
  group_.reset();
  view_base_.reset();
}

c10::intrusive_ptr<c10::TensorImpl> PlaceholderImpl::copy_detached(
    bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<PlaceholderImpl>(slot_, group_, key_set(), dtype(), device(),
                                                   /*detached=*/true);
  impl->set_sizes_and_strides(sizes(), strides(), storage_offset());
  impl->set_allow_tensor_metadata_change(allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> PlaceholderImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  if (filled_) return TensorImpl::shallow_copy_and_detach(version_counter, allow_tensor_metadata_change);
  auto impl = copy_detached(allow_tensor_metadata_change);
  impl->set_version_counter(version_counter);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> PlaceholderImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  if (filled_)
    return TensorImpl::shallow_copy_and_detach(std::move(version_counter), allow_tensor_metadata_change);
  auto impl = copy_detached(allow_tensor_metadata_change);
  impl->set_version_counter(std::move(version_counter));
  return impl;
}

void PlaceholderImpl::become(const at::Tensor& real) {
  storage_ = real.storage();
  storage_access_should_throw_ = false;
  set_sizes_and_strides(real.sizes(), real.strides(), real.storage_offset());
  set_version_counter(real.unsafeGetTensorImpl()->version_counter());
  filled_ = true;
  // The raw autograd fields, not grad_fn(): that accessor would re-check views made under
  // no_grad and raise where eager execution never asks.
  auto* meta = torch::autograd::impl::get_autograd_meta(real);
  if (meta && meta->grad_fn_) {
    at::Tensor self(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(this));
    torch::autograd::impl::set_gradient_edge(self, {meta->grad_fn_, meta->output_nr_});
  }
}

TensorMeta meta_of(const at::Tensor& t) {
  TensorMeta m;
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  m.storage_offset = t.storage_offset();
  m.dtype = static_cast<int8_t>(t.scalar_type());
  m.device_type = static_cast<int8_t>(t.device().type());
  m.device_index = t.device().index();
  m.requires_grad = t.requires_grad();
  return m;
}

std::string describe(const TensorMeta& m) {
  std::ostringstream os;
  os << c10::toString(scalar_type_of(m)) << c10::IntArrayRef(m.sizes);
  if (device_of(m).type() != c10::kCPU) os << "@" << device_of(m);
  if (m.requires_grad) os << " requires_grad";
  return os.str();
}

at::Tensor make_placeholder(const TensorMeta& meta, std::shared_ptr<Slot> slot,
                            std::shared_ptr<AliasGroup> group) {
  auto keys = c10::DispatchKeySet(c10::computeDispatchKey(scalar_type_of(meta), c10::kStrided, device_of(meta)));
  auto impl = c10::make_intrusive<PlaceholderImpl>(std::move(slot), std::move(group), keys,
                                                   c10::scalarTypeToTypeMeta(scalar_type_of(meta)),
                                                   device_of(meta), /*detached=*/false);
  impl->set_sizes_and_strides(meta.sizes, meta.strides, meta.storage_offset);
  at::Tensor t(std::move(impl));
  if (meta.requires_grad) {
    t.set_requires_grad(true);
    static_cast<PlaceholderImpl*>(t.unsafeGetTensorImpl())->set_born_requiring_grad();
  }
  return t;
}

at::Tensor placeholder_value(const PlaceholderImpl& p) {
  const at::Tensor& v = p.slot()->value;
  return p.detached() ? v.detach() : v;
}

at::Tensor resolve_placeholder(const at::Tensor& t) {
  auto* p = t.defined() ? as_placeholder(t) : nullptr;
  return p ? placeholder_value(*p) : t;
}

c10::IValue resolve_placeholders(const c10::IValue& v) {
  return map_tensors(v, [](const at::Tensor& t) { return resolve_placeholder(t); });
}

void DeadValueWatch::watch(const torch::jit::Stack& args, uint64_t seq) {
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      PlaceholderImpl* p = t.defined() ? as_placeholder(t) : nullptr;
      if (!p) return;
      p->set_last_use(seq);
      if (n_ < kSize) entries_[n_++] = Entry{p, seq, 0};
    });
  }
}

void DeadValueWatch::check(uint64_t lightened, bool gil) {
  size_t kept = 0;
  for (size_t i = 0; i < n_; ++i) {
    Entry e = entries_[i];
    if (e.seq <= lightened) continue;          // its item was dropped: the placeholder may be gone
    if (e.p->last_use() != e.seq) continue;    // read again by a later item: watched there
    if (only_reader_holds(*e.p, lightened)) {
      e.p->slot()->release_after.store(e.seq, std::memory_order_release);
      // Its object leaves the cyclic collector's lists: gc.get_objects() would list a tensor that
      // eagerly was freed, and reading it would find its value released. Only with the GIL (the C
      // fast path); on the dispatcher route, which runs without it, it stays listed.
      PyObject* obj = e.p->pyobj_slot()->load_pyobj();
      if (obj && gil) PyObject_GC_UnTrack(obj);
      continue;
    }
    if (++e.checks < kChecks) entries_[kept++] = e;
  }
  n_ = kept;
}

bool DeadValueWatch::only_reader_holds(PlaceholderImpl& p, uint64_t lightened) {
  const std::shared_ptr<Slot>& slot = p.slot();
  if (!slot || !slot->runner_allocated || p.filled()) return false;
  // The item's reference, and the one the tensor's Python object holds, if it has one (which,
  // with another C++ reference alive, holds the object in turn: torch's PyObject preservation).
  const uint32_t refs = c10::raw::intrusive_ptr::use_count(&p);
  PyObject* obj = p.pyobj_slot()->load_pyobj();
  if (obj) {
    if (refs != 2 || Py_REFCNT(obj) != 1) return false;
    const Py_ssize_t weaklist = Py_TYPE(obj)->tp_weaklistoffset;
    if (weaklist <= 0 || *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + weaklist))
      return false;
  } else if (refs != 1) {
    return false;
  }
  // The slot: this placeholder (and its alias group, which shares the slot's ownership), and the
  // producing item until it was dropped. Anything else (a detached copy, a view's group, the
  // GraphRunner's own copy) means another reader.
  const long expected = 1 + (p.group().get() == &slot->group ? 1 : 0) + (slot->seq > lightened ? 1 : 0);
  return slot.use_count() == expected;
}

uint32_t release_dead_values(const torch::jit::Stack& args, uint64_t seq) {
  uint32_t released = 0;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      const PlaceholderImpl* p = t.defined() ? as_placeholder(t) : nullptr;
      Slot* slot = p ? p->slot().get() : nullptr;
      if (!slot || slot->release_after.load(std::memory_order_acquire) != seq) return;
      // A value with a Python object of its own is not the GraphRunner's to drop (its last
      // reference but one would take the GIL); kernel outputs have none.
      if (slot->value.defined() && !slot->value.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj()) {
        slot->value = at::Tensor();
        ++released;
      }
    });
  }
  return released;
}

namespace {

// No autograd metadata, or what make_placeholder gives an output that requires grad: a leaf
// requiring grad, with no gradient, hook, name or forward gradient (the program may have given it
// any of them before dropping it).
bool as_made(PlaceholderImpl& p) {
  auto* meta = static_cast<torch::autograd::AutogradMeta*>(p.autograd_meta());
  if (!meta) return true;
  return p.born_requiring_grad() && meta->requires_grad_ && !meta->grad_.defined() && !meta->grad_fn_ &&
         meta->grad_accumulator_.expired() && !meta->fw_grad_ && meta->hooks_.empty() && !meta->cpp_hooks_list_ &&
         !meta->post_acc_grad_hooks_ && !meta->retains_grad_ && !meta->is_view_ && meta->name_.empty() &&
         meta->output_nr_ == 0;
}

// Nothing but `ref` (one strong reference) reaches the placeholder `p`, and nothing tells it from
// a new one: see PlaceholderPool.
bool dead_but_for(const at::Tensor& ref, PlaceholderImpl& p) {
  if (p.filled() || p.detached() || p.unsafe_storage() || p.has_extra_meta() || !as_made(p)) return false;
  // The reference, and the Python object's if it has one (which, with `ref` alive, holds the
  // object in turn: torch's PyObject preservation); weak ones: the strong ones' together, and
  // the PythonRunner's list of live placeholders.
  PyObject* obj = p.pyobj_slot()->load_pyobj();
  if (ref.use_count() != (obj ? 2u : 1u) || ref.weak_use_count() != 2) return false;
  if (!obj) return true;
  // Only the tensor holds its object: no Python reference, attribute, weak reference or hook,
  // and the class eager execution gives a new tensor.
  if (Py_REFCNT(obj) != 1 || Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) return false;
  const auto* var = reinterpret_cast<const THPVariable*>(obj);
  if (var->backward_hooks || var->post_accumulate_grad_hooks) return false;
  const Py_ssize_t weaklist = Py_TYPE(obj)->tp_weaklistoffset;
  if (weaklist > 0 && *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + weaklist)) return false;
  PyObject** dict = _PyObject_GetDictPtr(obj);
  return !dict || !*dict || PyDict_GET_SIZE(*dict) == 0;
}

}  // namespace

void PlaceholderPool::offer(c10::IValue& v) {
  if (!v.isTensor()) return;
  PlaceholderImpl* p = v.toTensor().defined() ? as_placeholder(v.toTensor()) : nullptr;
  if (!p || p->reuse_class_ == PlaceholderImpl::kNoReuse || kept_ == kMaxKept) return;
  // Dropped from the item first: an item that read it twice (`c * c`) holds it twice.
  at::Tensor t = std::move(v).toTensor();
  v = c10::IValue();
  if (!dead_but_for(t, *p)) return;
  // Its value goes now, as it would have with the placeholder. The slot stays with it where
  // nothing else holds it (its producing item was dropped; its group is the slot's own), for
  // `take` to hand out again: an allocation and a free per op less.
  const bool own = p->slot_ && p->group_.get() == &p->slot_->group && p->slot_.use_count() == 2;
  p->group_.reset();
  if (own) {
    p->slot_->retire();
  } else {
    p->slot_.reset();
  }
  if (PyObject* obj = p->pyobj_slot()->load_pyobj()) PyObject_GC_UnTrack(obj);
  by_class_[p->reuse_class_].push_back(c10::intrusive_ptr<PlaceholderImpl>::reclaim(
      static_cast<PlaceholderImpl*>(t.unsafeReleaseTensorImpl())));
  ++kept_;
}

uint32_t PlaceholderPool::class_of(const TensorMeta& meta) {
  std::vector<uint32_t>& same_hash = class_index_[meta_hash({meta})];
  for (uint32_t c : same_hash)
    if (classes_[c] == meta) return c;
  if (classes_.size() == kMaxClasses) return PlaceholderImpl::kNoReuse;
  const auto c = static_cast<uint32_t>(classes_.size());
  classes_.push_back(meta);
  by_class_.emplace_back();
  same_hash.push_back(c);
  return c;
}

at::Tensor PlaceholderPool::take(uint32_t cls, const TensorMeta& meta, bool inference, uint64_t seq,
                                 std::shared_ptr<Slot>* slot) {
  if (cls >= by_class_.size() || by_class_[cls].empty()) return {};
  c10::intrusive_ptr<PlaceholderImpl> p = std::move(by_class_[cls].back());
  by_class_[cls].pop_back();
  --kept_;
  if (PyObject* obj = p->pyobj_slot()->load_pyobj()) PyObject_GC_Track(obj);
  // The program may have changed its shape in place (`t.t_()`); inference mode decides the keys
  // and the version counter of a new placeholder. Otherwise `p` dies here.
  if (!same_ints(p->sizes(), meta.sizes) || !same_ints(p->strides(), meta.strides) ||
      p->storage_offset() != meta.storage_offset || p->dtype() != c10::scalarTypeToTypeMeta(scalar_type_of(meta)) ||
      p->is_inference() != inference || (p->autograd_meta() != nullptr) != meta.requires_grad)
    return {};
  if (!p->slot_) p->slot_ = std::allocate_shared<Slot>(PoolAllocator<Slot>());
  p->slot_->seq = seq;
  p->slot_->runner_allocated = true;
  p->group_ = own_group(p->slot_);
  *slot = p->slot_;
  p->born_requiring_grad_ = meta.requires_grad;  // as_made: its autograd metadata says so
  p->last_use_ = 0;
  p->view_base_.reset();  // pooled outputs are no views; as made
  auto& version = p->version_counter_;
  if (version.enabled() && (!version.unique() || version.current_version() != 0)) version = c10::VariableVersion(0);
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>(std::move(p)));
}

void PlaceholderPool::clear() {
  if (kept_ == 0) return;
  const PyGILState_STATE gil = PyGILState_Ensure();  // they die here, with their Python objects
  for (auto& kept : by_class_) {
    for (auto& p : kept)
      if (PyObject* obj = p->pyobj_slot()->load_pyobj()) PyObject_GC_Track(obj);
    kept.clear();
  }
  kept_ = 0;
  PyGILState_Release(gil);
}

}  // namespace terra::runtime
