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

namespace terra::runtime {

namespace {

// The dispatch key Terra's fallback is registered on. It sits above autograd, autocast and the
// Python modes, so the fallback sees each call exactly as the program issued it (before
// composite ops decompose), and it is only ever active through thread-local inclusion.
constexpr c10::DispatchKey kTerraKey = PythonRunner::kHookKey;
constexpr uint32_t kNoNode = UINT32_MAX;
constexpr uint64_t kEntryBoundary = 1;
// A loop's exit boundary is its id XOR this (terra/_loops.py: EXIT). Loop ids are even and EXIT is
// odd, so an odd boundary is a loop's exit.
constexpr uint64_t kLoopExit = 0x5A5A000000000001ULL;
// How far (in issued ops) the program thread may run ahead of the GraphRunner before it sleeps,
// and how far the GraphRunner must catch up before it wakes. Far enough for a whole forward and
// backward: a replayed block runs the items that went through autograd when it was recorded (the
// forward) only once the backward that consumes them is issued (block_replay.h); a program thread
// held 64 ops ahead made the GraphRunner wait for it, or run the forward through autograd, at the
// start of every iteration, so the two threads took turns instead of overlapping (forced
// co-execution, 3 interleaved rounds of fresh processes, ms per step at 64 -> 1024 ops: resnet
// 15.6 -> 12.7, dcgan 16.4 -> 11.8, gpt 20.9 -> 13.4; eager 11.2, 11.1, 9.6). Not much more: each
// pending item keeps its outputs' Python objects alive (torch keeps a tensor's object while C++
// holds the tensor), which wakes Python's cyclic collector (at 2048-4000 ops, a 256x256 add chain
// ran one full collection of 90 ms on the program thread within its first 10,000 ops).
constexpr uint64_t kAheadHigh = 1024, kAheadLow = 512;
// And at most this many bytes of outputs ahead: a value the program dropped after the last item
// reading it was issued (an iteration's result, replaced by the next one's) lives until the
// program thread, awake again, drops the executed items that made it; 1024 ops of a 2048x2048
// add chain left 300 MB more resident than 64 ops did, 32 MB with a 64 MiB bound; with 64 MiB a
// chain of 4 MB values (test_values_dropped_before_their_last_reader_ran_are_freed_right_after_it)
// grew 78-184 MB over eager's, 66-114 with 32 (forced co-execution of resnet, gpt and dcgan
// within noise of each other).
constexpr uint64_t kAheadBytes = 32ull << 20;
// Eager iterations after co-execution first lost with the GraphRunner's idle workers spinning,
// before it is timed with them asleep (Graph::workers_asleep, PythonRunner::choose_workers).
constexpr int64_t kFirstAsleepRecheck = 8;
// The OpenMP team moves between the threads (openmp_team.h) at most this often within a session:
// a move costs 0.2-0.5 ms (the pool's workers exit, the next region makes new ones), and a program
// that diverges every iteration would pay it twice per iteration. Held back too long, the program
// traces with two teams, every parallel region a futex hand-off: corpus p08 (convolutions, a
// random path that diverges) traced at 10-13 ms per iteration after co-executing against 3.5
// before. Whole program, 3 x 5 runs, medians: 100 ms: p08 161-173 ms, p22 47-85; 20 ms: p08
// 129-134, p22 35-43 (eager: 65-79 and 40). A session's first move into co-execution and
// leaving a session always move it.
constexpr int64_t kTeamMoveNs = 20'000'000;

void set_hook(bool on) { c10::impl::tls_set_dispatch_key_included(kTerraKey, on); }

// An ATen op's name from its handle, else the pseudo-op's own name.
std::string op_name(const c10::OperatorHandle* op, const char* name) {
  return op ? c10::toString(op->operator_name()) : std::string(name ? name : "?");
}

void call_below(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kTerraKey);
  op.callBoxed(stack);
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  PythonRunner::instance().on_aten(op, ks, stack);
}

// A real 0-d CPU tensor outside autograd: a host scalar candidate.
bool host_scalar(const at::Tensor& t) {
  return t.defined() && t.dim() == 0 && t.device().is_cpu() && !t.requires_grad() &&
         !as_placeholder(t) && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

// A real tensor that only the program thread can reach: the op's stack and one owner (the
// caller) hold its TensorImpl, and no other tensor shares its storage. No pending item reads or
// writes it, and no autograd node saved it (each would hold a reference), so an op that changes
// it in place needs nothing from the GraphRunner: `torch.tensor(data)` ends with `detach_()` on
// the tensor it just made, which Hugging Face models call in every forward (an empty key/value
// cache per layer), and that fetch waited for everything issued (hf_llama: 2 waits of 1-4 ms
// per step).
bool program_only(const at::Tensor& x, const torch::jit::Stack& stack, bool returned) {
  if (!x.defined() || as_placeholder(x)) return false;
  size_t refs = 1 + returned;  // the caller's, and PythonRunner::keep_returned's
  for (const c10::IValue& v : stack)
    refs += v.isTensor() && v.toTensor().unsafeGetTensorImpl() == x.unsafeGetTensorImpl();
  return x.use_count() == refs && (!x.has_storage() || x.storage().use_count() == 1);
}

// Memory the program can change without a PyTorch op: a tensor made over a buffer it does not
// own (`torch.from_numpy`, `torch.frombuffer`, DLPack: ATen's from_blob with a deleter). The
// program writes it through NumPy at any time (an RL observation buffer filled in place each
// step), so an op reading it reads it when issued, as eagerly, never when the GraphRunner runs.
const c10::DeleterFnPtr kFromBlobDeleter =
    c10::InefficientStdFunctionContext::makeDataPtr(nullptr, [](void*) {}, c10::Device(c10::kCPU)).get_deleter();

bool from_blob(const at::Tensor& x) {  // x: not a placeholder
  return x.defined() && x.has_storage() && x.storage().data_ptr().get_deleter() == kFromBlobDeleter;
}

// Argument `i`'s alias annotation in the op's schema (written, or returned as a view); nullptr
// for none, or for a pseudo-op (no schema).
const c10::AliasInfo* alias_info(const OpTemplate& t, size_t i) {
  if (!t.op) return nullptr;
  const auto& args = t.op->schema().arguments();
  return i < args.size() ? args[i].alias_info() : nullptr;
}

bool has_placeholder(const torch::jit::Stack& stack) {
  bool found = false;
  for (const c10::IValue& v : stack)
    for_each_tensor(v, [&](const at::Tensor& t) { found = found || as_placeholder(t); });
  return found;
}

class GilReleased {
 public:
  GilReleased() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~GilReleased() {
    if (state_) PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_;
};

[[noreturn]] void raise(const RunnerError& e, const std::string& where) {
  const std::string context = "(Terra: raised by the GraphRunner while executing " + where +
                              "; the program had already continued past that op)";
  try {
    std::rethrow_exception(e.exception);
  } catch (c10::Error& error) {
    error.add_context(context);  // keeps its type: IndexError, ValueError, ...
    throw;
  } catch (const std::exception& error) {
    TORCH_CHECK(false, error.what(), "\n", context);
  } catch (...) {
  }
  TORCH_CHECK(false, "Terra: the GraphRunner failed with a non-standard exception\n", context);
}

// The op and the innermost frame of the user's own code (not PyTorch's or Terra's), the file
// named by `label` where it knows it (a notebook cell: "In [3], line 6").
std::string where(const Node& n, const PythonRunner::FileLabel& label) {
  std::string s = n.tmpl.name;
  const terra::SourceFrame* user = n.tmpl.source ? terra::user_frame(*n.tmpl.source) : nullptr;
  if (!user) return s;
  const std::string cell = label ? label(user->file) : std::string();
  s += " called at " + (cell.empty() ? user->file + ":" + std::to_string(user->line)
                                     : cell + ", line " + std::to_string(user->line)) +
       " in " + user->function;
  return s;
}

}  // namespace

PythonRunner& PythonRunner::instance() {
  static auto* runner = new PythonRunner();  // never destroyed: its thread lives to process exit
  return *runner;
}

void PythonRunner::forget_after_fork() {
  (void)runner_.release();  // its thread exists only in the parent: never joined, never used
  RunnerAllocator::after_fork_in_child();
  mode_ = Mode::Off;
  paused_ = 0;
  set_hook(false);
  set_value_graveyard(nullptr);
  graph_ = nullptr;
}

void PythonRunner::install_dispatch_hook() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  pthread_atfork(nullptr, nullptr, [] { PythonRunner::instance().forget_after_fork(); });
  auto* lib = new torch::Library(torch::Library::IMPL, "_", kTerraKey, __FILE__, __LINE__);
  lib->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

GraphRunner& PythonRunner::runner() {
  if (!runner_) {
    RunnerAllocator::install();
    runner_ = std::make_unique<GraphRunner>();
  }
  return *runner_;
}

const char* PythonRunner::mode_name() const {
  switch (mode_) {
    case Mode::Off: return "off";
    case Mode::Tracing: return "tracing";
    case Mode::CoExec: return "co-executing";
    case Mode::Eager: return "eager";
  }
  return "?";
}

void PythonRunner::enter(Graph* graph, PythonStack::Root root) {
  TORCH_CHECK(mode_ == Mode::Off, "Terra: co-execution is already active on this thread");
  graph_ = graph;
  graph_name_ = Timeline::instance().intern(graph->name);
  last_team_move_ns_ = 0;  // the session's first move into co-execution is never held back
  root_ = root;
  owner_ = std::this_thread::get_id();
  open_loops_.clear();
  chosen_eager_ = false;
  iteration_mode_ = previous_mode_ = Mode::Off;
  completed_ns_ = 0;
  coexec_run_ = 0;
  eager_held_ = false;  // the session starts with them in (terra/_patches.py)
  eager_run_ = 0;
  grad_defined_.clear();
  scalar_use_.clear();
  own_made_.clear();
  own_made_prune_at_ = kOwnMadePruneAt;
  last_random_item_ = random_item_iteration_ = 0;
  set_value_graveyard(&graveyard_);
  if (runner_ || policy_.program_cache) RunnerAllocator::install().activate();
  mode_ = Mode::Tracing;
  begin_iteration(kEntryBoundary);
}

void PythonRunner::set_mode(Mode mode) {
  mode_ = mode;
  // The program thread's large blocks are cached where it runs ops itself: traced, fallen-back
  // and eager iterations. While it co-executes it allocates little (placeholders have no
  // storage), and its blocks would share the cache's lock with the GraphRunner's, which
  // allocates all the time (bert, co-executed: 6.56-6.78 ms per step with them cached,
  // 6.03-6.36 without).
  RunnerAllocator::set_program_thread(policy_.program_cache && mode != Mode::CoExec && mode != Mode::Off);
}

void PythonRunner::exit() {
  if (mode_ == Mode::Off) return;
  RunnerAllocator::set_program_thread(false);  // what runs after the session allocates as eager
  end_iteration();
  if (mode_ == Mode::CoExec) catch_up();
  if (runner_ && runner_team_) take_team_back(/*always=*/true);  // Terra off: one team, the program's
  if (runner_) advance_sequence(runner_->sequence());
  mode_ = Mode::Off;
  set_hook(false);
  pool_.clear();
  live_.clear();
  live_prune_at_ = kLivePruneSlack;
  set_value_graveyard(nullptr);
  graveyard_.clear();
  if (RunnerAllocator::installed()) RunnerAllocator::install().release();  // eager work keeps none of its memory
  grad_defined_.clear();
  own_made_.clear();
  raise_warnings();
  raise_if_failed();
  graph_ = nullptr;
  root_ = {};
}

void PythonRunner::pause() {
  if (paused_++ == 0) set_hook(false);
}

void PythonRunner::resume() {
  if (paused_ > 0 && --paused_ == 0) set_hook(mode_ == Mode::Tracing || mode_ == Mode::CoExec);
}

void PythonRunner::barrier(const std::string& why, const std::string& what) {
  if (mode_ == Mode::CoExec) diverge(terra::FallbackReason::EagerCall, why, what);
}

void PythonRunner::mark(uint64_t boundary, bool helper) {
  // A loop of the program's own functions run by another thread (a logger, a prefetcher) marks
  // nothing: iterations are the session thread's, and that thread's ops are the ones traced.
  if (mode_ == Mode::Off || std::this_thread::get_id() != owner_) return;
  if (!track_loop(boundary, helper)) return;
  // A loop whose iterations issue no ops (plain Python) keeps one open iteration: crossing its
  // boundary again costs a comparison. An eager iteration's ops are not followed (`cur_` stays at
  // the root), so eager iterations are cut at every mark: counted, and timed (payoff.h).
  if (boundary == boundary_ && cur_ == root_node_ && mode_ != Mode::Eager) return;
  end_iteration();
  begin_iteration(boundary);
}

bool PythonRunner::track_loop(uint64_t boundary, bool helper) {
  // Open loops, innermost last. A loop left without its exit boundary (a return, an exception)
  // is closed when a loop around it marks again.
  auto open = [&](uint64_t id) {
    for (size_t i = open_loops_.size(); i-- > 0;)
      if (open_loops_[i].id == id) return i;
    return open_loops_.size();
  };
  const bool exit = (boundary & 1) != 0;
  const uint64_t loop = exit ? boundary ^ kLoopExit : boundary;
  const size_t at = open(loop);
  bool inside_run_loop = false;  // inside another loop of the run function (of the cell)
  for (const OpenLoop& l : open_loops_)
    if (!l.helper && l.id != loop) inside_run_loop = true;
  // Inside a loop of the run function, a loop is part of that loop's iteration when it is a
  // helper's (a function defined next to the one terra.run runs: a Trainer.fit called once from
  // main is what the program iterates, but a model's loop over its layers or time steps, called
  // inside the training loop, is part of its iteration; marked, corpus p07's RNN time loop made
  // 4-op iterations with ragged counts: 1.53x -> 1.85x eager's time, two benchmark transformers
  // 1.0x -> 1.2x) or when its iterations are a few ops each (absorbs).
  if (inside_run_loop && (helper ? at == open_loops_.size() : absorbs(loop))) {
    open_loops_.resize(std::min(at, open_loops_.size()));  // absorbed while it ran
    return false;
  }
  if (at < open_loops_.size()) {
    open_loops_.resize(exit ? at : at + 1);
  } else if (!exit) {
    open_loops_.push_back({boundary, helper});
  } else if (helper) {
    return false;  // the exit of a helper loop that was not an iteration
  }
  return true;
}

bool PythonRunner::absorbs(uint64_t loop) {
  // A loop of the run function (of the cell) nested in another one whose iterations are a few ops
  // each (a loop over the parameters: a manual SGD update, weight clipping, an EMA of the
  // weights) is part of the enclosing loop's iteration, as a helper's loop is: marked, each
  // parameter's update was an iteration of its own, with an iteration's costs on both threads
  // for two ops, and the training step between them was cut into pieces (corpus p11, p25, p26
  // co-executed 5-22% of their iterations). A loop of whole training steps (an epoch loop's
  // batches) issues far more ops per iteration and stays the iteration. Absorbed for good: the
  // iteration running when it is absorbed goes on to the enclosing loop's next boundary and adds
  // those ops to its counts. At the outermost level it is an iteration again.
  constexpr uint64_t kAbsorbAfter = 6;  // iterations seen (traced or co-executed)
  constexpr uint64_t kFewOps = 8;       // ops per iteration, at most, on average
  auto it = graph_->roots.find(loop);
  if (it == graph_->roots.end()) return false;
  Graph::Root& r = it->second;
  r.absorbed = r.absorbed || (r.iterations_seen >= kAbsorbAfter && r.ops_seen <= kFewOps * r.iterations_seen);
  return r.absorbed;
}

void PythonRunner::end_iteration() {
  returned_.reset();  // kept for the iteration's next op only
  auto& root = graph_->roots[boundary_];
  const int64_t end = now_ns();
  if (mode_ == Mode::Tracing || mode_ == Mode::CoExec) {
    ++root.iterations_seen;
    root.ops_seen += path_.empty() ? 0 : path_.size() - 1;  // the nodes followed, after the root
  }
  double seconds = static_cast<double>(end - iteration_start_ns_) * 1e-9;
  coexec_run_ = mode_ == Mode::CoExec && iteration_mode_ == Mode::CoExec ? coexec_run_ + 1 : 0;
  // Not steady: the interval coexec_seconds measures holds the GraphRunner's first co-executed
  // iteration, whose tail after a switch includes making an OpenMP team (2-13 ms on a fresh
  // thread) and usually recording a block. Later recordings stay in: a program with several paths
  // (ragged batches) records one per path, a recurring cost of co-executing it (corpus p02 was
  // held co-executed at 3.4x eager's step time when they were left out).
  const bool steady = coexec_run_ == 0 || coexec_run_ >= kCoexecRunBeforeSample;
  if (policy_.adaptive && coexec_run_ > 0) {
    seconds = coexec_seconds(seconds);
    graph_->iterations_unsteady += !steady;
  } else {
    completed_ns_ = 0;
  }
  if (mode_ != Mode::Off) {
    add_span(mode_ == Mode::CoExec ? SpanKind::CoExec
             : mode_ == Mode::Eager ? SpanKind::Eager
             : diverged_            ? SpanKind::Fallback
                                    : SpanKind::Tracing,
             iteration_start_ns_, end);
  }
  switch (mode_) {
    case Mode::Tracing:
      if (diverged_) {
        ++graph_->iterations_fallback;
      } else {
        ++graph_->iterations_traced;
      }
      root.warmup.observe(added_);
      root.unsteady = first_new_ != kNoNode && !diverged_ ? root.unsteady + 1 : 0;
      if (root.unsteady == kUnsteadyRunToExplain) explain_unsteady();
      graph_->traced_seconds += seconds;
      break;
    case Mode::CoExec:
      ++graph_->iterations_coexecuted;
      graph_->coexec_seconds += seconds;
      break;
    case Mode::Eager:
      ++graph_->iterations_eager;
      graph_->iterations_eager_chosen += chosen_eager_;
      break;
    case Mode::Off:
      break;
  }
  if (choosing_spin()) note_workers_cpu(static_cast<double>(end - iteration_start_ns_) * 1e-9);
  if (policy_.adaptive && (chosen_eager_ || iteration_mode_ == Mode::CoExec)) {
    // Clean: the whole iteration ran in one mode, and so did the one before it; a co-executed
    // one also measured the GraphRunner in its steady state (coexec_seconds).
    const bool clean = mode_ == iteration_mode_ && previous_mode_ == iteration_mode_ && steady;
    const uint32_t checks = graph_->payoff.checks();
    // While the workers' two ways alternate, co-execution is timed for the payoff check the way it
    // won (A) only: a check right after a block of a slower way B (dcgan asleep: 1.3x) would time
    // co-execution at B's times, and hold eager execution for it.
    const bool other_way = !chosen_eager_ && graph_->workers_trial == Graph::WorkersTrial::Pairing &&
                           graph_->workers_pairing.b();
    graph_->payoff.record(boundary_, chosen_eager_, clean && !other_way, seconds, policy_.payoff_margin,
                          policy_.payoff_check_budget);
    if (choosing_spin() && graph_->payoff.checks() != checks) choose_workers();
    if (choosing_spin()) pair_workers(clean, seconds);
  } else if (policy_.adaptive && mode_ == Mode::Tracing && iteration_mode_ == Mode::Tracing &&
             previous_mode_ == Mode::Tracing && !diverged_ && !added_) {
    graph_->payoff.record_traced(boundary_, seconds);  // an upper bound on eager's time
  }
  previous_mode_ = mode_;
  // The GraphRunner has every item of this iteration: it may record it as a block, or it has
  // replayed one (block_replay.h).
  if (mode_ == Mode::CoExec && runner_ && policy_.replay) runner_->issue_control(OpKind::EndIteration);
  if (mode_ == Mode::Tracing || mode_ == Mode::CoExec) graph_->record_path(path_);
  if (occurrences_.size() > 4 * graph_->nodes.size() + 4096) occurrences_.clear();  // bound it
  if (live_.size() > live_prune_at_) {
    live_.erase(std::remove_if(live_.begin(), live_.end(), [](const auto& w) { return w.expired(); }),
                live_.end());
    live_prune_at_ = 2 * live_.size() + kLivePruneSlack;
  }
  if (runner_) runner_->reclaim(/*all=*/false, &pool_);  // called from Python: the GIL is held
}

double PythonRunner::coexec_seconds(double span_seconds) {
  // A co-executed iteration is done when the GraphRunner has run its ops, not when Python has
  // issued them: the program thread may run up to kAheadHigh ops ahead, several iterations of a
  // small loop, and timed alone it made co-execution look up to 300x faster than it was (corpus
  // p26 with 1 intra-op thread: co-executed for 5.9x eager's step time). So iteration k ends,
  // for the payoff check, once the GraphRunner has also finished iteration k-1: the gaps between
  // those moments are the pipeline's throughput, and the program keeps one iteration of lead.
  wait_for(completed_seq_, "iteration end (payoff timing)");
  const int64_t done = now_ns();
  const bool follows = completed_ns_ != 0 && previous_mode_ == Mode::CoExec;
  const double seconds = follows ? static_cast<double>(done - completed_ns_) * 1e-9 : span_seconds;
  completed_ns_ = done;
  completed_seq_ = runner_ ? runner_->issued() : 0;
  return seconds;
}

void PythonRunner::begin_iteration(uint64_t boundary) {
  boundary_ = boundary;
  added_ = diverged_ = false;
  first_new_ = kNoNode;
  iteration_start_ns_ = now_ns();
  ++iteration_serial_;
  auto it = graph_->roots.find(boundary);
  if (it == graph_->roots.end()) {
    OpTemplate marker;
    marker.kind = OpKind::Marker;
    char name[40];
    snprintf(name, sizeof(name), "iteration %016llx", static_cast<unsigned long long>(boundary));
    marker.name = name;
    Graph::Root root;
    root.node = graph_->add_node(std::move(marker), terra::hash_combine(boundary, 0x17e7));
    it = graph_->roots.emplace(boundary, root).first;
    added_ = true;
  }
  const Graph::Root& root = it->second;
  cur_ = root_node_ = root.node;
  path_.clear();
  uncounted_.clear();  // counts restart with the iteration
  path_.push_back(cur_);
  ++graph_->nodes[cur_].count;
  const bool was_chosen_eager = chosen_eager_;
  chosen_eager_ = false;
  const terra::Decision decision = terra::decide(policy_, {graph_->nodes.size(), root.warmup.quiet, root.divergences});
  Mode want = decision.action == terra::Decision::Action::StayEager ? Mode::Eager
              : decision.action == terra::Decision::Action::CoExecute ? stable_mode()
                                                                       : Mode::Tracing;
  // A switch the payoff check asked for moves the OpenMP team at once, rate limit or not: eager
  // iterations timed while the GraphRunner still held a team would be timed with two teams.
  // Entering an eager hold from a traced iteration (co-execution was left earlier, the team then
  // held back by the rate limit) moves it too: otherwise the hold's eager ops ran with two teams,
  // every parallel region a futex hand-off (corpus p03: 0.6-1.6 ms per eager step against 0.56).
  // A hold has no co-executed iterations, so this cannot thrash.
  if (mode_ == Mode::CoExec && want != Mode::CoExec) {
    catch_up(/*move_team=*/chosen_eager_);
  } else if (chosen_eager_ && runner_ && runner_team_) {
    take_team_back(/*always=*/true);
  }
  // The program thread's ops go to the GraphRunner from here, and its OpenMP team goes with them
  // (at most once per kTeamMoveNs); the GraphRunner's goes when the program runs ops itself again
  // (take_team_back).
  if (want == Mode::CoExec && mode_ != Mode::CoExec) {
    // A loop's first entry moves the team whatever the rate limit (once per loop, so it cannot
    // thrash): held back, the loop's first co-executed iterations ran with two teams (corpus p03:
    // a 3-iteration setup loop co-executed once, then the training loop's first co-executed
    // iteration took 3.3 ms against 0.35 ms later).
    if (was_chosen_eager || !it->second.coexecuted || team_may_move()) release_openmp_team();
    it->second.coexecuted = true;
    if (was_chosen_eager) grad_defined_.clear();  // the eager iterations changed the gradients
    runner().set_active(true);
    runner_team_ = true;
  }
  if (want == Mode::CoExec) {
    runner().set_replay(policy_.replay, policy_.accelerator_blocks, policy_.lanes);
    runner().set_worker_nice(policy_.worker_nice);
  }
  spin_limited_ = want == Mode::CoExec && (policy_.worker_spin == terra::Policy::WorkerSpin::Sleep ||
                                           (choosing_spin() && graph_->workers_asleep));
  graph_->iterations_workers_asleep += spin_limited_;
  limit_openmp_spinning(runner_team_ && spin_limited_);
  set_mode(want);
  iteration_mode_ = mode_;
  set_hook(mode_ != Mode::Eager && paused_ == 0);
  // The pass-through entry points go back in at once when a loop is traced or co-executed (the
  // pseudo-ops must see its `.grad` reads and backwards); they come out only after a few eager
  // iterations in a row: each switch costs 50-180 µs (60 class attributes set), and an outer loop
  // running eagerly around a co-executed inner one would otherwise pay two per outer iteration.
  eager_run_ = mode_ == Mode::Eager ? eager_run_ + 1 : 0;
  const bool hold = eager_run_ > kEagerRunBeforeHold;
  if (eager_hold_switch_ && hold != eager_held_) {
    eager_held_ = hold;
    eager_hold_switch_(eager_held_);
  }
}

namespace {

// Below this share of a spinning co-executed iteration's wall time, the workers' CPU is noise
// (hf_bert's spinning worker used about one core: 10 ms of CPU per 9-12 ms step).
constexpr double kWorkersCpuShare = 0.1;

// Whether the GraphRunner's idle workers took CPU while spinning (true where not measured):
// asleep saves only that.
bool workers_took_cpu(const Graph& g) {
  return g.spinning_seconds <= 0 || g.spinning_workers_cpu >= kWorkersCpuShare * g.spinning_seconds;
}

}  // namespace

void PythonRunner::note_workers_cpu(double wall_seconds) {
  // Consecutive iterations' ends bracket each iteration; a break (an iteration not co-executed
  // with the workers spinning, no GraphRunner) starts the chain again.
  const bool measured = runner_ && mode_ == Mode::CoExec && iteration_mode_ == Mode::CoExec && !spin_limited_;
  if (!measured) {
    workers_cpu_at_ = -1.0;
    return;
  }
  bool changed = false;
  const double workers = workers_cpu_.seconds(runner_->thread_id(), changed);
  if (workers < 0 || changed) {
    workers_cpu_at_ = workers;  // another set of workers: from here on
    return;
  }
  if (workers_cpu_at_ >= 0) {
    graph_->spinning_seconds += wall_seconds;
    graph_->spinning_workers_cpu += std::max(0.0, workers - workers_cpu_at_);
  }
  workers_cpu_at_ = workers;
}

void PythonRunner::choose_workers() {
  Graph& g = *graph_;
  using Trial = Graph::WorkersTrial;
  // Asleep saves only what the spinning workers took. Where they took next to no CPU (the
  // GraphRunner's kernels ran on its thread alone) the other way is never timed: that trial cost
  // short programs its iterations and the idle pool's making and release (corpus p28: 5 more
  // co-executed iterations that lost).
  const bool other_way_may_win = g.workers_asleep || workers_took_cpu(g);
  if (g.payoff.choice_eager()) {
    // Co-execution lost with the GraphRunner's idle workers as they were (its timing phase ran
    // wholly so): its next timing tries them the other way (Graph::workers_asleep) where that
    // may win, the same way again where not.
    // Where the pairing timed both ways side by side and kept the faster, the next timing keeps
    // that way: flipped, resnet's co-execution was timed with its workers asleep after the
    // pairing had found that way 1.4x slower (24-28 ms per step against 16-20), lost to eager
    // execution by 1.8x and was held eager for 121 iterations.
    const bool paired = g.workers_pairing.verdict() != terra::PairedTrial::Verdict::Running &&
                        !g.workers_pairing.ratios().empty();  // not given up for want of clean ones
    if (g.workers_trial == Trial::Pairing) g.workers_asleep = g.workers_asleep_before;
    if (other_way_may_win && !paired) g.workers_asleep = !g.workers_asleep;
    // The first loss: time co-execution again soon, not after a hold that grows with how much
    // slower the first (warm-up) samples were (hf_llama: 18-24 of 300 steps co-executed, its
    // asleep timing late). The same way too: the first co-executed iterations after an idle
    // pause can take several times their later time (threads woken late on this VM; corpus p01
    // after bench/corpus.py's eager child process: 0.82 ms against 0.12).
    if (!g.retimed_coexec) g.payoff.recheck_within(kFirstAsleepRecheck);
    g.retimed_coexec = true;
    g.workers_trial = Trial::Done;  // a way that lost and one that did not, or both lost
    return;
  }
  if (g.workers_trial == Trial::Untried && !other_way_may_win) {
    g.workers_trial = Trial::Done;
  } else if (g.workers_trial == Trial::Untried) {
    // The first win: the two ways alternate in blocks of co-executed iterations (paired_trial.h)
    // and the faster stays. Winning does not mean the spinning workers took no core: hf_bert's
    // co-execution ran its steps at 9-12 ms with them spinning, beating eager's, and at 5.3-8 ms
    // with them asleep, the spinning worker having used 10 ms of CPU per step on two cores
    // (forced co-execution, fresh processes); in one process, alternating blocks, asleep over
    // spinning: hf_bert 0.68, hf_gpt2 0.94, but dropblock 1.49, dcgan 1.31, bert 1.29
    // (bench/results/worker_spin_interleaved.md).
    g.workers_trial = Trial::Pairing;
    g.workers_pairing = terra::PairedTrial{};
    g.workers_asleep_before = g.workers_asleep;
  }
}

void PythonRunner::pair_workers(bool clean, double seconds) {
  Graph& g = *graph_;
  // Only co-executed iterations time a way (`clean`: wholly co-executed, after one that was).
  if (g.workers_trial != Graph::WorkersTrial::Pairing || iteration_mode_ != Mode::CoExec) return;
  const auto verdict = g.workers_pairing.record(clean, seconds);
  g.workers_asleep = g.workers_pairing.b() ? !g.workers_asleep_before : g.workers_asleep_before;
  if (verdict != terra::PairedTrial::Verdict::Running) g.workers_trial = Graph::WorkersTrial::Done;
}

PythonRunner::Mode PythonRunner::stable_mode() {
  if (!policy_.adaptive || !graph_->payoff.eager()) return Mode::CoExec;
  chosen_eager_ = true;
  return Mode::Eager;
}

namespace {

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
  uint64_t base = terra::hash_combine(op_identity(kind, op), PythonStack::hash(root_, &innermost));
  if (predicted) prefetch_arg_metas(*predicted);
  // Counts restart every iteration: an entry from an earlier iteration counts as zero, so the map
  // keeps its nodes from one iteration to the next instead of being cleared and refilled.
  auto count = [&](uint64_t b) -> Occurrence& {
    Occurrence& n = occurrences_[b];
    if (n.iteration != iteration_serial_) n = Occurrence{iteration_serial_, 0};
    return n;
  };
  for (uint32_t id : uncounted_) {  // each as its own key would have counted it
    const Node& accepted = graph_->nodes[id];
    count(accepted.base).count = accepted.occurrence + 1;
  }
  uncounted_.clear();
  Occurrence& n = count(base);
  last_key_ = KeyParts{base, n.count, innermost};
  return terra::hash_combine(base, n.count++);
}

uint32_t PythonRunner::predicted_node(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const {
  if (cur_ == kNoNode) return kNoNode;
  const uint32_t next = graph_->nodes[cur_].next;
  if (next == kNoNode) return kNoNode;
  const Node& n = graph_->nodes[next];
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

void PythonRunner::on_pseudo(OpKind kind, const char* name, torch::jit::Stack* stack,
                             const Exec& exec) {
  auto excluded = [&exec](torch::jit::Stack* s) {
    c10::impl::ExcludeDispatchKeyGuard guard(kTerraKey);
    exec(s);
  };
  if (mode_ == Mode::Off || mode_ == Mode::Eager) {
    excluded(stack);
    return;
  }
  uint64_t lookup = lookup_key(kind, nullptr);
  if (mode_ == Mode::CoExec && coexec_op(kind, nullptr, name, lookup, stack, excluded)) return;
  trace_op(kind, nullptr, name, lookup, stack, excluded);
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
  if (node == kNoNode && graph_->nodes.size() >= policy_.max_nodes) {
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
    fresh.source = std::make_shared<const terra::SourceInfo>(terra::SourceInfo{fresh.name, PythonStack::describe(root_)});
    node = graph_->add_node(std::move(fresh), lookup);
    Node& made = graph_->nodes[node];
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
      other = graph_->add_node(std::move(variant), lookup);
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
        // Whether the gradient exists depends on the path the backward took: ask the GraphRunner.
        wait_for(last_external_write_, "whether .grad exists");
        raise_if_failed();
        // A backward made it without predicting it (its traced leaves are another model's):
        // seen in two iterations, that backward is traced again to learn its leaves.
        if (t.is_leaf() && t.grad().defined() && last_write_backward_ != kNoNode)
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
  if (!successor && !graph_->has_edge(cur_, node)) {
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
    ++graph_->fetches;
    catch_up();
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
    case ExecMode::Fetch:
      ++graph_->fetches;
      run_fetch(t, stack, exec);
      note_own_made(t, *stack);
      break;
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
  const Node& c = graph_->nodes[cur_];
  if (c.next != kNoNode) {
    const Node& n = graph_->nodes[c.next];
    if (n.lookup == lookup && n.tmpl.matches(stack, nullptr)) return c.next;
  }
  for (const auto& [id, taken] : c.succ) {
    const Node& n = graph_->nodes[id];
    if (id != c.next && n.lookup == lookup && n.tmpl.matches(stack, nullptr)) return id;
  }
  return kNoNode;
}

bool PythonRunner::take_edge(uint32_t node) {
  bool added = false;
  if (cur_ != kNoNode) {
    Node& from = graph_->nodes[cur_];
    added = Graph::add_edge(from, node);
    from.next = node;
  }
  cur_ = node;
  path_.push_back(node);
  Node& to = graph_->nodes[node];
  ++to.count;
  // The next op is validated against this node's last successor: its lines are cold by then on a
  // model whose step walks megabytes of activations (the template checks were 5-7% of hf_bert's
  // program thread, most of it waiting for memory). Fetched now, they arrive while Python runs
  // up to the next op.
  const uint32_t next = to.next;
  if (next == kNoNode) return added;
  const Node& n = graph_->nodes[next];
  for (const void* line : {static_cast<const void*>(&n.lookup), static_cast<const void*>(&n.tmpl),
                           static_cast<const void*>(&n.tmpl.global), static_cast<const void*>(&n.tmpl.args),
                           static_cast<const void*>(&n.tmpl.outs)})
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
        std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> reached;
        for (auto& [impl, state] : grad_defined_) {
          at::Tensor x(state.leaf.lock());
          if (!x.defined() || x.unsafeGetTensorImpl() != impl) continue;
          const at::Tensor& g = x.grad();
          state.defined = g.defined();
          auto before = grads_before_.find(impl);
          bool changed = g.defined() && (before == grads_before_.end() ||
                                         before->second.first != g.unsafeGetTensorImpl() ||
                                         before->second.second != g._version());
          if (changed) reached.push_back(state.leaf);
        }
        std::sort(reached.begin(), reached.end(), [](const auto& a, const auto& b) {
          return a._unsafe_get_target() < b._unsafe_get_target();
        });
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

void PythonRunner::issue(uint32_t node_id, const OpTemplate& t, torch::jit::Stack* stack) {
  if (t.noop_alias) {
    torch::jit::Stack returns;
    for (const OutSpec& o : t.outs) returns.push_back((*stack)[static_cast<size_t>(o.alias_arg)]);
    *stack = std::move(returns);
    return;
  }
  if (TeamRegion::is_open()) {  // a parallel region of the GraphRunner's wants this core
    const int64_t start = now_ns();
    {
      GilReleased unlocked;
      TeamRegion::wait_out();
    }
    ++graph_->yields_to_parallel_regions;
    graph_->yielded_seconds += static_cast<double>(now_ns() - start) * 1e-9;
  }
  const bool wait_done = prepare_arguments(t, stack);
  if (!own_made_.empty()) forget_own_made(t, *stack);
  GraphRunner& r = runner();
  // The fast path holds the GIL; the dispatcher route is asked (it usually runs without).
  const bool gil = fast_ || PyGILState_Check();
  dead_.check(r.lightened(), gil);  // what the program dropped since the last issue
  WorkItem* item;
  if (r.has_room()) {
    item = &r.next_item();
  } else {
    GilReleased unlocked;  // the ring is full: never wait holding the GIL
    item = &r.next_item();
  }
  const uint64_t seq = r.issued() + 1;
  if (t.draws(*stack)) {
    last_random_item_ = seq;
    random_item_iteration_ = iteration_serial_;
  }
  item->kind = t.kind;
  item->op = t.op ? &*t.op : nullptr;
  item->grad_mode = t.grad_mode;
  item->inference_mode = t.inference_mode;
  item->autocast = t.autocast;
  item->node = node_id;
  item->expect = &t.outs;
  item->sequence_floor = at::sequence_number::peek();
  item->num_threads = at::get_num_threads();  // as the program has it now (thread_state.h)
  item->iteration = iteration_serial_;
  item->graph = graph_->serial;
  item->stream = t.accelerator ? current_stream(*t.accelerator) : std::nullopt;
  item->garbage.swap(graveyard_);  // emptied by the GraphRunner: the vectors circulate

  // Record writes (so a later fetch waits for them) and which host scalars the GraphRunner uses,
  // in one pass over the arguments.
  if (t.kind == OpKind::Backward || t.kind == OpKind::GradWrite) {
    last_external_write_ = seq;
    last_write_backward_ = t.kind == OpKind::Backward ? node_id : kNoNode;
  }
  if (t.op && (t.mutates_input || t.host_scalar_args)) {
    const auto& schema_args = t.op->schema().arguments();  // looked up once: this runs per op
    for (size_t i = 0; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      const auto* info = i < schema_args.size() ? schema_args[i].alias_info() : nullptr;
      const bool writes = t.mutates_input && info && info->isWrite();
      // Host scalars inside tensor lists count too: `_foreach_add_(state_steps, 1)` writes
      // Adam's `step` tensors, which the optimizer then reads with `.item()`.
      for_each_tensor(v, [&](const at::Tensor& x) {
        if (host_scalar(x)) {
          ScalarUse& use = scalar_use_[x.storage().unsafeGetStorageImpl()];
          (writes ? use.write : use.read) = seq;
        }
        if (!writes) return;
        auto* p = as_placeholder(x);
        // The program sees the version an in-place op gives its tensor at once, as eagerly (the
        // GraphRunner's op bumps the value's counter, which the placeholder takes when filled).
        // A view of a real tensor shares no counter with it (issue's make_out).
        if (p && p->version_counter().enabled()) p->bump_version();
        if (p && p->group()) {
          p->group()->last_write = seq;
        } else {
          last_external_write_ = seq;
          last_write_backward_ = kNoNode;
        }
      });
    }
  }

  std::shared_ptr<AliasGroup> base_group;
  for (const c10::IValue& v : *stack) {
    if (v.isTensor()) {
      if (auto* p = as_placeholder(v.toTensor())) base_group = p->group();
      break;
    }
  }
  item->outs.assign(t.outs.size(), nullptr);
  // Dropped placeholders are reused with the GIL only (the C fast path): the pool works with
  // Python objects, and a node issued through the dispatcher route (the GIL released) would fill
  // it with what it never takes.
  const bool reuse = gil && t.reuses_out;
  // An ATen op's template matched the call, inference mode included: no thread-state lookup.
  const bool inference = t.kind == OpKind::Aten ? t.inference_mode : c10::InferenceMode::is_enabled();
  size_t k = 0;
  auto make_out = [&]() -> at::Tensor {
    const OutSpec& o = t.outs[k];
    size_t index = k++;
    if (o.alias_arg >= 0) return (*stack)[static_cast<size_t>(o.alias_arg)].toTensor();
    if (o.none) return at::Tensor();
    if (reuse) {  // an ATen op's new output (OpTemplate::reuses_out), with a slot of its own
      std::shared_ptr<Slot> slot;
      if (at::Tensor p = pool_.take(node_id, o.meta, inference, seq, &slot); p.defined()) {
        ++graph_->placeholders_reused;
        item->outs[index] = std::move(slot);
        return p;  // still in live_
      }
    }
    auto slot = std::allocate_shared<Slot>(PoolAllocator<Slot>());
    slot->seq = seq;
    slot->runner_allocated = t.kind == OpKind::Aten;
    std::shared_ptr<AliasGroup> group;
    if (t.kind == OpKind::Aten) group = o.view ? base_group : own_group(slot);
    // In inference mode a view of a normal tensor is a normal tensor, as eager makes it (a
    // placeholder made there would be an inference tensor, without a version counter to share).
    const bool normal_view = o.view && inference && !stack->empty() &&
                             (*stack)[0].isTensor() && !(*stack)[0].toTensor().is_inference();
    std::optional<c10::InferenceMode> not_inference;
    if (normal_view) not_inference.emplace(false);
    at::Tensor p = make_placeholder(o.meta, slot, std::move(group));
    not_inference.reset();
    // A view of a placeholder shares its version counter, as eagerly (outside inference mode).
    // Not one of a real tensor: the GraphRunner's ops bump that counter themselves.
    if (o.view && !inference && !stack->empty() && (*stack)[0].isTensor() &&
        (*stack)[0].toTensor().defined()) {
      const PlaceholderImpl* base = as_placeholder((*stack)[0].toTensor());
      if (base && base->version_counter().enabled())
        p.unsafeGetTensorImpl()->set_version_counter(base->version_counter());
    }
    if (t.indexed_view != IndexedView::None) {
      p.unsafeGetTensorImpl()->set_storage_offset(t.view_offset(*stack));
    }
    if (reuse) static_cast<PlaceholderImpl*>(p.unsafeGetTensorImpl())->set_reuse_node(node_id);
    item->outs[index] = std::move(slot);
    live_.emplace_back(p.getIntrusivePtr());
    return p;
  };
  // Buffers circulate instead of being allocated: the item takes the arguments' vector, the
  // caller's stack takes the returns' (scratch) vector, scratch takes the item's old empty one.
  torch::jit::Stack& returns = scratch_;
  returns.clear();
  for (int n : t.return_sizes) {
    if (n == -1) {
      returns.emplace_back(make_out());
    } else if (n >= 0) {
      c10::List<at::Tensor> list;
      for (int i = 0; i < n; ++i) list.push_back(make_out());
      returns.emplace_back(std::move(list));
    } else {
      ++k;
      returns.emplace_back();
    }
  }
  item->args.clear();
  item->args.swap(*stack);
  stack->swap(returns);
  dead_.watch(item->args, seq);
  r.issue(t.out_bytes);
  if (wait_done) {
    // The op writes or aliases memory the program may change itself: it runs now, and its
    // outputs are real tensors over that memory, which later ops then see as such.
    wait_for(seq, t.name);
    for (const c10::IValue& v : *stack) for_each_tensor(v, [&](const at::Tensor& x) { fill(x); });
  }
  // Drop executed items soon: their outputs die, so the allocator reuses warm memory.
  r.reclaim(/*all=*/false, gil ? &pool_ : nullptr);
  const uint64_t done = r.done();  // one load of the line the GraphRunner writes per item
  const uint64_t ahead = r.issued() - done;
  if (ahead > kAheadHigh || (ahead > 1 && r.pending_bytes(done) > kAheadBytes)) {
    // Far ahead of the GraphRunner: sleep until it has caught up halfway, leaving the cores to
    // it (and its intra-op threads) instead of competing with them for work Python cannot use yet.
    GilReleased unlocked;
    r.wait_for(r.issued() - std::min(kAheadLow, ahead / 2), /*spin=*/false);
  }
}

namespace {

// No two elements of `t` share memory (ATen's has_internal_overlap answers "too hard" for any
// tensor that is not dense): dims ordered by stride, each stride passes the span of the smaller.
bool non_overlapping(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return true;
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the largest offset the smaller dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return false;
    span += stride * (size - 1);
  }
  return true;
}

}  // namespace

bool PythonRunner::prepare_arguments(const OpTemplate& t, torch::jit::Stack* stack) {
  // Two things the GraphRunner cannot see happen to arguments outside the dispatcher, checked in
  // one pass over them:
  // - A placeholder the program made a leaf (`torch.randn(..., requires_grad=True)`; see
  //   PlaceholderImpl::born_requiring_grad) is filled now: the GraphRunner then records the op's
  //   history on the leaf itself, so its `.grad` is the one the program reads, in co-execution and
  //   after a divergence alike. Given the value, it ran the op without history (an error: the
  //   output was traced requiring grad).
  // - An argument over memory the program changes without ops (python_memory) is read as it is
  //   now: a copy goes to the GraphRunner. A written argument, one an output aliases, one in a
  //   list, one whose elements overlap (an expanded one) or a large one (a dataset from
  //   from_numpy indexed each step: a copy would be a pass over all of it per op) is not copied;
  //   the op runs before the program goes on (returns true).
  constexpr size_t kCopyBytes = size_t{1} << 20;
  bool run_now = false;
  for (size_t i = 0; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) {
        for_each_tensor(v, [&](const at::Tensor& x) { run_now = run_now || (!as_placeholder(x) && python_memory(x)); });
      }
      continue;
    }
    const at::Tensor& x = v.toTensor();
    if (const auto* p = as_placeholder(x)) {
      if (!p->born_requiring_grad() && !p->detached() && p->requires_grad()) fill(x);
      continue;
    }
    if (!python_memory(x)) continue;
    bool aliased = !t.op || alias_info(t, i);
    for (const OutSpec& o : t.outs) aliased = aliased || o.view || o.alias_arg == static_cast<int>(i);
    // The copy has the tensor's sizes and strides (as validated), over a buffer of its own: a
    // column slice of a batch too (detector_numpy_nms's box targets, `t[..., 1:3]`, made every
    // loss op wait for all the work before it).
    if (aliased || !non_overlapping(x) ||
        at::detail::computeStorageNbytes(x.sizes(), x.strides(), x.itemsize()) > kCopyBytes) {
      run_now = true;
      continue;
    }
    c10::impl::ExcludeDispatchKeyGuard below(kTerraKey);
    v = at::empty_strided(x.sizes(), x.strides(), x.options()).copy_(x);
  }
  return run_now;
}

uint64_t PythonRunner::needed_seq(const c10::IValue& v) const {
  uint64_t need = 0;
  for_each_tensor(v, [&](const at::Tensor& t) {
    if (auto* p = as_placeholder(t)) {
      need = std::max({need, p->slot()->seq, p->group() ? p->group()->last_write : last_external_write_});
    } else if (host_scalar(t)) {
      auto it = scalar_use_.find(t.storage().unsafeGetStorageImpl());
      if (it != scalar_use_.end()) need = std::max(need, it->second.write);
    } else if (!own_made(t)) {
      need = std::max(need, last_external_write_);
    }
  });
  return need;
}

bool PythonRunner::own_made(const at::Tensor& x) const {
  if (own_made_.empty() || !x.defined() || as_placeholder(x)) return false;
  const c10::StorageImpl* s = x.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  return s && own_made_.count(s) != 0;
}

void PythonRunner::note_own_made(const OpTemplate& t, const torch::jit::Stack& returns, bool inputs_own_made) {
  if (mode_ != Mode::CoExec) return;
  if (own_made_.size() > own_made_prune_at_) {
    for (auto pos = own_made_.begin(); pos != own_made_.end();)
      pos = pos->second.expired() ? own_made_.erase(pos) : std::next(pos);
    own_made_prune_at_ = std::max(kOwnMadePruneAt, 2 * own_made_.size());
  }
  size_t k = 0;
  for (const c10::IValue& r : returns) {
    for_each_tensor(r, [&](const at::Tensor& x) {
      const size_t index = k++;
      // An output that may alias an argument is new memory only where every tensor argument was
      // own-made (an alias of one then shares its storage, already noted).
      if (!inputs_own_made && index < t.outs.size() && (t.outs[index].view || t.outs[index].alias_arg >= 0))
        return;
      if (!x.defined() || as_placeholder(x) || !x.device().is_cpu() || x.is_sparse()) return;
      const c10::Storage& storage = x.unsafeGetTensorImpl()->unsafe_storage();
      if (!storage) return;
      own_made_.try_emplace(storage.unsafeGetStorageImpl(),
                            c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()));
    });
    if (r.isNone()) ++k;
  }
}

void PythonRunner::forget_own_made(const OpTemplate& t, const torch::jit::Stack& args) {
  if (!t.mutates_input && !t.aliases_args && t.op && t.kind == OpKind::Aten) return;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& x) {
      if (!x.defined() || as_placeholder(x)) return;
      own_made_.erase(x.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
    });
  }
}

bool PythonRunner::run_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  if (!t.host_candidate || (own_made_.empty() && !t.random)) return false;
  bool here = true;
  for (const c10::IValue& v : *stack) {
    if (v.isGenerator()) return false;
    for_each_tensor(v, [&](const at::Tensor& x) {
      if (!here || !x.defined() || x.unsafeGetTensorImpl()->is_wrapped_number()) return;
      // Inputs as small as the outputs: below ATen's grain size, so no parallel region starts
      // in the program thread while the GraphRunner may hold the OpenMP team (openmp_team.h).
      here = own_made(x) && !x.requires_grad() && x.device().is_cpu() && x.nbytes() <= OpTemplate::kHostOpBytes;
    });
    if (!here) return false;
  }
  // The default generator is drawn in program order: a random op runs here after every random
  // item issued before it has run, so only where waiting for them leaves the GraphRunner work:
  // none issued in this iteration yet, and at least kRandomLead items issued after the last one
  // (a step's first draw waits for the previous step's last dropout while its backward and update
  // are queued). Waiting for a random item near the end of the queue cost more than it saved
  // (corpus p32: 30 waits of 3.5 ms at a small randn, for a large one at the previous step's end).
  // Item counts, not times: which ops run here depends on the program alone (block replay needs
  // a step's items to be the same from step to step).
  if (t.random && last_random_item_ != 0) {
    if (random_item_iteration_ == iteration_serial_ || runner().issued() - last_random_item_ < kRandomLead)
      return false;
    wait_for(last_random_item_, t.name);
    raise_if_failed();
  }
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  note_own_made(t, *stack, /*inputs_own_made=*/true);
  return true;
}

