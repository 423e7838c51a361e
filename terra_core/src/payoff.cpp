#include "terra/payoff.h"

#include <algorithm>
#include <utility>

namespace terra {

void Payoff::Window::add(double x) {
  v[static_cast<size_t>(next)] = x;
  next = (next + 1) % kSamples;
  n = std::min(n + 1, kSamples);
}

double Payoff::Window::median() const {
  std::array<double, kSamples> s = v;
  for (int i = 1; i < n; ++i)  // insertion sort of the n samples
    for (int j = i; j > 0 && s[static_cast<size_t>(j - 1)] > s[static_cast<size_t>(j)]; --j)
      std::swap(s[static_cast<size_t>(j - 1)], s[static_cast<size_t>(j)]);
  return n % 2 ? s[static_cast<size_t>(n / 2)] : 0.5 * (s[static_cast<size_t>(n / 2 - 1)] + s[static_cast<size_t>(n / 2)]);
}

std::vector<Payoff::LoopTimes> Payoff::loops() const {
  std::vector<LoopTimes> out;
  for (const auto& [id, l] : loops_)
    out.push_back({id, l.iterations, l.coexec.n ? l.coexec.median() : 0, l.eager.n ? l.eager.median() : 0});
  std::sort(out.begin(), out.end(), [](const LoopTimes& a, const LoopTimes& b) { return a.iterations > b.iterations; });
  return out;
}

void Payoff::start(Phase phase) {
  phase_ = phase;
  samples_ = iterations_ = 0;
}

void Payoff::record(uint64_t loop, bool eager, bool clean, double seconds, double margin) {
  Loop& l = loops_[loop];
  ++l.iterations;
  if (clean) (eager ? l.eager : l.coexec).add(seconds);
  if (phase_ == Phase::Hold) {
    if (--hold_left_ <= 0) start(choice_eager_ ? Phase::MeasureCoExec : Phase::MeasureEager);
    return;
  }
  ++iterations_;
  if (clean && eager == (phase_ == Phase::MeasureEager)) ++samples_;
  // A loop that never yields clean iterations (each one diverges, say) is checked anyway.
  if (samples_ < kSamples && iterations_ < 4 * kSamples) return;
  if (phase_ == Phase::MeasureCoExec && !measured_eager_) {
    start(Phase::MeasureEager);
    return;
  }
  measured_eager_ = measured_eager_ || phase_ == Phase::MeasureEager;
  check(margin);
}

void Payoff::check(double margin) {
  double coexec = 0, eager = 0;
  for (const auto& [id, l] : loops_) {
    if (l.coexec.n == 0 || l.eager.n == 0) continue;
    const double w = static_cast<double>(l.iterations);
    coexec += w * l.coexec.median();
    eager += w * l.eager.median();
  }
  uint64_t total = 0;
  for (const auto& [id, l] : loops_)
    if (l.coexec.n && l.eager.n) total += l.iterations;
  // No loop was timed both ways: keep co-executing (it is what the program asked for).
  const bool choose_eager = total > 0 && coexec > eager * (1.0 + margin);
  hold_ = checks_ > 0 && choose_eager == choice_eager_ ? std::min(2 * hold_, kMaxHold) : kFirstHold;
  hold_left_ = hold_;
  choice_eager_ = choose_eager;
  coexec_s_ = total ? coexec / static_cast<double>(total) : 0;
  eager_s_ = total ? eager / static_cast<double>(total) : 0;
  ++checks_;
  start(Phase::Hold);
}

}  // namespace terra
