#include "graph.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "terra/case_assignment.h"
#include "terra/export.h"
#include "terra/location_key.h"

#include <atomic>
#include <map>

namespace terra::runtime {

uint64_t Graph::next_serial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

namespace {

constexpr uint32_t kNoNode = UINT32_MAX;

const char* kind_name(const OpTemplate& t) {
  switch (t.kind) {
    case OpKind::Marker: return "iteration";
    case OpKind::Backward: return "backward";
    case OpKind::GradRead: return "grad_read";
    case OpKind::GradWrite: return "grad_write";
    case OpKind::ReleaseTeam:  // runner control, never recorded
    case OpKind::ClearAutocastCache:
    case OpKind::EndIteration:
    case OpKind::DropGraph:
    case OpKind::Aten: break;
  }
  switch (t.mode) {
    case ExecMode::Graph: return "graph";
    case ExecMode::PythonNow: return "python_now";
    case ExecMode::Fetch: return "fetch";
  }
  return "?";
}

}  // namespace

uint32_t Graph::add_node(OpTemplate tmpl, uint64_t lookup, terra::LocationKey key) {
  std::vector<uint32_t>& variants = index[lookup];
  key.variant = static_cast<uint32_t>(variants.size());
  std::vector<terra::TensorMeta> outputs;
  for (const OutSpec& o : tmpl.outs)
    if (!o.none) outputs.push_back(o.meta);
  const uint32_t id = trace.add(key, tmpl.source, std::move(outputs));
  variants.push_back(id);
  RuntimeNode& n = nodes.emplace_back();
  n.tmpl = std::move(tmpl);
  n.lookup = lookup;
  return id;
}

void Graph::record_path(std::vector<uint32_t>& path) {
  if (path.size() <= 1) return;  // an iteration without ops (the tail after a loop, say)
  trace.end_path(path);
  last_path.swap(path);
}

nlohmann::json payoff_json(const terra::Payoff& p) {
  const char* phase = p.phase() == terra::Payoff::Phase::MeasureCoExec  ? "timing co-execution"
                      : p.phase() == terra::Payoff::Phase::MeasureEager ? "timing eager execution"
                      : p.phase() == terra::Payoff::Phase::Pairing      ? "timing both in alternating blocks"
                                                                        : "holding";
  nlohmann::json loops = nlohmann::json::array();
  for (const auto& l : p.loops())
    loops.push_back({{"loop", l.loop}, {"iterations", l.iterations}, {"coexec_ms", l.coexec_s * 1e3},
                     {"eager_ms", l.eager_s * 1e3}});
  return {{"phase", phase},
          {"loops", loops},
          {"by_call", p.paired_by_call()},
          {"checks", p.checks()},
          {"choice", p.held_first() ? "eager" : !p.has_choice() ? "none yet" : p.choice_eager() ? "eager" : "co-execute"},
          // Eager execution held before any check because the graph's backward runs Python
          // (terra::Payoff::hold_eager_first).
          {"python_backward", p.held_first()},
          // The first choice held was an earlier run's (runtime/payoff_memory.h).
          {"remembered", p.resumed()},
          // The pairing's pairs so far (t(eager) / t(co-executed) each), the first how many an
          // earlier run's (Payoff::resume_pairing).
          {"pairs", p.phase() == terra::Payoff::Phase::Pairing ? p.pairs() : std::vector<double>{}},
          {"pairs_remembered", p.phase() == terra::Payoff::Phase::Pairing ? p.pairs_resumed() : 0},
          {"pairing_remembered", p.pairing_resumed()},
          {"coexec_ms", p.coexec_seconds() * 1e3},
          {"eager_ms", p.eager_seconds() * 1e3},
          {"next_check_in", p.phase() == terra::Payoff::Phase::Hold ? p.hold_left() : 0}};
}

namespace {

const char* workers_trial_name(Graph::WorkersTrial t) {
  switch (t) {
    case Graph::WorkersTrial::Untried: return "untried";
    case Graph::WorkersTrial::Pairing: return "pairing";
    case Graph::WorkersTrial::Done: break;
  }
  return "done";
}

}  // namespace

nlohmann::json stats_json(const Graph& g) {
  size_t edges = 0;  // between op nodes, as the views draw them
  for (const terra::ControlEdge& e : g.trace.edges()) edges += e.from != terra::kEntryNode && e.to != terra::kExitNode;
  std::map<std::string, uint64_t> by_op;  // dispatched co-executed ops, per operator
  uint64_t dispatched_total = 0;
  for (const auto& n : g.nodes) {
    if (n.dispatched == 0 || !n.tmpl.op) continue;
    by_op[c10::toString(n.tmpl.op->operator_name())] += n.dispatched;
    dispatched_total += n.dispatched;
  }
  std::vector<std::pair<std::string, uint64_t>> dispatched(by_op.begin(), by_op.end());
  std::stable_sort(dispatched.begin(), dispatched.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < dispatched.size() && i < 8; ++i)
    top.push_back({dispatched[i].first, dispatched[i].second});
  return {{"name", g.name},
          {"nodes", g.op_nodes()},
          {"edges", edges},
          {"iteration_starts", g.roots.size()},
          {"iterations_traced", g.iterations_traced},
          {"iterations_coexecuted", g.iterations_coexecuted},
          {"iterations_fallback", g.iterations_fallback},
          {"iterations_eager", g.iterations_eager},
          {"iterations_eager_chosen", g.iterations_eager_chosen},
          {"iterations_unsteady", g.iterations_unsteady},
          {"iterations_cut_at_backward", g.iterations_cut_at_backward},
          {"helper_step_loops", g.helper_step_loops},
          {"payoff", payoff_json(g.payoff)},
          {"workers_asleep", g.workers_asleep},
          {"iterations_workers_asleep", g.iterations_workers_asleep},
          {"workers_asleep_by_blocks", g.asleep_by_blocks},
          {"workers_trial", workers_trial_name(g.workers_trial)},
          // The GraphRunner's OpenMP workers' CPU per second of co-executed wall time with them spinning (-1: none).
          {"workers_cpu_share", g.spinning_seconds > 0 ? g.spinning_workers_cpu / g.spinning_seconds : -1.0},
          {"ops_traced", g.ops_traced},
          {"ops_coexecuted", g.ops_coexecuted},
          {"ops_fast", g.ops_fast},
          {"placeholders_reused", g.placeholders_reused},
          {"ops_dispatched", dispatched_total},
          {"ops_dispatched_top", top},
          {"fetches", g.fetches},
          {"host_ops", g.host_ops},
          {"yields_to_parallel_regions", g.yields_to_parallel_regions},
          {"yielded_seconds", g.yielded_seconds},
          {"grad_reads_direct", g.grad_reads_direct},
          {"fallbacks", g.fallbacks.entries().size()},
          {"traced_seconds", g.traced_seconds},
          {"coexec_seconds", g.coexec_seconds}};
}

nlohmann::json fallbacks_json(const Graph& g) {
  auto out = nlohmann::json::array();
  for (const terra::Fallback& f : g.fallbacks.entries())
    out.push_back({{"reason", f.text()},
                   {"kind", terra::to_string(f.reason)},
                   {"op", f.source ? f.source->op_name : std::string()},
                   {"count", f.count},
                   {"source", terra::source_json(f.source.get())},
                   {"where", terra::where_json(f.source.get())},
                   {"node", f.after == kNoNode ? nlohmann::json(nullptr) : nlohmann::json(f.after)}});
  return out;
}

nlohmann::json to_json(const Graph& g) {
  using nlohmann::json;
  std::unordered_map<uint32_t, bool> left_after;
  for (const terra::Fallback& f : g.fallbacks.entries())
    if (f.after != kNoNode) left_after[f.after] = true;
  // The core's export of the one TraceGraph and its case assignment, and per node what the
  // runtime knows: the template's label (op and output shapes) and kind, whether an iteration
  // fell back after it.
  json out = terra::to_json(g.trace, terra::assign_cases(g.trace));
  for (json& n : out["nodes"]) {
    const auto id = n["id"].get<uint32_t>();
    if (id == terra::kEntryNode || id == terra::kExitNode) {
      n["kind"] = id == terra::kEntryNode ? "entry" : "exit";
      n["shapes"] = json::array();
      n["fallback"] = false;
      continue;
    }
    const OpTemplate& t = g.nodes[id].tmpl;
    json shapes = json::array();
    for (const OutSpec& o : t.outs)
      if (!o.none) shapes.push_back(describe(o.meta));
    n["label"] = t.label();
    n["op"] = t.name;
    n["kind"] = kind_name(t);
    n["shapes"] = std::move(shapes);
    n["fallback"] = left_after.count(id) > 0;
  }
  out["name"] = g.name;
  out["last_path"] = g.last_path;
  out["fallbacks"] = fallbacks_json(g);
  out["stats"] = stats_json(g);
  return out;
}

}  // namespace terra::runtime