bool PythonRunner::run_view_here(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  if (t.mutates_input || t.random || t.outs.empty()) return false;
  for (const OutSpec& o : t.outs)
    if (!o.view) return false;
  bool python = false;
  for (const c10::IValue& v : *stack) {
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) return false;
      continue;
    }
    const at::Tensor& x = v.toTensor();
    // Without autograd history: the view's own (an autograd view node) would be made here.
    if (!x.defined() || as_placeholder(x) || x.requires_grad() || !x.device().is_cpu()) return false;
    python = python || python_memory(x);
  }
  if (!python) return false;
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  return true;
}

bool PythonRunner::run_on_host(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  const auto& schema_args = t.op->schema().arguments();
  uint64_t need = 0;
  bool any = false;
  for (size_t i = 0; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) {
      if (v.isTensorList() || v.isList()) return false;
      continue;
    }
    const at::Tensor& x = v.toTensor();
    if (x.unsafeGetTensorImpl()->is_wrapped_number()) continue;
    if (!host_scalar(x)) return false;
    any = true;
    auto it = scalar_use_.find(x.storage().unsafeGetStorageImpl());
    const auto* info = i < schema_args.size() ? schema_args[i].alias_info() : nullptr;
    if (info && info->isWrite() && it != scalar_use_.end()) return false;  // the runner uses it
    if (it != scalar_use_.end()) need = std::max(need, it->second.write);
  }
  if (!any) return false;
  wait_for(need, t.name);
  if (runner_) advance_sequence(runner_->sequence());
  exec(stack);
  return true;
}

