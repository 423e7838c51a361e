#include "placeholder.h"

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

TensorMeta TensorMeta::of(const at::Tensor& t) {
  TensorMeta m;
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  m.storage_offset = t.storage_offset();
  m.dtype = t.scalar_type();
  m.device = t.device();
  m.requires_grad = t.requires_grad();
  return m;
}

bool TensorMeta::matches(const at::Tensor& t) const {
  return t.scalar_type() == dtype && t.device() == device && t.requires_grad() == requires_grad &&
         t.sizes() == c10::IntArrayRef(sizes) && t.strides() == c10::IntArrayRef(strides);
}

std::string TensorMeta::str() const {
  std::ostringstream os;
  os << c10::toString(dtype) << c10::IntArrayRef(sizes);
  if (device.type() != c10::kCPU) os << "@" << device;
  if (requires_grad) os << " requires_grad";
  return os.str();
}

at::Tensor make_placeholder(const TensorMeta& meta, std::shared_ptr<Slot> slot,
                            std::shared_ptr<AliasGroup> group) {
  auto keys = c10::DispatchKeySet(c10::computeDispatchKey(meta.dtype, c10::kStrided, meta.device));
  auto impl = c10::make_intrusive<PlaceholderImpl>(std::move(slot), std::move(group), keys,
                                                   c10::scalarTypeToTypeMeta(meta.dtype),
                                                   meta.device, /*detached=*/false);
  impl->set_sizes_and_strides(meta.sizes, meta.strides, meta.storage_offset);
  at::Tensor t(std::move(impl));
  if (meta.requires_grad) t.set_requires_grad(true);
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

}  // namespace terra::runtime
