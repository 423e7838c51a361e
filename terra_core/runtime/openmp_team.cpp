#include "openmp_team.h"

#include "timeline.h"  // now_ns

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <string>
#include <thread>

namespace terra::runtime {

namespace {

using PauseAll = int (*)(int kind);
// What `#pragma omp parallel num_threads(n)` compiles to (libgomp's ABI).
using Parallel = void (*)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
constexpr int kPauseSoft = 1;  // omp_pause_soft: free the threads, keep the settings

// A function of the OpenMP runtime PyTorch loaded (the wheel bundles its own libgomp), or of the
// MKL its library links in, found by the symbol they export: Terra is linked against neither.
template <typename F>
F find(const char* name, const char* library) {
  if (library) {
    if (void* lib = dlopen(library, RTLD_LAZY | RTLD_NOLOAD)) {
      if (void* f = dlsym(lib, name)) return reinterpret_cast<F>(f);
    }
  }
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// The thread that holds the idle pool for limit_openmp_spinning: it sleeps until the wanted state
// changes. Made on first use and never joined (its state is never freed, so process exit and
// static destruction cannot race it).
struct SpinLimiter {
  std::mutex mutex;
  std::condition_variable changed;
  std::condition_variable settled;  // holds == want again
  bool want = false;
  bool holds = false;
  bool started = false;

  void loop(Parallel parallel) {
    pthread_setname_np(pthread_self(), "terra-omp-idle");
    // Lowest scheduling class, for this thread and the pool's worker it creates (threads inherit
    // it): making and releasing the pool runs libgomp's own spin waits (the region's end barrier,
    // the docked worker), about 9 ms of CPU on this 2-core machine when the process holds no more
    // OpenMP threads than CPUs. At normal priority those spins took the core that the program
    // thread, woken by a fetch's value, was queued for: corpus p01 had 8-14 steps of 1-4 ms
    // (against 120 us) in 12 runs, none with this; the pool's only job is to exist.
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return want != holds; });
      const bool hold = want;
      lock.unlock();
      if (hold) {
        parallel([](void*) {}, nullptr, 2, 0);  // an empty two-thread region: the pool
      } else {
        release_openmp_team();
      }
      lock.lock();
      holds = hold;
      settled.notify_all();
    }
  }
};

std::atomic<bool> g_limited{false};  // limit_openmp_spinning's last call, for spinning_limited

SpinLimiter* limiter() {
  static SpinLimiter* const instance = [] {
    // A forked child (a DataLoader worker) has no such thread, and its copy of the mutex may
    // have been held by it: start afresh there.
    pthread_atfork(nullptr, nullptr, [] {
      new (limiter()) SpinLimiter();
      g_limited.store(false, std::memory_order_relaxed);
    });
    return new SpinLimiter();
  }();
  return instance;
}

}  // namespace

void limit_openmp_spinning(bool on) {
  static const Parallel parallel = find<Parallel>("GOMP_parallel", "libgomp.so.1");
  if (!parallel) return;
  // Called at every iteration start: no lock when nothing changes (g_limited is `want`, kept
  // lock-free for openmp_spinning_limited).
  if (g_limited.exchange(on, std::memory_order_relaxed) == on) return;
  SpinLimiter* l = limiter();
  std::lock_guard<std::mutex> lock(l->mutex);
  l->want = on;
  if (!l->started) {
    l->started = true;
    std::thread([l] { l->loop(parallel); }).detach();
  }
  l->changed.notify_one();
}

void settle_openmp_spinning() {
  SpinLimiter* l = limiter();
  std::unique_lock<std::mutex> lock(l->mutex);
  if (l->started) l->settled.wait(lock, [&] { return l->holds == l->want; });
}

bool openmp_spinning_limited() { return g_limited.load(std::memory_order_relaxed); }

namespace {
thread_local bool t_region_noted = false;
thread_local int64_t t_region_ns = INT64_MIN / 2;  // when the last noted region was seen
}  // namespace

void note_parallel_region() {
  // With the spinning limited, the workers slept again within about 30 us.
  if (!openmp_spinning_limited()) t_region_noted = true;
}

bool openmp_workers_spinning() {
  if (openmp_spinning_limited()) return false;
  const int64_t now = now_ns();
  if (t_region_noted) {
    t_region_noted = false;
    t_region_ns = now;
  }
  return now - t_region_ns < kWorkerSpinNs;
}


static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
              "a futex word");