void PythonRunner::run_fetch(const OpTemplate& t, torch::jit::Stack* stack, const Exec& exec) {
  // What the op reads must have been computed; what it changes in place must no longer be read
  // by a pending item: only a tensor the program alone holds is known not to be.
  uint64_t need = 0;
  bool writes_shared = false;
  for (size_t i = 0; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && program_only(v.toTensor(), *stack, is_returned(v.toTensor()))) continue;
    need = std::max(need, needed_seq(v));
    const auto* info = alias_info(t, i);
    writes_shared = writes_shared || !t.op || (info && info->isWrite());
  }
  if (t.mutates_input && writes_shared) need = runner().issued();
  wait_for(need, t.name);
  raise_if_failed();
  for (c10::IValue& v : *stack) v = resolve_placeholders(v);
  advance_sequence(runner().sequence());
  exec(stack);
}

void PythonRunner::wait_for(uint64_t seq, std::string_view what) {
  if (!runner_ || runner_->done() >= seq) return;
  const int64_t start = now_ns();
  {
    GilReleased unlocked;
    runner_->wait_for(seq);
  }
  if (mode_ == Mode::CoExec && graph_) add_span(SpanKind::FetchWait, start, now_ns(), std::string(what));
}

void PythonRunner::note_fallback(terra::FallbackReason reason, std::string detail, const std::string& op) {
  auto source = std::make_shared<const terra::SourceInfo>(terra::SourceInfo{op, PythonStack::describe(root_)});
  graph_->fallbacks.record(reason, std::move(detail), std::move(source), cur_);
}

