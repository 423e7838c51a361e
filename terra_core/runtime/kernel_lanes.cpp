#include "kernel_lanes.h"

#include <ATen/ThreadLocalState.h>

#include "openmp_team.h"
#include "spin.h"
#include "timeline.h"  // now_ns

#include <algorithm>
#include <unordered_map>

namespace terra::runtime {

namespace {

enum State : uint8_t { kPending = 0, kClaimed = 1, kDone = 2 };

// How far past the lowest unclaimed kernel a thread looks for a ready one.
constexpr uint32_t kWindow = 32;

}  // namespace

std::unique_ptr<LanePlan> make_lane_plan(const std::vector<std::vector<uint32_t>>& reads,
                                         const std::vector<std::vector<uint32_t>>& outs,
                                         const std::vector<std::vector<uint32_t>>& drops,
                                         const std::vector<bool>& free, const std::vector<bool>& helped,
                                         const std::vector<bool>& parallel) {
  const uint32_t n = static_cast<uint32_t>(free.size());
  const uint32_t free_count = static_cast<uint32_t>(std::count(free.begin(), free.end(), true));
  const uint32_t helped_count = static_cast<uint32_t>(std::count(helped.begin(), helped.end(), true));
  if (n < LanePlan::kMinKernels || helped_count < LanePlan::kMinFree) return nullptr;
  auto plan = std::make_unique<LanePlan>();
  plan->free = free_count;
  plan->barrier.resize(n);
  plan->helped.assign(helped.begin(), helped.end());
  plan->parallel.assign(parallel.begin(), parallel.end());
  plan->dep_offsets.reserve(n + 1);
  std::unordered_map<uint32_t, uint32_t> maker;                  // table entry -> kernel
  std::unordered_map<uint32_t, std::vector<uint32_t>> readers;  // table entry -> kernels so far
  int64_t last_barrier = -1;
  std::vector<uint32_t> mine;
  for (uint32_t i = 0; i < n; ++i) {
    plan->barrier[i] = !free[i];
    plan->dep_offsets.push_back(static_cast<uint32_t>(plan->deps.size()));
    mine.clear();
    if (free[i]) {
      if (last_barrier >= 0) mine.push_back(static_cast<uint32_t>(last_barrier));
      for (uint32_t id : reads[i])
        if (auto m = maker.find(id); m != maker.end()) mine.push_back(m->second);
      for (uint32_t id : drops[i])  // dropped after it: every other reader must be done
        if (auto r = readers.find(id); r != readers.end()) mine.insert(mine.end(), r->second.begin(), r->second.end());
      std::sort(mine.begin(), mine.end());
      mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
      plan->deps.insert(plan->deps.end(), mine.begin(), mine.end());
    } else {
      last_barrier = i;  // waits for everything before it (KernelLanes::work)
    }
    for (uint32_t id : reads[i]) readers[id].push_back(i);
    for (uint32_t id : outs[i]) maker[id] = i;
  }
  plan->dep_offsets.push_back(static_cast<uint32_t>(plan->deps.size()));
  return plan;
}

struct KernelLanes::Job {
  const LanePlan& plan;
  const std::function<void(uint32_t, bool)>& run;
  c10::impl::LocalDispatchKeySet keys;
  // The GraphRunner's thread-local state (grad and inference mode, modes, hooks), which a helping
  // thread takes on: a program thread waiting inside `torch.inference_mode()` would otherwise
  // make the kernels' outputs inference tensors, which the GraphRunner's next in-place kernel on
  // them refuses.
  at::ThreadLocalState tls;
  std::unique_ptr<std::atomic<uint8_t>[]> state;
  std::atomic<uint32_t> done{0};
  std::atomic<uint32_t> low{0};  // every kernel below it is claimed
  std::atomic<bool> failed{false};
  std::atomic<uint32_t> helped{0};
  std::atomic<bool> parallel_running{false};  // the GraphRunner runs a LanePlan::parallel kernel
  std::mutex error_mutex;
  uint32_t error_index = UINT32_MAX;
  std::exception_ptr error;

  Job(const LanePlan& p, const std::function<void(uint32_t, bool)>& r, c10::impl::LocalDispatchKeySet k)
      : plan(p), run(r), keys(k), state(new std::atomic<uint8_t>[p.size()]) {
    for (uint32_t i = 0; i < p.size(); ++i) state[i].store(kPending, std::memory_order_relaxed);
  }

