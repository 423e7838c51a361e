// PythonRunner: the side of co-execution that runs in the program's own Python thread.
//
// While Terra is active on a thread, every ATen call of that thread reaches `on_aten` (a dispatcher
// fallback on a thread-local key) before autograd or any kernel, and the patched Python entry
// points for `backward` and `.grad` reach `on_pseudo`. Per iteration (a segment of the program
// between two iteration boundaries, see `mark`) the runner is in one of three modes:
//   Tracing  the op runs eagerly and is recorded into the TraceGraph;
//   CoExec   the op is validated against the TraceGraph (same LocationKey, same argument
//            template) and issued to the GraphRunner; the program gets placeholders;
//   Eager    past the policy's caps: the op runs eagerly, nothing is recorded.
// A call that does not validate is a divergence: the GraphRunner finishes what was issued, every
// live placeholder becomes a real tensor, and the rest of the iteration is traced. The program
// never sees a difference except time.
//
// Its work is in stages, one file each: python_runner_ops.cpp (interception, tracing, validation
// of each op), python_runner_grads.cpp (`.grad` presence after each backward),
// python_runner_issue.cpp (work items, ops run here, host scalars, fetches),
// python_runner_loops.cpp (iteration boundaries and the mode of each iteration), and
// python_runner.cpp (the hook, entering and leaving graphs, fallbacks, errors).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/intrusive_ptr.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <thread>
#include <vector>

#include "graph.h"
#include "graph_runner.h"
#include "openmp_team.h"
#include "op_template.h"
#include "python_stack.h"
#include "terra/policy.h"
#include "timeline.h"

namespace terra::runtime {

class PythonRunner {
 public:
  static PythonRunner& instance();
  static void install_dispatch_hook();

  // Session control, called with the GIL held. `root` bounds the call stacks that key the ops.
  void enter(Graph* graph, PythonStack::Root root);
  void exit();
  bool active() const { return mode_ != Mode::Off; }
  // An iteration boundary; `helper`: of a loop in a function defined next to the one terra.run
  // runs, an iteration only while no loop of that function is open (track_loop).
  void mark(uint64_t boundary, bool helper = false);
  // After a backward the program called returned (python/module.cpp): where no marked loop is
  // open and the program keeps calling backward (a library's training loop, which no AST pass
  // marks), each backward ends an iteration.
  void after_backward();
  Graph* graph() const { return graph_; }
  terra::Policy& policy() { return policy_; }
  // After settings changed: between sessions, a program cache turned off stops caching at once.
  void settings_changed();
  GraphRunner& runner();
  // Wall time the GraphRunner has spent executing items (0 before it exists): its work, without
  // the idle spinning that its CPU time includes.
  uint64_t runner_busy_ns() const { return runner_ ? runner_->busy_ns() : 0; }