void PythonRunner::explain_unsteady() {
  // Tracing goes on (a program with many paths may still cover them all), but the user learns
  // why the loop is not co-executed, at the op that keeps changing. A loop that becomes steady
  // and then not again (entered anew, going further) has one entry, counted, with the latest
  // detail.
  const OpTemplate& t = graph_->nodes[first_new_].tmpl;
  graph_->fallbacks.record(terra::FallbackReason::NeverSteady,
                           std::to_string(kUnsteadyRunToExplain) + " in a row; the last one's first: " +
                               (first_new_why_.empty() ? std::string("a new op at this point of the program")
                                                       : first_new_why_),
                           t.source);
}

void PythonRunner::opaque_begin(const std::string& why, const std::string& what) {
  if (mode_ == Mode::CoExec) {
    note_fallback(terra::FallbackReason::EagerCall, why, what);
    ++graph_->fetches;
    catch_up();
    raise_if_failed();
  }
  pause();
}

void PythonRunner::opaque_end() { resume(); }

void PythonRunner::diverge(terra::FallbackReason reason, std::string detail, const std::string& op, bool new_path) {
  std::string span = op + ": " + terra::describe(reason, detail);
  note_fallback(reason, std::move(detail), op);
  auto& root = graph_->roots[boundary_];
  if (new_path) {
    ++root.divergences;
    root.warmup.quiet = 0;
  }
  const int64_t start = now_ns();
  set_mode(Mode::Tracing);  // before the wait, so it is not also counted as a fetch
  catch_up();
  diverged_ = true;
  add_span(SpanKind::Diverge, start, now_ns(), std::move(span));
}

