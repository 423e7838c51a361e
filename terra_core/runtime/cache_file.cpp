#include "cache_file.h"

#include "terra/location_key.h"  // hash_combine

#include <ATen/Version.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace terra::runtime {

namespace {

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

uint64_t fingerprint(uint64_t format) {
  uint64_t h = terra::hash_combine(format, hash_string(at::show_config()));
  h = terra::hash_combine(h, hash_string(kernel_environment()));
  return terra::hash_combine(h, hash_string(cpu_identity()));
}

}  // namespace

std::string CacheFile::default_dir() {
  if (const char* dir = std::getenv("TERRA_CACHE_DIR")) {
    const std::string d(dir);
    return d == "0" || d == "off" ? std::string() : d;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/terra";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/terra";
  return {};
}

std::string CacheFile::path_in(const std::string& dir, const char* stem, uint64_t format) {
  if (dir.empty()) return {};
  char name[96];
  std::snprintf(name, sizeof name, "/%s-%016llx.bin", stem, static_cast<unsigned long long>(fingerprint(format)));
  return dir + name;
}

CacheFile::CacheFile(std::string path, size_t record_bytes, uint64_t max_bytes)
    : path_(std::move(path)), record_bytes_(record_bytes) {
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
  if (size > static_cast<off_t>(max_bytes)) return;  // emptied
  read_.resize(static_cast<size_t>(size) / record_bytes_ * record_bytes_);
  const ssize_t got = ::pread(fd_, read_.data(), read_.size(), 0);
  read_.resize(got > 0 ? static_cast<size_t>(got) / record_bytes_ * record_bytes_ : 0);
}

CacheFile::~CacheFile() {
  if (fd_ >= 0) ::close(fd_);
}

void CacheFile::append(const void* record) {
  if (fd_ < 0) return;
  // One write of one record: appends of other processes do not tear it (O_APPEND).
  if (::write(fd_, record, record_bytes_) != static_cast<ssize_t>(record_bytes_)) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace terra::runtime
