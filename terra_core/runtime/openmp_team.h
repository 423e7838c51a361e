// One OpenMP team per process: the team moves to the thread that runs the kernels.
//
// libgomp gives every thread that starts a parallel region a pool of worker threads of its own,
// kept until that thread exits. Once the GraphRunner has run one op large enough for intra-op
// threads, a process on a machine with as many cores as a pool has threads holds more OpenMP
// threads than CPUs; libgomp then stops spinning, and every parallel region of *either* thread
// becomes a futex hand-off. Measured on 2 cores, torch 2.13, in the program thread while the
// GraphRunner only kept its pool: F.linear 8x16->32 4.1 -> 47 us, a 100k-element sum 6.4 -> 57
// us, a 256x256 matmul 173 -> 260 us (bench/results/openmp_team.md).
//
// So at most one thread holds a pool at a time. The program thread releases its pool when its
// ops start going to the GraphRunner (an iteration begins co-executing); the GraphRunner releases
// its pool, as a work item in issue order, before the program thread runs ops itself again
// (leaving co-execution: a divergence, an opaque region, the end of a session). Releasing costs
// 0.25 us without a pool, about 90 us with one (its workers exit; the next parallel region makes
// new ones) — measured 0.2-0.5 ms inside real programs — so within a session the team moves at
// most once per 20 ms (a program that diverges every iteration would otherwise pay it twice per
// iteration: corpus p22 4.16x eager's step time against 1.05x without moves); in between, the
// process may hold both teams for a while. Leaving a session always takes the GraphRunner's away.
//
// Keeping both teams while co-executing was measured too (bench/run.py, 5 rounds, 2 process
// rounds, ratio to fresh-process eager, two teams vs one): resnet 2.08 vs 1.30, gpt 1.82 vs
// 1.74, stochastic_downsampling 2.54 vs 1.75, rl_cartpole 1.13 vs 1.10. With two, every parallel
// region of the GraphRunner is a futex hand-off (a chain of 256x256 adds: 65 vs 23 us/op).
//
// Results do not depend on which thread owns the team: each op still runs with the program
// thread's intra-op thread count (the GraphRunner sets it per item), so parallel reductions split
// their work exactly as eager execution does.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace terra::runtime {

// Releases the calling thread's OpenMP worker pool, if it has one (OpenMP 5.0's
// omp_pause_resource_all). A no-op inside a parallel region or without an OpenMP runtime.
void release_openmp_team();

// Sets the calling thread's intra-op thread count, for that thread only: OpenMP's nthreads ICV
// (what at::get_num_threads() and at::parallel_for read) and MKL's thread-local count.
//
// Not at::set_num_threads: besides the two, that one changes process-wide state the program's own
// ops see. It turns MKL's dynamic threading off, so from then on MKL splits even a 32x64 tanh or a
// small sgemm over every thread of the program thread's team as well (a process that never called
// it runs them on one thread: eager ops were slower and started OpenMP teams eager never has,
// and MKL's sgemm gives other bits with another thread count); it clears oneDNN's primitive cache
// (every convolution of the program rebuilds its primitive); it resizes the pthreadpool.
void set_intraop_threads(int n);
// The calling thread's counts as set_intraop_threads sets them, to put back exactly.
struct IntraopThreads {
  int omp = 0;   // OpenMP's nthreads ICV
  int mkl = -1;  // MKL's thread-local count (0: MKL's global one); -1: no MKL
};
// Sets `n` like set_intraop_threads and returns what was set before.
IntraopThreads swap_intraop_threads(int n);
void restore_intraop_threads(const IntraopThreads& previous);

