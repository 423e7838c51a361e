// Payoff memory: the payoff check's latest choice for a loop, kept across processes.
//
// A graph's payoff check (terra/payoff.h) times co-execution against eager execution before it
// knows which is faster: a few iterations of each, and where the two are close, alternating
// blocks of both. A process that starts again (a notebook restarted and run again, a script
// launched again) paid that again for every graph, though nothing it measures had changed:
// rl_cartpole's 5-step calls, which co-execution makes slower, ran at 0.67 of eager's speed while
// it explored, and a notebook's first calls are what its user sees. So each check's choice is
// kept in a cache file (cache_file.h: one per machine and PyTorch build), under a key made of
// what the choice was measured on: the ops of the loop's iteration in order (names, output dtypes
// and sizes; not where the program wrote them, so a notebook cell edited and run again, another
// graph with the same ops, starts from it too), the intra-op thread count and the payoff margin.
// A graph whose loop has a remembered choice starts holding it as long as the check that made it
// held it (Payoff::resume; at most Payoff::kResumedHold), with the GraphRunner's idle workers the way that run had found best,
// and is then checked as usual: a changed machine or load is found at the first re-check, which
// stores its own choice. Policy::remember_payoff turns it off.
#pragma once

#include "cache_file.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace terra::runtime {

// A check's outcome, and what the graph had learnt of its GraphRunner's idle workers by then
// (Graph::workers_asleep, retimed_coexec, workers_trial); or a check still timing the two modes
// in alternating blocks (Payoff::Phase::Pairing), with the pairs it had completed (kept after each).
struct PayoffChoice {
  bool chosen = true;                // a check made a choice (the one below)
  bool eager = false;                // eager execution was the faster
  double coexec_s = 0, eager_s = 0;  // the per-iteration times the check compared
  int64_t hold = 0;                  // iterations the choice was held for
  bool workers_asleep = false, retimed_coexec = false, workers_settled = false;
  bool pairing = false;              // a check was pairing the modes (Payoff::resume_pairing)
  std::vector<double> pairs;         // its pairs' t(eager) / t(co-executed), the first kPairsKept
  static constexpr uint32_t kPairsKept = 3;  // PairedTrial::kPairs - 1: a fourth pair decides
};

// One choice on disk: the key; a tag in the upper half, the hold below it and the flags in the
// lowest byte; the two times; the pairing's pairs (n_pairs of them).
struct PayoffChoiceCodec {
  using Value = PayoffChoice;
  struct Record {
    uint64_t key;
    uint64_t tagged;
    double coexec_s, eager_s;
    float pairs[PayoffChoice::kPairsKept];
    uint32_t n_pairs;
  };
  static Record encode(uint64_t key, const PayoffChoice& c);
  static std::optional<PayoffChoice> decode(const Record& rec);
};

// find, store, path and loaded: CachedTable.
class PayoffMemory : public CachedTable<PayoffChoiceCodec> {
 public:
  using Choice = PayoffChoice;
  // The process's memory, read from its cache file on first use.
  static PayoffMemory& process();

  // Every check of every graph, and every pair of a pairing, adds 48 bytes: emptied past this.
  static constexpr uint64_t kMaxFileBytes = 4ull << 20;
  explicit PayoffMemory(std::string file, uint64_t max_bytes = kMaxFileBytes)
      : CachedTable(std::move(file), max_bytes) {}
  // The cache file for this machine and PyTorch build under `dir` ("" when `dir` is empty).
  static std::string file_in(const std::string& dir);
};

}  // namespace terra::runtime
