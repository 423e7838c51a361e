// PythonRunner, ops: each op the program issues, intercepted (the dispatch hook or the C fast
// path), traced into the graph, or validated against the recorded path while co-executing.
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

bool has_placeholder(const torch::jit::Stack& stack) {
  bool found = false;
  for (const c10::IValue& v : stack)
    for_each_tensor(v, [&](const at::Tensor& t) { found = found || as_placeholder(t); });
  return found;
}

constexpr size_t kPrefetchArgs = 4;  // the first arguments' specs: tensors come first in most ops

// A cache line fetched ahead of use. The empty asm makes it count as work: GCC treats a prefetch as
// free of side effects and deleted whole loops of them (prefetch_arg_specs, inlined, compiled to
// nothing, and hf_bert's template checks were back to waiting on memory).
inline void fetch(const void* p) {
  __builtin_prefetch(p);
  asm volatile("" : : "r"(p));
}

// The argument specs of a template (whose own lines are in cache), then their tensor metadata
// (once the specs are): fetched ahead of the template checks (PythonRunner::lookup_key).
void prefetch_arg_specs(const OpTemplate& t) {
  const size_t n = std::min(t.args.size(), kPrefetchArgs);
  for (size_t i = 0; i < n; ++i) {
    const char* a = reinterpret_cast<const char*>(&t.args[i]);
    for (size_t line = 0; line < sizeof(ArgSpec); line += 64) fetch(a + line);
  }
}

void prefetch_arg_metas(const OpTemplate& t) {
  const size_t n = std::min(t.args.size(), kPrefetchArgs);
  for (size_t i = 0; i < n; ++i) {
    const ArgSpec& a = t.args[i];
    if (a.kind != ArgSpec::Kind::Tensor || a.metas.empty()) continue;
    fetch(a.metas.data());
#if defined(__GLIBCXX__)
    if (!a.wrapped.empty()) fetch(a.wrapped.begin()._M_p);  // vector<bool>'s words
#endif
  }
}

}  // namespace

uint64_t PythonRunner::lookup_key(OpKind kind, const c10::OperatorHandle* op) {
  // The predicted node's argument specs are fetched in two steps around the stack walk, each
  // step reading only lines the one before fetched (take_edge fetched the template itself):
  // the template checks then find them in cache instead of waiting on each in turn.
  const OpTemplate* predicted = mode_ == Mode::CoExec ? predicted_template() : nullptr;
  if (predicted) prefetch_arg_specs(*predicted);
  uint64_t innermost = 0;
  const uint64_t identity = op_identity(kind, op), stack = PythonStack::hash(root_, &innermost);
  const uint64_t base = terra::hash_combine(identity, stack);
  if (predicted) prefetch_arg_metas(*predicted);
  // Counts restart every iteration: an entry from an earlier iteration counts as zero, so the map
  // keeps its nodes from one iteration to the next instead of being cleared and refilled.
  auto count = [&](uint64_t b) -> Occurrence& {
    Occurrence& n = occurrences_[b];
    if (n.iteration != iteration_serial_) n = Occurrence{iteration_serial_, 0};
    return n;
  };
  for (uint32_t id : uncounted_) {  // each as its own key would have counted it
    const RuntimeNode& accepted = graph_->nodes[id];
    count(accepted.base).count = accepted.occurrence + 1;
  }
  uncounted_.clear();
  Occurrence& n = count(base);
  last_key_ = KeyParts{base, n.count, innermost, identity, stack};
  return terra::hash_combine(base, n.count++);
}

