// PythonRunner: the program thread's side of co-execution (python_runner.h). This file holds its
// life (the dispatch hook, entering and leaving a graph, modes), fallbacks, waiting for the
// GraphRunner and its errors; the stages of an op and an iteration live beside it:
// python_runner_loops.cpp (iteration boundaries, the mode each iteration runs in),
// python_runner_ops.cpp (interception, tracing, validation), python_runner_grads.cpp (`.grad`
// presence), python_runner_issue.cpp (work items, host scalars, fetches).
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

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  PythonRunner::instance().on_aten(op, ks, stack);
}

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
std::string where(const RuntimeNode& n, const PythonRunner::FileLabel& label) {
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
  graph_->payoff.session_started();
  graph_name_ = Timeline::instance().intern(graph->name);
  last_team_move_ns_ = 0;  // the session's first move into co-execution is never held back
  root_ = root;
  owner_ = std::this_thread::get_id();
  open_loops_.clear();
  unmarked_loop_ = false;
  run_backwards_at_ = backwards_;
  chosen_eager_ = false;
  iteration_mode_ = previous_mode_ = Mode::Off;
  completed_ns_ = 0;
  coexec_run_ = 0;
  eager_held_ = false;  // the session starts with them in (terra/_patches.py)
  eager_run_ = 0;
  grad_defined_.clear();
  last_backward_ = previous_backward_ = 0;  // the last session's have run (exit catches up)
  python_memory_saved_ = false;
  python_copies_.clear();
  last_backward_node_ = kNoNode;           // a node of that session's graph
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

void PythonRunner::settings_changed() {
  if (mode_ != Mode::Off || policy_.program_cache) return;  // a session sets its thread per iteration
  RunnerAllocator::set_program_thread(false);
  if (RunnerAllocator::installed()) RunnerAllocator::install().release();
}

void PythonRunner::exit() {
  if (mode_ == Mode::Off) return;
  // Eager work after the session keeps taking its large blocks from the cache (runner_allocator.h:
  // freeing them made its steps fault 2-3x as many pages as before the session).
  RunnerAllocator::set_program_thread(policy_.program_cache);
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
  if (RunnerAllocator::installed()) {
    RunnerAllocator& allocator = RunnerAllocator::install();
    if (policy_.program_cache) {
      allocator.idle();  // only what the program thread takes, up to kIdleCachedBytes
    } else {
      allocator.release();
    }
  }
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

void PythonRunner::opaque_begin(const std::string& why, const std::string& what) {
  if (mode_ == Mode::CoExec) {
    note_fallback(terra::FallbackReason::EagerCall, why, what);
    ++graph_->fetches;
    catch_up();
    raise_if_failed();
  }
  pause();
}

void PythonRunner::opaque_end() {
  resume();
  if (mode_ == Mode::CoExec && paused_ == 0) resume_coexecution();
}

void PythonRunner::resume_coexecution() {
  // The program ran ops itself inside a co-executed iteration (an opaque region, a backward that
  // runs Python) and may have taken the OpenMP team back (catch_up, which also let the
  // GraphRunner sleep when idle): co-executing again, the GraphRunner spins for work and may
  // make a pool of its own, which leaving co-execution must release (take_team_back moves only a
  // team the GraphRunner is marked to hold). Unmarked, it stayed: the loop's eager iterations,
  // once the payoff check held them, ran with two pools, every parallel region a futex hand-off
  // (a custom autograd.Function each step: 2.8-3.0 ms per step against eager's 1.3-1.6, the
  // payoff check misled into co-executing by those eager times; a tensor hook each step kept the
  // GraphRunner's worker too; session 53). The program thread keeps its own pool: giving it up
  // after each region made the next region make one anew (forced co-execution 2.9-3.2 -> 3.8-4.0
  // ms per step).
  if (!runner_) return;
  runner_->set_active(true);
  runner_team_ = true;
}

void PythonRunner::drop_graphs(const std::optional<std::string>& name) {
  TORCH_CHECK(!active(), "Terra: cannot reset graphs while co-execution is active");
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (name && it->first != *name) {
      ++it;
      continue;
    }
    if (runner_) runner_->issue_control(OpKind::DropGraph, it->second->serial);
    it = graphs_.erase(it);
  }
}

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
  // A tensor subclass with a __torch_dispatch__ (a FakeTensor that torch.compile's tracing makes
  // through `_make_subclass`, its attributes not yet set) is no placeholder and none of its ops
  // were issued: asking for its writes in flight dispatched to it half-made (session 52).
  if (t.key_set().has(c10::DispatchKey::Python)) return;
  if (as_placeholder(t)) {
    fill(t);
  } else {
    wait_for(needed_seq(t), "a tensor's value");  // a real tensor (a parameter, say) may have writes in flight
  }
  raise_if_failed();
}

void PythonRunner::await_writes(const at::Tensor& t) {
  if (!t.defined()) return;
  if (const PlaceholderImpl* p = as_placeholder(t)) {
    // Without an alias group it is a view of an ordinary tensor (or a gradient): its counter is
    // that tensor's, which the GraphRunner's ops bump; filled, the placeholder shares it.
    if (!p->group()) fill(t);
  } else {
    wait_for(needed_seq(t), "a tensor's version");
  }
  raise_if_failed();
}

void PythonRunner::fill_history(const at::Tensor& t) {
  if (!t.defined() || !as_placeholder(t)) return;
  fill(t);
  raise_if_failed();
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
