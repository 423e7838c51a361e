#include "verdicts.h"

#include <cstring>

namespace terra::runtime {

namespace {

// Bumped whenever what a verdict means changes (the check, the signature's fields).
constexpr uint64_t kFormat = 2;  // 2: up to 20 generic samples (block_replay.cpp); 1's verdicts may be wrong
// One verdict on disk: the signature, then a tag with the verdict in its lowest bit (a torn or
// foreign record does not carry the tag and is skipped).
constexpr uint64_t kTag = 0x7e77a5c4e0000000ull;
struct Record {
  uint64_t key;
  uint64_t tagged;
};

}  // namespace

std::string Verdicts::file_in(const std::string& dir) {
  return CacheFile::path_in(dir, "one_thread_verdicts", kFormat);
}

Verdicts& Verdicts::process() {
  // Never destroyed: recordings may run at exit.
  static Verdicts* v = new Verdicts(file_in(CacheFile::default_dir()));
  return *v;
}

Verdicts::Verdicts(std::string file, uint64_t max_bytes) : file_(std::move(file), sizeof(Record), max_bytes) {
  const auto& bytes = file_.records();
  for (size_t at = 0; at < bytes.size(); at += sizeof(Record)) {
    Record rec;
    std::memcpy(&rec, bytes.data() + at, sizeof rec);
    if ((rec.tagged & ~uint64_t{1}) != kTag || rec.key == 0) continue;
    same_[rec.key] = rec.tagged & 1;
    ++loaded_;
  }
}

std::optional<bool> Verdicts::find(uint64_t key) {
  if (key == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = same_.find(key);
  return it == same_.end() ? std::nullopt : std::optional<bool>(it->second);
}

void Verdicts::store(uint64_t key, bool same) {
  if (key == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  same_[key] = same;
  const Record rec{key, kTag | (same ? 1u : 0u)};
  file_.append(&rec);
}

std::string Verdicts::path() {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_.path();
}

uint64_t Verdicts::loaded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_;
}

}  // namespace terra::runtime