void PythonRunner::add_span(SpanKind kind, int64_t start, int64_t end, std::string detail) {
  Span span;
  span.kind = kind;
  span.start_ns = start;
  span.end_ns = end;
  span.iteration = iteration_serial_;
  span.boundary = boundary_;
  span.graph = graph_name_;
  if (!detail.empty()) span.detail = Timeline::instance().note(std::move(detail));
  Timeline::instance().add(span);
}

void PythonRunner::clear_autocast_cache() {
  if (mode_ == Mode::CoExec && runner_) {
    GilReleased unlocked;  // the ring may be full
    runner_->issue_control(OpKind::ClearAutocastCache);
  }
  at::autocast::clear_cache();
}

bool PythonRunner::team_may_move() {
  const int64_t now = now_ns();
  if (now - last_team_move_ns_ < kTeamMoveNs) return false;
  last_team_move_ns_ = now;
  return true;
}

void PythonRunner::take_team_back(bool always) {
  runner_->set_active(false);
  // Without moving the team, the GraphRunner's autocast cache is still dropped: the program runs
  // ops itself now (thread_state.h).
  const bool move = runner_team_ && (always || team_may_move());
  uint64_t seq;
  {
    GilReleased unlocked;  // the ring may be full
    seq = runner_->issue_control(move ? OpKind::ReleaseTeam : OpKind::ClearAutocastCache);
  }
  if (move) {
    runner_team_ = false;
    limit_openmp_spinning(false);  // released meanwhile, by the limiter's thread
  }
  wait_for(seq, "the OpenMP team's move");
  if (move) settle_openmp_spinning();
}

