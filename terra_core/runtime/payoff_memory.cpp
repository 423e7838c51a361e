#include "payoff_memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace terra::runtime {

namespace {

// Bumped whenever what a choice means changes (the check, the key's parts).
constexpr uint64_t kFormat = 1;
// One choice on disk: the key; a tag in the upper half (a torn or foreign record does not carry
// it and is skipped), the hold below it and the flags in the lowest byte; the two times.
constexpr uint64_t kTag = 0x7e77a9a4ull << 32;
constexpr uint64_t kTagMask = 0xffffffffull << 32;
enum Flag : uint64_t { kEager = 1, kAsleep = 2, kRetimed = 4, kSettled = 8 };
struct Record {
  uint64_t key;
  uint64_t tagged;
  double coexec_s, eager_s;
};

uint64_t tagged(const PayoffMemory::Choice& c) {
  const uint64_t hold = static_cast<uint64_t>(std::clamp<int64_t>(c.hold, 0, 0xffffff));
  return kTag | hold << 8 | (c.eager ? kEager : 0) | (c.workers_asleep ? kAsleep : 0) |
         (c.retimed_coexec ? kRetimed : 0) | (c.workers_settled ? kSettled : 0);
}

std::optional<PayoffMemory::Choice> choice_of(const Record& rec) {
  const bool times_ok = std::isfinite(rec.coexec_s) && std::isfinite(rec.eager_s) && rec.coexec_s >= 0 &&
                        rec.eager_s >= 0;
  if ((rec.tagged & kTagMask) != kTag || rec.key == 0 || !times_ok) return std::nullopt;
  PayoffMemory::Choice c;
  c.eager = rec.tagged & kEager;
  c.workers_asleep = rec.tagged & kAsleep;
  c.retimed_coexec = rec.tagged & kRetimed;
  c.workers_settled = rec.tagged & kSettled;
  c.hold = static_cast<int64_t>((rec.tagged >> 8) & 0xffffff);
  c.coexec_s = rec.coexec_s;
  c.eager_s = rec.eager_s;
  return c;
}

}  // namespace

std::string PayoffMemory::file_in(const std::string& dir) {
  return CacheFile::path_in(dir, "payoff_choices", kFormat);
}

PayoffMemory& PayoffMemory::process() {
  static PayoffMemory* m = new PayoffMemory(file_in(CacheFile::default_dir()));  // never destroyed
  return *m;
}

PayoffMemory::PayoffMemory(std::string file, uint64_t max_bytes) : file_(std::move(file), sizeof(Record), max_bytes) {
  const auto& bytes = file_.records();
  for (size_t at = 0; at < bytes.size(); at += sizeof(Record)) {
    Record rec;
    std::memcpy(&rec, bytes.data() + at, sizeof rec);
    const auto choice = choice_of(rec);
    if (!choice) continue;
    choices_[rec.key] = *choice;
    ++loaded_;
  }
}

std::optional<PayoffMemory::Choice> PayoffMemory::find(uint64_t key) {
  if (key == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = choices_.find(key);
  return it == choices_.end() ? std::nullopt : std::optional<Choice>(it->second);
}

void PayoffMemory::store(uint64_t key, const Choice& choice) {
  if (key == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  choices_[key] = choice;
  const Record rec{key, tagged(choice), choice.coexec_s, choice.eager_s};
  file_.append(&rec);
}

std::string PayoffMemory::path() {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_.path();
}

uint64_t PayoffMemory::loaded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_;
}

}  // namespace terra::runtime
