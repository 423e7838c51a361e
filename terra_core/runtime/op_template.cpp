#include "op_template.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace terra::runtime {

namespace {

// Random ops whose kernels touch no generator where a probability argument is 0 or the training
// flag is false: ATen's `dropout` and its kin return their input (or zeros) before any draw
// (`_dropout_impl`; the fused kernel is taken only for p > 0), and the CPU kernels of
// scaled_dot_product_attention apply dropout only for dropout_p > 0. (native_dropout is not
// among them: it draws a mask of ones at p = 0.)
void note_no_draw_arguments(const c10::OperatorHandle& op, OpTemplate& t) {
  const std::string& name = op.operator_name().name;
  static const char* const kDropouts[] = {"aten::dropout", "aten::dropout_", "aten::feature_dropout",
                                          "aten::feature_dropout_", "aten::alpha_dropout",
                                          "aten::alpha_dropout_", "aten::feature_alpha_dropout",
                                          "aten::feature_alpha_dropout_"};
  const bool dropout = std::find(std::begin(kDropouts), std::end(kDropouts), name) != std::end(kDropouts);
  const bool attention = name == "aten::scaled_dot_product_attention";
  if (!dropout && !attention) return;
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size() && i < 127; ++i) {
    const std::string& a = arguments[i].name();
    if (a == (attention ? "dropout_p" : "p")) t.random_p_arg = static_cast<int8_t>(i);
    if (a == "train") t.random_train_arg = static_cast<int8_t>(i);
  }
  t.random_cpu_only = attention;
}

// Ops that update batch-norm running statistics in place though their schemas do not mark those
// arguments written (`Tensor? running_mean`, not `Tensor(a!)?`): the composites F.batch_norm and
// F.instance_norm call, the backend ops below them, and the statistics updates SyncBatchNorm
// calls. Unmarked, a running mean the program made itself (`torch.zeros(c)`) stayed its own, so a
// small op on it after a training batch_norm (`m.clone()`) ran in the program thread before the
// GraphRunner's update; the arguments are found by name, so any overload counts.
uint64_t statistics_writes(const c10::FunctionSchema& schema) {
  const std::string& name = schema.operator_name().name;
  static const char* const kStatistics[] = {"aten::batch_norm", "aten::instance_norm", "aten::_batch_norm_impl_index",
                                            "aten::native_batch_norm", "aten::cudnn_batch_norm",
                                            "aten::miopen_batch_norm", "aten::batch_norm_update_stats",
                                            "aten::batch_norm_gather_stats",
                                            "aten::batch_norm_gather_stats_with_counts"};
  if (std::find(std::begin(kStatistics), std::end(kStatistics), name) == std::end(kStatistics)) return 0;
  const auto& arguments = schema.arguments();
  uint64_t bits = 0;
  for (size_t i = 0; i < arguments.size() && i < 64; ++i)
    if (arguments[i].name() == "running_mean" || arguments[i].name() == "running_var") bits |= uint64_t{1} << i;
  return bits;
}

}  // namespace

bool OpTemplate::writes_beyond(size_t i) const {
  if (!op) return false;
  const auto& arguments = op->schema().arguments();
  return i < arguments.size() && arguments[i].alias_info() && arguments[i].alias_info()->isWrite();
}

bool OpTemplate::draws(const std::vector<c10::IValue>& args) const {
  if (!random) return false;
  if (random_p_arg < 0 && random_train_arg < 0) return true;
  if (random_cpu_only) {
    for (const c10::IValue& v : args)
      if (v.isTensor() && v.toTensor().defined() && !v.toTensor().device().is_cpu()) return true;
  }
  const auto at = [&](int8_t i) -> const c10::IValue* {
    return i >= 0 && static_cast<size_t>(i) < args.size() ? &args[static_cast<size_t>(i)] : nullptr;
  };
  if (const c10::IValue* p = at(random_p_arg); p && p->isDouble() && p->toDouble() == 0.0) return false;
  if (const c10::IValue* train = at(random_train_arg); train && train->isBool() && !train->toBool()) return false;
  return true;
}