void PythonRunner::catch_up(bool move_team) {
  if (!runner_) return;
  take_team_back(move_team);  // waits for everything issued before it, too
  materialize_all();
  runner_->reclaim(/*all=*/true);
  advance_sequence(runner_->sequence());  // the program continues eagerly from here
}

void PythonRunner::materialize_all() {
  pool_.clear();  // a dropped placeholder needs no value
  for (auto& weak : live_) {
    at::Tensor t(weak.lock());
    if (t.defined()) fill(t);
  }
  live_.clear();
}

void PythonRunner::fill(const at::Tensor& t) {
  auto* p = as_placeholder(t);
  if (!p) return;
  wait_for(needed_seq(t), "a tensor's value");
  if (!p->slot()->value.defined()) return;  // never computed (the GraphRunner failed)
  p->become(placeholder_value(*p));
}

void PythonRunner::materialize(PyObject* obj) {
  if (!THPVariable_Check(obj)) return;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (as_placeholder(t)) {
    fill(t);
  } else {
    wait_for(needed_seq(t), "a tensor's value");  // a real tensor (a parameter, say) may have writes in flight
  }
  raise_if_failed();
}

bool PythonRunner::python_memory(const at::Tensor& x) const {  // x: not a placeholder
  if (from_blob(x)) return true;
  if (exposed_.empty() || !x.defined() || !x.has_storage()) return false;
  auto it = exposed_.find(x.storage().unsafeGetStorageImpl());
  return it != exposed_.end() && it->second.storage.lock().get() == it->first;
}

