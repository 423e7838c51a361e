#include "verdicts.h"

namespace terra::runtime {

namespace {

// Bumped whenever what a verdict means changes (the check, the signature's fields).
constexpr uint64_t kFormat = 2;  // 2: up to 20 generic samples (block_replay.cpp); 1's verdicts may be wrong
// A torn or foreign record does not carry the tag and is skipped.
constexpr uint64_t kTag = 0x7e77a5c4e0000000ull;

}  // namespace

VerdictCodec::Record VerdictCodec::encode(uint64_t key, bool same) { return {key, kTag | (same ? 1u : 0u)}; }

std::optional<bool> VerdictCodec::decode(const Record& rec) {
  if ((rec.tagged & ~uint64_t{1}) != kTag) return std::nullopt;
  return (rec.tagged & 1) != 0;
}

std::string Verdicts::file_in(const std::string& dir) {
  return CacheFile::path_in(dir, "one_thread_verdicts", kFormat);
}

Verdicts& Verdicts::process() {
  // Never destroyed: recordings may run at exit.
  static Verdicts* v = new Verdicts(file_in(CacheFile::default_dir()));
  return *v;
}

}  // namespace terra::runtime
