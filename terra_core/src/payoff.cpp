#include "terra/payoff.h"

#include "terra/median.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace terra {

void Payoff::Window::add(double x) {
  v[static_cast<size_t>(next)] = x;
  next = (next + 1) % kSamples;
  n = std::min(n + 1, kSamples);
}

double Payoff::Window::median() const {
  std::array<double, kSamples> s = v;
  return median_in_place(s.begin(), s.begin() + n);
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
  session_way_.reset();  // a pairing begun inside a session runs its blocks' ways there
  // A measuring phase times its mode afresh: older samples may be from another phase of the
  // program. The other mode's samples are recent (taken while it was held). Pairing keeps both.
  if (phase == Phase::Hold || phase == Phase::Pairing) return;
  for (auto& [id, l] : loops_) (phase == Phase::MeasureCoExec ? l.coexec : l.eager) = Window{};
}

void Payoff::record_traced(uint64_t loop, double seconds) { loops_[loop].traced.add(seconds); }

void Payoff::session_started() {
  const int last = session_records_;
  session_records_ = 0;
  session_way_.reset();
  if (phase_ == Phase::Pairing && last > 0 && last <= kShortSession) session_way_ = pairing_.b();
}

void Payoff::record(uint64_t loop, bool eager, bool clean, double seconds, double margin,
                    double check_budget, bool costs_coexec) {
  // A session longer than the short ones before it is paired in blocks inside it from here on.
  if (++session_records_ > kShortSession) session_way_.reset();
  Loop& l = loops_[loop];
  ++l.iterations;
  if (clean) (eager ? l.eager : l.coexec).add(seconds);
  if (phase_ == Phase::Hold) {
    if (--hold_left_ <= 0) start(choice_eager_ ? Phase::MeasureCoExec : Phase::MeasureEager);
    return;
  }
  if (phase_ == Phase::Pairing) {
    if (pair_loop_ == 0) pair_loop_ = loop;  // a pairing taken up: the first loop recorded
    if (loop != pair_loop_) return;  // blocks of one loop's iterations only
    const bool timed = clean || (costs_coexec && !eager);
    const auto verdict = pairing_.record(timed && eager == pairing_.b(), seconds);
    if (verdict == PairedTrial::Verdict::Running) return;
    // The times compared (explain's, hold_for's) say what the pairs said of the paired loop: the
    // latest blocks of the two modes saw different moments of the host.
    Totals t = totals(false);
    std::vector<double> ratios = pairing_.ratios();  // t(eager) / t(co-executed)
    // Neighbouring pairs ran their modes in opposite orders (A B, then B A), so a drifting host
    // moves their ratios opposite ways: their geometric means cancel it, where a trial decided on
    // an odd number of pairs (three, most of them on one side) would report one that drifted.
    for (size_t k = 0; k + 1 < ratios.size(); ++k) ratios[k] = std::sqrt(ratios[k] * ratios[k + 1]);
    if (ratios.size() > 1) ratios.pop_back();
    const Loop& l = loops_[pair_loop_];
    if (!ratios.empty() && l.coexec.n > 0 && l.eager.n > 0) {
      const double ratio = median_in_place(ratios.begin(), ratios.end());
      const double w = static_cast<double>(l.iterations);
      t.coexec += w * (l.eager.median() / ratio - l.coexec.median());
    }
    decide(verdict == PairedTrial::Verdict::TakeB, t, check_budget);
    return;
  }
  ++iterations_;
  if (clean && eager == (phase_ == Phase::MeasureEager)) ++samples_;
  if (samples_ >= kQuick && clear_winner(margin, check_budget)) return;
  // A loop that never yields clean iterations (each one diverges, say) is checked anyway.
  if (samples_ < kSamples && iterations_ < 4 * kSamples) return;
  if (phase_ == Phase::MeasureCoExec && !measured_eager_) {
    start(Phase::MeasureEager);
    return;
  }
  measured_eager_ = measured_eager_ || phase_ == Phase::MeasureEager;
  const Totals t = totals(false);
  // No loop was timed both ways: keep co-executing (it is what the program asked for).
  const double limit = t.eager * (1.0 + margin);
  const bool eager_faster = t.weight > 0 && t.coexec > limit;
  // Not clear (clear_winner did not decide): a first choice, or a change of it, is paired.
  if (t.weight > 0 && (!has_choice() || eager_faster != choice_eager_)) {
    start_pairing(margin);
    return;
  }
  decide(eager_faster, t, check_budget);
}