  bool ready(uint32_t i) const {
    if (plan.barrier[i]) return done.load(std::memory_order_acquire) == i;  // see the header
    for (uint32_t d = plan.dep_offsets[i]; d < plan.dep_offsets[i + 1]; ++d)
      if (state[plan.deps[d]].load(std::memory_order_acquire) != kDone) return false;
    return true;
  }
};

bool KernelLanes::work(Job& job, bool helper, const std::function<bool()>* waiting) {
  const LanePlan& plan = job.plan;
  const uint32_t n = plan.size();
  int64_t idle_since = 0;
  uint32_t idle_scans = 0;
  for (;;) {
    uint32_t low = job.low.load(std::memory_order_acquire);
    while (low < n && job.state[low].load(std::memory_order_acquire) != kPending) ++low;
    for (uint32_t seen = job.low.load(std::memory_order_relaxed);
         seen < low && !job.low.compare_exchange_weak(seen, low, std::memory_order_acq_rel);) {
    }
    if (low >= n) {
      if (helper || job.done.load(std::memory_order_acquire) == n) return false;
      cpu_relax();
      continue;
    }
    if (helper && !(*waiting)()) return false;
    // The GraphRunner takes the lowest ready kernel; a helper the highest one before the next
    // barrier, the one the GraphRunner will need last.
    uint32_t end = std::min(n, low + kWindow);
    if (helper) {
      for (uint32_t i = low; i < end; ++i)
        if (plan.barrier[i]) {
          end = i;
          break;
        }
    }
    bool claimed = false;
    for (uint32_t k = 0; k < end - low; ++k) {
      const uint32_t i = helper ? end - 1 - k : low + k;
      if (job.state[i].load(std::memory_order_acquire) != kPending) continue;
      if (plan.barrier[i]) {
        if (!job.ready(i)) break;  // nothing after it may start before it
      } else if ((helper && !plan.helped[i]) || !job.ready(i)) {
        continue;
      }
      uint8_t expected = kPending;
      if (!job.state[i].compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) continue;
      claimed = true;
      if (helper) job.helped.fetch_add(1, std::memory_order_relaxed);
      const bool parallel = !helper && plan.parallel[i];
      if (parallel) job.parallel_running.store(true);
      if (!job.failed.load(std::memory_order_acquire)) {
        try {
          job.run(i, helper);
        } catch (...) {
          std::lock_guard<std::mutex> lock(job.error_mutex);
          if (i < job.error_index) {
            job.error_index = i;
            job.error = std::current_exception();
          }
          job.failed.store(true, std::memory_order_release);
        }
      }
      if (parallel) job.parallel_running.store(false);
      job.state[i].store(kDone, std::memory_order_release);
      job.done.fetch_add(1, std::memory_order_acq_rel);
      if (!helper && plan.barrier[i] && left_idle_.exchange(false)) call_for_help();
      break;
    }
    if (claimed) {
      idle_scans = 0;
      continue;
    }
    if (helper && job.parallel_running.load()) return true;
    for (int k = 0; k < 16; ++k) cpu_relax();
    if (helper && ++idle_scans % 32 == 0) {
      const int64_t now = now_ns();
      if (idle_scans == 32) {
        idle_since = now;
      } else if (now - idle_since > kIdleNs) {
        return true;  // the GraphRunner is on a long barrier: the program thread sleeps meanwhile
      }
    }
  }
}

uint32_t KernelLanes::run(const LanePlan& plan, c10::impl::LocalDispatchKeySet keys,
                      const std::function<void(uint32_t, bool)>& run) {
  Job job(plan, run, keys);
  left_idle_.store(false);
  job_.store(&job);
  call_for_help();
  work(job, /*helper=*/false, nullptr);
  job_.store(nullptr);
  while (inside_.load() != 0) cpu_relax();  // a helper finishing its kernel, or leaving
  if (job.error) std::rethrow_exception(job.error);
  return job.helped.load(std::memory_order_relaxed);
}

void KernelLanes::help(const std::function<bool()>& waiting, uint64_t& seen) {
  if (job_.load() == nullptr) return;  // no job open (always, with lanes off): nothing to count
  // seq_cst throughout: either the GraphRunner sees this thread inside before it ends the job,
  // or this thread sees the job gone.
  inside_.fetch_add(1);
  struct Leave {
    std::atomic<int>& inside;
    ~Leave() { inside.fetch_sub(1); }
  } leave{inside_};
  const uint64_t calls = calls_.load();
  Job* job = job_.load();
  if (job == nullptr || calls == seen) return;
  seen = calls;
  at::ThreadLocalStateGuard tls(job->tls);
  c10::impl::ForceDispatchKeyGuard keys(job->keys);  // its keys less the recording hook
  const IntraopThreads previous = swap_intraop_threads(1);  // kernels with one thread's bits
  struct Restore {
    IntraopThreads previous;
    ~Restore() { restore_intraop_threads(previous); }
  } restore{previous};
  if (work(*job, /*helper=*/true, &waiting)) left_idle_.store(true);
}

void KernelLanes::call_for_help() {
  calls_.fetch_add(1);
  if (on_job_) on_job_();
}

}  // namespace terra::runtime