namespace {

using Kind = ArgSpec::Kind;

// The kind of a Python number fed to an op; a change of kind (int -> float) changes type
// promotion, so it is validated like a constant.
uint8_t number_kind(const c10::IValue& v) {
  if (v.isDouble()) return 1;
  if (v.isInt()) return 2;
  if (v.isBool()) return 3;
  if (v.isComplexDouble()) return 4;
  return 0;
}

bool is_number_type(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  auto k = t->kind();
  return k == c10::TypeKind::FloatType || k == c10::TypeKind::NumberType ||
         k == c10::TypeKind::ComplexType;
}

// A `Scalar[]` argument: its values never decide an output's shape (the foreach ops' ScalarList
// overloads), unlike `int[]` (sizes, dims) or `float[]` (upsampling's scale factors).
bool is_scalar_list_type(const c10::TypePtr& type) {
  const auto* list = type->castRaw<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::NumberType;
}

bool is_optional_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toList())
    if (!e.isTensor() && !e.isNone()) return false;
  return true;
}

bool tensor_matches(const TensorMeta& m, bool wrapped, const at::Tensor& t) {
  if (!t.defined()) return false;
  if (wrapped) return t.unsafeGetTensorImpl()->is_wrapped_number() && t.scalar_type() == scalar_type_of(m);
  return !t.unsafeGetTensorImpl()->is_wrapped_number() && matches(m, t);
}

// An element of a `Tensor?[]` list that holds a tensor: PyTorch's indexing boxes the dims it does
// not index (`d[:, idx]`) as undefined tensors, other callers as None.
bool defined_tensor(const c10::IValue& e) { return e.isTensor() && e.toTensor().defined(); }

bool has_bool_index(const c10::IValue& v) {
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toList())
    if (defined_tensor(e) && (e.toTensor().scalar_type() == at::kBool || e.toTensor().scalar_type() == at::kByte))
      return true;
  return false;
}

IndexedView indexed_view_of(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  const c10::OperatorName& name = op.operator_name();
  if (args.empty() || !args[0].isTensor() || !args[0].toTensor().defined()) return IndexedView::None;
  if (name.name == "aten::select" && name.overload_name == "int") return IndexedView::Select;
  if (name.name == "aten::slice" && name.overload_name == "Tensor") return IndexedView::Slice;
  if (name.name == "aten::narrow" && name.overload_name.empty()) return IndexedView::Narrow;
  return IndexedView::None;
}

// The arguments of an indexed view that place it in its base: select's index, slice's start and
// end, narrow's start.
bool is_position_arg(IndexedView view, size_t i) {
  switch (view) {
    case IndexedView::Select: return i == 2;
    case IndexedView::Slice: return i == 2 || i == 3;
    case IndexedView::Narrow: return i == 2;
    case IndexedView::None: return false;
  }
  return false;
}

// Where an indexed view starts along its dimension, and how long it is; nullopt where eager
// execution raises (an index out of range).
struct ViewPlace {
  int64_t dim = 0, start = 0, length = 0;
};

std::optional<ViewPlace> place_view(IndexedView view, const TensorMeta& base,
                                    const torch::jit::Stack& args) {
  const auto ndim = static_cast<int64_t>(base.sizes.size());
  if (ndim == 0) return std::nullopt;
  int64_t dim = args[1].toInt();
  if (dim < -ndim || dim >= ndim) return std::nullopt;
  if (dim < 0) dim += ndim;
  const int64_t size = base.sizes[static_cast<size_t>(dim)];
  ViewPlace p;
  p.dim = dim;
  switch (view) {
    case IndexedView::Select: {
      int64_t index = args[2].toInt();
      if (index < -size || index >= size) return std::nullopt;
      p.start = index < 0 ? index + size : index;
      p.length = 1;
      return p;
    }
    case IndexedView::Slice: {  // clamped as at::slice clamps
      const int64_t step = args[4].toInt();
      if (step <= 0) return std::nullopt;
      int64_t start = args[2].isNone() ? 0 : args[2].toInt();
      int64_t end = args[3].isNone() ? std::numeric_limits<int64_t>::max() : args[3].toInt();
      if (start < 0) start += size;
      if (end < 0) end += size;
      start = std::clamp<int64_t>(start, 0, size);
      end = std::clamp<int64_t>(end, start, size);
      p.start = start;
      p.length = (end - start + step - 1) / step;
      return p;
    }
    case IndexedView::Narrow: {
      int64_t start = args[2].toInt();
      const int64_t length = args[3].toInt();
      if (start < -size || start > size) return std::nullopt;
      if (start < 0) start += size;
      if (length < 0 || start > size - length) return std::nullopt;
      p.start = start;
      p.length = length;
      return p;
    }
    case IndexedView::None: break;
  }
  return std::nullopt;
}

}  // namespace

