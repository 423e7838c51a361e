// Graph: the TraceGraph of one co-executed region (a cell, a `terra.run` function), as it runs.
//
// The graph is the core's terra::TraceGraph (`trace`), built op by op as the program meets ops:
// its nodes (by LocationKey), control edges, counts, paths and sources are what validation follows,
// what the views draw and what the core's case assignment cuts into basic blocks. Beside it the
// runtime keeps, per NodeId, what running a node needs (`nodes`: the OpTemplate that validates
// later calls and that the GraphRunner executes, and the keys the program thread predicts it by).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "op_template.h"
#include "terra/paired_trial.h"
#include "terra/payoff.h"
#include "terra/policy.h"
#include "terra/trace_graph.h"

namespace terra::runtime {

// What the runtime keeps for one node of the TraceGraph (the graph keeps its key, counts, edges
// and source).
struct RuntimeNode {
  OpTemplate tmpl;
  // The node's location as one hash (PythonRunner::lookup_key): its key without the variant. Made
  // of the op and its call stack (`base`) and which occurrence of that pair in its iteration; and
  // the calling frame alone (code and instruction, PythonStack::innermost; 0: not known). An ATen
  // op that is the predicted next node's op, from that frame, with matching arguments, is that node
  // without walking the stack (PythonRunner::predicted_node).
  uint64_t lookup = 0;
  uint64_t base = 0;
  uint32_t occurrence = 0;
  uint64_t innermost = 0;
  // Times co-executed after arriving through the dispatcher rather than the C fast path
  // (python/fast_path.cpp): where the fast path would help next (`%terra explain`).
  uint64_t dispatched = 0;
  // The successor taken last: the next op is checked against it first (matching_successor).
  uint32_t next = UINT32_MAX;
  uint32_t next_edge = UINT32_MAX;  // the TraceGraph's edge to `next`
};

struct Graph {
  std::string name;
  // Unique in the process (a graph made after another was reset may reuse its address and name).
  const uint64_t serial = next_serial();
  static uint64_t next_serial();
  // The one TraceGraph; only the program thread changes or reads it.
  terra::TraceGraph trace;
  // Per NodeId (the entry's and exit's are empty). A deque: they never move, so the GraphRunner
  // can hold pointers into their templates while the program thread keeps adding nodes.
  std::deque<RuntimeNode> nodes = std::deque<RuntimeNode>(2);
  // A location's nodes (RuntimeNode::lookup -> its variants, in the order made).
  std::unordered_map<uint64_t, std::vector<uint32_t>> index;
  // What a person reads about each location's nodes (PythonRunner::source_of): nodes at one
  // location, the occurrence apart (a model's layers, a loop over the parameters), share one.
  std::unordered_map<uint64_t, std::shared_ptr<const terra::SourceInfo>> sources;
  struct Root {
    uint32_t node = 0;
    terra::Warmup warmup;  // consecutive traced iterations that added nothing
    int unsteady = 0;     // consecutive traced iterations that each added nodes
    uint32_t divergences = 0;
    bool coexecuted = false;  // entered co-execution at least once
    // Its traced and co-executed iterations and the ops they issued; `absorbed`: a nested loop
    // of a few ops per iteration, part of the enclosing loop's iteration (PythonRunner::absorbs).
    uint64_t iterations_seen = 0, ops_seen = 0;
    bool absorbed = false;
  };
  std::unordered_map<uint64_t, Root> roots;  // iteration boundary id -> its marker node
  // A helper's loop met inside a loop of the run function (PythonRunner::training_steps): its
  // completed iterations there and how many of them ran a backward; `steps` once decided (-1:
  // not yet, 1: its iterations are training steps, iterations of their own).
  struct HelperLoop {
    uint64_t iterations = 0, with_backward = 0;
    uint64_t backwards_at = 0;  // PythonRunner::backwards_ at its iteration's start
    bool open = false;          // an iteration of it is running
    int8_t steps = -1;
  };
  std::unordered_map<uint64_t, HelperLoop> helper_loops;
  // Iterations ended at a backward (PythonRunner::after_backward) and helper loops found to be
  // training steps (PythonRunner::training_steps): what `%terra explain` says of where iterations
  // come from when the program's own loops did not give them.
  uint64_t iterations_cut_at_backward = 0, helper_step_loops = 0;
  uint64_t iterations_traced = 0, iterations_coexecuted = 0, iterations_fallback = 0,
           iterations_eager = 0, iterations_eager_chosen = 0, ops_traced = 0, ops_coexecuted = 0, fetches = 0,
           host_ops = 0;
  // Co-executed `.grad` reads answered with the leaf's real gradient, without an item or a
  // placeholder (PythonRunner::choose_grad_read).
  uint64_t grad_reads_direct = 0;
  // Co-executed iterations whose time was not a payoff sample: the first two after a switch
  // measured the GraphRunner starting (PythonRunner::coexec_seconds).
  uint64_t iterations_unsteady = 0;
  // Co-executed ATen ops that came through the C fast path (python/fast_path.cpp) rather than
  // PyTorch's binding and the dispatcher (those are counted per node: RuntimeNode::dispatched).
  uint64_t ops_fast = 0;
  uint64_t placeholders_reused = 0;  // outputs handed out as a dropped placeholder (PythonRunner::reuse_)
  // Co-executed ops before which the program thread slept through a parallel region of the
  // GraphRunner's (openmp_team.h, TeamRegion), and how long in all.
  uint64_t yields_to_parallel_regions = 0;
  double yielded_seconds = 0;
  // Where and why iterations left co-execution (`after`: the node they followed last).
  terra::FallbackLog fallbacks;
  // Whether co-executing this graph is faster than running it eagerly (terra/payoff.h):
  // iterations it runs eagerly for that reason are `iterations_eager_chosen`.
  terra::Payoff payoff;
  // The key its checks' choices are kept under across processes (runtime/payoff_memory.h; 0:
  // none), and whether it was looked up (PythonRunner::recall_payoff).
  uint64_t payoff_key = 0;
  bool payoff_recalled = false;
  // Its co-executed iterations run with the GraphRunner's idle OpenMP workers asleep
  // (openmp_team.h, limit_openmp_spinning). Flipped each time the payoff check finds co-execution
  // slower than eager execution, so its next timing of co-execution tries the workers the other
  // way (Policy::worker_spin auto): where the spinning workers took the program's core, asleep
  // may win. Where co-execution wins the first time, the two ways run in alternating blocks of
  // co-executed iterations, and the other way is kept where it was faster (WorkersTrial,
  // terra/paired_trial.h, PythonRunner::choose_workers): winning does not mean the workers took
  // no core.
  bool workers_asleep = false;
  // Co-execution has been timed a second time after its first loss (choose_workers).
  bool retimed_coexec = false;
  // Its co-executed iterations keep the workers asleep because every kernel its recorded blocks
  // run in a parallel region works on tensors below the grain size (PythonRunner::
  // choose_first_workers): the other way is not tried (choose_workers). `first_workers_chosen`:
  // the blocks were looked at (or an earlier run's choice recalled, recall_payoff).
  bool asleep_by_blocks = false;
  bool first_workers_chosen = false;
  // Pairing: the two ways alternate (workers_pairing, way A being workers_asleep_before).
  enum class WorkersTrial : uint8_t { Untried, Pairing, Done };
  WorkersTrial workers_trial = WorkersTrial::Untried;
  terra::PairedTrial workers_pairing;
  bool workers_asleep_before = false;
  uint64_t iterations_workers_asleep = 0;  // co-executed iterations run so
  // Co-executed iterations with the workers spinning: their wall time, and the CPU time the
  // GraphRunner's OpenMP workers used meanwhile (WorkerCpuClock). Asleep can only save what the
  // workers took: where they took next to nothing (kernels too small for intra-op threads), the
  // other way is not tried (choose_workers).
  double spinning_seconds = 0, spinning_workers_cpu = 0;
  double traced_seconds = 0, coexec_seconds = 0;