uintptr_t PythonRunner::expose(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.device().is_cpu() || as_placeholder(t)) return 0;
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto it = exposed_.find(impl);
  if (it != exposed_.end() && it->second.storage.lock().get() != impl) {
    exposed_.erase(it);  // a dead storage's address, reused
    it = exposed_.end();
  }
  if (it == exposed_.end()) it = exposed_.emplace(impl, Exposed{t.storage().getWeakStorageImpl(), 0}).first;
  ++it->second.arrays;
  return reinterpret_cast<uintptr_t>(impl);
}

void PythonRunner::unexpose(uintptr_t key) {
  auto it = exposed_.find(reinterpret_cast<const c10::StorageImpl*>(key));
  if (it != exposed_.end() && --it->second.arrays <= 0) exposed_.erase(it);
}

void PythonRunner::sync() {
  if (!runner_) return;
  wait_for(runner_->issued(), "sync");
  raise_warnings();
  raise_if_failed();
}

void PythonRunner::raise_warnings() {
  if (!runner_ || !runner_->has_warnings()) return;
  const std::vector<RunnerWarning> warnings = runner_->take_warnings();
  // The op's later iterations run it here, after what it reads (a fetch), so its warnings come
  // from its own call, where eager execution raises them. A warning raised on the GraphRunner is
  // one that recurs: a once-per-process one (TORCH_WARN_ONCE) was raised by the first, traced call.
  for (const RunnerWarning& w : warnings) {
    if (!graph_ || w.graph != graph_->serial || w.node >= graph_->nodes.size()) continue;
    OpTemplate& t = graph_->nodes[w.node].tmpl;
    if (t.kind != OpKind::Aten || t.mode != ExecMode::Graph) continue;
    t.mode = ExecMode::Fetch;
    // In `%terra explain` (terra.explain()): why this op now waits for the GraphRunner.
    graph_->fallbacks.record(terra::FallbackReason::Warning, {}, t.source, w.node);
  }
  // Raised as Python warnings (or errors, as the filters say) when the handler goes.
  torch::PyWarningHandler handler;
  for (const RunnerWarning& w : warnings) c10::warn(w.warning);
}

void PythonRunner::raise_if_failed() {
  if (!runner_ || !runner_->failed()) return;
  wait_for(runner_->issued(), "an error");
  RunnerError e = runner_->take_error();
  std::string at = e.node < (graph_ ? graph_->nodes.size() : 0) ? where(graph_->nodes[e.node], file_label_) : "an op";
  if (mode_ == Mode::CoExec) {
    take_team_back();  // the program goes on eagerly
    materialize_all();
    set_mode(Mode::Tracing);
    diverged_ = true;
  }
  raise(e, at);
}

}  // namespace terra::runtime
