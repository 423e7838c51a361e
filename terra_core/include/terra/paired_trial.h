// PairedTrial: which of two ways of running a loop is faster, from alternating blocks of its own
// iterations.
//
// The host's speed drifts: on the 2-core VM of session 31 and later, one program's step time
// differs by up to 30% between processes and by 10-20% within one over seconds, so a single
// timing phase of each way (what the GraphRunner's workers' trial did before) decided by noise:
// music_transformer and bert kept their workers asleep in some processes although they ran 1.27
// and 1.29 times slower so, hf_bert kept them spinning although asleep took 0.68 of the time.
// Neighbouring blocks see nearly the same host, so the ratio of each pair of neighbouring blocks
// (one each way) cancels the drift: bench/interleaved.py, which times two settings that way in
// one process, gave quartiles within 3-10% of the median where separate processes' runs overlapped.
//
// Blocks of kBlock iterations run A B B A A B ...; the first kSettle iterations of a block are not
// counted (the switch itself costs: an OpenMP pool made or released), nor the kSettle after an
// unclean iteration (one that did not time its way alone: a divergence, a session's start); a block
// ends once it has counted kCounted. Each pair gives t(B)/t(A)
// from its blocks' mean iteration times. A first pair beyond kClear either way decides at once (a
// clearly slower way costs kBlock iterations, not a whole trial; "clear": beyond kClear times the
// gain or below it divided by kClear); otherwise B is taken where the
// median of kPairs pairs is below kGain (or the gain given), decided as soon as the pairs still to
// come cannot change that (three of four on one side, say).
//
// Plain C++ on plain numbers: the runtime feeds it co-executed iteration times (PythonRunner).
#pragma once

#include <cstdint>
#include <vector>

namespace terra {

class PairedTrial {
 public:
  static constexpr int kBlock = 6;
  static constexpr int kSettle = 2;
  static constexpr int kPairs = 4;
  static constexpr double kClear = 1.25;
  static constexpr double kGain = 0.95;
  // Iterations after which a trial that could not fill its blocks (too few clean iterations)
  // keeps A.
  static constexpr int kMaxIterations = 8 * kPairs * 2 * kBlock;

  enum class Verdict : uint8_t { Running, KeepA, TakeB };

  static constexpr int kCounted = kBlock - kSettle;  // iterations a block's time is the mean of

  PairedTrial() = default;
  // `gain`: B is taken where the median pair's t(B)/t(A) is below it (kGain by default).
  explicit PairedTrial(double gain) : gain_(gain) {}

  // Whether the next iteration runs way B (until a verdict; after it, whether B was taken).
  bool b() const { return verdict_ == Verdict::Running ? block_is_b(block_) : verdict_ == Verdict::TakeB; }
  // An iteration ran the way b() said and took `seconds`. `clean`: it measured that way alone (ran
  // wholly co-executed after an iteration that did); an unclean one starts its block's settling
  // again, and the block goes on until it has counted kCounted clean iterations.
  Verdict record(bool clean, double seconds);
  Verdict verdict() const { return verdict_; }
  // t(B) / t(A) per pair so far.
  const std::vector<double>& ratios() const { return ratios_; }
  // Goes on from the pairs an earlier trial of the same two ways had completed (their ratios, at
  // most kPairs - 1 of them taken: a trial with kPairs decided), before any iteration is recorded:
  // its next block is the one after them, and the first pair's early verdict (kClear) is theirs,
  // not the next pair's; pairs that already fix the median decide at once. The payoff check's
  // pairing left unfinished by a process that ended (runtime/payoff_memory.h).
  void resume(const std::vector<double>& ratios);

 private:
  static bool block_is_b(int block) { return ((block + 1) / 2) % 2 == 1; }  // A B B A A B B A ...
  void decide_by_pairs();  // the verdict the pairs so far fix, whatever the rest give

  double gain_ = kGain;
  Verdict verdict_ = Verdict::Running;
  int block_ = 0, settled_ = 0, counted_ = 0, iterations_ = 0;
  double sum_ = 0;
  double pair_[2] = {0, 0};  // this pair's block times: A, B
  std::vector<double> ratios_;
};

}  // namespace terra
