// Payoff: whether co-executing a graph is faster than running it eagerly, measured as it runs.
//
// Co-execution can lose. On a 2-core machine the GraphRunner's OpenMP worker and the program
// thread compete for one core whenever the GraphRunner runs a parallel region (MKL splits even a
// 7x2x128 matmul over both threads) while Python runs, and the worker spins for milliseconds after
// each region. Measured on corpus p01, a small MLP (whole program, fresh processes, medians):
// 74.1 ms co-executed against 16.5 ms eager with 2 intra-op threads, 13.1 against 16.4 with 1
// (bench/results/contention.md).
// The thread count cannot be lowered for the GraphRunner alone: MKL's sgemm results differ
// between 1 and 2 threads for 98 of 1674 shapes there, so results would differ from eager's.
// Where co-execution does not pay, the graph runs eagerly and Terra costs next to nothing.
//
// A graph's iterations go through phases: a few co-executed iterations are timed, then a few
// eager ones, and the faster mode runs for a while (`hold`, kHoldGrowth times longer each time a
// check confirms the choice, up to kMaxHold iterations); then the other mode is timed again. Each loop (an
// iteration start) keeps the median of its latest clean iterations per mode: ones that ran
// wholly in that mode and followed an iteration of the same mode (the first after a switch pays
// for the switch). A check compares the loops timed in both modes, each weighted by how often it
// runs. Co-execution is kept while its time is at most eager's times (1 + margin).
//
// Timing the slower mode costs: a 50-step program whose co-execution is 4x slower spent half its
// time in co-executed timing phases. So a phase ends after kQuick clean iterations when the
// winner is already clear (by a factor kClear), and before eager execution was ever timed, traced
// iterations stand in for it: tracing runs every op eagerly and records it, so it is never faster
// than eager execution, and co-execution slower than tracing is slower than eager. And a hold
// lasts long enough that its re-check (kQuick clean iterations of the slower mode and one paying
// for the switch, at the last check's times) costs at most kCheckBudget of the hold's time: after
// co-execution measured 4.5x slower, that is 500 iterations, not 32.
//
// The host's speed drifts by 10-30% over seconds (terra/paired_trial.h), so a phase of each mode
// in turn decided by the drift where the two were close: gpt, whose co-execution won by 7-20% in
// side-by-side blocks, co-executed 24 to 429 of 447 iterations by the luck of its first checks.
// So a check that is not clear (no factor kClear either way) and would begin or change the
// choice times the two modes in alternating blocks (Phase::Pairing, a PairedTrial of co-execution
// as A and eager execution as B, over the loop that runs most), and that decides. A check that
// confirms the choice holds it without pairing: in a steady program, re-checks cost what they did.
//
// Plain C++ on plain numbers: the runtime feeds it iteration times and asks which mode is next.
#pragma once

#include "terra/paired_trial.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace terra {

class Payoff {
 public:
  static constexpr int kSamples = 6;          // clean iterations timed per measuring phase
  static constexpr int kQuick = 3;            // enough when one mode is faster by kClear
  // Sequential phases see the host's drift too: at 1.25, gpt's first check found co-execution
  // clearly slower on three eager samples (12.5 ms against 10) that later ran at 8-9.
  static constexpr double kClear = 1.5;
  static constexpr int64_t kFirstHold = 32;   // iterations a new choice runs before a re-check
  static constexpr int64_t kHoldGrowth = 4;   // each confirming check holds this much longer
  static constexpr int64_t kMaxHold = 8192;
  static constexpr double kCheckBudget = 0.03;  // default: a re-check's cost, as a share of its hold
  // Iterations to hold the faster mode (per-iteration times `fast` and `slow`) so that a re-check
  // costs at most `budget` of the hold's time; at least `base`, at most kMaxHold.
  static int64_t hold_for(int64_t base, double fast, double slow, double budget = kCheckBudget);
  enum class Phase : uint8_t { MeasureCoExec, MeasureEager, Pairing, Hold };