bool is_number_list(const c10::IValue& v) {
  if (!v.isList() || v.isTensorList()) return false;
  for (const c10::IValue& e : v.toList())
    if (number_kind(e) == 0) return false;
  return true;
}

bool same_constant(const c10::IValue& a, const c10::IValue& b) {
  if (a.isNone() || b.isNone()) return a.isNone() && b.isNone();
  if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
  if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
  if (a.isDouble() && b.isDouble()) return a.toDouble() == b.toDouble();
  if (a.isIntList() && b.isIntList()) return a.toIntList() == b.toIntList();
  if (a.isString() && b.isString()) return a.toStringRef() == b.toStringRef();
  if (a.isDevice() && b.isDevice()) return a.toDevice() == b.toDevice();
  // Any generator of the device: a draw from one runs in the program thread, from the generator
  // it is given (a DataLoader makes a new one per epoch).
  if (a.isGenerator() && b.isGenerator()) return a.toGenerator().device() == b.toGenerator().device();
  if (a.isList() && b.isList()) {
    auto la = a.toList(), lb = b.toList();
    if (la.size() != lb.size()) return false;
    for (size_t i = 0; i < la.size(); ++i)
      if (!same_constant(la.get(i), lb.get(i))) return false;
    return true;
  }
  if (a.isTuple() && b.isTuple()) {
    const auto& ea = a.toTupleRef().elements();
    const auto& eb = b.toTupleRef().elements();
    if (ea.size() != eb.size()) return false;
    for (size_t i = 0; i < ea.size(); ++i)
      if (!same_constant(ea[i], eb[i])) return false;
    return true;
  }
  if (a.isTensor() || b.isTensor())
    return a.isTensor() && b.isTensor() && !a.toTensor().defined() && !b.toTensor().defined();
  return a.tagKind() == b.tagKind() && a == b;
}

uint64_t op_identity(OpKind kind, const c10::OperatorHandle* op) {
  if (kind == OpKind::Aten) return reinterpret_cast<uint64_t>(&op->schema());
  return 0x7e77a000ULL + static_cast<uint64_t>(kind);
}