std::atomic<int> TeamRegion::state_{0};
std::atomic<int> TeamRegion::sleepers_{0};
std::atomic<uint64_t> TeamRegion::waits_{0};

TeamRegion::TeamRegion(bool open) : open_(open) {
  if (open_) state_.store(1, std::memory_order_seq_cst);
}

TeamRegion::~TeamRegion() {
  if (!open_) return;
  // seq_cst both: a sleeper counted after this load found the state 0 in its futex call.
  state_.store(0, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

void TeamRegion::wait_out() {
  if (!is_open()) return;
  waits_.fetch_add(1, std::memory_order_relaxed);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  // The futex call sleeps only while the state is still 1; the timeout bounds a wake-up lost to
  // anything unforeseen (a region is a kernel's length: microseconds to milliseconds).
  const timespec bound{0, 2'000'000};
  while (state_.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAIT_PRIVATE, 1, &bound, nullptr, 0);
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

namespace {

// A thread's name (its /proc comm, without the newline); empty where it cannot be read.
std::string thread_name(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/comm", static_cast<int>(tid));
  std::FILE* f = std::fopen(path, "re");
  if (!f) return {};
  char name[32] = {};
  const bool ok = std::fgets(name, sizeof name, f) != nullptr;
  std::fclose(f);
  if (!ok) return {};
  name[std::strcspn(name, "\n")] = '\0';
  return name;
}

// The threads of this process named as thread `owner`, itself aside: the threads it made (a new
// thread carries its maker's name; libgomp names none of its own), its OpenMP workers. `listed`:
// adds the threads listed; `unread`: set where one's name could not be read (it was ending).
std::vector<pid_t> threads_named_like(pid_t owner, size_t* listed = nullptr, bool* unread = nullptr) {
  std::vector<pid_t> workers;
  const std::string name = thread_name(owner);
  DIR* dir = name.empty() ? nullptr : opendir("/proc/self/task");
  if (!dir) return workers;
  while (const dirent* e = readdir(dir)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid <= 0) continue;
    if (listed) ++*listed;
    if (tid == owner) continue;
    const std::string other = thread_name(tid);
    if (other.empty() && unread) *unread = true;  // ending while listed
    if (other == name) workers.push_back(tid);
  }
  closedir(dir);
  // A thread made or ended during the listing may show a thread twice (procfs lists by position).
  std::sort(workers.begin(), workers.end());
  workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
  return workers;
}

// /proc/self/task's link count: 2 + the process's thread count; 0 where it cannot be read.
uint64_t task_links() {
  struct stat task {};
  return stat("/proc/self/task", &task) == 0 ? static_cast<uint64_t>(task.st_nlink) : 0;
}

// The calling thread's lowering of its workers: one thread-local, so each check below is one
// lookup (set_intraop_threads runs it at every thread-count switch of a replayed block).
struct LoweredWorkers {
  int nice = 0;     // lower_openmp_workers's setting
  int threads = 1;  // the largest intra-op count set since the pool was released: its size
  int upto = 1;     // the pool's workers up to this count were lowered ...
  int by = 0;       // ... by this much
  uint64_t links = 0;  // /proc/self/task's link count at the last look that found no workers (0: look)
};
thread_local LoweredWorkers t_lowered;

pid_t thread_id() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Linux keeps a nice value per thread: PRIO_PROCESS with a thread id sets that thread's only.
int nice_of(pid_t tid) {
  errno = 0;
  const int n = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  return errno ? 0 : n;
}

// Whether the calling thread has OpenMP workers now (threads_named_like), looked for again only
// when the process's thread count changed since the last look that found none.
bool workers_made(LoweredWorkers& l) {
  const uint64_t links = task_links();
  if (links != 0 && links == l.links) return false;
  size_t listed = 0;
  bool unread = false;
  const bool made = !threads_named_like(thread_id(), &listed, &unread).empty();
  // The count is remembered only where the listing was the settled set of threads: a released
  // pool's worker that ended while it was listed (counted, then gone or unreadable), and a new
  // worker made after, left the count as remembered and the new worker was never lowered (the
  // OpenMPTeam.LoweredWorkers... GoogleTest failed so once in CI, session 47, and in session 45).
  const bool settled = !unread && links != 0 && links == listed + 2 && task_links() == links;
  l.links = made || !settled ? 0 : links;
  return made;
}

void lower_workers(int threads, int by) {
  static const Parallel parallel = find<Parallel>("GOMP_parallel", "libgomp.so.1");
  static const auto thread_num = find<int (*)()>("omp_get_thread_num", "libgomp.so.1");
  if (!parallel || !thread_num) return;
  struct Want {
    int nice;
    int (*thread_num)();
  } want{std::min(19, nice_of(thread_id()) + by), thread_num};
  // An empty region of `threads` threads: the pool's workers (made now if need be) set their own.
  parallel(
      [](void* p) {
        const auto* w = static_cast<const Want*>(p);
        if (w->thread_num() != 0) setpriority(PRIO_PROCESS, static_cast<id_t>(thread_id()), w->nice);
      },
      &want, static_cast<unsigned>(threads), 0);
}

}  // namespace

void lower_openmp_workers(int nice) {
  nice = std::clamp(nice, 0, 19);
  LoweredWorkers& l = t_lowered;
  if (nice != l.nice) {
    if (nice < l.by) release_openmp_team();  // their priority cannot be raised back
    l.nice = nice;
    l.upto = 1;  // lowered again (or not) below
  }
  if (l.nice == 0 || l.threads <= l.upto || !workers_made(l)) return;
  lower_workers(l.threads, l.nice);
  l.upto = l.threads;
  l.by = l.nice;
}

void ready_openmp_workers(int threads) {
  LoweredWorkers& l = t_lowered;
  if (threads > l.threads) l.threads = threads;
}

namespace {

// The per-thread count setters, found once (absent without libgomp or MKL).
struct IntraopSetters {
  int (*omp_get)() = find<int (*)()>("omp_get_max_threads", "libgomp.so.1");
  void (*omp_set)(int) = find<void (*)(int)>("omp_set_num_threads", "libgomp.so.1");
  // What mkl.h maps mkl_set_num_threads_local to (the lower-case symbol is the Fortran
  // interface, which takes a pointer); it returns the previous count.
  int (*mkl_set)(int) = find<int (*)(int)>("MKL_Set_Num_Threads_Local", "libtorch_cpu.so");
};
const IntraopSetters& intraop_setters() {
  static const IntraopSetters setters;
  return setters;
}

}  // namespace

void set_intraop_threads(int n) {
  const IntraopSetters& f = intraop_setters();
  if (f.omp_set) f.omp_set(n);
  if (f.mkl_set) f.mkl_set(n);
  ready_openmp_workers(n);
}

IntraopThreads swap_intraop_threads(int n) {
  const IntraopSetters& f = intraop_setters();
  IntraopThreads previous;
  if (f.omp_get && f.omp_set) {
    previous.omp = f.omp_get();
    f.omp_set(n);
  }
  if (f.mkl_set) previous.mkl = f.mkl_set(n);
  return previous;
}

void restore_intraop_threads(const IntraopThreads& previous) {
  const IntraopSetters& f = intraop_setters();
  if (f.omp_set && previous.omp > 0) f.omp_set(previous.omp);
  if (f.mkl_set && previous.mkl >= 0) f.mkl_set(previous.mkl);
}

namespace {

// The CPU clock of thread `tid` of this process: what pthread_getcpuclockid makes from a thread's
// id (Linux's MAKE_THREAD_CPUCLOCK: the id inverted, per-thread, scheduler time).
clockid_t thread_cpu_clock(pid_t tid) { return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 4 | 2); }

}  // namespace

void WorkerCpuClock::list(pid_t owner) {
  owner_ = owner;
  clocks_.clear();
  for (const pid_t tid : threads_named_like(owner)) clocks_.push_back(thread_cpu_clock(tid));
}

double WorkerCpuClock::seconds(pid_t owner, bool& changed) {
  struct stat task {};
  if (owner <= 0 || stat("/proc/self/task", &task) != 0) return -1.0;
  changed = owner != owner_ || static_cast<uint64_t>(task.st_nlink) != links_;
  if (changed) {
    links_ = task.st_nlink;
    list(owner);
  }
  int64_t ns = 0;
  for (const clockid_t clock : clocks_) {
    timespec t{};
    if (clock_gettime(clock, &t) != 0) {
      links_ = 0;  // a worker exited: list them again next time
      continue;
    }
    ns += static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  }
  return static_cast<double>(ns) * 1e-9;
}

void release_openmp_team() {
  static const PauseAll pause = find<PauseAll>("omp_pause_resource_all", "libgomp.so.1");
  if (pause) pause(kPauseSoft);
  t_lowered.upto = 1;  // the workers are gone
  t_lowered.by = 0;
  t_lowered.links = 0;  // new ones are looked for afresh
}

}  // namespace terra::runtime