void Payoff::start_pairing(double margin) {
  uint64_t most = 0;
  for (const auto& [id, l] : loops_) {
    if (l.coexec.n > 0 && l.eager.n > 0 && l.iterations > most) {
      most = l.iterations;
      pair_loop_ = id;
    }
  }
  pairing_ = paired_modes(margin);
  pairs_resumed_ = 0;
  start(Phase::Pairing);
}

PairedTrial Payoff::paired_modes(double margin) {
  // Co-execution kept within the margin (a margin of -1 or less: never kept).
  return PairedTrial(1.0 / std::max(1.0 + margin, 1e-12));
}

void Payoff::resume_pairing(const std::vector<double>& ratios, double margin, double check_budget) {
  pair_loop_ = 0;
  pairing_ = paired_modes(margin);
  pairing_.resume(ratios);
  pairing_resumed_ = true;
  pairs_resumed_ = static_cast<int>(pairing_.ratios().size());
  measured_eager_ = true;  // its B blocks time eager execution
  start(Phase::Pairing);
  // Pairs that fix the median already decide now, with no times of this run's to show (a run
  // keeps none such: it decides at them).
  if (pairing_.verdict() != PairedTrial::Verdict::Running)
    decide(pairing_.verdict() == PairedTrial::Verdict::TakeB, totals(false), check_budget);
}

Payoff::Totals Payoff::totals(bool traced_for_eager) const {
  Totals t;
  for (const auto& [id, l] : loops_) {
    const Window& eager = l.eager.n == 0 && traced_for_eager ? l.traced : l.eager;
    if (l.coexec.n == 0 || eager.n == 0) continue;
    const double w = static_cast<double>(l.iterations);
    t.coexec += w * l.coexec.median();
    t.eager += w * eager.median();
    t.weight += l.iterations;
  }
  return t;
}

bool Payoff::clear_winner(double margin, double check_budget) {
  const bool eager_known = measured_eager_ || phase_ == Phase::MeasureEager;
  const Totals t = totals(!eager_known);
  if (t.weight == 0) return false;
  const double limit = t.eager * (1.0 + margin);
  if (t.coexec > limit * kClear) {
    measured_eager_ = eager_known;
    decide(true, t, check_budget);
    return true;
  }
  // Traced times only bound eager's from above: they can show co-execution slower, never faster.
  if (eager_known && t.coexec * kClear < limit) {
    measured_eager_ = true;
    decide(false, t, check_budget);
    return true;
  }
  return false;
}

int64_t Payoff::hold_for(int64_t base, double fast, double slow, double budget) {
  if (!(fast > 0) || !(slow > fast)) return std::min(base, kMaxHold);
  const double check = (kQuick + 1) * (slow - fast);  // the slower mode's extra time in a re-check
  const double needed = std::ceil(check / (budget * fast));
  return needed >= static_cast<double>(kMaxHold) ? kMaxHold
                                                 : std::max(base, static_cast<int64_t>(needed));
}

void Payoff::decide(bool eager, const Totals& t, double check_budget) {
  coexec_s_ = t.weight ? t.coexec / static_cast<double>(t.weight) : 0;
  eager_s_ = t.weight ? t.eager / static_cast<double>(t.weight) : 0;
  const bool confirms = has_choice() && eager == choice_eager_;
  const int64_t base = confirms ? std::min(kHoldGrowth * hold_, kMaxHold) : kFirstHold;
  hold_ = eager ? hold_for(base, eager_s_, coexec_s_, check_budget)
               : hold_for(base, coexec_s_, eager_s_, check_budget);
  hold_left_ = hold_;
  choice_eager_ = eager;
  ++checks_;
  start(Phase::Hold);
}

void Payoff::hold_before_any_check(bool eager, int64_t hold) {
  measured_eager_ = eager;  // a held eager choice times eager execution as it runs
  hold_ = hold_left_ = hold;
  choice_eager_ = eager;
  start(Phase::Hold);
}

void Payoff::hold_eager_first(int64_t hold) {
  if (held_first_) return;  // once: its re-check decides from then on
  held_first_ = true;
  hold_before_any_check(true, std::clamp(hold, kFirstHold, kMaxHold));
}

void Payoff::resume(bool eager, double coexec_s, double eager_s, int64_t hold) {
  resumed_ = true;
  coexec_s_ = coexec_s;
  eager_s_ = eager_s;
  hold_before_any_check(eager, std::clamp(hold, kFirstHold, kResumedHold));
}

}  // namespace terra
