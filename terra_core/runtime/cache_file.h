// A cache file: fixed-size records appended to a file in Terra's cache directory, one file per
// kind of record and per machine and PyTorch build, read whole when a process opens it.
//
// What is kept there is measured on this machine with this build (one-thread verdicts,
// verdicts.h; the payoff check's choices, payoff_memory.h), so the file's name holds a
// fingerprint of what the measurements depend on besides their keys: PyTorch's build
// configuration (`at::show_config()`: version, compiler, BLAS and oneDNN versions, the CPU
// capability kernels dispatch to), the environment variables that choose MKL's, oneDNN's and
// ATen's code paths (MKL_CBWR, DNNL_MAX_CPU_ISA...), the CPU model and its feature flags, and the
// record's own format version.
//
// Where: $TERRA_CACHE_DIR, else $XDG_CACHE_HOME/terra, else ~/.cache/terra; TERRA_CACHE_DIR=0
// turns the files off. A file that cannot be read or written is ignored (its records then last
// for the process only); one grown past its limit is emptied and started again; a record whose
// tag is not the kind's (torn by a crash, another format) is skipped. Appends are single writes
// to a file opened with O_APPEND: processes sharing a file do not tear each other's records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace terra::runtime {

class CacheFile {
 public:
  // $TERRA_CACHE_DIR, $XDG_CACHE_HOME/terra, ~/.cache/terra; "" when turned off.
  static std::string default_dir();
  // `dir`/`stem`-<fingerprint of the machine, the build and `format`>.bin ("" when `dir` is empty).
  static std::string path_in(const std::string& dir, const char* stem, uint64_t format);

  // Opens (making its directory) the file at `path` ("": none) for records of `record_bytes`;
  // emptied first where it is larger than `max_bytes`.
  CacheFile(std::string path, size_t record_bytes, uint64_t max_bytes);
  ~CacheFile();
  CacheFile(const CacheFile&) = delete;
  CacheFile& operator=(const CacheFile&) = delete;

  // The whole records the file held when opened, back to back, oldest first.
  const std::vector<char>& records() const { return read_; }
  // Appends one record of `record_bytes`; after a failed write the file is left alone.
  void append(const void* record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  size_t record_bytes_;
  int fd_ = -1;
  std::vector<char> read_;
};

// Values by key (0: none), kept for the process and in a CacheFile ("" for none: the process
// only). `Codec` names the on-disk `Record` (trivially copyable, its first member `uint64_t key`)
// and the `Value`, and turns one into the other: `encode(key, value)`, `decode(record)` (nullopt:
// a torn or foreign record, skipped). A later record of a key wins. Thread-safe.
template <typename Codec>
class CachedTable {
 public:
  using Value = typename Codec::Value;
  using Record = typename Codec::Record;

  CachedTable(std::string file, uint64_t max_bytes) : file_(std::move(file), sizeof(Record), max_bytes) {
    const std::vector<char>& bytes = file_.records();
    for (size_t at = 0; at + sizeof(Record) <= bytes.size(); at += sizeof(Record)) {
      Record rec;
      std::memcpy(&rec, bytes.data() + at, sizeof rec);
      const std::optional<Value> value = rec.key != 0 ? Codec::decode(rec) : std::nullopt;
      if (!value) continue;
      values_[rec.key] = *value;
      ++loaded_;
    }
  }
  std::optional<Value> find(uint64_t key) {
    if (key == 0) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    return it == values_.end() ? std::nullopt : std::optional<Value>(it->second);
  }
  // Keeps `value` for the process, and appends it to the file.
  void store(uint64_t key, const Value& value) {
    if (key == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    const Record rec = Codec::encode(key, value);
    file_.append(&rec);
  }
  // The file ("" when off or unusable), and how many records it held when read.
  std::string path() {
    std::lock_guard<std::mutex> lock(mutex_);
    return file_.path();
  }
  uint64_t loaded() {
    std::lock_guard<std::mutex> lock(mutex_);
    return loaded_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint64_t, Value> values_;
  CacheFile file_;
  uint64_t loaded_ = 0;
};

}  // namespace terra::runtime
