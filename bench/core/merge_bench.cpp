// terra_core_bench: cost per op of merging traces into a TraceGraph and of generating the symbolic
// graph from it, for traces of 1k, 10k and 100k ops. Writes core_merge.json and core_merge.md to
// bench/results/ (or to the directory given as the first argument).
//
// The traces look like a training step of a deep nn.Sequential: 64 distinct op sites repeated by a
// library loop (so keys differ by occurrence), each op reading the previous op's output and a
// parameter, some reading a fed scalar. The "branch" trace takes the other side of an if/else
// every 500 ops and re-converges, so the merged graph has diamonds to cut into blocks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "terra/case_assignment.h"
#include "terra/graph_gen.h"
#include "terra/trace_graph.h"

using namespace terra;

namespace {

Trace make_trace(size_t n, bool branch) {
  Trace t;
  t.ops.reserve(n);
  OccurrenceCounter occ;
  const uint64_t relu = op_identity("aten::relu"), gelu = op_identity("aten::gelu");
  const uint64_t linear = op_identity("aten::linear");
  TensorMeta m;
  m.sizes = {32, 64};
  m.strides = {64, 1};
  m.dtype = 6;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t line = static_cast<uint32_t>(j % 64);
    OpRecord r;
    if (j % 500 == 250) {
      // The if/else has a site of its own, so that taking one side does not shift the occurrence
      // counts of the loop's other sites.
      const uint32_t site = static_cast<uint32_t>(j / 500);
      r.key = occ.key(branch ? gelu : relu, stack_hash({{1, 10}, {3, site * 2 + branch}}));
    } else {
      r.key = occ.key(line % 2 ? relu : linear, stack_hash({{1, 10}, {2, line}}));
    }
    if (j) r.inputs.push_back(ValueRef::op(j - 1));
    r.inputs.push_back(ValueRef::external(0x7f0000000000ull + (j % 4096) * 64));
    if (line == 7) r.inputs.push_back(ValueRef::feed(0));
    r.outputs.push_back(m);
    r.is_fetch = j + 1 == n;
    t.ops.push_back(std::move(r));
  }
  return t;
}

template <class F>
double median_ns(int reps, F&& f) {
  std::vector<double> ns;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : TERRA_BENCH_RESULTS;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t n : {size_t{1000}, size_t{10000}, size_t{100000}}) {
    const Trace a = make_trace(n, false), b = make_trace(n, true);
    const int reps = static_cast<int>(std::max<size_t>(5, 500000 / n));
    std::vector<TraceGraph> fresh(static_cast<size_t>(reps));  // destroyed outside the timings
    size_t next = 0;
    const double cold = median_ns(reps, [&] { fresh[next++].merge(a); });
    fresh.clear();
    TraceGraph g;
    g.merge(a);
    const double warm = median_ns(reps, [&] { g.merge(a); });
    std::vector<TraceGraph> with_a(static_cast<size_t>(reps));
    for (TraceGraph& h : with_a) h.merge(a);
    next = 0;
    const double branch = median_ns(reps, [&] { with_a[next++].merge(b); });
    with_a.clear();
    g.merge(b);
    CaseAssignment cases;
    const double assign = median_ns(reps, [&] { cases = assign_cases(g); });
    SymbolicGraph sg;
    const double gen = median_ns(reps, [&] { sg = generate(g, cases); });
    bool ok = true;
    const double rep = median_ns(reps, [&] { ok = replay(sg, b).ok && ok; });
    const double per = static_cast<double>(n);
    nlohmann::json row = {{"ops", n},
                          {"nodes", g.size() - 2},
                          {"blocks", cases.cases.size()},
                          {"repetitions", reps},
                          {"merge_new_ns_per_op", cold / per},
                          {"merge_known_ns_per_op", warm / per},
                          {"merge_branching_ns_per_op", branch / per},
                          {"assign_cases_ns_per_op", assign / per},
                          {"generate_ns_per_op", gen / per},
                          {"generation_total_ns_per_op", (assign + gen) / per},
                          {"replay_ns_per_op", rep / per},
                          {"replay_ok", ok}};
    std::printf("%s\n", row.dump().c_str());
    rows.push_back(row);
  }
  nlohmann::json out = {{"benchmark", "terra_core merge and generation"},
                        {"cpu", cpu_model()},
                        {"compiler", __VERSION__},
                        {"timing", "median wall time of repeated runs, one thread, divided by trace length"},
                        {"results", rows}};
  std::ofstream(dir + "/core_merge.json") << out.dump(2) << "\n";

  std::ofstream md(dir + "/core_merge.md");
  md << "# terra_core: merge and generation cost per op\n\n"
     << "`terra_core_bench` (bench/core/merge_bench.cpp), Release, one thread, " << cpu_model() << ".\n"
     << "Median of repeated runs divided by the trace length, in ns per op.\n\n"
     << "| ops | merge (new) | merge (known) | merge (branching) | assign_cases | generate | replay |\n"
     << "|---:|---:|---:|---:|---:|---:|---:|\n";
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "| %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r["ops"].get<size_t>(),
                  r["merge_new_ns_per_op"].get<double>(), r["merge_known_ns_per_op"].get<double>(),
                  r["merge_branching_ns_per_op"].get<double>(), r["assign_cases_ns_per_op"].get<double>(),
                  r["generate_ns_per_op"].get<double>(), r["replay_ns_per_op"].get<double>());
    md << line;
  }
  md << "\n- merge (new): a trace into an empty graph, every op a new node.\n"
     << "- merge (known): the same trace again, the steady state while warming up.\n"
     << "- merge (branching): a second trace, into the graph of the first, that takes the other side of an\n"
     << "  if/else every 500 ops (new node, two new edges, re-converging).\n"
     << "- assign_cases + generate: graph generation from the graph of both traces.\n"
     << "- replay: the reference walk of the branching trace through the generated graph.\n"
     << "\nEvery pass does constant work per op (none revisits earlier ops), so total time grows\n"
     << "linearly and ns/op stays within a small factor from 1k to 100k. What rises at 100k is memory:\n"
     << "a graph of 100k nodes is tens of MB of small heap blocks, far past the L2, and a profile of\n"
     << "merge (known) puts about half its time on cache misses in the per-input producer lists (the\n"
     << "next layout to flatten). The machine is a shared 2-vCPU VM: expect +-30% between runs.\n";
  return 0;
}
