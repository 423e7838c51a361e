#include "terra/payoff.h"

#include <gtest/gtest.h>

#include <functional>
#include <optional>

namespace terra::test {
namespace {

// Runs iterations of one loop in whatever mode the Payoff asks for, each taking the given time in
// that mode; the first iteration after a switch is not clean.
struct Driver {
  Payoff p;
  bool last = false;  // the mode of the previous iteration (none yet: co-executed)
  // Returns how many of the iterations ran eagerly.
  int run(int iterations, double coexec_s, double eager_s, double margin = 0.0, uint64_t loop = 1) {
    int eager_runs = 0;
    for (int i = 0; i < iterations; ++i) {
      const bool eager = p.eager();
      eager_runs += eager;
      p.record(loop, eager, eager == last, eager ? eager_s : coexec_s, margin);
      last = eager;
    }
    return eager_runs;
  }
};

// Run until the next check (at most `limit` iterations); returns the iterations it took.
int until_check(Driver& d, double coexec_s, double eager_s, int limit = 1000) {
  const uint32_t checks = d.p.checks();
  int i = 0;
  while (d.p.checks() == checks && i < limit) {
    d.run(1, coexec_s, eager_s);
    ++i;
  }
  return i;
}

TEST(Payoff, MeasuresCoExecutionThenEagerThenHoldsTheFaster) {
  Driver d;
  Payoff& p = d.p;
  EXPECT_FALSE(p.eager());  // co-execution is timed first
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureCoExec);
  // Close times (1.1 vs 1.0 is no clear winner): both phases run to kSamples clean iterations.
  d.run(Payoff::kSamples, 1.0, 1.1);
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureEager);
  EXPECT_TRUE(p.eager());
  // The first eager iteration follows a co-executed one: it is not a sample.
  d.run(Payoff::kSamples, 1.0, 1.1);
  EXPECT_EQ(p.checks(), 0u);
  d.run(1, 1.0, 1.1);
  // Not clear: the two modes alternate in blocks (co-execution first) until the pairs decide.
  EXPECT_EQ(p.phase(), Payoff::Phase::Pairing);
  EXPECT_FALSE(p.eager());
  until_check(d, 1.0, 1.1);
  EXPECT_EQ(p.phase(), Payoff::Phase::Hold);
  EXPECT_FALSE(p.choice_eager());
  EXPECT_FALSE(p.eager());
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_DOUBLE_EQ(p.coexec_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(p.eager_seconds(), 1.1);
  EXPECT_EQ(p.hold_left(), Payoff::kFirstHold);
}

TEST(Payoff, AClearWinnerEndsAPhaseEarly) {
  Driver d;
  Payoff& p = d.p;
  d.run(Payoff::kSamples, 3.0, 1.0);
  ASSERT_EQ(p.phase(), Payoff::Phase::MeasureEager);
  // One iteration paying for the switch, then kQuick clean ones show eager 3x faster.
  EXPECT_EQ(until_check(d, 3.0, 1.0), 1 + Payoff::kQuick);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_TRUE(p.eager());
  // While holding, everything runs eagerly; the re-check times co-execution again, briefly.
  const int64_t hold = Payoff::hold_for(Payoff::kFirstHold, 1.0, 3.0);
  ASSERT_EQ(p.hold_left(), hold);
  const int n = static_cast<int>(hold);
  EXPECT_EQ(d.run(n, 3.0, 1.0), n);
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureCoExec);
  EXPECT_EQ(until_check(d, 3.0, 1.0), 1 + Payoff::kQuick);
  EXPECT_EQ(p.checks(), 2u);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_EQ(p.hold_left(), Payoff::kHoldGrowth * hold);  // a confirmed choice is held longer
}

TEST(Payoff, TracedIterationsShowCoExecutionSlowerBeforeEagerIsTimed) {
  Driver d;
  Payoff& p = d.p;
  for (int i = 0; i < 3; ++i) p.record_traced(1, 1.0);  // tracing: eager work plus recording
  EXPECT_EQ(until_check(d, 3.0, 1.0), Payoff::kQuick);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_DOUBLE_EQ(p.eager_seconds(), 1.0);
}

