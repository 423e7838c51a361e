#include "payoff_memory.h"

#include <algorithm>
#include <cmath>

namespace terra::runtime {

namespace {

// Bumped whenever what a choice means changes (the check, the key's parts).
constexpr uint64_t kFormat = 2;  // 2: pairings in progress
// A torn or foreign record does not carry the tag and is skipped.
constexpr uint64_t kTag = 0x7e77a9a4ull << 32;
constexpr uint64_t kTagMask = 0xffffffffull << 32;
constexpr uint64_t kEager = 1, kAsleep = 2, kRetimed = 4, kSettled = 8, kChosen = 16, kPairing = 32;  // flags

}  // namespace

PayoffChoiceCodec::Record PayoffChoiceCodec::encode(uint64_t key, const PayoffChoice& c) {
  const uint64_t hold = static_cast<uint64_t>(std::clamp<int64_t>(c.hold, 0, 0xffffff));
  const uint64_t tagged = kTag | hold << 8 | (c.eager ? kEager : 0) | (c.workers_asleep ? kAsleep : 0) |
                          (c.retimed_coexec ? kRetimed : 0) | (c.workers_settled ? kSettled : 0) |
                          (c.chosen ? kChosen : 0) | (c.pairing ? kPairing : 0);
  Record rec{key, tagged, c.coexec_s, c.eager_s, {}, 0};
  for (double r : c.pairs) {
    if (rec.n_pairs == PayoffChoice::kPairsKept) break;
    rec.pairs[rec.n_pairs++] = static_cast<float>(r);
  }
  return rec;
}

std::optional<PayoffChoice> PayoffChoiceCodec::decode(const Record& rec) {
  const bool times_ok = std::isfinite(rec.coexec_s) && std::isfinite(rec.eager_s) && rec.coexec_s >= 0 &&
                        rec.eager_s >= 0;
  if ((rec.tagged & kTagMask) != kTag || !times_ok || rec.n_pairs > PayoffChoice::kPairsKept) return std::nullopt;
  PayoffChoice c;
  c.chosen = rec.tagged & kChosen;
  c.pairing = rec.tagged & kPairing;
  if (!c.chosen && !c.pairing) return std::nullopt;  // nothing to start from
  c.pairs.assign(rec.pairs, rec.pairs + rec.n_pairs);
  c.eager = rec.tagged & kEager;
  c.workers_asleep = rec.tagged & kAsleep;
  c.retimed_coexec = rec.tagged & kRetimed;
  c.workers_settled = rec.tagged & kSettled;
  c.hold = static_cast<int64_t>((rec.tagged >> 8) & 0xffffff);
  c.coexec_s = rec.coexec_s;
  c.eager_s = rec.eager_s;
  return c;
}

std::string PayoffMemory::file_in(const std::string& dir) {
  return CacheFile::path_in(dir, "payoff_choices", kFormat);
}

PayoffMemory& PayoffMemory::process() {
  static PayoffMemory* m = new PayoffMemory(file_in(CacheFile::default_dir()));  // never destroyed
  return *m;
}

}  // namespace terra::runtime
