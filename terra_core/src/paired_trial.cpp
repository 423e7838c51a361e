#include "terra/paired_trial.h"

#include "terra/median.h"

namespace terra {

void PairedTrial::resume(const std::vector<double>& ratios) {
  ratios_.clear();
  for (double r : ratios) {
    if (static_cast<int>(ratios_.size()) == kPairs - 1) break;
    if (r > 0 && r < 1e6) ratios_.push_back(r);  // a ratio of two iteration times
  }
  block_ = 2 * static_cast<int>(ratios_.size());
  decide_by_pairs();
}

void PairedTrial::decide_by_pairs() {
  // The median of kPairs pairs once the pairs still to come cannot move it across the gain: it is
  // at least the median with all of them at 0 and at most the one with all of them vast (it grows
  // with each pair's ratio). dcgan's and dropblock's three pairs of 1.1-1.16 fix it above the
  // gain, and their fourth pair's blocks, half of them eager, are not run. The verdict is the one
  // the last pair would have given.
  const size_t left = static_cast<size_t>(kPairs) - ratios_.size();
  std::vector<double> low = ratios_, high = ratios_;
  low.insert(low.end(), left, 0.0);
  high.insert(high.end(), left, 1e300);
  if (median_in_place(low.begin(), low.end()) >= gain_) {
    verdict_ = Verdict::KeepA;
  } else if (median_in_place(high.begin(), high.end()) < gain_) {
    verdict_ = Verdict::TakeB;
  }
}

PairedTrial::Verdict PairedTrial::record(bool clean, double seconds) {
  if (verdict_ != Verdict::Running) return verdict_;
  if (++iterations_ > kMaxIterations) {
    verdict_ = Verdict::KeepA;
    return verdict_;
  }
  // An unclean iteration starts the settling again and keeps what the block counted: blocks of
  // kBlock clean iterations in a row never filled where every few iterations are unclean (a
  // notebook's calls of 5 steps, each a session starting with one), and the payoff check's pairing
  // stayed in its first block, co-executing, for all kMaxIterations (payoff.h: session_started).
  if (!clean || !(seconds > 0)) {
    settled_ = 0;
    return verdict_;
  }
  if (settled_ < kSettle) {
    ++settled_;
    return verdict_;
  }
  sum_ += seconds;
  if (++counted_ < kCounted) return verdict_;
  pair_[block_is_b(block_) ? 1 : 0] = sum_ / counted_;
  settled_ = counted_ = 0;
  sum_ = 0;
  if (block_++ % 2 == 0) return verdict_;  // the pair's first block
  const double ratio = pair_[1] / pair_[0];
  ratios_.push_back(ratio);
  // Far from the gain either way: the payoff check's pairing takes eager execution (B) only where
  // it beats co-execution by the margin, and a first pair 20% in eager's favour took it with any
  // margin (test_co_execution_is_timed_again_with_the_workers_the_other_way[True], margin 100).
  if (ratios_.size() == 1 && (ratio > kClear * gain_ || ratio * kClear < gain_)) {
    verdict_ = ratio > gain_ ? Verdict::KeepA : Verdict::TakeB;
  } else {
    decide_by_pairs();
  }
  return verdict_;
}

}  // namespace terra