TEST(Payoff, TracedIterationsNeverShowCoExecutionFaster) {
  Driver d;
  Payoff& p = d.p;
  for (int i = 0; i < 3; ++i) p.record_traced(1, 1.0);
  // Co-execution faster than tracing says nothing about eager: eager is timed as well.
  d.run(Payoff::kSamples, 0.5, 0.9);
  EXPECT_EQ(p.checks(), 0u);
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureEager);
}

TEST(Payoff, AnEagerHoldBeforeAnyCheckTimesCoExecutionWhenItEnds) {
  Driver d;
  Payoff& p = d.p;
  d.last = true;  // the held iterations run eagerly from the start
  p.hold_eager_first(100);
  EXPECT_TRUE(p.held_first());
  EXPECT_FALSE(p.has_choice());  // no check made it
  EXPECT_EQ(d.run(100, 3.0, 1.0), 100);
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureCoExec);
  EXPECT_FALSE(p.held_first());  // its re-check times co-execution now
  p.hold_eager_first(100);       // once only: the re-check goes on
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureCoExec);
  EXPECT_FALSE(p.eager());
  // The re-check times co-execution against the eager iterations timed while held: the switch's
  // iteration, then kQuick clean ones show co-execution 3x slower.
  EXPECT_EQ(until_check(d, 3.0, 1.0), 1 + Payoff::kQuick);
  EXPECT_FALSE(p.held_first());
  EXPECT_TRUE(p.choice_eager());
  EXPECT_DOUBLE_EQ(p.eager_seconds(), 1.0);
  EXPECT_EQ(p.hold_left(), Payoff::hold_for(Payoff::kFirstHold, 1.0, 3.0));
}

TEST(Payoff, AnEagerHoldBeforeAnyCheckGivesWayWhereCoExecutionIsFaster) {
  Driver d;
  Payoff& p = d.p;
  d.last = true;
  p.hold_eager_first(40);
  d.run(40, 0.2, 1.0);
  EXPECT_EQ(until_check(d, 0.2, 1.0), 1 + Payoff::kQuick);
  EXPECT_FALSE(p.choice_eager());
  EXPECT_FALSE(p.eager());
}

TEST(Payoff, FollowsAChangeInWhichModeIsFaster) {
  Driver d;
  Payoff& p = d.p;
  until_check(d, 3.0, 1.0);
  ASSERT_TRUE(p.choice_eager());
  // Co-execution became faster (a later phase of the program): the next check sees it, against
  // eager samples taken during the hold.
  until_check(d, 0.5, 1.0);
  EXPECT_EQ(p.checks(), 2u);
  EXPECT_FALSE(p.choice_eager());
  // A flipped choice starts over, from the times just measured.
  EXPECT_EQ(p.hold_left(), Payoff::hold_for(Payoff::kFirstHold, 0.5, 1.0));
}

TEST(Payoff, AHoldIsLongEnoughThatItsReCheckCostsLittle) {
  // Close times: the first hold. 3x slower: a re-check (the slower mode's kQuick clean
  // iterations and the switch) costs 8 s, which is kCheckBudget of 267 one-second iterations.
  EXPECT_EQ(Payoff::hold_for(Payoff::kFirstHold, 1.0, 1.1), Payoff::kFirstHold);
  EXPECT_EQ(Payoff::hold_for(Payoff::kFirstHold, 1.0, 3.0), 267);
  EXPECT_EQ(Payoff::hold_for(Payoff::kFirstHold, 1.0, 100.0), Payoff::kMaxHold);
  EXPECT_EQ(Payoff::hold_for(Payoff::kFirstHold, 0.0, 0.0), Payoff::kFirstHold);  // nothing timed
  // The re-check's share of the time, over its hold, stays within the budget.
  for (double slow : {1.5, 2.0, 4.5, 10.0}) {
    const int64_t hold = Payoff::hold_for(Payoff::kFirstHold, 1.0, slow);
    const double check = (Payoff::kQuick + 1) * (slow - 1.0);
    EXPECT_LE(check / static_cast<double>(hold), Payoff::kCheckBudget + 1e-12) << slow;
  }
  // End to end: co-execution 4.5x slower is re-checked only after hundreds of eager iterations.
  Driver d;
  until_check(d, 4.5, 1.0);
  ASSERT_TRUE(d.p.choice_eager());
  EXPECT_GE(until_check(d, 4.5, 1.0, 100000), 467);
}

