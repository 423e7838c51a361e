#include "terra/paired_trial.h"
#include "terra/median.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

namespace terra::test {
namespace {

using Verdict = PairedTrial::Verdict;

// Runs the trial until its verdict (at most `limit` iterations); an iteration's time is
// `time(b, i)` for way B or A at iteration i (a drifting host, say). Returns the ways run.
std::vector<bool> run(PairedTrial& t, const std::function<double(bool, int)>& time, int limit = 1000) {
  std::vector<bool> ways;
  for (int i = 0; i < limit && t.verdict() == Verdict::Running; ++i) {
    const bool b = t.b();
    ways.push_back(b);
    t.record(true, time(b, i));
  }
  return ways;
}

TEST(PairedTrial, AlternatesBlocksABBAAndTakesTheWayFasterInMostPairs) {
  PairedTrial t;
  // B 8% faster, while the host slows down by 60% over the trial: each way's plain mean would
  // mix the drift in, the pairs cancel it.
  const auto ways = run(t, [](bool b, int i) { return (b ? 0.92 : 1.0) * (1.0 + 0.0125 * i); });
  ASSERT_EQ(t.verdict(), Verdict::TakeB);
  EXPECT_TRUE(t.b());
  ASSERT_EQ(ways.size(), static_cast<size_t>(2 * PairedTrial::kPairs * PairedTrial::kBlock));
  const int k = PairedTrial::kBlock;
  for (int block = 0; block < 8; ++block) {  // A B B A A B B A
    const bool b = block == 1 || block == 2 || block == 5 || block == 6;
    for (int i = 0; i < k; ++i) EXPECT_EQ(ways[static_cast<size_t>(block * k + i)], b) << block << " " << i;
  }
  // Each pair alone holds the drift between its blocks, in opposite directions for an A B pair and
  // the B A pair after it: together they give B's share.
  ASSERT_EQ(t.ratios().size(), static_cast<size_t>(PairedTrial::kPairs));
  EXPECT_GT(t.ratios()[0], 0.92);
  EXPECT_LT(t.ratios()[1], 0.92);
  for (size_t i = 0; i + 1 < t.ratios().size(); i += 2)
    EXPECT_NEAR(std::sqrt(t.ratios()[i] * t.ratios()[i + 1]), 0.92, 0.005) << i;
}

TEST(PairedTrial, KeepsAWhereBIsNotClearlyFaster) {
  PairedTrial t;
  run(t, [](bool b, int i) { return (b ? 0.97 : 1.0) + (i % 3) * 0.01; });  // 3%: within kGain
  EXPECT_EQ(t.verdict(), Verdict::KeepA);
  EXPECT_FALSE(t.b());
  PairedTrial slower;
  run(slower, [](bool b, int) { return b ? 1.1 : 1.0; });
  EXPECT_EQ(slower.verdict(), Verdict::KeepA);
  // Three pairs on one side: a fourth could not move the median.
  EXPECT_EQ(slower.ratios().size(), static_cast<size_t>(PairedTrial::kPairs - 1));
}

TEST(PairedTrial, AGainOfOneTakesBWhereverItIsFaster) {
  // The payoff check's pairing (terra/payoff.h): eager execution (B) is taken wherever it is
  // faster than co-execution (A) in the median pair, not only by kGain's 5%.
  auto time = [](bool b, int i) { return (b ? 0.97 : 1.0) + (i % 3) * 0.01; };
  PairedTrial t(1.0);
  run(t, time);
  EXPECT_EQ(t.verdict(), Verdict::TakeB);
  PairedTrial by_default;
  run(by_default, time);
  EXPECT_EQ(by_default.verdict(), Verdict::KeepA);
}

TEST(PairedTrial, AFirstPairFarApartDecidesAtOnce) {
  PairedTrial slow_b;
  const auto ways = run(slow_b, [](bool b, int) { return b ? 1.5 : 1.0; });
  EXPECT_EQ(slow_b.verdict(), Verdict::KeepA);
  EXPECT_EQ(ways.size(), static_cast<size_t>(2 * PairedTrial::kBlock));  // one pair
  PairedTrial fast_b;
  run(fast_b, [](bool b, int) { return b ? 0.6 : 1.0; });
  EXPECT_EQ(fast_b.verdict(), Verdict::TakeB);
  EXPECT_EQ(fast_b.ratios().size(), 1u);
}

TEST(PairedTrial, AFirstPairDecidesAtOnceOnlyFarFromTheGain) {
  // The payoff check's pairing with a margin of 100 (gain 1/101): eager execution (B) 30% faster
  // is no reason to take it, and a first pair that far above the gain keeps A at once.
  PairedTrial margin(1.0 / 101.0);
  run(margin, [](bool b, int) { return b ? 0.7 : 1.0; });
  EXPECT_EQ(margin.verdict(), Verdict::KeepA);
  EXPECT_EQ(margin.ratios().size(), 1u);
  // Far below even that gain: at once.
  PairedTrial far(1.0 / 101.0);
  run(far, [](bool b, int) { return b ? 0.001 : 1.0; });
  EXPECT_EQ(far.verdict(), Verdict::TakeB);
  EXPECT_EQ(far.ratios().size(), 1u);
  // Near it, by the pairs' median (three on one side fix it).
  PairedTrial near(1.0 / 101.0);
  run(near, [](bool b, int) { return b ? 0.0098 : 1.0; });
  EXPECT_EQ(near.verdict(), Verdict::TakeB);
  EXPECT_EQ(near.ratios().size(), static_cast<size_t>(PairedTrial::kPairs - 1));
}

TEST(PairedTrial, TheFirstIterationsOfEachBlockAreNotCounted) {
  PairedTrial t;
  // Each block's first kSettle iterations pay for the switch (10x); B is otherwise 30% faster.
  const int k = PairedTrial::kBlock;
  run(t, [k](bool b, int i) { return (i % k) < PairedTrial::kSettle ? 10.0 : (b ? 0.7 : 1.0); });
  EXPECT_EQ(t.verdict(), Verdict::TakeB);
  ASSERT_EQ(t.ratios().size(), 1u);
  EXPECT_DOUBLE_EQ(t.ratios()[0], 0.7);
}

TEST(PairedTrial, AnUncleanIterationRestartsItsBlocksSettlingAndTooFewCleanOnesKeepA) {
  PairedTrial t;
  // One unclean iteration in the middle of the first block (after its settling and one counted
  // iteration): the block settles again and counts the rest of its kCounted.
  for (int i = 0; i < PairedTrial::kSettle + 1; ++i) t.record(true, 1.0);
  t.record(false, 50.0);  // not counted, whatever it took
  int n = 0;
  while (t.verdict() == Verdict::Running && n < 100) {
    t.record(true, t.b() ? 0.5 : 1.0);
    ++n;
  }
  EXPECT_EQ(t.verdict(), Verdict::TakeB);
  EXPECT_EQ(n, (PairedTrial::kBlock - 1) + PairedTrial::kBlock);
  EXPECT_DOUBLE_EQ(t.ratios()[0], 0.5);
  // Never clean: the trial gives up after kMaxIterations and keeps A.
  PairedTrial never;
  for (int i = 0; i <= PairedTrial::kMaxIterations; ++i) never.record(false, 1.0);
  EXPECT_EQ(never.verdict(), Verdict::KeepA);
  EXPECT_TRUE(never.ratios().empty());
}

TEST(PairedTrial, BlocksFillAcrossShortRunsThatEachStartUnclean) {
  // A notebook's calls of 5 steps: each call's first iteration is unclean (the session's start),
  // so no kBlock clean iterations ever come in a row. The blocks still fill, from the clean
  // iterations of consecutive calls, and the trial decides as it would on one long run.
  constexpr int kCall = 5;
  PairedTrial t(1.0);
  int n = 0;
  std::vector<bool> ways;
  for (; t.verdict() == Verdict::Running && n < PairedTrial::kMaxIterations; ++n) {
    const bool clean = n % kCall != 0;
    ways.push_back(t.b());
    t.record(clean, clean ? (t.b() ? 0.7 : 1.0) : 10.0);
  }
  EXPECT_EQ(t.verdict(), Verdict::TakeB);
  ASSERT_EQ(t.ratios().size(), 1u);  // a first pair beyond kClear
  EXPECT_DOUBLE_EQ(t.ratios()[0], 0.7);
  // Each block: kCounted counted iterations, each call giving kCall - 1 - kSettle.
  const int per_call = kCall - 1 - PairedTrial::kSettle;
  const int calls_per_block = (PairedTrial::kCounted + per_call - 1) / per_call;
  EXPECT_LE(n, 2 * calls_per_block * kCall);
  EXPECT_FALSE(ways.front());
  EXPECT_TRUE(ways.back());
}

TEST(PairedTrial, AResumedTrialGoesOnAfterTheEarlierPairsAndDecidesWithThem) {
  // Three earlier pairs, two with B slower, one with B twice as fast; the next pair, here B 20%
  // faster, is the fourth, and the median of the four keeps A. A trial without them is still
  // running after that pair (its first pair, not beyond kClear), and takes B after three.
  const auto faster_b = [](bool b, int) { return b ? 0.8 : 1.0; };
  PairedTrial resumed;
  resumed.resume({1.2, 1.3, 0.5});
  EXPECT_EQ(resumed.verdict(), Verdict::Running);
  EXPECT_EQ(resumed.ratios().size(), 3u);
  EXPECT_TRUE(resumed.b()) << "the blocks after three pairs: B A (the seventh and eighth of A B B A A B B A)";
  const auto ways = run(resumed, faster_b);
  EXPECT_EQ(resumed.verdict(), Verdict::KeepA);
  EXPECT_EQ(ways.size(), static_cast<size_t>(2 * PairedTrial::kBlock));
  EXPECT_EQ(resumed.ratios().size(), static_cast<size_t>(PairedTrial::kPairs));

  PairedTrial fresh;
  const auto fresh_ways = run(fresh, faster_b);
  EXPECT_EQ(fresh.verdict(), Verdict::TakeB);
  EXPECT_EQ(fresh_ways.size(), static_cast<size_t>(2 * (PairedTrial::kPairs - 1) * PairedTrial::kBlock));

  // One earlier pair: the next block is B (the third of A B B A), and no early verdict follows the
  // second pair, however clear (the first pair's was the earlier trial's to take).
  PairedTrial one;
  one.resume({1.0});
  EXPECT_TRUE(one.b());
  run(one, [](bool b, int) { return b ? 0.5 : 1.0; }, 2 * PairedTrial::kBlock);
  EXPECT_EQ(one.verdict(), Verdict::Running);
  EXPECT_EQ(one.ratios().size(), 2u);

  // At most kPairs - 1 are taken (a trial with kPairs had decided), and only ratios of two times;
  // three on one side of the gain decide at once.
  PairedTrial many;
  many.resume({0.5, -1.0, std::nan(""), 0.5, 0.5, 0.5});
  EXPECT_EQ(many.ratios(), (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(many.verdict(), Verdict::TakeB);
}

TEST(PairedTrial, AVerdictBeforeTheLastPairIsTheOneTheLastPairWouldHaveGiven) {
  // Every three pairs from a set of ratios around the gain (0.95), and every fourth (also far
  // below and above them all): where the three decide (taken up by resume, as the trial's own
  // three would), the median of all four agrees whatever the fourth; where they do not, some
  // fourth gives each verdict.
  const std::vector<double> values = {0.5, 0.94, 0.95, 0.96, 1.5};
  std::vector<double> fourths = values;
  fourths.push_back(1e-3);
  fourths.push_back(1e3);
  int decided = 0, open = 0;
  for (double a : values)
    for (double b : values)
      for (double c : values) {
        PairedTrial t;
        t.resume({a, b, c});
        bool keeps = false, takes = false;
        for (double d : fourths) {
          std::vector<double> four = {a, b, c, d};
          const bool take = median_in_place(four.begin(), four.end()) < PairedTrial::kGain;
          takes = takes || take;
          keeps = keeps || !take;
          if (t.verdict() != Verdict::Running) {
            EXPECT_EQ(t.verdict() == Verdict::TakeB, take) << a << " " << b << " " << c << " " << d;
          }
        }
        if (t.verdict() == Verdict::Running) {
          ++open;
          EXPECT_TRUE(keeps && takes) << a << " " << b << " " << c;
        } else {
          ++decided;
        }
      }
  EXPECT_GT(decided, 0);
  EXPECT_GT(open, 0);
  // Two pairs far enough above the gain fix the median too: with two more at 0 it is 1.
  PairedTrial two;
  two.resume({2.0, 2.5});
  EXPECT_EQ(two.verdict(), Verdict::KeepA);
}

}  // namespace
}  // namespace terra::test