  // Interception points.
  void on_aten(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
  // The C fast path (python/fast_path.cpp) calls `on_fast` with the stack the dispatcher would
  // have handed the fallback, skipping PyTorch's argument parser and the dispatcher. It may only
  // do so where the dispatcher route would reach the fallback now (`fast_ready` and the keys of
  // the arguments, which the caller checks).
  bool fast_ready() const { return mode_ == Mode::CoExec && paused_ == 0 && policy_.fast_path; }
  // The fast path's argument stack on the session's thread: issue() swaps its vector with a work
  // item's, so one vector circulates and building a call's stack allocates nothing. A member,
  // not a thread_local: each access to one of those from this module is a __tls_get_addr call
  // (three per op). nullptr on other threads (their ops are not intercepted).
  torch::jit::Stack* fast_stack() { return std::this_thread::get_id() == owner_ ? &fast_stack_ : nullptr; }
  // The dispatch key Terra's fallback is registered on (python_runner.cpp says why this one).
  static constexpr c10::DispatchKey kHookKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
  // Called with true when a loop starts running eagerly (the session's pass-through entry points
  // come out: terra/_patches.py eager_hold), with false when it is traced or co-executed again.
  void set_eager_hold_switch(std::function<void(bool)> hold) { eager_hold_switch_ = std::move(hold); }
  void on_fast(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    run_aten(op, stack, /*fast=*/true);  // co-executing (fast_ready); no entry is a passthrough op
  }
  // The fast path's last result, wrapped for Python, kept until the next one or the iteration's
  // end. Torch's PyObject preservation makes a TensorImpl with a Python object take a reference
  // to it through the interpreter (acquiring the GIL through pybind11) when a second C++
  // reference appears, and drop it when the last but one goes: dropping the result after
  // wrapping it, then capturing it as the next op's argument, crossed that line twice per op
  // (about 290 instructions, 6% of the program thread on a 1x1 chain). Kept, the next op's item
  // takes its reference without a crossing, and this one goes when nothing hinges on it.
  void keep_returned(at::Tensor&& result) { returned_ = std::move(result); }
  bool is_returned(const at::Tensor& t) const {
    return returned_.defined() && t.unsafeGetTensorImpl() == returned_.unsafeGetTensorImpl();
  }
  // backward / .grad / .grad = : `exec` runs the real thing on the given stack.
  void on_pseudo(OpKind kind, const char* name, torch::jit::Stack* stack,
                 const std::function<void(torch::jit::Stack*)>& exec);

  // Makes a placeholder's Python object an ordinary tensor (waits for its value). GIL held.
  void materialize(PyObject* tensor);
  // Before the program reads a tensor's version counter (`t._version`): an ordinary tensor's is
  // bumped by the GraphRunner's in-place ops, so the writes issued to it must have run; so is
  // that of a placeholder viewing one (it is filled). Any other placeholder's is bumped as the
  // program issues them (make_output): nothing to wait for.
  void await_writes(const at::Tensor& t);
  // Before the program reads a tensor's autograd history (`grad_fn`, `is_leaf`): an unfilled
  // placeholder has none (the GraphRunner makes it), so it is filled first; eager execution
  // shows the output's node at once.
  void fill_history(const at::Tensor& t);
  void sync();  // waits for all issued work; raises a pending GraphRunner error
  // A NumPy array over a tensor's memory was handed to Python (`t.numpy()`, `np.asarray(t)`):
  // until `unexpose(key)` (the array died), the program may write that memory at any time, so
  // ops read it as from_numpy memory (python_memory). Returns the key, 0 if nothing to track.
  uintptr_t expose(const at::Tensor& t);
  void unexpose(uintptr_t key);
  // torch.clear_autocast_cache (an autocast region ended): clears the program thread's cache and,
  // while co-executing, the GraphRunner's, in issue order (thread_state.h).
  void clear_autocast_cache();
  // Stops interception while Terra's own Python code runs (printing a tensor, for instance).
  void pause();
  void resume();
  // Something Terra cannot co-execute is about to happen (`what`): leave co-execution for the
  // rest of this iteration, recording `why` for explain (terra::FallbackReason::EagerCall).
  void barrier(const std::string& why, const std::string& what);
  // Python code Terra runs as an opaque unit (a custom autograd.Function's forward): nothing in
  // it is traced; during co-execution everything issued first completes and every placeholder
  // becomes real, so the code sees eager state. `why` is listed by explain.
  void opaque_begin(const std::string& why, const std::string& what);
  void opaque_end();
  std::map<std::string, std::unique_ptr<Graph>>& graphs() { return graphs_; }
  // Drops the graph called `name` (every graph: none), and the GraphRunner's blocks of it. Not
  // while a session is active.
  void drop_graphs(const std::optional<std::string>& name);

  const char* mode_name() const;
  // In a child made by fork() (DataLoader workers): the GraphRunner thread did not come along, so
  // the child runs everything eagerly, untraced (installed with pthread_atfork).
  void forget_after_fork();
  // How errors name a source file: a notebook kernel maps its cells' files to "In [n]"; an empty
  // result keeps the file name. Called with the GIL held.
  using FileLabel = std::function<std::string(const std::string&)>;
  void set_file_label(FileLabel label) { file_label_ = std::move(label); }

 private:
  enum class Mode { Off, Tracing, CoExec, Eager };
  std::function<void(bool)> eager_hold_switch_;
  bool eager_held_ = false;  // the pass-through entry points are out for eager iterations
  uint32_t eager_run_ = 0;   // eager iterations in a row
  static constexpr uint32_t kEagerRunBeforeHold = 8;
  // Traced iterations in a row that each added ops before a loop is explained as never steady.
  static constexpr int kUnsteadyRunToExplain = 8;
  using Exec = std::function<void(torch::jit::Stack*)>;

  // An ATen op the program issued while tracing or co-executing; `fast`: it came through the C
  // fast path, not the dispatcher.
  void run_aten(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool fast);
  // `name`: a pseudo-op's; an ATen op's comes from `op` (op_name), only where it is needed.
  // The source of a new node at the location last keyed (last_key_), shared with that
  // location's other nodes.
  std::shared_ptr<const terra::SourceInfo> source_of(const std::string& op);
  void trace_op(OpKind kind, const c10::OperatorHandle* op, const char* name,
                uint64_t lookup, torch::jit::Stack* stack, const Exec& exec);
  // `predicted`: the node predicted_node found (then `lookup` is not used).
  bool coexec_op(OpKind kind, const c10::OperatorHandle* op, const char* name,
                 uint64_t lookup, torch::jit::Stack* stack, const Exec& exec,
                 uint32_t predicted = UINT32_MAX);
  // Before an op is issued: fills placeholders the program made leaves, copies arguments over
  // memory the program changes without ops; true: the op must run before the program goes on.
  bool prepare_arguments(const OpTemplate& t, torch::jit::Stack* stack);
  void issue(uint32_t node_id, const OpTemplate& t, torch::jit::Stack* stack);
  // issue()'s steps (python_runner_issue.cpp; those on every op's path inlined there: called
  // out of line they cost 80 instructions per op, 2% of the program thread's work).
  void yield_to_parallel_region();
  [[gnu::always_inline]] inline WorkItem& free_item(GraphRunner& r);
  [[gnu::always_inline]] inline void fill_item(WorkItem& item, uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args, uint64_t seq);
  [[gnu::always_inline]] inline void note_writes(uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args, uint64_t seq);
  // The outputs' placeholders into scratch_ (reused from the pool where `reuse`).
  struct Outputs {
    WorkItem& item;
    uint32_t node_id;
    const OpTemplate& t;
    const torch::jit::Stack& args;
    uint64_t seq;
    bool reuse;
    bool inference = false;
    // A placeholder first argument's group (its views share it); a pointer, copied only for a
    // view: a copy per op wrote the count of a line the GraphRunner also writes (the slot's),
    // 6% of the program thread's samples on a 1x1 add chain.
    const std::shared_ptr<AliasGroup>* base_group = nullptr;
  };
  [[gnu::always_inline]] inline void make_outputs(WorkItem& item, uint32_t node_id, const OpTemplate& t, const torch::jit::Stack& args,
                    uint64_t seq, bool reuse);
  [[gnu::always_inline]] inline at::Tensor make_output(const Outputs& out, size_t index);
  [[gnu::always_inline]] inline void keep_pace(GraphRunner& r, bool gil);  // reclaim executed items; sleep when far ahead
  void run_fetch(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec);
  // `new_path`: the program left the traced paths (counted against Policy::max_divergences);
  // false: a known path traced again to learn something (OpTemplate::relearn).
  void diverge(terra::FallbackReason reason, std::string detail, const std::string& op, bool new_path = true);
  void note_fallback(terra::FallbackReason reason, std::string detail, const std::string& op);
  void explain_unsteady();  // a loop traced kUnsteadyRunToExplain times, each adding ops
  // A Python-lane span of the current iteration (timeline.h).
  void add_span(SpanKind kind, int64_t start, int64_t end, std::string detail = {});
  void end_iteration();
  void begin_iteration(uint64_t boundary);
  // The mode a stable iteration runs in: co-executed, or eagerly where that measured faster.
  Mode stable_mode();
  // Before this run's first check, an earlier run's choice or pairing (payoff_memory.h) has the
  // graph's next iteration run eagerly.
  // So does a hold a backward that runs Python started (hold_eager_if_backward_runs_python).
  bool remembered_eager() const {
    const terra::Payoff& p = graph_->payoff;
    return (p.remembered() || p.held_first()) && p.checks() == 0 && p.eager();
  }
  // After a traced iteration whose path holds a backward that runs Python, before the graph's
  // first check: eager execution is held (terra::Payoff::hold_eager_first says why).
  void hold_eager_if_backward_runs_python();
  // At the end of a graph's first traced loop iteration (`path`, from its marker): its payoff
  // check starts from an earlier run's choice for those ops where one is kept (payoff_memory.h),
  // and the graph's checks are kept under the same key (store_payoff_choice, after each).
  void recall_payoff(const std::vector<uint32_t>& path);
  void store_payoff_choice();
  uint64_t payoff_key(const std::vector<uint32_t>& path) const;
  // A co-executed iteration's time as the payoff check sees it: up to the GraphRunner's finishing
  // the previous iteration (waits for that); `span_seconds` where no co-executed one preceded.
  double coexec_seconds(double span_seconds);
  uint64_t completed_seq_ = 0;  // issued at the end of the previous co-executed iteration
  int64_t completed_ns_ = 0;    // when that iteration's predecessor had been run (0: none)
  int coexec_run_ = 0;          // co-executed iterations in a row, up to this one
  // CPU time of the GraphRunner's OpenMP workers at the last iteration's end, while measuring
  // (note_workers_cpu); -1 when not.
  double workers_cpu_at_ = -1.0;
  WorkerCpuClock workers_cpu_;
  static constexpr int kCoexecRunBeforeSample = 3;  // the first two time the GraphRunner's start
  bool chosen_eager_ = false;        // this iteration runs eagerly because that is faster
  Mode iteration_mode_ = Mode::Off;  // the mode this iteration began in
  Mode previous_mode_ = Mode::Off;   // the mode the previous iteration ended in
  // Waits for everything issued and makes every live placeholder real: from here the program
  // thread sees eager state (leaving co-execution, or before Python code Terra cannot trace).
  void catch_up(bool move_team = false);
  // After the program ran ops itself inside a co-executed iteration (opaque_end, a backward that
  // runs Python): the team and the GraphRunner's spinning back to co-execution.
  void resume_coexecution();
  // The OpenMP team follows the kernels (openmp_team.h): the GraphRunner gives its team up, in
  // issue order, before the program thread runs ops itself again.
  void take_team_back(bool always = false);
  bool team_may_move();          // rate limit of team moves (kTeamMoveNs)
  int64_t last_team_move_ns_ = 0;
  bool runner_team_ = false;     // the GraphRunner may hold an OpenMP pool
  // This co-executed iteration runs with the GraphRunner's idle OpenMP workers asleep
  // (Graph::workers_asleep, or the policy).
  bool spin_limited_ = false;
  // After a payoff check (choosing_spin): which way the graph's co-executed iterations keep the
  // GraphRunner's idle OpenMP workers next (Graph::workers_asleep, Graph::WorkersTrial).
  void choose_workers();
  // Until the graph's first payoff check, from its recorded blocks: asleep where the kernels they
  // run in parallel regions all work on small tensors (Graph::asleep_by_blocks).
  void choose_first_workers();
  // Adds a co-executed iteration with the workers spinning to Graph::spinning_seconds and
  // spinning_workers_cpu (choose_workers reads them).
  void note_workers_cpu(double wall_seconds);
  // At a co-executed iteration's end, while the two ways alternate (Graph::WorkersTrial::Pairing):
  // its time to the trial, and the way for the next iteration.
  void pair_workers(bool clean, double seconds);
  bool choosing_spin() const { return policy_.adaptive && policy_.worker_spin == terra::Policy::WorkerSpin::Auto; }
  void materialize_all();
  void fill(const at::Tensor& placeholder);
  // Waits for item `seq`; `what` (the op that waits) names the timeline's span.
  // Waits until the GraphRunner has run item `seq`; `what` (an op's name, or why) labels the
  // timeline's fetch_wait span.
  void wait_for(uint64_t seq, std::string_view what);
  // Raises the GraphRunner's warnings as Python warnings, and makes each op that raised one a
  // fetch from then on (GraphRunner::take_warnings).
  void raise_warnings();
  void raise_if_failed();
  // The op's location key: its identity, call stack and occurrence in the iteration (what it
  // was made of stays in last_key_, for a node made from it). First counts the occurrences of the
  // ops accepted by predicted_node since the last key, as if each had been keyed.
  uint64_t lookup_key(OpKind kind, const c10::OperatorHandle* op);
  struct KeyParts {
    uint64_t base = 0;
    uint32_t occurrence = 0;
    uint64_t innermost = 0;
    uint64_t op = 0, stack = 0;  // what `base` hashes
    terra::LocationKey location() const { return {op, stack, occurrence}; }
  };
  KeyParts last_key_;
  // While co-executing: the current node's last successor, where the ATen op `op` called from
  // the same Python frame (code and instruction) with arguments its template matches; kNoNode
  // otherwise (the op is then keyed and looked up in full). The callers' frames are not walked:
  // a different caller with the same op, frame and arguments computes the same thing, and where
  // the program goes on differently the next op does not match.
  uint32_t predicted_node(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const;
  std::vector<uint32_t> uncounted_;  // nodes predicted_node accepted since the last lookup_key
  uint64_t needed_seq(const c10::IValue& v) const;
  bool passthrough(const c10::OperatorHandle& op);
  // The node among a location's candidates whose template the call matches, or kNoNode; then
  // `why`, if given, says why the first candidate did not.
  uint32_t match_node(const std::vector<uint32_t>& candidates, const torch::jit::Stack& stack,
                      std::string* why) const;
  // The same answer where it is a successor of the current node (the recorded path's next op,
  // nearly always): found without the location index, a hash table too large to stay in cache
  // (about 5% of the program thread's time on hf_bert, a miss or two per op). kNoNode otherwise.
  uint32_t matching_successor(uint64_t lookup, const torch::jit::Stack& stack) const;
  // The program goes from the current node to `node`, which becomes current: the edge counted
  // (true: it is new), `node` remembered as the current node's last successor, counted, and
  // appended to the path.
  bool take_edge(uint32_t node);
  // The template of the current node's last successor (the op most likely next), or nullptr.
  const OpTemplate* predicted_template() const;
  // Which candidate a `.grad` read is: whether the gradient is defined at this point is known on
  // the Python side from the backward and `.grad =` ops issued so far. `settled`: the read is
  // answered with the leaf's real gradient, because no item issued since the program thread last
  // saw it may have replaced it (a backward into a defined gradient accumulates in place): no
  // item, no placeholder, no GraphRunner. That covers the optimizers' and
  // zero_grad(set_to_none=False)'s reads of gradients kept across steps. A gradient replaced while
  // co-executing (zero_grad's default set_to_none) is read through an item: answering those
  // directly once a fetch had drained the GraphRunner made such programs slower (corpus p10, p12,
  // p24: whole-program 1.0-1.7x eager's time became 2.3-2.8x; not understood).
  // A fetch found that `backward` created the gradient of `leaf` without predicting it
  // (OpTemplate::relearn).
  static void note_unpredicted(OpTemplate& backward, const at::Tensor& leaf);
  uint32_t choose_grad_read(const std::vector<uint32_t>& candidates, const at::Tensor& t,
                            bool* settled);
  void note_grads(uint32_t node, const torch::jit::Stack& args, const torch::jit::Stack& returns,
                  bool traced);

  Mode mode_ = Mode::Off;
  Graph* graph_ = nullptr;
  uint32_t graph_name_ = 0;  // Timeline::intern(graph_->name)
  PythonStack::Root root_;
  std::thread::id owner_;  // the thread the session runs on (enter)
  torch::jit::Stack fast_stack_;  // fast_stack()
  struct OpenLoop {
    uint64_t id;
    bool helper;
  };
  std::vector<OpenLoop> open_loops_;  // innermost last (track_loop)
  bool track_loop(uint64_t boundary, bool helper);  // false: not an iteration boundary
  bool absorbs(uint64_t loop);  // a loop of a few ops per iteration (Graph::Root::absorbed)
  // A helper's loop whose iterations each run a backward: training steps, iterations of their own
  // inside a loop of the run function (Graph::HelperLoop). `exit`: the mark is the loop's exit.
  bool training_steps(uint64_t loop, bool exit);
  uint64_t backwards_ = 0;  // backward calls the session's thread made (on_pseudo)
  // Backward pseudo-ops executing on this thread (on_pseudo): what runs inside one is part of it.
  static thread_local int backward_depth_;
  uint64_t iteration_backwards_ = 0;  // backwards_ at the current iteration's start
  // backwards_ at the last boundary that was not a helper loop's (the session's entry, a loop of
  // the run function), and whether the session runs a training loop no pass marks
  // (after_backward): each backward then ends an iteration, and a helper's loops count as
  // inside a loop of the run function.
  uint64_t run_backwards_at_ = 0;
  bool unmarked_loop_ = false;
  // Ends the current iteration and begins one at `boundary` (an iteration that issued nothing
  // keeps going).
  void cut_iteration(uint64_t boundary);
  terra::Policy policy_ = terra::Policy::from_environment();
  uint32_t cur_ = 0;
  uint32_t root_node_ = UINT32_MAX;  // the marker node the current iteration started from
  uint64_t boundary_ = 0;
  bool added_ = false;      // this iteration added nodes or edges
  bool diverged_ = false;   // this iteration fell back
  // The first node this traced iteration added, and why the nodes already at its location did
  // not validate: what `%terra explain` names for a loop that never becomes steady.
  uint32_t first_new_ = UINT32_MAX;
  std::string first_new_why_;
  int64_t iteration_start_ns_ = 0;
  uint64_t iteration_serial_ = 0;  // iterations begun, over all graphs (timeline)
  struct Occurrence {
    uint64_t iteration = 0;  // the iteration `count` belongs to
    uint32_t count = 0;
  };
  std::unordered_map<uint64_t, Occurrence> occurrences_;
  std::vector<uint32_t> path_;  // nodes this iteration followed, from its marker
  torch::jit::Stack scratch_;   // issue(): the returns' buffer, reused
  at::Tensor returned_;         // keep_returned
  bool fast_ = false;           // the op being run came through the fast path (the GIL is held)
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> live_;  // placeholders handed out
  // Dropped output placeholders to hand out again (placeholder.h); emptied before every live
  // placeholder is made real, and when the session ends.
  PlaceholderPool pool_;
  size_t live_prune_at_ = kLivePruneSlack;  // prune `live_` of dead entries past this size
  static constexpr size_t kLivePruneSlack = 256;
  uint64_t last_external_write_ = 0;
  // An op with autograd history read memory the program changes without ops (python_memory):
  // autograd saved that tensor, and eager's backward reads it as it is when the backward runs, so
  // the next Backward item runs before the program goes on (prepare_arguments, issue).
  bool python_memory_saved_ = false;
  // The copies that ops with autograd history got of such memory (copy, the tensor over the
  // memory), until the next backward: if the memory changed since, the program waits for
  // everything issued and writes its values into the copy, which autograd saved, before the
  // backward is issued or run (eager's backward reads the memory as it is then). Beyond kMaxPythonCopies an op
  // runs at once instead, as python_memory_saved_ says.
  std::vector<std::pair<at::Tensor, at::Tensor>> python_copies_;
  static constexpr size_t kMaxPythonCopies = 256;
  // Before a Backward item: the copies in python_copies_ hold the memory's current values.
  void refresh_python_copies(const torch::jit::Stack& backward_args);
  // The Backward node of the item at last_external_write_ (kNoNode: another kind of write).
  uint32_t last_write_backward_ = UINT32_MAX;
  // The last Backward item issued: the only kind of item that may give or take the gradient of a
  // leaf it does not name (a GradWrite names its leaf, whose state grad_defined_ then holds).
  uint64_t last_backward_ = 0;
  uint64_t previous_backward_ = 0;             // the Backward item issued before that one
  uint32_t last_backward_node_ = UINT32_MAX;   // last_backward_'s node (kNoNode: none this session)
  // Whether the backward at last_backward_ leaves the gradient of `leaf` alone: traced with the
  // same leaves reached each time, it saw this one and did not reach it (a GAN's discriminator
  // step, read by the generator's `zero_grad`). Then the leaf's own field says whether it has a
  // gradient once the backwards before it have run.
  bool last_backward_spares(const at::Tensor& leaf) const;
  // 0-d CPU tensors the GraphRunner has used, by storage: last item reading / writing each. Host
  // scalars (Adam's step counter) that the GraphRunner never touches are updated and read in the
  // Python thread at once, so `.item()` on them never waits.
  struct ScalarUse {
    uint64_t read = 0, write = 0;
  };
  std::unordered_map<const c10::StorageImpl*, ScalarUse> scalar_use_;
  // Storages NumPy arrays share (expose), with how many such arrays are alive.
  struct Exposed {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int arrays = 0;
  };
  std::unordered_map<const c10::StorageImpl*, Exposed> exposed_;
  // Memory the program can change without an op: from_blob memory (from_numpy, frombuffer,
  // DLPack) or memory an alive NumPy array shares (expose).
  bool python_memory(const at::Tensor& x) const;
  bool run_on_host(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec);
  // Tensors the program thread made itself while co-executing (PythonNow factories, fetches and
  // host ops), by storage, as long as no issued item may write them or alias them: only the
  // program thread ever changes them, so an op reading them needs nothing from the GraphRunner.
  // The weak reference keeps the StorageImpl's memory, so its address names no other storage.
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> own_made_;
  bool own_made(const at::Tensor& x) const;
  // Entries of dead storages are dropped when the map grows past this, which then doubles what
  // is left (a program may keep thousands of own-made tensors alive: one scan per host op would
  // be quadratic).
  size_t own_made_prune_at_ = kOwnMadePruneAt;
  static constexpr size_t kOwnMadePruneAt = 4096;
  // Registers the fresh tensor outputs of an op the program thread ran (not views, not arguments).
  void note_own_made(const OpTemplate& t, const torch::jit::Stack& returns, bool inputs_own_made = false);
  // An item about to be issued may write or alias its tensor arguments: they are not own-made.
  void forget_own_made(const OpTemplate& t, const torch::jit::Stack& args);
  // Host ops: a small op (OpTemplate::host_candidate, each input up to kHostOpBytes too) whose
  // tensors are all own-made (or Python numbers), CPU-only, writing none of its arguments and
  // outside autograd runs at once in the program thread, as eagerly, instead of as an item
  // behind everything issued. A check of an input batch (`torch.all(mask
  // == 1).item()` in Hugging Face's masking) then no longer waits for the GraphRunner to finish
  // the previous step. A random one runs here after the random items issued before it (the
  // generator is drawn in program order), where that wait leaves the GraphRunner work (run_here).
  bool run_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec);
  // Changes mode_ during a session, and with it whether the program thread's large allocations
  // come from the caching allocator (Policy::program_cache).
  void set_mode(Mode mode);
  // A view of a tensor over memory the program changes without ops (python_memory: a NumPy
  // array from torch.from_numpy, a batch sliced from such a dataset) runs here, at once: its
  // output must be a real tensor over that memory, and it reads no data, so it need not wait, as
  // an issued one would, for every item before it (detector_numpy_nms waited for the previous
  // step's backward and update before slicing its next batch).
  bool run_view_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec);
  static constexpr uint64_t kRandomLead = 64;       // items after the last random one, at least
  uint64_t last_random_item_ = 0;       // the last item that draws from a default generator (0: none)
  uint64_t random_item_iteration_ = 0;  // the iteration that issued it (iteration_serial_)
  int paused_ = 0;
  // Python-side knowledge of whether a leaf's .grad is defined (absent: unknown), and the issue
  // sequence of the last item that may have given it another gradient tensor (a `.grad =`, a
  // backward creating it where it was undefined, or any backward with create_graph): 0 where the
  // program thread has seen the real gradient since (traced, or fetched after a wait).
  struct GradState {
    c10::weak_intrusive_ptr<c10::TensorImpl> leaf;
    bool defined;
    uint64_t replaced_at = 0;
  };
  std::unordered_map<const c10::TensorImpl*, GradState> grad_defined_;
  // Before a traced backward: each known leaf's gradient (tensor and version), to see which it reached.
  std::unordered_map<const c10::TensorImpl*, std::pair<const c10::TensorImpl*, int64_t>> grads_before_;
  void snapshot_grads();
  std::unordered_map<const c10::FunctionSchema*, bool> passthrough_;
  std::unique_ptr<GraphRunner> runner_;
  FileLabel file_label_;
  std::vector<at::Tensor> graveyard_;  // GraphRunner-made values that died here (placeholder.h)
  DeadValueWatch dead_;  // placeholders only their last reading item holds (placeholder.h)
  std::map<std::string, std::unique_ptr<Graph>> graphs_;
};

}  // namespace terra::runtime