TEST(Payoff, MarginFavoursCoExecution) {
  Driver keep, drop;
  for (int i = 0; i < 1000 && keep.p.checks() == 0; ++i) keep.run(1, 1.2, 1.0, /*margin=*/0.25);
  for (int i = 0; i < 1000 && drop.p.checks() == 0; ++i) drop.run(1, 1.2, 1.0, /*margin=*/0.1);
  EXPECT_FALSE(keep.p.choice_eager());
  EXPECT_TRUE(drop.p.choice_eager());
}

// Iterations in whatever mode the Payoff asks for, each taking time(eager, i) (a drifting host).
int until_check_with(Payoff& p, bool& last, int& i, const std::function<double(bool, int)>& time,
                     int limit = 1000) {
  const uint32_t checks = p.checks();
  int eager_runs = 0;
  for (int n = 0; p.checks() == checks && n < limit; ++n, ++i) {
    const bool eager = p.eager();
    eager_runs += eager;
    p.record(1, eager, eager == last, time(eager, i), 0.0);
    last = eager;
  }
  return eager_runs;
}

TEST(Payoff, AnUnclearFirstCheckIsDecidedByAlternatingBlocksWhichCancelTheHostsDrift) {
  // Co-execution 10% faster, but the host runs 30% slower while co-execution is first timed:
  // a phase of each in turn would choose eager execution (1.17 against 1.0).
  Payoff p;
  bool last = false;
  int i = 0;
  auto time = [](bool eager, int i) { return (eager ? 1.0 : 0.9) * (i < Payoff::kSamples ? 1.3 : 1.0); };
  until_check_with(p, last, i, time);
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_FALSE(p.choice_eager());
  // Eager execution 10% faster on a steady host: the pairs take it.
  Payoff q;
  last = false;
  i = 0;
  until_check_with(q, last, i, [](bool eager, int) { return eager ? 0.9 : 1.0; });
  EXPECT_TRUE(q.choice_eager());
}

// Stochastic depth's shape: co-executed iterations as fast as eager ones when clean, but three
// in four record a new path (unclean, at 2.5x). A pairing's co-executed blocks time those too
// (costs_coexec) and take eager execution within a few blocks; timing only clean ones, the
// blocks filled one clean iteration in four (each unclean one restarting the block's settling),
// and the pairing found the two modes equal after running co-executed most of the time.
TEST(Payoff, APairingTimesWhatCoExecutingCostsNotOnlyItsCleanIterations) {
  Payoff p;
  bool last = false;
  // First phases: close clean times, so the first check pairs the modes.
  for (int i = 0; i < 200 && p.phase() != Payoff::Phase::Pairing; ++i) {
    const bool eager = p.eager();
    p.record(1, eager, eager == last, 1.0, 0.0);
    last = eager;
  }
  ASSERT_EQ(p.phase(), Payoff::Phase::Pairing);
  int coexecuted = 0;
  for (int k = 0; k < 400 && p.checks() == 0; ++k) {
    const bool eager = p.eager();
    const bool recorded = !eager && k % 4 != 0;  // a new path's recording
    coexecuted += !eager;
    p.record(1, eager, eager == last && !recorded, recorded ? 2.5 : 1.0, 0.0, Payoff::kCheckBudget,
             /*costs_coexec=*/recorded && eager == last);
    last = eager;
  }
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_LE(coexecuted, 2 * PairedTrial::kBlock) << "co-executed while paired";
}

TEST(Payoff, APairedChoiceReportsThePairsRatio) {
  // Co-execution 10% faster on a host slowing by 1.5% per iteration: the latest block of each
  // mode saw another moment of the host, the pairs did not.
  Payoff p;
  bool last = false;
  int i = 0;
  until_check_with(p, last, i, [](bool eager, int i) { return (eager ? 1.0 : 0.9) * (1.0 + 0.015 * i); });
  ASSERT_EQ(p.checks(), 1u);
  EXPECT_FALSE(p.choice_eager());
  EXPECT_NEAR(p.coexec_seconds() / p.eager_seconds(), 0.9, 0.02);
}

