// Timeline: where the time of recent iterations went, per thread, for `%terra timeline`.
//
// Two lanes: the program's Python thread (one span per iteration, tagged with how it ran, plus
// nested spans where it waited for a fetch or fell back) and the GraphRunner (spans while it
// executed work items, split where the iteration that issued them changes). Spans go into a
// bounded ring per lane, so a long run keeps only its recent past. Each ring has one writer (its
// lane's thread), and recording a span is a plain copy of a trivially copyable struct between two
// stores, no lock and no string copy (names and divergence details are interned, off the per-
// iteration path); readers copy a slot and keep it only if its stamp did not change meanwhile
// (a sequence lock per slot). Times are steady-clock nanoseconds.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace terra::runtime {

enum class Lane : uint8_t { Python, Graph };

enum class SpanKind : uint8_t {
  Tracing,    // an iteration run eagerly and recorded
  CoExec,     // an iteration whose ops went to the GraphRunner
  Fallback,   // an iteration that left co-execution (the span of the whole iteration) ...
  Eager,      // an iteration past the policy's caps: eager, unrecorded
  FetchWait,  // the Python thread waiting for a value the GraphRunner computes
  Diverge,    // ... and, nested, the wait for in-flight work when it left
  Busy,       // the GraphRunner executing work items
};

const char* to_string(Lane lane);
const char* to_string(SpanKind kind);

struct Span {
  Lane lane = Lane::Python;
  SpanKind kind = SpanKind::Tracing;
  int64_t start_ns = 0, end_ns = 0;
  uint64_t iteration = 0;  // serial number of the iteration, over all graphs
  uint64_t boundary = 0;   // Python lane: the loop (iteration boundary id) the iteration belongs to
  uint32_t graph = 0;      // the graph's name (Timeline::intern; 0 for the GraphRunner)
  uint32_t detail = 0;     // Python lane: the op and reason of a divergence (Timeline::note; 0: none)
  uint64_t ops = 0;        // GraphRunner: items executed in the span
  int64_t busy_ns = 0;     // GraphRunner: time spent executing them (the rest it waited for work)
};

class Timeline {
 public:
  static Timeline& instance();
  explicit Timeline(size_t capacity = 16384) : lanes_{Ring(capacity), Ring(capacity)} {}

  // Only the lane's own thread adds to it, so the two threads never wait for each other here.
  void add(const Span& span);
  std::vector<Span> spans() const;  // both lanes, by start time
  void clear();

  // A stable id for a graph name (kept for the life of the process; names are few).
  uint32_t intern(const std::string& name);
  const std::string& name(uint32_t id) const;
  // An id for a divergence detail; the newest kDetails stay readable.
  uint32_t note(std::string detail);
  std::string detail(uint32_t id) const;
  static constexpr size_t kDetails = 1024;

 private:
  struct Ring {
    explicit Ring(size_t capacity)
        : capacity(capacity), spans(capacity), stamps(new std::atomic<uint64_t>[capacity]) {
      for (size_t i = 0; i < capacity; ++i) stamps[i].store(0, std::memory_order_relaxed);
    }
    size_t capacity;
    std::vector<Span> spans;
    // Per slot: 2k+1 while the k-th span is written into it, 2k+2 once it is complete.
    std::unique_ptr<std::atomic<uint64_t>[]> stamps;
    std::atomic<uint64_t> written{0};  // spans added so far
    std::atomic<uint64_t> cleared{0};  // spans below this count were cleared
  };
  Ring lanes_[2];
  mutable std::mutex names_mutex_;
  std::deque<std::string> names_{""};  // id 0: no name
  std::unordered_map<std::string, uint32_t> name_ids_;
  std::deque<std::string> details_;     // the newest kDetails, ids from details_base_ + 1
  uint32_t details_base_ = 0;
};

int64_t now_ns();

}  // namespace terra::runtime