OpTemplate OpTemplate::record(OpKind kind, const c10::OperatorHandle* op, const std::string& name,
                              const torch::jit::Stack& args) {
  OpTemplate t;
  t.kind = kind;
  if (op) t.op = *op;
  t.name = name;
  t.grad_mode = at::GradMode::is_enabled();
  t.inference_mode = c10::InferenceMode::is_enabled();
  t.autocast = AutocastState::current();
  t.global = GlobalState::current();
  const c10::FunctionSchema* schema = op ? &op->schema() : nullptr;
  if (op) t.indexed_view = indexed_view_of(*op, args);
  bool any_tensor = false;
  t.args.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    ArgSpec a;
    if (v.isInt() && is_position_arg(t.indexed_view, i)) {
      a.kind = Kind::Feed;
      a.feed_tag = number_kind(v);
      a.constant = v;  // kept: the template is a plain one again if the view is its own input
    } else if (v.isTensor() && !v.toTensor().defined()) {
      a.kind = Kind::Constant;  // an undefined tensor: validated as such
      a.constant = v;
    } else if (v.isTensor()) {
      a.kind = Kind::Tensor;
      a.metas.push_back(meta_of(v.toTensor()));
      a.wrapped.push_back(v.toTensor().unsafeGetTensorImpl()->is_wrapped_number());
      any_tensor = any_tensor || !a.wrapped.back();
    } else if (v.isTensorList() || (!v.isNone() && is_optional_tensor_list(v))) {
      a.kind = Kind::TensorList;
      for (const c10::IValue& e : v.toList()) {
        const bool present = defined_tensor(e);
        a.present.push_back(present);
        a.metas.push_back(present ? meta_of(e.toTensor()) : TensorMeta{});
        a.wrapped.push_back(present && e.toTensor().unsafeGetTensorImpl()->is_wrapped_number());
        any_tensor = any_tensor || present;
      }
    } else if (!v.isNone() && number_kind(v) != 0 &&
               (schema ? i < schema->arguments().size() &&
                             is_number_type(schema->arguments()[i].type())
                       : v.isDouble())) {
      a.kind = Kind::Feed;
      a.feed_tag = number_kind(v);
    } else if (schema && i < schema->arguments().size() && v.isList() &&
               is_scalar_list_type(schema->arguments()[i].type()) && is_number_list(v)) {
      a.kind = Kind::Numbers;
      for (const c10::IValue& e : v.toList()) a.feed_tags.push_back(number_kind(e));
    } else if (v.isStorage()) {
      a.kind = Kind::Storage;
      a.storage_device = v.toStorage().device();
      a.storage_nbytes = v.toStorage().nbytes();
    } else {
      a.kind = Kind::Constant;
      a.constant = v;
    }
    for (size_t j = 0; j < a.metas.size(); ++j) {
      const TensorMeta& m = a.metas[j];
      const c10::Device device = device_of(m);
      if (!t.accelerator && !device.is_cpu() && !device.is_meta()) t.accelerator = device;
      const bool tensor = a.kind == Kind::Tensor || a.present[j];
      t.host_scalar_args = t.host_scalar_args || (tensor && m.sizes.empty() && device.is_cpu() &&
                                                  !m.requires_grad && !a.wrapped[j]);
    }
    t.args.push_back(std::move(a));
  }
  if (schema) {
    const auto& arguments = schema->arguments();
    t.written_args = statistics_writes(*schema);
    t.mutates_input = t.written_args != 0;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (!arguments[i].alias_info() || !arguments[i].alias_info()->isWrite()) continue;
      t.mutates_input = true;
      if (i < 64) t.written_args |= uint64_t{1} << i;
    }
    bool tensor_returns = true;
    for (const auto& r : schema->returns()) {
      auto k = r.type()->kind();
      bool list_of_tensors = k == c10::TypeKind::ListType &&
                             r.type()->castRaw<c10::ListType>()->getElementType()->kind() ==
                                 c10::TypeKind::TensorType;
      if (k != c10::TypeKind::TensorType && !list_of_tensors) tensor_returns = false;
    }
    bool index_by_mask = false;
    for (const c10::IValue& v : args) index_by_mask = index_by_mask || has_bool_index(v);
    // `x[idx]` with integer index tensors: the output's shape follows from the indices' shapes,
    // as index_select's does (the tag is there for boolean masks, caught by index_by_mask).
    const bool integer_index = !index_by_mask && op->operator_name().name == "aten::index";
    if (!tensor_returns || (op->hasTag(at::Tag::dynamic_output_shape) && !integer_index) ||
        op->hasTag(at::Tag::data_dependent_output) || op->hasTag(at::Tag::inplace_view) ||
        index_by_mask) {
      t.mode = ExecMode::Fetch;
    }
    t.random = op->hasTag(at::Tag::nondeterministic_seeded);
    if (t.random) note_no_draw_arguments(*op, t);
    // A draw from a generator of the program's own (`torch.randn(..., generator=g)`, a
    // DataLoader's shuffling) runs in the program thread, in order with what the program does to
    // that generator: `g.manual_seed`, `g.get_state`, `g.set_state` are methods of an immutable
    // type, beyond interception, so with the draw pending in the GraphRunner a reseed between
    // issue and run changed its numbers. (The default generator's seeding functions are synced.)
    bool own_generator = false;
    for (const c10::IValue& v : args) own_generator = own_generator || (v.isGenerator() && !v.isNone());
    if (t.random && own_generator) t.mode = ExecMode::Fetch;
    if (t.mode != ExecMode::Fetch && !any_tensor && !t.random) t.mode = ExecMode::PythonNow;
  }
  return t;
}