TEST(Payoff, AReCheckThatConfirmsTheChoiceIsNotPaired) {
  Payoff p;
  bool last = false;
  int i = 0;
  auto time = [](bool eager, int) { return eager ? 1.1 : 1.0; };
  until_check_with(p, last, i, time);
  ASSERT_FALSE(p.choice_eager());
  ASSERT_EQ(p.phase(), Payoff::Phase::Hold);
  // The hold, then eager execution timed again: it confirms co-execution, which is held longer.
  bool paired = false;
  const uint32_t checks = p.checks();
  for (int n = 0; n < 1000 && p.checks() == checks; ++n, ++i) {
    paired = paired || p.phase() == Payoff::Phase::Pairing;
    const bool eager = p.eager();
    p.record(1, eager, eager == last, time(eager, i), 0.0);
    last = eager;
  }
  EXPECT_FALSE(paired);
  EXPECT_FALSE(p.choice_eager());
  EXPECT_EQ(p.hold_left(), Payoff::kHoldGrowth * Payoff::kFirstHold);
}

// Calls of `call` iterations, each a session: its first iteration is never clean (nothing ran
// before it in the session), nor a co-executed one before the session's third (the GraphRunner's
// start: PythonRunner's kCoexecRunBeforeSample), nor the first after a switch. Runs until the
// first check; returns the iterations, and in `mixed` the calls that began while the modes were
// paired and ran both modes.
int run_calls(Payoff& p, int call, double coexec_s, double eager_s, bool& paired, int& mixed) {
  bool last = false;
  int i = 0, coexec_run = 0;
  mixed = 0;
  std::optional<bool> way;  // the mode of the current call's iterations, if one
  bool call_paired = false;
  for (; p.checks() == 0 && i < 2 * PairedTrial::kMaxIterations; ++i) {
    const bool first = i % call == 0;
    if (first) {
      p.session_started();
      mixed += call_paired && !way;
      call_paired = p.phase() == Payoff::Phase::Pairing;
      EXPECT_EQ(p.paired_by_call(), call_paired && i >= 2 * call);  // a short call came before
      way.reset();
    }
    const bool eager = p.eager();
    if (first) way = eager;
    if (way && *way != eager) way.reset();
    coexec_run = eager || first ? 0 : coexec_run + 1;
    const bool clean = !first && eager == last && (eager || coexec_run >= 2);
    paired = paired || p.phase() == Payoff::Phase::Pairing;
    p.record(1, eager, clean, eager ? eager_s : coexec_s, 0.0);
    last = eager;
  }
  return i;
}

TEST(Payoff, ANotebooksShortCallsArePairedCallByCall) {
  // Eager execution 10% faster: no clear winner, so the check pairs the modes. The blocks fill
  // from consecutive calls' clean iterations and switch only between calls. Blocks of 6 clean
  // iterations in a row never filled in 5-step calls: the calls co-executed for all of the
  // pairing's kMaxIterations (403 iterations, then co-execution kept); blocks that filled across
  // calls but switched inside them cost more than either mode (bench/results/s48_short_calls.md).
  constexpr int kCall = 7;  // 5 steps, the stretches before and after the loop
  Payoff p;
  bool paired = false;
  int mixed = 0;
  const int n = run_calls(p, kCall, 1.1, 1.0, paired, mixed);
  ASSERT_TRUE(paired);
  ASSERT_EQ(p.checks(), 1u);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_LE(n, 40 * kCall);
  EXPECT_EQ(mixed, 0);
  // Co-execution 10% faster: kept, the same way.
  Payoff q;
  paired = false;
  EXPECT_LE(run_calls(q, kCall, 1.0, 1.1, paired, mixed), 40 * kCall);
  EXPECT_TRUE(paired);
  EXPECT_FALSE(q.choice_eager());
  EXPECT_EQ(mixed, 0);
}

