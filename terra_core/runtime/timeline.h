// Timeline: where the time of recent iterations went, per thread, for `%terra timeline`.
//
// Two lanes: the program's Python thread (one span per iteration, tagged with how it ran, plus
// nested spans where it waited for a fetch or fell back) and the GraphRunner (spans while it
// executed work items, split where the iteration that issued them changes). Spans go into a
// bounded ring, so a long run keeps only its recent past and recording costs one uncontended lock
// per span, never per op. Times are steady-clock nanoseconds.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
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
  std::string graph;       // the graph's name (Python lane; empty for the GraphRunner)
  std::string detail;      // Python lane: the op and reason of a divergence
  uint64_t ops = 0;        // GraphRunner: items executed in the span
  int64_t busy_ns = 0;     // GraphRunner: time spent executing them (the rest it waited for work)
};

class Timeline {
 public:
  static Timeline& instance();
  explicit Timeline(size_t capacity = 16384) : lanes_{Ring(capacity), Ring(capacity)} {}

  // Each lane has its own ring and lock, so the two threads never wait for each other here.
  void add(Span span);
  std::vector<Span> spans() const;  // both lanes, by start time
  void clear();

 private:
  struct Ring {
    explicit Ring(size_t capacity) : capacity(capacity) {}
    mutable std::mutex mutex;
    std::vector<Span> spans;
    size_t next = 0;  // where the next span goes once the ring is full
    size_t capacity;
  };
  Ring lanes_[2];
};

int64_t now_ns();

}  // namespace terra::runtime