void OpTemplate::record_outputs(const torch::jit::Stack& returns) {
  outs.clear();
  return_sizes.clear();
  const c10::FunctionSchema* schema = op ? &op->schema() : nullptr;
  auto alias_of = [&](size_t ret) -> int {
    if (!schema || ret >= schema->returns().size()) return -1;
    const auto* info = schema->returns()[ret].alias_info();
    if (!info || !info->isWrite()) return -1;
    for (size_t i = 0; i < schema->arguments().size(); ++i) {
      const auto* ai = schema->arguments()[i].alias_info();
      if (ai && ai->isWrite() && ai->beforeSets() == info->beforeSets()) return static_cast<int>(i);
    }
    return -1;
  };
  auto is_view = [&](size_t ret) {
    if (!schema || ret >= schema->returns().size()) return false;
    const auto* info = schema->returns()[ret].alias_info();
    return info && !info->isWrite();
  };
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::IValue& r = returns[j];
    auto add = [&](const at::Tensor& t, int alias) {
      OutSpec o;
      o.alias_arg = alias;
      o.view = is_view(j);
      o.none = !t.defined();
      o.autograd_view = o.view && t.defined() && t.is_view();
      if (t.defined() && t.layout() != c10::kStrided) {
        // A sparse (or other non-strided) value, which no placeholder can stand for (a sparse
        // embedding's gradient): the op runs as a fetch, its outputs real.
        mode = ExecMode::Fetch;
        o.meta.sizes = t.sizes().vec();
      } else if (t.defined()) {
        o.meta = meta_of(t);
      }
      outs.push_back(std::move(o));
    };
    if (r.isTensor()) {
      return_sizes.push_back(-1);
      add(r.toTensor(), alias_of(j));
    } else if (r.isTensorList()) {
      auto list = r.toTensorList();
      return_sizes.push_back(static_cast<int>(list.size()));
      for (const at::Tensor& t : list) add(t, -1);
    } else if (r.isNone()) {
      return_sizes.push_back(-2);
      OutSpec o;
      o.none = true;
      outs.push_back(o);
    } else {
      mode = ExecMode::Fetch;  // a Python value: the program needs it now
      return_sizes.push_back(-3);
    }
  }
  scalar_outputs = !outs.empty();
  for (const OutSpec& o : outs) scalar_outputs = scalar_outputs && !o.none && o.meta.sizes.empty();
  derive_from_aliases();
}

void OpTemplate::derive_from_aliases() {
  // A view-like op that returned its own input (x.to(x.dtype), x.contiguous() of a contiguous x)
  // hands back the same tensor during co-execution and issues nothing.
  noop_alias = !mutates_input && !outs.empty();
  out_bytes = 0;
  aliases_args = false;
  bool fresh_cpu_no_grad = true;  // every output new memory on the CPU, outside autograd
  for (const OutSpec& o : outs) {
    noop_alias = noop_alias && o.alias_arg >= 0;
    aliases_args = aliases_args || o.view || o.alias_arg >= 0;
    fresh_cpu_no_grad = fresh_cpu_no_grad && o.alias_arg < 0 && !o.meta.requires_grad && device_of(o.meta).is_cpu();
    if (o.none || o.alias_arg >= 0) continue;
    uint64_t n = c10::elementSize(scalar_type_of(o.meta));
    for (int64_t size : o.meta.sizes) n *= static_cast<uint64_t>(size);
    out_bytes += n;
  }
  host_candidate = !mutates_input && !accelerator && fresh_cpu_no_grad && out_bytes <= kHostOpBytes;
  reuses_out = kind == OpKind::Aten && outs.size() == 1 && return_sizes.size() == 1 && return_sizes[0] == -1 &&
               outs[0].alias_arg < 0 && !outs[0].view && !outs[0].none &&
               indexed_view == IndexedView::None && out_bytes <= kReuseBytes;
}

void OpTemplate::mark_same_as_input(size_t out, int arg) {
  if (out < outs.size()) outs[out].alias_arg = arg;
  derive_from_aliases();
  if (noop_alias && indexed_view != IndexedView::None) {
    // A view that was its own input (a slice covering everything): only these positions are.
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].kind == Kind::Feed && is_position_arg(indexed_view, i)) args[i].kind = Kind::Constant;
    indexed_view = IndexedView::None;
  }
}

int64_t OpTemplate::view_offset(const torch::jit::Stack& call) const {
  const at::Tensor& base = call[0].toTensor();
  const auto place = place_view(indexed_view, args[0].metas[0], call);
  TORCH_INTERNAL_ASSERT(place, "view_offset of a call that does not match");
  return base.storage_offset() + place->start * base.stride(place->dim);
}