TEST(Payoff, LongSessionsAreStillPairedInBlocksInsideThem) {
  // A session of 400 iterations (a script's training loop): the blocks switch inside it.
  Payoff p;
  bool paired = false;
  int mixed = 0;
  const int n = run_calls(p, 400, 1.1, 1.0, paired, mixed);
  ASSERT_TRUE(paired);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_LT(n, 400);
  // Short calls until the pairing begins, then a long call: held to one way for its first
  // kShortSession iterations at most, then paired in blocks inside it, and decided there.
  Payoff q;
  bool last = false;
  int i = 0;
  for (; q.phase() != Payoff::Phase::Pairing && i < 1000; ++i) {
    if (i % 5 == 0) q.session_started();
    const bool eager = q.eager();
    q.record(1, eager, i % 5 != 0 && eager == last, eager ? 1.0 : 1.1, 0.0);
    last = eager;
  }
  ASSERT_EQ(q.phase(), Payoff::Phase::Pairing);
  q.session_started();
  EXPECT_TRUE(q.paired_by_call());
  int switches = 0, n_long = 0;
  for (bool first = true; q.checks() == 0 && n_long < 300; ++n_long, first = false) {
    const bool eager = q.eager();
    switches += !first && eager != last;
    q.record(1, eager, !first && eager == last, eager ? 1.0 : 1.1, 0.0);
    last = eager;
  }
  EXPECT_EQ(q.checks(), 1u);
  EXPECT_TRUE(q.choice_eager());
  EXPECT_FALSE(q.paired_by_call());
  EXPECT_GE(switches, 2);
  EXPECT_LT(n_long, 150);
}

TEST(Payoff, LoopsAreWeightedByHowOftenTheyRun) {
  Driver d;
  // Loop 1 runs twice as often as loop 2 and co-executes faster; loop 2 is slower co-executed.
  // Unweighted, the medians would average to 1.25 s against eager's 1 s.
  int i = 0;
  for (; d.p.checks() == 0 && i < 1000; ++i) {
    const uint64_t loop = i % 3 == 2 ? 2 : 1;
    d.run(1, loop == 1 ? 0.5 : 2.0, 1.0, 0.0, loop);
  }
  ASSERT_EQ(d.p.checks(), 1u);
  const double loop2 = i / 3, loop1 = i - loop2;
  EXPECT_NEAR(d.p.coexec_seconds(), (loop1 * 0.5 + loop2 * 2.0) / i, 1e-12);
  EXPECT_FALSE(d.p.choice_eager());
}

TEST(Payoff, WithoutCleanIterationsItChecksAnywayAndKeepsCoExecuting) {
  Payoff p;
  for (int i = 0; i < 8 * Payoff::kSamples && p.checks() == 0; ++i)
    p.record(1, p.eager(), /*clean=*/false, 1.0, 0.0);
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_FALSE(p.choice_eager());  // nothing was timed both ways
}

// An earlier run's choice (runtime/payoff_memory.h): held from the first iteration for as long
// as that run held it, and a re-check that agrees on times too close to tell holds it longer
// instead of pairing the modes as a first check would.
TEST(Payoff, AnEarlierRunsChoiceIsHeldThenConfirmedWithoutPairing) {
  Driver d;
  Payoff& p = d.p;
  p.resume(/*eager=*/true, /*coexec_s=*/1.2, /*eager_s=*/1.0, /*hold=*/64);
  EXPECT_TRUE(p.resumed());
  EXPECT_EQ(p.checks(), 0u);
  EXPECT_EQ(p.phase(), Payoff::Phase::Hold);
  EXPECT_EQ(d.run(64, 1.2, 1.0), 64) << "held eagerly from the first iteration";
  EXPECT_EQ(p.phase(), Payoff::Phase::MeasureCoExec);
  bool paired = false;
  for (int i = 0; i < 200 && p.checks() == 0; ++i) {
    d.run(1, 1.2, 1.0);
    paired = paired || p.phase() == Payoff::Phase::Pairing;
  }
  EXPECT_FALSE(paired);
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_EQ(p.hold(), Payoff::kHoldGrowth * 64) << "a confirming check holds longer";

  // The same times in a run that remembers nothing: its first check is not clear, so it pairs.
  Driver fresh;
  for (int i = 0; i < 200 && fresh.p.phase() != Payoff::Phase::Pairing; ++i) fresh.run(1, 1.2, 1.0);
  EXPECT_EQ(fresh.p.phase(), Payoff::Phase::Pairing);
}

TEST(Payoff, AnEarlierRunsChoiceThatNoLongerHoldsIsChangedAtTheFirstReCheck) {
  Driver d;
  Payoff& p = d.p;
  Payoff longer;
  longer.resume(/*eager=*/true, 1.2, 1.0, /*hold=*/Payoff::kMaxHold);
  EXPECT_EQ(longer.hold_left(), Payoff::kResumedHold) << "checked again sooner than that run would have";
  p.resume(/*eager=*/true, 1.2, 1.0, /*hold=*/1);  // at least kFirstHold
  EXPECT_EQ(p.hold_left(), Payoff::kFirstHold);
  EXPECT_EQ(d.run(static_cast<int>(Payoff::kFirstHold), 0.5, 1.0), Payoff::kFirstHold);
  until_check(d, 0.5, 1.0);  // co-execution now twice as fast: clear at once
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_FALSE(p.choice_eager());
  EXPECT_FALSE(p.eager());
}