uint32_t PythonRunner::predicted_node(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const {
  if (cur_ == kNoNode) return kNoNode;
  const uint32_t next = graph_->nodes[cur_].next;
  if (next == kNoNode) return kNoNode;
  const RuntimeNode& n = graph_->nodes[next];
  if (n.innermost == 0 || !n.tmpl.op || !(*n.tmpl.op == op)) return kNoNode;  // pseudo-ops have no op
  if (PythonStack::innermost(root_) != n.innermost || !n.tmpl.matches(stack, nullptr)) return kNoNode;
  return next;
}

void PythonRunner::on_aten(const c10::OperatorHandle& op, c10::DispatchKeySet,
                           torch::jit::Stack* stack) {
  if (mode_ == Mode::Off || mode_ == Mode::Eager) {
    call_below(op, stack);
    return;
  }
  if (passthrough(op)) {
    call_below(op, stack);
    return;
  }
  run_aten(op, stack, /*fast=*/false);
}

void PythonRunner::run_aten(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool fast) {
  struct FastScope {  // an op run inside this one (a fetch's) restores the outer op's answer
    bool& flag;
    bool outer;
    ~FastScope() { flag = outer; }
  } scope{fast_, fast_};
  fast_ = fast;
  auto exec = [&op](torch::jit::Stack* s) { call_below(op, s); };
  auto coexecuted = [&] { ++(fast ? graph_->ops_fast : graph_->nodes[cur_].dispatched); };  // cur_: the op's node
  if (mode_ == Mode::CoExec) {
    const uint32_t predicted = predicted_node(op, *stack);
    if (predicted != kNoNode && coexec_op(OpKind::Aten, &op, nullptr, 0, stack, exec, predicted)) {
      uncounted_.push_back(predicted);
      coexecuted();
      return;
    }
  }
  uint64_t lookup = lookup_key(OpKind::Aten, &op);
  if (mode_ == Mode::CoExec && coexec_op(OpKind::Aten, &op, nullptr, lookup, stack, exec)) {
    coexecuted();
    return;
  }
  trace_op(OpKind::Aten, &op, nullptr, lookup, stack, exec);
}

bool PythonRunner::passthrough(const c10::OperatorHandle& op) {
  // Profiler annotations (record_function around optimizer steps and zero_grad) carry opaque
  // handle objects and compute nothing: they run where they are called, untraced.
  const c10::FunctionSchema* schema = &op.schema();
  auto it = passthrough_.find(schema);
  if (it != passthrough_.end()) return it->second;
  bool pass = op.operator_name().name.rfind("profiler::", 0) == 0;
  passthrough_.emplace(schema, pass);
  return pass;
}

thread_local int PythonRunner::backward_depth_ = 0;

void PythonRunner::on_pseudo(OpKind kind, const char* name, torch::jit::Stack* stack,
                             const Exec& exec) {
  auto excluded = [&exec](torch::jit::Stack* s) {
    c10::impl::ExcludeDispatchKeyGuard guard(kTerraKey);
    exec(s);
  };
  // A backward's Python (a reentrant checkpoint's recomputation, a custom Function's backward)
  // reading `.grad` or calling backward again is part of that backward's execution, which runs
  // eagerly whatever the mode: it runs as called. As pseudo-ops of their own they were traced in
  // the middle of the outer one and took its key: `torch.utils.checkpoint(..., use_reentrant=True)`
  // raised "TraceGraph::add: key ... is in the graph already".
  if (backward_depth_ > 0) {
    excluded(stack);
    return;
  }
  struct InBackward {
    bool on;
    explicit InBackward(bool b) : on(b) { backward_depth_ += on; }
    ~InBackward() { backward_depth_ -= on; }
  } in_backward(kind == OpKind::Backward);
  // Whichever way it runs (issued, traced, eagerly after a fallback), a backward reads what
  // autograd saved of NumPy memory as it is now (python_copies_).
  if (kind == OpKind::Backward && !python_copies_.empty()) refresh_python_copies(*stack);
  backwards_ += kind == OpKind::Backward;
  if (mode_ == Mode::Off || mode_ == Mode::Eager) {
    excluded(stack);
    return;
  }
  uint64_t lookup = lookup_key(kind, nullptr);
  if (mode_ == Mode::CoExec && coexec_op(kind, nullptr, name, lookup, stack, excluded)) return;
  trace_op(kind, nullptr, name, lookup, stack, excluded);
}

std::shared_ptr<const terra::SourceInfo> PythonRunner::source_of(const std::string& op) {
  std::shared_ptr<const terra::SourceInfo>& source = graph_->sources[last_key_.base];
  if (!source || source->op_name != op)
    source = std::make_shared<const terra::SourceInfo>(terra::SourceInfo{op, PythonStack::describe(root_)});
  return source;
}

void PythonRunner::trace_op(OpKind kind, const c10::OperatorHandle* op, const char* name,
                            uint64_t lookup, torch::jit::Stack* stack, const Exec& exec) {
  if (has_placeholder(*stack)) {
    // Left over from co-execution (e.g. a placeholder without a Python object): use its value.
    wait_for(runner().issued(), "a placeholder left from co-execution");
    for (c10::IValue& v : *stack) v = resolve_placeholders(v);
  }
  uint32_t node = kNoNode;
  std::string why;  // why the nodes at this location did not validate (explain_unsteady)
  if (auto it = graph_->index.find(lookup); it != graph_->index.end())
    node = match_node(it->second, *stack, first_new_ == kNoNode ? &why : nullptr);
  if (node == kNoNode && graph_->op_nodes() >= policy_.max_nodes) {
    // max_nodes was checked only where an iteration begins, so one iteration that never ends (a
    // training loop in a library's code, which nothing marks) grew the graph without bound, every
    // op traced: about 4 µs over eager per op, and memory. The rest of it runs eagerly.
    note_fallback(terra::FallbackReason::NodeCap,
                  "this iteration keeps meeting new ops (a loop Terra does not mark, in a library's code, say)",
                  op_name(op, name));
    set_mode(Mode::Eager);
    set_hook(false);
    exec(stack);
    return;
  }
  if (runner_) advance_sequence(runner_->sequence());
  OpTemplate fresh;
  std::vector<const c10::TensorImpl*> inputs;
  torch::jit::Stack args_copy;
  if (kind != OpKind::Aten) args_copy = *stack;
  const bool python_in_backward = kind == OpKind::Backward && backward_runs_python(*stack);
  if (kind == OpKind::Backward) snapshot_grads();
  if (node != kNoNode && python_in_backward) graph_->nodes[node].tmpl.runs_python = true;
  if (node == kNoNode) {
    // The name only for a new node: c10::toString builds it through an ostringstream, about
    // 0.4 µs that every traced ATen op paid.
    fresh = OpTemplate::record(kind, op, op_name(op, name), *stack);
    fresh.runs_python = python_in_backward;
    for (const c10::IValue& v : *stack)
      inputs.push_back(v.isTensor() ? v.toTensor().unsafeGetTensorImpl() : nullptr);
  }
  exec(stack);
  ++graph_->ops_traced;
  if (node == kNoNode) {
    fresh.record_outputs(*stack);
    size_t k = 0;
    for (const c10::IValue& r : *stack) {
      if (r.isTensor() && k < fresh.outs.size() && fresh.outs[k].alias_arg < 0) {
        auto pos = std::find(inputs.begin(), inputs.end(), r.toTensor().unsafeGetTensorImpl());
        if (pos != inputs.end() && r.toTensor().defined())
          fresh.mark_same_as_input(k, static_cast<int>(pos - inputs.begin()));
      }
      for_each_tensor(r, [&](const at::Tensor&) { ++k; });
      if (r.isNone()) ++k;
    }
    fresh.source = source_of(fresh.name);
    node = graph_->add_node(std::move(fresh), lookup, last_key_.location());
    RuntimeNode& made = graph_->nodes[node];
    made.base = last_key_.base;
    made.occurrence = last_key_.occurrence;
    made.innermost = last_key_.innermost;
    added_ = true;
    if (first_new_ == kNoNode) {
      first_new_ = node;
      first_new_why_ = std::move(why);
    }
  } else if (kind == OpKind::GradRead &&
             graph_->nodes[node].tmpl.outs.at(0).none != !(stack->at(0).isTensor() &&
                                                           stack->at(0).toTensor().defined())) {
    // The other variant of a .grad read (undefined before the first backward, defined after).
    uint32_t other = kNoNode;
    for (uint32_t id : graph_->index[lookup])
      if (id != node && graph_->nodes[id].tmpl.kind == OpKind::GradRead) other = id;
    if (other == kNoNode) {
      OpTemplate variant = graph_->nodes[node].tmpl;
      variant.record_outputs(*stack);
      other = graph_->add_node(std::move(variant), lookup, graph_->trace.node(node).key);
      added_ = true;
    }
    node = other;
  } else {
    // A known node whose outputs now differ: its output shape depends on data. From now on it
    // runs as a fetch (eagerly, with concrete inputs) during co-execution.
    OpTemplate& t = graph_->nodes[node].tmpl;
    size_t k = 0;
    for (const c10::IValue& r : *stack) {
      for_each_tensor(r, [&](const at::Tensor& x) {
        if (k < t.outs.size() && !t.outs[k].none && t.outs[k].alias_arg < 0 &&
            !matches(t.outs[k].meta, x))
          t.mode = ExecMode::Fetch;
        ++k;
      });
    }
  }
  if (kind != OpKind::Aten) note_grads(node, args_copy, *stack, /*traced=*/true);
  if (take_edge(node)) added_ = true;
}

bool PythonRunner::coexec_op(OpKind kind, const c10::OperatorHandle* op, const char* name,
                             uint64_t lookup, torch::jit::Stack* stack, const Exec& exec,
                             uint32_t predicted) {
  if (runner().failed()) raise_if_failed();
  if (runner_->has_warnings()) raise_warnings();  // an earlier item's, before this op goes on
  uint32_t node = predicted;
  bool fetched = false;
  bool settled = false;  // a .grad read answered with the real gradient (choose_grad_read)
  std::string why;
  if (node == kNoNode && kind != OpKind::GradRead) node = matching_successor(lookup, *stack);
  const bool successor = node != kNoNode;  // an edge from the current node: has_edge holds
  auto it = graph_->index.end();
  if (node == kNoNode) it = graph_->index.find(lookup);
  if (it != graph_->index.end()) {
    if (kind == OpKind::GradRead) {
      const at::Tensor& t = stack->at(0).toTensor();
      node = choose_grad_read(it->second, t, &settled);
      if (node == kNoNode && !as_placeholder(t)) {
        // Whether the gradient exists depends on the path the backward took: the leaf's own field
        // says, once no backward that may reach it is pending. Other items do not matter: a
        // GradWrite to this leaf would have made its state known, and one to another leaf or an
        // in-place write leaves this field alone. (Waiting for those too cost a session's first
        // iteration a round trip per parameter: `zero_grad` writes each gradient before reading
        // the next; gpt, 5-step calls: 2.7 ms per call.)
        const bool spared = last_backward_spares(t);
        wait_for(spared ? previous_backward_ : last_backward_, "whether .grad exists");
        raise_if_failed();
        // A backward made it without predicting it (its traced leaves are another model's):
        // seen in two iterations, that backward is traced again to learn its leaves.
        if (!spared && t.is_leaf() && t.grad().defined() && last_write_backward_ != kNoNode)
          note_unpredicted(graph_->nodes[last_write_backward_].tmpl, t);
        grad_defined_.insert_or_assign(
            t.unsafeGetTensorImpl(),
            GradState{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), t.grad().defined()});
        node = choose_grad_read(it->second, t, &settled);
        fetched = node != kNoNode;
      }
      if (node == kNoNode) why = "whether .grad is defined here is not known";
    } else {
      node = match_node(it->second, *stack, &why);
    }
  }
  if (node == kNoNode) {
    if (it == graph_->index.end()) diverge(terra::FallbackReason::NewOp, {}, op_name(op, name));
    else diverge(terra::FallbackReason::NewArguments, why, op_name(op, name));
    return false;
  }
  if (kind == OpKind::Backward && graph_->nodes[node].tmpl.relearn) {
    // This backward created gradients of leaves its trace did not reach, in two iterations: the
    // program made its model again (a notebook cell run twice) or trains another one. Their
    // gradients' presence would be unknown at every read after each backward (a wait for the
    // GraphRunner per parameter per step: tabular_mlp's steps took 0.48 ms instead of 0.27), so
    // the backward is traced again, once, to learn them.
    OpTemplate& b = graph_->nodes[node].tmpl;
    b.relearn = false;
    b.unpredicted.clear();
    if (b.relearned_iteration != 0 && iteration_serial_ <= b.relearned_iteration + OpTemplate::kRelearnSpan) {
      b.relearn_off = true;  // the last learning did not last: models alternating
    } else {
      b.backward_traced = false;  // learning them is not a change of path
      b.relearned_iteration = iteration_serial_;
      diverge(terra::FallbackReason::NewLeaves, {}, op_name(op, name), /*new_path=*/false);
      return false;
    }
  }
  if (!successor && graph_->trace.find_edge(cur_, node) == terra::kNone) {
    // Known op, new order: a path the graph has not covered (the .grad bookkeeping and
    // placeholders' metadata are only trusted along recorded paths).
    diverge(terra::FallbackReason::NewBranch, {}, op_name(op, name));
    return false;
  }
  const OpTemplate& t = graph_->nodes[node].tmpl;
  take_edge(node);
  ++graph_->ops_coexecuted;
  if (fetched) {
    ++graph_->fetches;
    torch::jit::Stack args = *stack;
    exec(stack);
    note_grads(node, args, *stack, /*traced=*/false);
    return true;
  }
  if (t.runs_python) {
    // Hooks or a custom Function's backward: run it here, in program order, on real tensors.
    graph_->fallbacks.record(terra::FallbackReason::AutogradRoute, {}, t.source, node);
    ++graph_->fetches;
    catch_up();
    struct Resume {  // co-executing again after it, raised or not
      PythonRunner& r;
      ~Resume() { r.resume_coexecution(); }
    } resume{*this};
    raise_if_failed();
    torch::jit::Stack args = *stack;
    snapshot_grads();
    exec(stack);
    note_grads(node, args, *stack, /*traced=*/true);
    return true;
  }
  if (settled) {
    ++graph_->grad_reads_direct;
    exec(stack);
    return true;
  }
  switch (t.mode) {
    case ExecMode::PythonNow:
      exec(stack);
      note_own_made(t, *stack, /*inputs_own_made=*/true);
      break;
    case ExecMode::Fetch: {
      ++graph_->fetches;
      torch::jit::Stack args;
      if (kind != OpKind::Aten) args = *stack;
      run_fetch(t, stack, exec);
      note_own_made(t, *stack);
      if (kind != OpKind::Aten) note_grads(node, args, *stack, /*traced=*/false);
      break;
    }
    case ExecMode::Graph:
      if (kind == OpKind::Aten && t.scalar_outputs && !t.random && run_on_host(t, stack, exec)) {
        ++graph_->host_ops;
        note_own_made(t, *stack);
        break;
      }
      if (kind == OpKind::Aten && run_here(t, stack, exec)) {
        ++graph_->host_ops;
        break;
      }
      if (kind == OpKind::Aten && run_view_here(t, stack, exec)) {
        ++graph_->host_ops;
        break;
      }
      if (kind != OpKind::Aten) {
        torch::jit::Stack args = *stack;
        issue(node, t, stack);
        note_grads(node, args, *stack, /*traced=*/false);
      } else {
        issue(node, t, stack);
      }
      break;
  }
  return true;
}

