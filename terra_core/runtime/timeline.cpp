#include "timeline.h"

#include <algorithm>
#include <chrono>

namespace terra::runtime {

const char* to_string(Lane lane) { return lane == Lane::Python ? "python" : "graph"; }

const char* to_string(SpanKind kind) {
  switch (kind) {
    case SpanKind::Tracing: return "tracing";
    case SpanKind::CoExec: return "coexec";
    case SpanKind::Fallback: return "fallback";
    case SpanKind::Eager: return "eager";
    case SpanKind::FetchWait: return "fetch_wait";
    case SpanKind::Diverge: return "diverge";
    case SpanKind::Busy: return "busy";
  }
  return "?";
}

Timeline& Timeline::instance() {
  static auto* timeline = new Timeline();  // the GraphRunner thread may outlive static destruction
  return *timeline;
}

void Timeline::add(Span span) {
  Ring& ring = lanes_[static_cast<int>(span.lane)];
  std::lock_guard<std::mutex> lock(ring.mutex);
  if (ring.spans.size() < ring.capacity) {
    ring.spans.push_back(std::move(span));
    return;
  }
  ring.spans[ring.next] = std::move(span);
  ring.next = (ring.next + 1) % ring.capacity;
}

std::vector<Span> Timeline::spans() const {
  std::vector<Span> out;
  for (const Ring& ring : lanes_) {
    std::lock_guard<std::mutex> lock(ring.mutex);
    for (size_t i = 0; i < ring.spans.size(); ++i)
      out.push_back(ring.spans[(ring.next + i) % ring.spans.size()]);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  return out;
}

void Timeline::clear() {
  for (Ring& ring : lanes_) {
    std::lock_guard<std::mutex> lock(ring.mutex);
    ring.spans.clear();
    ring.next = 0;
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace terra::runtime