// While the GraphRunner holds the team, its idle workers should wait asleep, not spinning.
//
// After each parallel region libgomp's workers spin for the next one: about 9 ms on this 2-core
// machine (GOMP_SPINCOUNT's default of 300000 pauses), unless the process holds more OpenMP
// threads than CPUs, when they spin 1000 pauses (about 30 us) and then sleep. Co-executing, the
// GraphRunner replays most kernels with one thread but some with the program's count (kernels
// whose bits depend on it, layer_norm's backward; large ones while the program waits), so its
// worker spun nearly all the time on the core the program thread needed: measured on hf_bert,
// forced co-execution, 10-12 ms of CPU per step beyond the GraphRunner's own 10, on 2 cores.
//
// But a sleeping worker costs a wake-up (a futex, about 70 us more per parallel region after a
// gap here), and programs whose GraphRunner runs many parallel regions lost: forced co-execution,
// step time against eager's, spinning -> asleep (bench/results/worker_spin_forced.md): hf_llama
// 1.23 -> 0.95, hf_bert 1.52 -> 1.46, gpt 1.32 -> 1.33, but resnet 1.00 -> 1.49, dcgan 1.11 ->
// 1.40, music_transformer 1.21 -> 1.31. So a graph co-executes with its workers asleep only when
// co-execution with them spinning lost to eager execution, and keeps them so while that wins
// (Graph::workers_asleep). Timing both ways up front cost short programs too much: corpus
// programs of 30-60 iterations took up to 4x eager's step time, their payoff check delayed.
//
// `true` makes a thread of Terra's own hold an idle two-thread pool (it and one worker, both
// asleep), so the process holds more OpenMP threads than CPUs and libgomp's short spin applies;
// `false` releases that pool, and eager execution spins as it always does. Both return at once:
// the thread does the work (a parallel region that makes the pool, omp_pause_resource_all). Only
// the time idle workers spin changes: nothing runs with another thread count. A no-op without
// libgomp.
void limit_openmp_spinning(bool on);
// Waits until the last limit_openmp_spinning call has taken effect (the pool made or released):
// leaving co-execution, the program's own parallel regions then find one pool, its own.
void settle_openmp_spinning();
// Whether the limit is on (the last call's `on`): a kernel is then not spread over the program's
// threads to speed the GraphRunner up while the program waits (RecordedKernel::spread), since
// each spread would wait for a worker to wake.
bool openmp_spinning_limited();

// Whether the calling thread's OpenMP workers are likely spinning now, because a parallel region
// of its ended within the last kWorkerSpinNs (note_parallel_region) and the spinning is not
// limited. libgomp's idle workers spin about 9 ms after each region here (see above).
//
// The GraphRunner uses it to spread kernels: a one-thread kernel is spread over the program's
// threads while the program waits only when it is long (RecordedKernel::spread), because a
// parallel region wakes a worker that then spins on the core the program's Python needs; while
// the workers spin anyway (a kernel whose bits need the program's count, a convolution, ran
// moments ago), that cost is paid and every kernel is spread. Measured on detector_numpy_nms
// (forced co-execution, convolutions every step, the program waiting for the forward at a NumPy
// stage): 17.0-18.5 ms per step with long kernels alone spread, 14.4-16.5 with all (eager
// 11.9-12.6).
bool openmp_workers_spinning();
// A kernel large enough for a parallel region ran on the calling thread with more than one
// intra-op thread (ignored while the spinning is limited). Costs a thread-local store; the time
// is taken at the next openmp_workers_spinning, which only a waiting program asks for: a region
// before a pause of any length counts as spinning at the next wait. Taking it at the region was
// tried in session 44 and not kept: in one 3-round run hf_llama took 0.89 of eager's step against
// 0.73 (bench/results/s44_all12.md, where "Terra" is that build), but the kernels spread while
// the program waited vary from 6,800 to 10,900 per 40 steps between runs of one build, so
// neither way was shown better.
void note_parallel_region();
constexpr int64_t kWorkerSpinNs = 8'000'000;

