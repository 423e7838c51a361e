#include "terra/location_key.h"

#include <cstdio>

namespace terra {

uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed: short names still spread well
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h);
}

uint64_t op_identity(std::string_view name, std::string_view overload,
                     const std::vector<uint64_t>& attributes) {
  uint64_t h = hash_combine(hash_bytes(name), hash_bytes(overload));
  for (uint64_t a : attributes) h = hash_combine(h, a);
  return h == kReservedOp ? h - 1 : h;
}

uint64_t stack_hash(const std::vector<FrameId>& frames) {
  uint64_t h = 0x5354414b;  // any fixed seed; an empty stack hashes to a fixed value too
  for (const FrameId& f : frames) h = hash_combine(hash_combine(h, f.code), f.offset);
  return h;
}

std::string to_string(const LocationKey& key) {
  char buf[80];
  int n = std::snprintf(buf, sizeof buf, "%016llx:%016llx#%u", static_cast<unsigned long long>(key.op),
                        static_cast<unsigned long long>(key.stack), key.occurrence);
  if (key.variant) std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "/v%u", key.variant);
  return buf;
}

const SourceFrame* user_frame(const SourceInfo& source) {
  for (auto f = source.frames.rbegin(); f != source.frames.rend(); ++f) {
    bool library = false;
    for (const char* dir : {"/torch/", "/terra/", "/terra_kernel/"})
      library = library || f->file.find(dir) != std::string::npos;
    if (!library) return &*f;
  }
  return source.frames.empty() ? nullptr : &source.frames.back();
}

std::string describe(const SourceInfo& source) {
  std::string out = source.op_name.empty() ? "op" : source.op_name;
  const SourceFrame* user = user_frame(source);
  if (!user) return out;
  const SourceFrame& f = *user;
  out += " at " + f.file + ":" + std::to_string(f.line);
  if (!f.function.empty()) out += " in " + f.function;
  return out;
}

LocationKey OccurrenceCounter::key(uint64_t op, uint64_t stack) {
  uint32_t& seen = counts_[{op, stack}];
  return {op, stack, seen++};
}

}  // namespace terra