uint32_t PythonRunner::matching_successor(uint64_t lookup, const torch::jit::Stack& stack) const {
  if (cur_ == kNoNode) return kNoNode;
  // Two nodes of one location never both match a call (the second was made because the first did
  // not), so the successor that matches is the node match_node would find. The one taken last is
  // tried first: its key and template were prefetched when the current node was reached.
  const uint32_t next = graph_->nodes[cur_].next;
  if (next != kNoNode) {
    const RuntimeNode& n = graph_->nodes[next];
    if (n.lookup == lookup && n.tmpl.matches(stack, nullptr)) return next;
  }
  for (const terra::Successor& s : graph_->trace.successors(cur_)) {
    const RuntimeNode& n = graph_->nodes[s.node];
    if (s.node != next && n.lookup == lookup && n.tmpl.matches(stack, nullptr)) return s.node;
  }
  return kNoNode;
}

bool PythonRunner::take_edge(uint32_t node) {
  bool added = false;
  if (cur_ != kNoNode) {
    RuntimeNode& from = graph_->nodes[cur_];
    if (from.next == node) {
      graph_->trace.retake(from.next_edge);
    } else {
      added = graph_->trace.take(cur_, node, &from.next_edge);
      from.next = node;
    }
  }
  cur_ = node;
  path_.push_back(node);
  const RuntimeNode& to = graph_->nodes[node];
  // The next op is validated against this node's last successor: its lines are cold by then on a
  // model whose step walks megabytes of activations (the template checks were 5-7% of hf_bert's
  // program thread, most of it waiting for memory). Fetched now, they arrive while Python runs
  // up to the next op; so do the TraceGraph's lines that taking the next edge reads (this node's
  // successors, the next node's count).
  const uint32_t next = to.next;
  if (next == kNoNode) return added;
  const RuntimeNode& n = graph_->nodes[next];
  for (const void* line : {static_cast<const void*>(&n.lookup), static_cast<const void*>(&n.tmpl),
                           static_cast<const void*>(&n.tmpl.global), static_cast<const void*>(&n.tmpl.args),
                           static_cast<const void*>(&n.tmpl.outs),
                           static_cast<const void*>(graph_->trace.successors(node).data()),
                           static_cast<const void*>(&graph_->trace.node(next))})
    fetch(line);
  return added;
}

const OpTemplate* PythonRunner::predicted_template() const {
  if (cur_ == kNoNode) return nullptr;
  const uint32_t next = graph_->nodes[cur_].next;
  return next == kNoNode ? nullptr : &graph_->nodes[next].tmpl;
}

uint32_t PythonRunner::match_node(const std::vector<uint32_t>& candidates,
                                  const torch::jit::Stack& stack, std::string* why) const {
  for (uint32_t id : candidates)
    if (graph_->nodes[id].tmpl.matches(stack, nullptr)) return id;
  // Worked out only on failure: asking every candidate for a reason built strings on every op
  // whose location holds several nodes (ragged shapes), most of them matching a later one.
  if (why && !candidates.empty()) graph_->nodes[candidates[0]].tmpl.matches(stack, why);
  return kNoNode;
}

}  // namespace terra::runtime