TEST(Payoff, APairingAnEarlierRunLeftGoesOnFromItsPairsWithoutTimingEachModeAlone) {
  // An earlier run's pairing had three pairs, one with eager execution twice as fast, one with it
  // 10% faster, one 30% slower; this run's co-execution is 5% faster. The fourth pair decides, for
  // eager execution by the median (0.975).
  Driver d;
  Payoff& p = d.p;
  p.resume_pairing({0.5, 0.9, 1.3}, /*margin=*/0.0);
  EXPECT_EQ(p.phase(), Payoff::Phase::Pairing);
  EXPECT_TRUE(p.remembered());
  EXPECT_TRUE(p.pairing_resumed());
  EXPECT_FALSE(p.resumed()) << "no earlier choice";
  EXPECT_FALSE(p.has_choice());
  EXPECT_EQ(p.pairs_resumed(), 3);
  const int iterations = until_check(d, 1.0, 1.05);
  // One pair of blocks, each with the iteration that switched modes (not clean), no measuring phase.
  EXPECT_EQ(iterations, 2 * PairedTrial::kBlock + 2);
  EXPECT_EQ(p.checks(), 1u);
  EXPECT_TRUE(p.choice_eager());
  EXPECT_EQ(p.phase(), Payoff::Phase::Hold);

  // Its blocks are of one loop's iterations: the first recorded after it was taken up (above loop
  // 1; here loop 2); another's are not counted.
  Driver other;
  other.p.resume_pairing({0.5, 0.9, 1.3}, 0.0);
  other.run(1, 1.0, 1.05, 0.0, /*loop=*/2);
  EXPECT_EQ(until_check(other, 1.0, 1.05, 100), 100);
  EXPECT_EQ(other.p.checks(), 0u);
  EXPECT_EQ(other.p.phase(), Payoff::Phase::Pairing);

  // The same run remembering nothing: co-execution, after timing each mode and pairing them.
  Driver fresh;
  const int fresh_iterations = until_check(fresh, 1.0, 1.05);
  EXPECT_FALSE(fresh.p.choice_eager());
  EXPECT_GT(fresh_iterations, 2 * (PairedTrial::kPairs - 1) * PairedTrial::kBlock);
}

TEST(Payoff, PairsAnEarlierRunLeftThatFixTheMedianDecideAtOnce) {
  Driver d;
  d.p.resume_pairing({0.5, 0.5, 0.5}, /*margin=*/0.0);
  EXPECT_EQ(d.p.checks(), 1u);
  EXPECT_TRUE(d.p.choice_eager());
  EXPECT_EQ(d.p.phase(), Payoff::Phase::Hold);
  EXPECT_EQ(d.p.hold_left(), Payoff::kFirstHold);
}

TEST(Payoff, ALaterPairingOfARunThatTookUpOneStillPairsTheLoopThatRunsMost) {
  // A pairing taken up from an earlier run decides for eager execution; the re-check after its hold
  // finds co-execution 5% faster, not clearly, and pairs again, over loop 1 (the loop timed both
  // ways). An iteration of another loop recorded first does not take that pairing over.
  Driver d;
  Payoff& p = d.p;
  p.resume_pairing({0.5, 0.9, 1.3}, /*margin=*/0.0);
  until_check(d, 1.0, 1.05);
  ASSERT_TRUE(p.choice_eager());
  for (int i = 0; i < 1000 && p.phase() != Payoff::Phase::Pairing; ++i) d.run(1, 1.0, 1.05);
  ASSERT_EQ(p.phase(), Payoff::Phase::Pairing);
  d.run(1, 1.0, 1.05, 0.0, /*loop=*/2);
  EXPECT_LT(until_check(d, 1.0, 1.05, 200), 200);
  EXPECT_EQ(p.checks(), 2u);
  EXPECT_FALSE(p.choice_eager());
}

}  // namespace
}  // namespace terra::test