// The calling thread's OpenMP workers run `nice` steps below it in CPU priority (0: as it).
//
// Co-executing on two cores, three threads want them: the program thread's Python, the
// GraphRunner and its worker. The worker computes only in the GraphRunner's parallel regions (a
// kernel whose bits need the program's count, a long one while the program waits) and spins for
// the next region in between, about 9 ms after each here: on gpt it spun 27% of the process's
// samples while the GraphRunner, busy for 99% of each step, got 88% of a core. At a lower
// priority, the spinning worker yields its core to the program thread or the GraphRunner whenever
// either is runnable, and takes it when both wait (the program waiting for the GraphRunner is
// when most kernels are spread). Only the time each thread gets changes: no kernel runs with
// another thread count.
//
// Lowers workers the pool already has, at this call (each iteration's start on the GraphRunner):
// threads of the process named as the calling thread (a thread it made carries its name; libgomp
// names none of its own), listed again only when the process's thread count changed since the
// last look (a stat of /proc/self/task otherwise). Workers a later parallel region makes run at
// the thread's priority until the next call. Lowering never makes a pool: an empty region made
// one for it before, at the GraphRunner's first switch to the program's thread count, and a
// GraphRunner whose kernels all ran with one thread (small ops, blocks checked to give the same
// bits so) then held a worker it never used. Worse, every session paid for it: the session's end
// releases the GraphRunner's pool (the team goes back to the program), the next session's first
// co-executed iteration made a new one, and the new worker, woken on the core where the
// GraphRunner spun at the region's barrier, waited 3-7 ms for it (perf sched: the other core
// idle meanwhile). tabular_mlp, 5-step `terra.run` calls in one process: 3.8-12 ms per call
// against 1.7 eager, 1.2-1.3 ms with the workers never lowered (bench/results/short_calls.md).
//
// Raising a worker's priority back needs a privilege, so lowering less than before releases the
// pool instead (its next region makes new workers). The program thread's own pool is never
// lowered: only the GraphRunner calls this.
void lower_openmp_workers(int nice);
// The calling thread's next parallel regions may have `threads` threads: workers up to that count
// are lowered at the next lower_openmp_workers once they exist. A thread-local compare.
void ready_openmp_workers(int threads);

// A parallel region of the GraphRunner's is open: the program thread gives its core up for it.
//
// Co-executing on two cores, the GraphRunner's parallel regions share the second core between
// its OpenMP worker and the program thread's Python, and the worker runs `lower_openmp_workers`
// steps below it: a region started while the program runs Python waits at its closing barrier
// until the scheduler gives the worker the core. Kernels whose bits need the program's thread
// count run such regions whatever the program does (layer_norm's backward splits its weight
// gradients per thread): on gpt, forced co-execution, the GraphRunner's master waited at that
// barrier for 14% of the process's samples (eager's main thread: 2%), 12 of them in the five
// layer_norm backwards per step, on a GraphRunner busy for the whole step.
//
// So the GraphRunner opens a TeamRegion around each kernel it replays or binds with more than one
// thread that runs a parallel region (on tensors of the grain size, or splitting its work by thread
// whatever its size: one whose bits need the count), and the program thread, at its next issued op
// (`wait_out`, after an atomic load that finds none open nearly always), sleeps until it closes:
// the worker takes the core at once and the program loses what the region has left. A region the
// program is already waiting through (RecordedKernel::spread) costs it nothing.
class TeamRegion {
 public:
  explicit TeamRegion(bool open);  // GraphRunner thread; nothing happens when `open` is false
  ~TeamRegion();
  TeamRegion(const TeamRegion&) = delete;
  TeamRegion& operator=(const TeamRegion&) = delete;
  static bool is_open() { return state_.load(std::memory_order_relaxed) != 0; }
  // Program thread: returns once no region is open, asleep meanwhile (a futex on the state).
  static void wait_out();
  static uint64_t waits() { return waits_.load(std::memory_order_relaxed); }  // wait_out calls that found one open

 private:
  bool open_;
  static std::atomic<int> state_;     // 1 while a region is open
  static std::atomic<int> sleepers_;  // program threads asleep in wait_out
  static std::atomic<uint64_t> waits_;
};

// The CPU time one thread's OpenMP workers have taken, read from another thread: the program
// thread weighs the GraphRunner's spinning workers against sleeping ones by it
// (PythonRunner::choose_workers).
//
// Its workers are the threads it created: Linux names a new thread after the one that made it,
// and libgomp names none of its own, so they are the other threads with its name
// (/proc/self/task, listed again whenever the process's thread count changes). The process's CPU
// clock less the program thread's and the GraphRunner's counted every other thread too: in a
// test run, the other threads of the process took 11% of the wall time of co-executed iterations
// whose GraphRunner never ran a parallel region, and its workers were tried asleep for it.
class WorkerCpuClock {
 public:
  // Seconds of CPU the workers of thread `owner` (a thread id) took so far, or -1 where it cannot
  // be read; `changed` is set when the workers were listed again (another set: the sum is not
  // comparable with the previous one). Not thread-safe: one reading thread.
  double seconds(pid_t owner, bool& changed);

 private:
  void list(pid_t owner);
  pid_t owner_ = 0;
  uint64_t links_ = 0;  // /proc/self/task's link count when listed: 2 + the thread count
  std::vector<clockid_t> clocks_;
};

}  // namespace terra::runtime
