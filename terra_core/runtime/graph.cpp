#include "graph.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "terra/case_assignment.h"
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
          {"checks", p.checks()},
          {"choice", p.checks() == 0 ? "none yet" : p.choice_eager() ? "eager" : "co-execute"},
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

nlohmann::json frames_json(const std::shared_ptr<const terra::SourceInfo>& source) {
  auto out = nlohmann::json::array();
  if (source)
    for (const terra::SourceFrame& f : source->frames) out.push_back({f.file, f.line, f.function});
  return out;
}

nlohmann::json where_json(const std::shared_ptr<const terra::SourceInfo>& source) {
  const terra::SourceFrame* f = source ? terra::user_frame(*source) : nullptr;
  return f ? nlohmann::json({f->file, f->line, f->function}) : nlohmann::json(nullptr);
}

nlohmann::json stats_json(const Graph& g) {
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
          {"edges", g.trace.edges().size()},
          {"iteration_starts", g.roots.size()},
          {"iterations_traced", g.iterations_traced},
          {"iterations_coexecuted", g.iterations_coexecuted},
          {"iterations_fallback", g.iterations_fallback},
          {"iterations_eager", g.iterations_eager},
          {"iterations_eager_chosen", g.iterations_eager_chosen},
          {"iterations_unsteady", g.iterations_unsteady},
          {"payoff", payoff_json(g.payoff)},
          {"workers_asleep", g.workers_asleep},
          {"iterations_workers_asleep", g.iterations_workers_asleep},
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
                   {"source", frames_json(f.source)},
                   {"where", where_json(f.source)},
                   {"node", f.after == kNoNode ? nlohmann::json(nullptr) : nlohmann::json(f.after)}});
  return out;
}

nlohmann::json to_json(const Graph& g) {
  using nlohmann::json;
  std::unordered_map<uint32_t, bool> left_after;
  for (const terra::Fallback& f : g.fallbacks.entries())
    if (f.after != kNoNode) left_after[f.after] = true;

  // Entry and exit are the TraceGraph's virtual nodes: the views draw what ran, from the markers.
  const terra::TraceGraph& t = g.trace;
  json nodes = json::array();
  for (uint32_t id = terra::kExitNode + 1; id < t.size(); ++id) {
    const RuntimeNode& n = g.nodes[id];
    json shapes = json::array();
    for (const OutSpec& o : n.tmpl.outs)
      if (!o.none) shapes.push_back(describe(o.meta));
    nodes.push_back({{"id", id},
                     {"label", n.tmpl.label()},
                     {"op", n.tmpl.name},
                     {"kind", kind_name(n.tmpl)},
                     {"shapes", std::move(shapes)},
                     {"count", t.node(id).count},
                     {"source", frames_json(t.node(id).source)},
                     {"where", where_json(t.node(id).source)},
                     {"fallback", left_after.count(id) > 0}});
  }
  // Control edges between those nodes; an edge's place in this list is how the switch-cases name it.
  json edges = json::array();
  std::vector<uint32_t> place(t.edges().size(), kNoNode);
  for (terra::EdgeId e = 0; e < t.edges().size(); ++e) {
    const terra::ControlEdge& ce = t.edge(e);
    if (ce.from == terra::kEntryNode || ce.to == terra::kExitNode) continue;
    place[e] = static_cast<uint32_t>(edges.size());
    edges.push_back({{"from", ce.from}, {"to", ce.to}, {"count", ce.count}});
  }
  auto edge_of = [&](terra::EdgeId e) { return place[e] == kNoNode ? json(nullptr) : json(place[e]); };

  json blocks = json::array(), cases = json::array(), back = json::array();
  const terra::CaseAssignment assignment = terra::assign_cases(t);
  for (size_t b = 0; b < assignment.cases.size(); ++b) {
    const terra::SwitchCase& sc = assignment.cases[b];
    blocks.push_back({{"id", b}, {"nodes", sc.block.nodes}});
    json entering = json::array();
    for (terra::EdgeId e : sc.entering)
      if (json i = edge_of(e); !i.is_null()) entering.push_back(i);
    cases.push_back({{"block", b}, {"entering", std::move(entering)}});
  }
  for (terra::EdgeId e : assignment.back_edges)
    if (json i = edge_of(e); !i.is_null()) back.push_back(i);

  json out = {{"name", g.name},
              {"nodes", std::move(nodes)},
              {"edges", std::move(edges)},
              {"blocks", std::move(blocks)},
              {"switch_cases", std::move(cases)},
              {"back_edges", std::move(back)},
              {"last_path", g.last_path},
              {"fallbacks", fallbacks_json(g)},
              {"stats", stats_json(g)}};
  return out;
}

}  // namespace terra::runtime
