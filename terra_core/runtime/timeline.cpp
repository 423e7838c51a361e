#include "timeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>

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

void Timeline::add(const Span& span) {
  Ring& ring = lanes_[static_cast<int>(span.lane)];
  const uint64_t k = ring.written.load(std::memory_order_relaxed);
  const size_t i = k % ring.capacity;
  ring.stamps[i].store(2 * k + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  ring.spans[i] = span;
  ring.stamps[i].store(2 * k + 2, std::memory_order_release);
  ring.written.store(k + 1, std::memory_order_release);
}

std::vector<Span> Timeline::spans() const {
  std::vector<Span> out;
  for (const Ring& ring : lanes_) {
    const uint64_t end = ring.written.load(std::memory_order_acquire);
    uint64_t k = std::max(ring.cleared.load(std::memory_order_acquire),
                          end > ring.capacity ? end - ring.capacity : 0);
    for (; k < end; ++k) {
      const size_t i = k % ring.capacity;
      if (ring.stamps[i].load(std::memory_order_acquire) != 2 * k + 2) continue;  // overwritten
      Span copy;
      std::memcpy(static_cast<void*>(&copy), &ring.spans[i], sizeof(Span));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (ring.stamps[i].load(std::memory_order_relaxed) != 2 * k + 2) continue;  // torn
      out.push_back(copy);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  return out;
}

void Timeline::clear() {
  for (Ring& ring : lanes_) ring.cleared.store(ring.written.load(std::memory_order_acquire));
}

uint32_t Timeline::intern(const std::string& name) {
  std::lock_guard<std::mutex> lock(names_mutex_);
  auto it = name_ids_.find(name);
  if (it != name_ids_.end()) return it->second;
  names_.push_back(name);
  const auto id = static_cast<uint32_t>(names_.size() - 1);
  name_ids_.emplace(name, id);
  return id;
}

const std::string& Timeline::name(uint32_t id) const {
  std::lock_guard<std::mutex> lock(names_mutex_);
  return id < names_.size() ? names_[id] : names_[0];  // deque: references stay valid
}

uint32_t Timeline::note(std::string detail) {
  std::lock_guard<std::mutex> lock(names_mutex_);
  details_.push_back(std::move(detail));
  if (details_.size() > kDetails) {
    details_.pop_front();
    ++details_base_;
  }
  return details_base_ + static_cast<uint32_t>(details_.size());
}

std::string Timeline::detail(uint32_t id) const {
  std::lock_guard<std::mutex> lock(names_mutex_);
  if (id <= details_base_ || id > details_base_ + details_.size()) return {};
  return details_[id - details_base_ - 1];
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace terra::runtime