  // Whether the graph's next iteration should run eagerly.
  bool eager() const {
    return phase_ == Phase::MeasureEager || (phase_ == Phase::Hold && choice_eager_) ||
           (phase_ == Phase::Pairing && (session_way_ ? *session_way_ : pairing_.b()));
  }
  // A session (a `terra.run` call, a notebook cell) begins. Where the graph's sessions are short
  // (the last one recorded at most kShortSession iterations), each runs wholly in the way the
  // pairing is at when it begins, so its blocks switch only between calls: switching modes inside
  // 5-step calls made gpt's calls 0.80 of eager's speed while its pairing lasted, against 1.08
  // co-executing (bench/results/s48_short_calls.md). A block that fills during a call leaves the
  // rest of the call uncounted (it runs the other way). A session that goes on past
  // kShortSession iterations is paired in blocks inside it from then on.
  void session_started();
  static constexpr int kShortSession = 4 * PairedTrial::kBlock;
  // The modes are paired and this session runs wholly in one of them (session_started).
  bool paired_by_call() const { return phase_ == Phase::Pairing && session_way_.has_value(); }
  // An iteration of loop `loop` took `seconds` in mode `eager`. `clean`: it ran wholly in that
  // mode and the iteration before it ran in the same mode. `margin`: co-execution is kept while
  // it takes at most (1 + margin) times eager's time; `check_budget`: see hold_for.
  // `costs_coexec`: a co-executed iteration that was not clean for what it paid co-executing
  // (it recorded a new path, or fell back), not for switching modes or for running another way
  // on purpose. A pairing's co-executed blocks time those too: a loop whose co-executed
  // iterations record a path most of the time (stochastic depth, 64 paths) filled its blocks
  // with clean ones so slowly that it ran co-executed, at 1.5-2x eager's step, for 100
  // iterations and more while paired (session 52). Measuring phases still time clean ones only:
  // a program's first recordings (rnn_lengths' 17 lengths) are its warm-up, which a pairing
  // comes after.
  void record(uint64_t loop, bool eager, bool clean, double seconds, double margin,
              double check_budget = kCheckBudget, bool costs_coexec = false);
  // A clean traced iteration of `loop` (one that added nothing to the graph) took `seconds`.
  void record_traced(uint64_t loop, double seconds);

