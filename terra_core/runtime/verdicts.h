// One-thread verdicts: whether a kernel, called with given argument geometry, gives the same bits
// with one intra-op thread as with the program's count (block_replay.h: Block::one_thread).
//
// A recording checks each kernel it has no verdict for by running it three more times on copies
// of its arguments; on a small convolutional network that was 90-110 ms of the first co-executed
// iteration (8 eager steps). Verdicts are kept for the process, and in a file per machine and
// PyTorch build, so a program run again (a notebook restarted and run again, a script launched
// again) records its blocks without checking what an earlier run checked (cache_file.h: where
// the file is, what its name depends on; without one, verdicts last for the process only and
// kernels are checked as before).
#pragma once

#include "cache_file.h"

#include <cstdint>
#include <optional>
#include <string>

namespace terra::runtime {

// One verdict on disk: the signature, then a tag with the verdict in its lowest bit.
struct VerdictCodec {
  using Value = bool;  // the kernel gives the same bits with one intra-op thread
  struct Record {
    uint64_t key;
    uint64_t tagged;
  };
  static Record encode(uint64_t key, bool same);
  static std::optional<bool> decode(const Record& rec);
};

// Key 0: a kernel without a signature (never known). find, store (appended to the cache file),
// path ("" when off or unusable) and loaded (verdicts the file held when read): CachedTable.
class Verdicts : public CachedTable<VerdictCodec> {
 public:
  // The process's verdicts, read from the cache file on first use.
  static Verdicts& process();

  // A table on its own file ("" for none), read at once. A file grown past `max_bytes` (every
  // distinct kernel signature adds 16 bytes: programs with ever-new shapes keep adding) is
  // emptied and started again: the verdicts are only a cache.
  static constexpr uint64_t kMaxFileBytes = 16ull << 20;
  explicit Verdicts(std::string file, uint64_t max_bytes = kMaxFileBytes)
      : CachedTable(std::move(file), max_bytes) {}

  // The cache file for this machine and PyTorch build under `dir` ("" when `dir` is empty).
  static std::string file_in(const std::string& dir);
};

}  // namespace terra::runtime
