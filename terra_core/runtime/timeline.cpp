#include "timeline.h"

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
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(span));
    return;
  }
  ring_[next_] = std::move(span);
  next_ = (next_ + 1) % capacity_;
}

std::vector<Span> Timeline::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Span> out;
  out.reserve(ring_.size());
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

void Timeline::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.clear();
  next_ = 0;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace terra::runtime
