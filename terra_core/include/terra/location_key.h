// LocationKey: where in the user's program an operation happened, as three integers.
//
// Terra recognises "the same op again" across iterations by its location, never by its values.
// A key is the op identity (op name + overload + the structural attributes the caller chooses,
// hashed), the stack hash (the user-visible Python frames, code identity + instruction offset,
// hashed by the caller) and the occurrence: how many times this (op, stack) pair already ran in the
// current iteration. The occurrence unrolls loops that repeat the same frames (nn.Sequential, a
// Python `for` over layers) into distinct keys; `OccurrenceCounter` computes it. The variant tells
// apart nodes the runtime keeps at one location for calls it cannot validate against one template
// (ragged shapes, a `.grad` read before and after the first backward); traces merged whole use 0.
//
// Guarantees: a key is 24 bytes, compared and hashed without touching memory elsewhere. Everything
// a human wants to read (op name, file/line/function) lives in `SourceInfo`, kept beside the key and
// never compared. Op identity `kReservedOp` is Terra's own (the virtual entry and exit nodes);
// `op_identity` never returns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace terra {

// Mixes 64 bits well (splitmix64's finaliser); the building block of every hash here. Inline:
// the program thread hashes two per Python frame of every op it validates (out of line, through
// the shared library's PLT, they were 3-4% of its time on a 1x1 add chain).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Order-sensitive combination: hash_combine(a, b) != hash_combine(b, a) in general.
inline uint64_t hash_combine(uint64_t seed, uint64_t value) {
  return mix64(seed ^ (value + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2)));
}
uint64_t hash_bytes(std::string_view bytes);

inline constexpr uint64_t kReservedOp = ~uint64_t{0};

// Op identity from the op's name, overload and structural attributes (dims, flags, reduction...).
// Scalars that Terra feeds at run time must not be passed as attributes, or every new value would
// be a new op.
uint64_t op_identity(std::string_view name, std::string_view overload = {},
                     const std::vector<uint64_t>& attributes = {});

// One user-visible Python frame as the caller identifies it: code identity (a hash of the code
// object's content, so that re-running a cell with the same code keeps its keys) + instruction offset.
struct FrameId {
  uint64_t code = 0;
  uint32_t offset = 0;
};
// Stack hash of frames listed outermost first.
uint64_t stack_hash(const std::vector<FrameId>& frames);

struct LocationKey {
  uint64_t op = 0;
  uint64_t stack = 0;
  uint32_t occurrence = 0;
  uint32_t variant = 0;

  // Keys of the TraceGraph's virtual nodes: where every iteration starts and ends.
  static constexpr LocationKey entry() { return {kReservedOp, 0, 0}; }
  static constexpr LocationKey exit() { return {kReservedOp, 0, 1}; }

  friend bool operator==(const LocationKey& a, const LocationKey& b) {
    return a.op == b.op && a.stack == b.stack && a.occurrence == b.occurrence && a.variant == b.variant;
  }
  friend bool operator!=(const LocationKey& a, const LocationKey& b) { return !(a == b); }
  friend bool operator<(const LocationKey& a, const LocationKey& b) {
    if (a.op != b.op) return a.op < b.op;
    if (a.stack != b.stack) return a.stack < b.stack;
    if (a.occurrence != b.occurrence) return a.occurrence < b.occurrence;
    return a.variant < b.variant;
  }
};

struct LocationKeyHash {
  size_t operator()(const LocationKey& k) const {
    return static_cast<size_t>(hash_combine(hash_combine(k.op, k.stack), k.occurrence | uint64_t{k.variant} << 32));
  }
};

// "ab12...:cd34...#3" (and "/v2" for variant 2): stable text for logs, JSON and DOT.
std::string to_string(const LocationKey& key);

// What a person reads about an op; shared (one object per key) rather than copied per trace.
struct SourceFrame {
  std::string file;
  int line = 0;
  std::string function;
};
struct SourceInfo {
  std::string op_name;              // "aten::addmm" or "torch.nn.functional.linear"
  std::vector<SourceFrame> frames;  // outermost first
};
// The innermost frame of the user's own code: not in PyTorch, Terra or its kernel (files under
// a `torch/`, `terra/` or `terra_kernel/` directory); else the innermost frame; null if none.
const SourceFrame* user_frame(const SourceInfo& source);
// "aten::addmm at train.py:12 in step": the op and its user frame, for messages.
std::string describe(const SourceInfo& source);

// Per-iteration occurrence counts of (op, stack): the runtime calls `key` for every op it meets and
// `reset` when an iteration starts. Keys it hands out within one iteration are all distinct, which
// is what TraceGraph::merge requires of a trace.
class OccurrenceCounter {
 public:
  LocationKey key(uint64_t op, uint64_t stack);
  void reset() { counts_.clear(); }

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const {
      return static_cast<size_t>(hash_combine(p.first, p.second));
    }
  };
  std::unordered_map<std::pair<uint64_t, uint64_t>, uint32_t, PairHash> counts_;
};

}  // namespace terra
