// PythonRunner, `.grad` presence: which leaves have a gradient after each backward, learned while
// tracing, so that a co-executed `.grad` read answers without waiting for the GraphRunner.
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

void PythonRunner::snapshot_grads() {
  grads_before_.clear();
  for (auto& [impl, state] : grad_defined_) {
    at::Tensor x(state.leaf.lock());
    if (!x.defined() || x.unsafeGetTensorImpl() != impl) continue;
    const at::Tensor& g = x.grad();
    if (g.defined()) grads_before_[impl] = {g.unsafeGetTensorImpl(), g._version()};
  }
}

void PythonRunner::note_unpredicted(OpTemplate& backward, const at::Tensor& leaf) {
  if (backward.relearn_off) return;
  auto& seen = backward.unpredicted;
  for (const auto& w : seen) {
    if (w._unsafe_get_target() == leaf.unsafeGetTensorImpl() && !w.expired()) {
      backward.relearn = true;  // a second iteration: a leaf that lasts
      return;
    }
  }
  if (seen.size() >= 64)  // leaves made anew every iteration: the dead ones go
    seen.erase(std::remove_if(seen.begin(), seen.end(), [](const auto& w) { return w.expired(); }), seen.end());
  if (seen.size() < 64) seen.emplace_back(leaf.getIntrusivePtr());
}

bool PythonRunner::last_backward_spares(const at::Tensor& leaf) const {
  if (last_backward_node_ == kNoNode) return false;
  const OpTemplate& b = graph_->nodes[last_backward_node_].tmpl;
  if (!b.backward_traced || !b.grads_after_stable || b.relearn) return false;
  const c10::TensorImpl* impl = leaf.unsafeGetTensorImpl();
  auto holds = [&](const std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>>& leaves) {
    auto it = std::lower_bound(leaves.begin(), leaves.end(), impl,
                               [](const auto& w, const c10::TensorImpl* p) { return w._unsafe_get_target() < p; });
    return it != leaves.end() && it->_unsafe_get_target() == impl && !it->expired();
  };
  return holds(b.grads_seen) && !holds(b.grads_after);
}

uint32_t PythonRunner::choose_grad_read(const std::vector<uint32_t>& candidates,
                                        const at::Tensor& t, bool* settled) {
  const at::Tensor base = as_placeholder(t) ? at::Tensor() : t;
  auto known = base.defined() ? grad_defined_.find(base.unsafeGetTensorImpl()) : grad_defined_.end();
  if (known != grad_defined_.end() && known->second.leaf.lock().get() != base.unsafeGetTensorImpl())
    known = grad_defined_.end();  // a dead tensor's address, reused
  if (known == grad_defined_.end()) return kNoNode;  // not known here: the caller fetches it
  const GradState& state = known->second;
  for (uint32_t id : candidates) {
    const OpTemplate& c = graph_->nodes[id].tmpl;
    if (c.kind == OpKind::GradRead && c.matches({t}, nullptr) && c.outs.at(0).none == !state.defined) {
      // With nothing issued that may have replaced it, the leaf's gradient is the one the
      // program sees here (a guard: the real field must agree).
      *settled = state.defined && state.replaced_at == 0 && t.grad().defined();
      return id;
    }
  }
  return kNoNode;
}

void PythonRunner::note_grads(uint32_t node, const torch::jit::Stack& args,
                              const torch::jit::Stack& returns, bool traced) {
  OpTemplate& t = graph_->nodes[node].tmpl;
  // The item just issued, if this op was co-executed (a traced op ran for real: nothing pending).
  const uint64_t seq = traced || !runner_ ? 0 : runner_->issued();
  // A weak reference keeps its target's address, so an entry found for a live `x` is x's.
  auto set = [&](const at::Tensor& x, bool defined, bool replaced) {
    if (!x.defined() || as_placeholder(x)) return;
    GradState& s = grad_defined_
                       .try_emplace(x.unsafeGetTensorImpl(),
                                    GradState{c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr()), defined})
                       .first->second;
    s.defined = defined;
    if (traced) s.replaced_at = 0;
    else if (replaced) s.replaced_at = seq;
  };
  auto leaf = [](const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); };
  switch (t.kind) {
    case OpKind::GradRead:
      set(leaf(args.at(0)), !returns.empty() && returns[0].isTensor() && returns[0].toTensor().defined(),
          false);
      break;
    case OpKind::GradWrite:
      set(leaf(args.at(0)), !args.at(1).isNone(), true);
      break;
    case OpKind::Backward:
      if (traced) {
        // Observe which of the leaves the program looks at this backward reached (gradient
        // created or accumulated). If that differs between traces (the forward took another
        // path), it is not known in advance.
        std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> reached, seen;
        for (auto& [impl, state] : grad_defined_) {
          at::Tensor x(state.leaf.lock());
          if (!x.defined() || x.unsafeGetTensorImpl() != impl) continue;
          seen.push_back(state.leaf);
          const at::Tensor& g = x.grad();
          state.defined = g.defined();
          auto before = grads_before_.find(impl);
          bool changed = g.defined() && (before == grads_before_.end() ||
                                         before->second.first != g.unsafeGetTensorImpl() ||
                                         before->second.second != g._version());
          if (changed) reached.push_back(state.leaf);
        }
        auto by_target = [](const auto& a, const auto& b) { return a._unsafe_get_target() < b._unsafe_get_target(); };
        std::sort(reached.begin(), reached.end(), by_target);
        std::sort(seen.begin(), seen.end(), by_target);
        t.grads_seen = std::move(seen);
        auto same = [](const auto& a, const auto& b) {
          if (a.size() != b.size()) return false;
          for (size_t i = 0; i < a.size(); ++i)
            if (a[i]._unsafe_get_target() != b[i]._unsafe_get_target()) return false;
          return true;
        };
        if (t.backward_traced && !same(reached, t.grads_after)) t.grads_after_stable = false;
        t.backward_traced = true;
        t.grads_after = std::move(reached);
      } else {
        // With create_graph the engine accumulates out of place: every gradient it reaches is a
        // new tensor. Otherwise it accumulates into a defined gradient in place, and a leaf whose
        // gradient was not known defined gets a new one.
        const bool create = args.size() > 3 && args[3].isBool() && args[3].toBool();
        if (create) {
          for (auto& [impl, state] : grad_defined_) state.replaced_at = seq;
        }
        if (t.grads_after_stable) {
          for (auto& weak : t.grads_after) {
            at::Tensor x(weak.lock());
            if (!x.defined()) continue;
            auto known = grad_defined_.find(x.unsafeGetTensorImpl());
            set(x, true, /*replaced=*/known == grad_defined_.end() || !known->second.defined);
          }
        } else {
          for (auto pos = grad_defined_.begin(); pos != grad_defined_.end();)
            pos = pos->second.defined ? std::next(pos) : grad_defined_.erase(pos);
        }
      }
      break;
    default:
      break;
  }
}

}  // namespace terra::runtime