bool OpTemplate::matches(const torch::jit::Stack& call, std::string* why) const {
  if (call.size() != args.size()) {
    if (why) *why = "different number of arguments";
    return false;
  }
  // Both modes from one read of the thread's autograd state (GradMode::is_enabled and
  // InferenceMode::is_enabled each look it up through __tls_get_addr).
  const c10::AutogradState& modes = c10::AutogradState::get_tls_state();
  if (grad_mode != modes.get_grad_mode() || inference_mode != modes.get_inference_mode()) {
    if (why) *why = "grad mode / inference mode differs";
    return false;
  }
  if (!autocast.is_current()) {
    if (why) *why = "autocast state differs";
    return false;
  }
  if (global != GlobalState::current()) {
    if (why) *why = "the default dtype or deterministic-algorithms setting differs";
    return false;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& a = args[i];
    const c10::IValue& v = call[i];
    bool ok = true;
    switch (a.kind) {
      case Kind::Tensor:
        ok = v.isTensor() && tensor_matches(a.metas[0], a.wrapped[0], v.toTensor());
        if (!ok && why) {
          *why = "argument " + std::to_string(i) + " is " +
                 (v.isTensor() ? describe(meta_of(v.toTensor())) : std::string("not a tensor")) +
                 ", traced as " + describe(a.metas[0]);
        }
        break;
      case Kind::TensorList: {
        // The failing element is described only when a reason is asked for: this runs for every
        // co-executed op with a tensor list (foreach ops, cat, stack).
        int64_t bad = -1;  // the element that differs; -1: the list's length differs
        if (!v.isList() || v.toList().size() != a.metas.size()) {
          ok = false;
        } else {
          auto list = v.toList();
          for (size_t k = 0; ok && k < a.metas.size(); ++k) {
            const c10::IValue& e = list.get(k);
            ok = a.present[k] ? e.isTensor() && tensor_matches(a.metas[k], a.wrapped[k], e.toTensor())
                              : !defined_tensor(e) && (e.isNone() || e.isTensor());
            if (!ok) bad = static_cast<int64_t>(k);
          }
        }
        if (!ok && why) {
          *why = "tensor list argument " + std::to_string(i);
          if (bad < 0) {
            *why += " has another length";
          } else {
            const auto k = static_cast<size_t>(bad);
            const c10::IValue e = v.toList().get(k);
            *why += ": element " + std::to_string(k) + " is " +
                    (defined_tensor(e) ? describe(meta_of(e.toTensor())) : std::string("not a tensor")) +
                    ", traced as " + (a.present[k] ? describe(a.metas[k]) : std::string("None"));
          }
        }
        break;
      }
      case Kind::Feed:
        ok = number_kind(v) == a.feed_tag;
        if (!ok && why) *why = "argument " + std::to_string(i) + " changed number type";
        break;
      case Kind::Numbers: {
        ok = v.isList() && v.toList().size() == a.feed_tags.size();
        if (ok) {
          auto list = v.toList();
          for (size_t k = 0; ok && k < a.feed_tags.size(); ++k) ok = number_kind(list.get(k)) == a.feed_tags[k];
        }
        if (!ok && why) *why = "number list argument " + std::to_string(i) + " changed length or number types";
        break;
      }
      case Kind::Storage:
        ok = v.isStorage() && v.toStorage().device() == a.storage_device &&
             v.toStorage().nbytes() == a.storage_nbytes;
        if (!ok && why) *why = "argument " + std::to_string(i) + " is a storage of another size or device";
        break;
      case Kind::Constant:
        ok = same_constant(v, a.constant);
        if (!ok && why) {
          std::ostringstream os;
          os << "argument " << i << " is " << v << ", traced as " << a.constant;
          *why = os.str();
        }
        break;
    }
    if (!ok) return false;
  }
  if (indexed_view != IndexedView::None) {
    const auto place = place_view(indexed_view, args[0].metas[0], call);
    if (!place) {
      if (why) *why = "the view's position is out of range";
      return false;
    }
    if (indexed_view != IndexedView::Select && !outs.empty() &&
        place->length != outs[0].meta.sizes[static_cast<size_t>(place->dim)]) {
      if (why) *why = "the slice has another length than traced";
      return false;
    }
  }
  return true;
}

std::string OpTemplate::label() const {
  std::ostringstream os;
  os << name;
  for (const OutSpec& o : outs) {
    if (o.none) continue;
    os << " " << c10::IntArrayRef(o.meta.sizes);
  }
  return os.str();
}

}  // namespace terra::runtime
