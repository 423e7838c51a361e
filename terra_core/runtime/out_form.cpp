#include "out_form.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace terra::runtime {
namespace {

// functional "name.overload" -> its out= form's, as native_functions.yaml spells them (no "aten::").
struct StructuredPair {
  std::string_view functional, out;
};
constexpr StructuredPair kStructured[] = {
#include "structured_ops.inc"
    {"", ""},  // an end for an empty list
};

std::string yaml_name(const c10::OperatorName& op) {
  std::string_view name = op.name;
  if (name.substr(0, 6) == "aten::") name.remove_prefix(6);
  std::string s(name);
  if (!op.overload_name.empty()) s += "." + op.overload_name;
  return s;
}

// The out= schema is the functional's arguments, then one written tensor per return.
bool arguments_extend(const c10::FunctionSchema& f, const c10::FunctionSchema& out) {
  const auto& fa = f.arguments();
  const auto& oa = out.arguments();
  if (oa.size() != fa.size() + f.returns().size() || out.returns().size() != f.returns().size()) return false;
  for (size_t i = 0; i < fa.size(); ++i)
    if (fa[i].name() != oa[i].name() || *fa[i].type() != *oa[i].type()) return false;
  for (size_t i = fa.size(); i < oa.size(); ++i) {
    const c10::AliasInfo* alias = oa[i].alias_info();
    if (!alias || !alias->isWrite() || oa[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  for (const c10::Argument& r : f.returns())  // new tensors (an in-place form returns its argument)
    if (r.type()->kind() != c10::TypeKind::TensorType || r.alias_info()) return false;
  return true;
}

std::optional<c10::OperatorHandle> find_out_form(const c10::OperatorHandle& functional) {
  if (functional.hasTag(at::Tag::dynamic_output_shape) || functional.hasTag(at::Tag::data_dependent_output))
    return std::nullopt;
  const std::string name = yaml_name(functional.operator_name());
  for (const StructuredPair& p : kStructured) {
    if (p.functional != name) continue;
    const auto dot = p.out.find('.');
    const std::string base = "aten::" + std::string(p.out.substr(0, dot));
    const std::string overload = dot == std::string_view::npos ? "" : std::string(p.out.substr(dot + 1));
    auto out = c10::Dispatcher::singleton().findSchema({base, overload});
    if (!out || !out->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !arguments_extend(functional.schema(), out->schema()))
      return std::nullopt;
    return out;
  }
  return std::nullopt;
}

std::atomic<size_t> g_kept_bytes{0};  // KeptResults of the process

}  // namespace

const c10::OperatorHandle* structured_out_form(const c10::OperatorHandle& functional) {
  static const bool off = [] {  // TERRA_OUT_FORM=0: every result allocated anew (A/B runs)
    const char* v = std::getenv("TERRA_OUT_FORM");
    return v && std::string(v) == "0";
  }();
  if (off) return nullptr;
  static std::mutex mutex;
  // One lookup per operator for the process (its entries never move: the handles are kept by
  // recorded kernels).
  static std::unordered_map<c10::OperatorName, std::optional<c10::OperatorHandle>> found;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = found.find(functional.operator_name());
  if (it == found.end()) it = found.emplace(functional.operator_name(), find_out_form(functional)).first;
  return it->second ? &*it->second : nullptr;
}

void KeptResults::keep(const at::Tensor* results, size_t n) {
  if (n == 0) return;
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!results[i].defined() || !results[i].unsafeGetTensorImpl()->has_storage() ||
        results[i].nbytes() > kKeptResultBytes)
      return;
    bytes += results[i].nbytes();
  }
  if (tensors_.size() % n != 0) clear();  // sets of another size (not expected)
  const bool replace = tensors_.size() >= kSets * n;
  const size_t replaced = replace ? set_bytes_[next_] : 0;
  // Within the budget: what the process keeps, less what this set replaces, plus it.
  size_t total = g_kept_bytes.load(std::memory_order_relaxed);
  do {
    if (total - replaced + bytes > kBudgetBytes) return;
  } while (!g_kept_bytes.compare_exchange_weak(total, total - replaced + bytes, std::memory_order_relaxed));
  if (replace) {
    std::copy(results, results + n, tensors_.begin() + static_cast<std::ptrdiff_t>(next_ * n));
    set_bytes_[next_] = bytes;
    next_ = (next_ + 1) % kSets;
  } else {
    set_bytes_[tensors_.size() / n] = bytes;
    tensors_.insert(tensors_.end(), results, results + n);
  }
}

void KeptResults::clear() {
  g_kept_bytes.fetch_sub(bytes(), std::memory_order_relaxed);
  tensors_.clear();
  set_bytes_ = {};
  next_ = 0;
}

size_t KeptResults::total_bytes() { return g_kept_bytes.load(std::memory_order_relaxed); }

}  // namespace terra::runtime
