#include "verdicts.h"

#include "terra/location_key.h"  // hash_combine

#include <ATen/Version.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

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

uint64_t hash_string(const std::string& s) { return std::hash<std::string>{}(s); }

// The lines of /proc/cpuinfo that name the first CPU's model and features.
std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, out;
  int wanted = 2;
  while (wanted > 0 && std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) {
      out += line + "\n";
      --wanted;
    }
  }
  return out;
}

// Settings read from the environment that choose kernel code paths without showing in
// `at::show_config()`.
std::string kernel_environment() {
  std::string out;
  for (const char* name : {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
                           "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_CPU_ISA_HINTS",
                           "ONEDNN_CPU_ISA_HINTS", "OPENBLAS_CORETYPE"}) {
    const char* value = std::getenv(name);
    out += std::string(name) + "=" + (value ? value : "") + "\n";
  }
  return out;
}

uint64_t fingerprint() {
  uint64_t h = terra::hash_combine(kFormat, hash_string(at::show_config()));
  h = terra::hash_combine(h, hash_string(kernel_environment()));
  return terra::hash_combine(h, hash_string(cpu_identity()));
}

}  // namespace

std::string Verdicts::default_dir() {
  if (const char* dir = std::getenv("TERRA_CACHE_DIR")) {
    const std::string d(dir);
    return d == "0" || d == "off" ? std::string() : d;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/terra";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/terra";
  return {};
}

std::string Verdicts::file_in(const std::string& dir) {
  if (dir.empty()) return {};
  char name[64];
  std::snprintf(name, sizeof name, "/one_thread_verdicts-%016llx.bin",
                static_cast<unsigned long long>(fingerprint()));
  return dir + name;
}

Verdicts& Verdicts::process() {
  static Verdicts* v = new Verdicts(file_in(default_dir()));  // never destroyed: recordings may run at exit
  return *v;
}

Verdicts::Verdicts(std::string file, uint64_t max_bytes) : path_(std::move(file)) { read(max_bytes); }

Verdicts::~Verdicts() {
  if (fd_ >= 0) ::close(fd_);
}

void Verdicts::read(uint64_t max_bytes) {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  fd_ = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    path_.clear();
    return;
  }
  const off_t size = ::lseek(fd_, 0, SEEK_END);
  if (size > static_cast<off_t>(max_bytes) && ::ftruncate(fd_, 0) != 0) {
    ::close(fd_);
    fd_ = -1;
    path_.clear();
    return;
  }
  std::vector<Record> records(static_cast<size_t>(size) / sizeof(Record));
  const ssize_t got = ::pread(fd_, records.data(), records.size() * sizeof(Record), 0);
  records.resize(got > 0 ? static_cast<size_t>(got) / sizeof(Record) : 0);
  for (const Record& rec : records) {
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
  if (fd_ < 0) return;
  // One write of one record: appends of other processes do not tear it (O_APPEND).
  const Record rec{key, kTag | (same ? 1u : 0u)};
  if (::write(fd_, &rec, sizeof rec) != static_cast<ssize_t>(sizeof rec)) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string Verdicts::path() {
  std::lock_guard<std::mutex> lock(mutex_);
  return path_;
}

uint64_t Verdicts::loaded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_;
}

}  // namespace terra::runtime
