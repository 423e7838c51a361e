// PythonRunner, iterations: loop marks and iteration boundaries, the mode each iteration runs in
// (traced, co-executed or eager: terra::decide and the payoff check), and the way the
// GraphRunner's OpenMP workers wait while co-executing.
#include "python_runner.h"

#include "backward_hooks.h"
#include "openmp_team.h"
#include "payoff_memory.h"
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
#include <cstring>
#include <thread>

#include <pthread.h>

#include "python_runner_parts.h"

namespace terra::runtime {

using namespace runner_parts;

namespace {

// A loop's exit boundary is its id XOR this (terra/_loops.py: EXIT). Loop ids are even and EXIT is
// odd, so an odd boundary is a loop's exit.
constexpr uint64_t kLoopExit = 0x5A5A000000000001ULL;

// Eager iterations after co-execution first lost with the GraphRunner's idle workers spinning,
// before it is timed with them asleep (Graph::workers_asleep, PythonRunner::choose_workers).
constexpr int64_t kFirstAsleepRecheck = 8;

// Below this share of a spinning co-executed iteration's wall time, the workers' CPU is noise
// (hf_bert's spinning worker used about one core: 10 ms of CPU per 9-12 ms step).
constexpr double kWorkersCpuShare = 0.1;

// Co-executed iterations within which a graph's recorded blocks may choose its workers asleep
// (PythonRunner::choose_first_workers).
constexpr uint64_t kFirstWorkersLook = 16;

// Whether the GraphRunner's idle workers took CPU while spinning (true where not measured):
// asleep saves only that.
bool workers_took_cpu(const Graph& g) {
  return g.spinning_seconds <= 0 || g.spinning_workers_cpu >= kWorkersCpuShare * g.spinning_seconds;
}

}  // namespace

void PythonRunner::mark(uint64_t boundary, bool helper) {
  // A loop of the program's own functions run by another thread (a logger, a prefetcher) marks
  // nothing: iterations are the session thread's, and that thread's ops are the ones traced.
  if (mode_ == Mode::Off || std::this_thread::get_id() != owner_) return;
  if (!track_loop(boundary, helper)) return;
  if (!helper) run_backwards_at_ = backwards_;
  cut_iteration(boundary);
}

void PythonRunner::cut_iteration(uint64_t boundary) {
  // A loop whose iterations issue no ops (plain Python) keeps one open iteration: crossing its
  // boundary again costs a comparison. An eager iteration's ops are not followed (`cur_` stays at
  // the root), so eager iterations are cut at every mark: counted, and timed (payoff.h).
  if (boundary == boundary_ && cur_ == root_node_ && mode_ != Mode::Eager) return;
  end_iteration();
  begin_iteration(boundary);
}

void PythonRunner::after_backward() {
  // A training loop that no AST pass marks (a library's Trainer.train, a loop in a module of
  // its own, a comprehension) ran as one iteration: every step one more stretch of one trace,
  // traced whole and co-executed only if it ended, past Policy::max_nodes never. Its backwards
  // repeat: where no marked loop is open, the second backward since the run function's last
  // boundary finds it, and from then on each backward ends an iteration (kBackwardBoundary: its
  // root). An iteration is then one step's optimizer update and the next step's forward and
  // backward. (Not since the iteration's start: a model's loop over its layers, defined in a
  // cell, counts as a loop where none of the run function is open, and its iterations would have
  // kept that count at 0; once the unmarked loop is found a helper's loops are inside it,
  // track_loop.) Inside a marked loop (an epoch loop calling an imported module's
  // train_one_epoch) the iteration must have run kInLoopBackwards first: a GAN's step runs two,
  // and its loop's iterations stay whole.
  constexpr uint64_t kInLoopBackwards = 4;
  if (mode_ == Mode::Off || std::this_thread::get_id() != owner_ || backward_depth_ > 0) return;
  if (!unmarked_loop_) {
    const bool in_loop = !open_loops_.empty();
    if (backwards_ - (in_loop ? iteration_backwards_ : run_backwards_at_) < (in_loop ? kInLoopBackwards : 2)) return;
    unmarked_loop_ = true;
  }
  ++graph_->iterations_cut_at_backward;
  cut_iteration(kBackwardBoundary);
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
  // Inside another loop of the run function (of the cell), or a training loop no pass marks.
  bool inside_run_loop = unmarked_loop_;
  for (const OpenLoop& l : open_loops_)
    if (!l.helper && l.id != loop) inside_run_loop = true;
  // Inside a loop of the run function, a loop is part of that loop's iteration when it is a
  // helper's (a function defined next to the one terra.run runs: a Trainer.fit called once from
  // main is what the program iterates, but a model's loop over its layers or time steps, called
  // inside the training loop, is part of its iteration; marked, corpus p07's RNN time loop made
  // 4-op iterations with ragged counts: 1.53x -> 1.85x eager's time, two benchmark transformers
  // 1.0x -> 1.2x) unless its iterations are training steps (training_steps), or when its
  // iterations are a few ops each (absorbs).
  if (inside_run_loop && (helper ? at == open_loops_.size() && !training_steps(loop, exit) : absorbs(loop))) {
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

bool PythonRunner::training_steps(uint64_t loop, bool exit) {
  // A notebook's epoch loop calling a function of an earlier cell that loops over the batches
  // (`for epoch in range(E): train_one_epoch(...)`), a run function's loop calling its file's:
  // the helper's loop is the training loop, and as part of the epoch's iteration each epoch was
  // one trace of every step, traced whole at least twice before co-executing (the quick-start
  // notebook's three timed 300-step runs: 28,000 nodes, 4 traced, 0.71x eager's speed), and past
  // Policy::max_nodes never co-executed. A model's loop over its layers runs no backward inside
  // an iteration; a loop of training steps runs one in each. Decided after kStepsAfter completed
  // iterations, for good; from then on each of its iterations is one.
  constexpr uint64_t kStepsAfter = 3;
  Graph::HelperLoop& h = graph_->helper_loops[loop];
  if (h.steps < 0) {
    if (h.open) {  // its iteration ended here: its next one's mark, or its exit
      ++h.iterations;
      h.with_backward += backwards_ != h.backwards_at;
    }
    h.open = !exit;
    h.backwards_at = backwards_;
    if (h.iterations >= kStepsAfter) {
      h.steps = h.with_backward == h.iterations ? 1 : 0;
      graph_->helper_step_loops += h.steps;
    }
  }
  return h.steps == 1;
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
  const bool settling = coexec_run_ > 0 && coexec_run_ < kCoexecRunBeforeSample;
  bool steady = !settling;
  if (policy_.adaptive && coexec_run_ > 0) {
    seconds = coexec_seconds(seconds);
    // Nor is one whose interval held the recording of a path this loop had never taken (the
    // interval ends once the GraphRunner finished the previous iteration; its recording may be
    // known one iteration later): a program with a few paths records each once, and its first
    // checks, timing those recordings, held rnn_lengths (17 lengths) eager for good in 2 of 3
    // processes (0.98 of eager's step against 0.76 co-executed).
    const uint64_t recorded = runner_ ? runner_->new_path_iteration() : 0;
    if (recorded != 0 && recorded + 1 >= iteration_serial_) steady = false;  // k-2, k-1 or k
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
    const bool was_pairing = graph_->payoff.phase() == terra::Payoff::Phase::Pairing;
    const size_t pairs = graph_->payoff.pairs().size();
    // While the workers' two ways alternate, co-execution is timed for the payoff check the way it
    // won (A) only: a check right after a block of a slower way B (dcgan asleep: 1.3x) would time
    // co-execution at B's times, and hold eager execution for it.
    const bool other_way = !chosen_eager_ && graph_->workers_trial == Graph::WorkersTrial::Pairing &&
                           graph_->workers_pairing.b();
    // Unclean for what co-executing costs (it fell back, or recorded a new path), not for the
    // switch into co-execution (the first iterations after another mode) or another way on purpose.
    const bool switching = previous_mode_ != iteration_mode_ || settling;
    graph_->payoff.record(boundary_, chosen_eager_, clean && !other_way, seconds, policy_.payoff_margin,
                          policy_.payoff_check_budget, /*costs_coexec=*/!clean && !other_way && !switching);
    const auto trial = graph_->workers_trial;
    if (choosing_spin() && graph_->payoff.checks() != checks) choose_workers();
    if (choosing_spin()) pair_workers(clean, seconds);
    // Kept after each check, each change of the workers' way and each pair a pairing completes
    // (or its start): a process may end before the pairing decides.
    const bool pairing = graph_->payoff.phase() == terra::Payoff::Phase::Pairing;
    if (graph_->payoff.checks() != checks || graph_->workers_trial != trial ||
        (pairing && (!was_pairing || graph_->payoff.pairs().size() != pairs)))
      store_payoff_choice();
  } else if (policy_.adaptive && mode_ == Mode::Tracing && iteration_mode_ == Mode::Tracing &&
             previous_mode_ == Mode::Tracing && !diverged_ && !added_) {
    graph_->payoff.record_traced(boundary_, seconds);  // an upper bound on eager's time
  }
  previous_mode_ = mode_;
  // The GraphRunner has every item of this iteration: it may record it as a block, or it has
  // replayed one (block_replay.h).
  if (mode_ == Mode::CoExec && runner_ && policy_.replay) runner_->issue_control(OpKind::EndIteration);
  // A loop's first traced iteration (not the stretch before a loop, nor after one: odd boundaries)
  // says which ops the graph's payoff check will time.
  if (policy_.adaptive && !graph_->payoff_recalled && mode_ == Mode::Tracing && (boundary_ & 1) == 0)
    recall_payoff(path_);
  if (policy_.adaptive && mode_ == Mode::Tracing) hold_eager_if_backward_runs_python();
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
  iteration_backwards_ = backwards_;
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
    root.node = graph_->add_node(std::move(marker), terra::hash_combine(boundary, 0x17e7),
                                 terra::LocationKey{op_identity(OpKind::Marker, nullptr), boundary, 0});
    it = graph_->roots.emplace(boundary, root).first;
    added_ = true;
  }
  const Graph::Root& root = it->second;
  cur_ = root_node_ = root.node;
  path_.clear();
  uncounted_.clear();  // counts restart with the iteration
  path_.push_back(cur_);
  // Every iteration start is counted (the marker's count is how often the loop ran, eager
  // iterations included); only traced and co-executed iterations end a path (record_path).
  graph_->trace.take(terra::kEntryNode, cur_);
  const bool was_chosen_eager = chosen_eager_;
  chosen_eager_ = false;
  const terra::Decision decision = terra::decide(policy_, {graph_->op_nodes(), root.warmup.quiet, root.divergences});
  Mode want = decision.action == terra::Decision::Action::StayEager ? Mode::Eager
              : decision.action == terra::Decision::Action::CoExecute ? stable_mode()
                                                                       : Mode::Tracing;
  // An earlier run's eager choice holds from the loop's second iteration: tracing the rest of its
  // warm-up would cost what the choice saves (rl_cartpole traced 11 iterations of ragged episodes
  // before its first stable one, at twice eager's time each). The graph is traced once the hold
  // ends and co-execution is timed again. So does the eager block of a pairing taken up from an
  // earlier run: its iterations are timed as they run.
  if (want == Mode::Tracing && policy_.adaptive && remembered_eager()) {
    chosen_eager_ = true;
    want = Mode::Eager;
  }
  // A switch the payoff check asked for moves the OpenMP team at once, rate limit or not: eager
  // iterations timed while the GraphRunner still held a team would be timed with two teams.
  // Entering an eager hold from a traced iteration (co-execution was left earlier, the team then
  // held back by the rate limit) moves it too: otherwise the hold's eager ops ran with two teams,
  // every parallel region a futex hand-off (corpus p03: 0.6-1.6 ms per eager step against 0.56).
  // A hold has no co-executed iterations, so this cannot thrash. So does a loop that stays eager
  // for good (the divergence or node cap): its eager steps ran with two teams to the end
  // (stochastic_downsampling after its eighth divergence: 10.6 ms per eager step against 3.5).
  // A traced iteration takes the team back too, once the rate limit allows: held back at a
  // divergence (the move into co-execution was less than kTeamMoveNs before), it stayed with the
  // GraphRunner through every traced iteration up to the next co-executed one (rnn_lengths, a
  // new sequence length diverging: traced iterations of 12-23 ms against 3-4 with one team).
  const bool take_team = want != Mode::CoExec && runner_ && runner_team_ &&
                         (want == Mode::Eager || team_may_move());
  if (mode_ == Mode::CoExec && want != Mode::CoExec) {
    catch_up(/*move_team=*/take_team);
  } else if (take_team) {
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
  if (want == Mode::CoExec && choosing_spin()) choose_first_workers();
  // Until the blocks have chosen, a co-executed iteration right after traced ones (the one that
  // records a new path's block, running its kernels with the program's count where their bits
  // may need it) runs with the workers asleep too: a pool the GraphRunner makes then would
  // otherwise stall it (openmp_team.h) and its worker spin beside the program.
  const bool recording = !graph_->first_workers_chosen && previous_mode_ == Mode::Tracing;
  spin_limited_ = want == Mode::CoExec && (policy_.worker_spin == terra::Policy::WorkerSpin::Sleep ||
                                           (choosing_spin() && (graph_->workers_asleep || recording)));
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
  // Iterations cut at each backward need the backward pseudo-op to end them: its pass-through
  // stays in (about 8 us per backward).
  const bool hold = eager_run_ > kEagerRunBeforeHold && boundary_ != kBackwardBoundary;
  if (eager_hold_switch_ && hold != eager_held_) {
    eager_held_ = hold;
    eager_hold_switch_(eager_held_);
  }
}

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
  const bool other_way_may_win = !g.asleep_by_blocks && (g.workers_asleep || workers_took_cpu(g));
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

void PythonRunner::choose_first_workers() {
  Graph& g = *graph_;
  if (g.first_workers_chosen) return;
  if (g.workers_trial != Graph::WorkersTrial::Untried || g.payoff.checks() > 0 ||
      g.iterations_coexecuted >= kFirstWorkersLook) {
    g.first_workers_chosen = true;
    return;
  }
  // The blocks recorded so far: a loop's first block can be an inner loop's, with no parallel
  // kernel, and the training step's come later.
  const GraphRunner::ReplayCounts c = runner().replay_counts(g.serial);
  if (c.parallel_large > 0) {
    g.first_workers_chosen = true;  // spinning first, as ever
  } else if (c.parallel_small > 0) {
    g.first_workers_chosen = g.workers_asleep = g.asleep_by_blocks = true;
    g.workers_trial = Graph::WorkersTrial::Done;  // the other way is not tried
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

void PythonRunner::hold_eager_if_backward_runs_python() {
  terra::Payoff& p = graph_->payoff;
  if (p.checks() != 0 || p.remembered() || p.phase() != terra::Payoff::Phase::MeasureCoExec) return;
  for (uint32_t id : path_) {
    const OpTemplate& t = graph_->nodes[id].tmpl;
    if (t.kind == OpKind::Backward && t.runs_python) {
      p.hold_eager_first(terra::Payoff::kPythonBackwardHold);
      return;
    }
  }
}

PythonRunner::Mode PythonRunner::stable_mode() {
  if (!policy_.adaptive || !graph_->payoff.eager()) return Mode::CoExec;
  chosen_eager_ = true;
  return Mode::Eager;
}

void PythonRunner::recall_payoff(const std::vector<uint32_t>& path) {
  Graph& g = *graph_;
  g.payoff_recalled = true;
  if (!policy_.remember_payoff) return;
  g.payoff_key = payoff_key(path);
  const auto choice = PayoffMemory::process().find(g.payoff_key);
  if (!choice) return;
  if (choice->chosen) g.payoff.resume(choice->eager, choice->coexec_s, choice->eager_s, choice->hold);
  // A pairing that run's process ended in goes on here.
  if (choice->pairing) g.payoff.resume_pairing(choice->pairs, policy_.payoff_margin, policy_.payoff_check_budget);
  g.workers_asleep = choice->workers_asleep;
  g.first_workers_chosen = true;
  g.retimed_coexec = choice->retimed_coexec;
  if (choice->workers_settled) g.workers_trial = Graph::WorkersTrial::Done;
}

void PythonRunner::store_payoff_choice() {
  const Graph& g = *graph_;
  const bool pairing = g.payoff.phase() == terra::Payoff::Phase::Pairing;
  if (g.payoff_key == 0 || !policy_.remember_payoff || !(g.payoff.has_choice() || pairing)) return;
  PayoffMemory::Choice c;
  c.chosen = g.payoff.has_choice();
  c.pairing = pairing;
  if (pairing) c.pairs = g.payoff.pairs();
  c.eager = g.payoff.choice_eager();
  c.coexec_s = g.payoff.coexec_seconds();
  c.eager_s = g.payoff.eager_seconds();
  c.hold = g.payoff.hold();
  // While the two ways alternate, the way the trial started from (the pairing is not kept).
  c.workers_asleep = g.workers_trial == Graph::WorkersTrial::Pairing ? g.workers_asleep_before : g.workers_asleep;
  c.retimed_coexec = g.retimed_coexec;
  c.workers_settled = g.workers_trial == Graph::WorkersTrial::Done;
  PayoffMemory::process().store(g.payoff_key, c);
}

uint64_t PythonRunner::payoff_key(const std::vector<uint32_t>& path) const {
  // What the check measures: the computation, not where the program wrote it. So the ops in
  // order (names, not their schemas' addresses) with their outputs' dtypes and sizes (a model
  // made wider is another measurement), the intra-op thread count and the margin the check
  // decides by; not the loop's id nor the call stacks, which change with the cell's text: a
  // notebook cell edited and run again (another print, another epoch count) is another graph
  // with the same ops, and starts from the choice made for it before. The first kKeyNodes ops.
  constexpr size_t kKeyNodes = 4096;
  uint64_t h = terra::hash_combine(0x7e77a9a4, static_cast<uint64_t>(at::get_num_threads()));
  double margin = policy_.payoff_margin;
  uint64_t margin_bits = 0;
  std::memcpy(&margin_bits, &margin, sizeof margin_bits);
  h = terra::hash_combine(h, margin_bits);
  for (size_t i = 1; i < path.size() && i <= kKeyNodes; ++i) {
    const OpTemplate& t = graph_->nodes[path[i]].tmpl;
    h = terra::hash_combine(h, terra::hash_bytes(t.name));
    for (const OutSpec& o : t.outs) {
      h = terra::hash_combine(h, static_cast<uint64_t>(o.meta.dtype) + 1);
      for (int64_t size : o.meta.sizes) h = terra::hash_combine(h, static_cast<uint64_t>(size));
    }
  }
  return h | 1;  // never 0 (none)
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

}  // namespace terra::runtime