  std::vector<uint32_t> last_path;  // the last iteration's nodes, from its marker

  // Adds a node at location `key` (its variant is the next free one of that location) that
  // `lookup` (the key as one hash) finds.
  uint32_t add_node(OpTemplate tmpl, uint64_t lookup, terra::LocationKey key);
  uint32_t op_nodes() const { return static_cast<uint32_t>(trace.size() - 2); }  // entry and exit aside
  // An iteration ended having followed `path` (from its marker): the path ends there in the
  // TraceGraph; it is kept as the last path (swapped out).
  void record_path(std::vector<uint32_t>& path);
};

// The graph for viewers (`terra.graph_json`): the core's export schema (terra/export.h: nodes,
// control edges, blocks and switch-cases of the one TraceGraph) with, per node, its kind, the
// template's label and output shapes and whether an iteration fell back after it (entry and exit
// have kind "entry" and "exit"), and the name, the last path, fallbacks and statistics.
nlohmann::json to_json(const Graph& graph);
nlohmann::json stats_json(const Graph& graph);  // iterations and ops by how they ran, times
// Its fallbacks: reason (text), kind, op, count, source and where (terra/export.h's shapes), node
// (the node the iteration left after).
nlohmann::json fallbacks_json(const Graph& graph);
// The payoff check's state: phase, checks made, the last choice and the times it compared.
nlohmann::json payoff_json(const terra::Payoff& payoff);

}  // namespace terra::runtime