  // Starts from a choice an earlier run's check made (runtime/payoff_memory.h), before any
  // iteration was recorded: holds it for `hold` iterations (as that check did; at least
  // kFirstHold, at most kResumedHold), then checks as after a check of its own (a confirming
  // check holds longer; a check that is not clear and would change the choice pairs the modes).
  void resume(bool eager, double coexec_s, double eager_s, int64_t hold);
  // An earlier run may have measured on a busier machine: its choice is checked again within this
  // many iterations, however long that run had come to hold it (up to kMaxHold).
  static constexpr int64_t kResumedHold = 512;
  // Before any check: the graph's backward runs Python (a tensor or module hook, a custom
  // autograd.Function), so co-executing it runs the forward on the GraphRunner, waits for it, runs
  // the backward on the program thread and moves the OpenMP team back and forth: 3-4x eager's time
  // per iteration on 2 cores, and a check's co-executed timing (at least five iterations) cost a
  // short program more than half again its eager time (corpus p28: 1.8-2.2x). Holds eager execution
  // `hold` iterations (kPythonBackwardHold), then times co-execution as a re-check does. Once per
  // graph: later calls do nothing.
  void hold_eager_first(int64_t hold);
  static constexpr int64_t kPythonBackwardHold = 512;
  // The eager execution held now is hold_eager_first's (before any check; not its re-check).
  bool held_first() const { return held_first_ && checks_ == 0 && phase_ == Phase::Hold; }
  // Goes on with the pairing of an earlier run's check (runtime/payoff_memory.h) that its process
  // ended before it decided: the modes are timed in alternating blocks of the iterations of the
  // first loop recorded from here (the one whose ops the memory's key is), after the pairs that
  // run completed (`ratios`, t(eager)/t(co-executed)), without timing each mode alone first. Where
  // the earlier run also had a choice, resume() it first. dcgan's and dropblock's co-execution, 1.2
  // times as fast as eager execution on this host, was still paired after 60 steps, and every run
  // paired again from nothing.
  void resume_pairing(const std::vector<double>& ratios, double margin, double check_budget = kCheckBudget);
  // The pairs the current pairing has completed (t(eager) / t(co-executed) each), and how many of
  // them an earlier run's (resume_pairing).
  const std::vector<double>& pairs() const { return pairing_.ratios(); }
  int pairs_resumed() const { return pairs_resumed_; }
  int64_t hold() const { return hold_; }  // the last check's hold
  bool resumed() const { return resumed_; }
  // What this run started from was an earlier run's: a choice (resume) or a pairing (resume_pairing).
  bool remembered() const { return resumed_ || pairing_resumed_; }
  bool pairing_resumed() const { return pairing_resumed_; }
  // A choice is held or was: a check of this run's made it, or an earlier run's (resume).
  bool has_choice() const { return checks_ > 0 || resumed_; }
  // Re-times the mode not chosen after at most `iterations` more (a shorter hold): another way
  // of running that mode is to be tried.
  void recheck_within(int64_t iterations) {
    if (phase_ == Phase::Hold) hold_left_ = std::min(hold_left_, iterations);
  }
  Phase phase() const { return phase_; }
  bool choice_eager() const { return choice_eager_; }  // the last check's choice
  uint32_t checks() const { return checks_; }
  int64_t hold_left() const { return hold_left_; }
  // The last check's per-iteration times (weighted over loops), in seconds; 0 before a check.
  double coexec_seconds() const { return coexec_s_; }
  double eager_seconds() const { return eager_s_; }
  struct LoopTimes {
    uint64_t loop = 0, iterations = 0;
    double coexec_s = 0, eager_s = 0;  // medians of the latest clean iterations; 0: none
  };
  std::vector<LoopTimes> loops() const;

 private:
  struct Window {  // the latest kSamples clean iteration times of one loop in one mode
    std::array<double, kSamples> v{};
    int n = 0, next = 0;
    void add(double x);
    double median() const;
  };
  struct Loop {
    Window coexec, eager, traced;
    uint64_t iterations = 0;  // weight in a check
  };
  struct Totals {  // weighted over the loops timed both ways
    double coexec = 0, eager = 0;
    uint64_t weight = 0;
  };
  // `traced_for_eager`: loops not yet timed eagerly use their traced times instead.
  Totals totals(bool traced_for_eager) const;
  void start(Phase phase);
  void start_pairing(double margin);
  static PairedTrial paired_modes(double margin);  // A co-executed, B eager, B taken beyond the margin
  bool clear_winner(double margin, double check_budget);  // decides early if one mode is clearly faster
  void decide(bool eager, const Totals& t, double check_budget);
  void hold_before_any_check(bool eager, int64_t hold);  // resume's and hold_eager_first's hold

  std::unordered_map<uint64_t, Loop> loops_;
  PairedTrial pairing_;     // Phase::Pairing: A co-executed, B eager
  uint64_t pair_loop_ = 0;  // the loop whose iterations the pairing times (0: the next one recorded)
  Phase phase_ = Phase::MeasureCoExec;
  bool choice_eager_ = false;
  bool measured_eager_ = false;
  int samples_ = 0, iterations_ = 0;  // in the current measuring phase
  int64_t hold_left_ = 0, hold_ = 0;
  uint32_t checks_ = 0;
  bool resumed_ = false;  // the choice held first came from an earlier run (resume)
  bool held_first_ = false;  // hold_eager_first
  bool pairing_resumed_ = false;  // the first pairing went on from an earlier run's (resume_pairing)
  int pairs_resumed_ = 0;  // pairs of the current pairing an earlier run completed
  double coexec_s_ = 0, eager_s_ = 0;
  int session_records_ = 0;  // record() calls in this session
  std::optional<bool> session_way_;  // short sessions while pairing: this session's way (eager?)
};

}  // namespace terra
