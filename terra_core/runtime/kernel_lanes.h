// Kernel lanes: the independent kernels of one replayed item run on two threads.
//
// Every co-executing benchmark program is bound by the GraphRunner (its busy time is 95-99% of
// the step's), while the program thread waits for it for much of the step: hf_llama's program
// thread used 2.45 ms of CPU per 4.65 ms step, the GraphRunner 4.12. A backward's kernels are
// largely independent of each other (each linear layer's input and weight gradients, the
// attention's branches): of one training step's kernels, two threads could run the backward in
// 0.84 (hf_llama), 0.87 (gpt) and 0.92 (hf_bert) of the time on one (a list schedule over the
// kernels' data dependencies, measured below autograd with a dispatch mode).
//
// So an item with many kernels (a backward) gets a `LanePlan` when its block is recorded: which
// of its kernels must wait for which. A kernel that only reads its arguments and makes new
// values (no argument written, no random numbers, the same bits with one intra-op thread, a CPU
// kernel) is free: it waits only for the kernels that made its arguments (and, where it drops a
// table entry as its last reader, for the entry's other readers). Every other kernel is a
// barrier: it runs on the GraphRunner once every kernel before it is done, and no kernel after
// it starts before it ends, as in issue order. A free kernel writes nothing another kernel reads
// but its own new outputs, and runs with one intra-op thread wherever it runs, as the ordered
// replay runs it: the results are the ordered replay's, bit for bit.
//
// The second thread is the program thread, while it waits for the GraphRunner (ahead of it, or
// for a value; GraphRunner::wait_for): a thread of its own competed with the program's Python
// for the second core and made hf_llama slower (forced co-execution, 4.2-4.4 -> 4.9-5.6 ms per
// step). The GraphRunner takes the lowest ready kernel, the helper the highest ready one before
// the next barrier (the one the GraphRunner needs last), each claimed with a compare-and-swap;
// the helper takes only kernels that ran at least kHelpNs when recorded (shorter ones cost more
// in cache lines moving between the cores than they save), and leaves while the GraphRunner runs
// a kernel with the program's intra-op threads (its OpenMP worker needs the core) or after
// kIdleNs without work, called back once the GraphRunner is past the next barrier. The helper
// runs them in the GraphRunner's thread-local state (grad and inference mode, its dispatch keys
// less the recording hook), whatever its own is. Only while the GraphRunner's OpenMP workers
// sleep (BlockReplayer::run). A kernel's exception is raised on
// the GraphRunner after the item, the lowest-numbered one first; the kernels after a failed one
// are skipped (barriers could not start anyway).
//
// Measured (bench/results/forced_coexec_lanes.md, forced co-execution with the workers asleep,
// 3 interleaved rounds, ms per step, lanes off -> on): hf_bert 5.97 -> 4.69, gpt 7.73 -> 7.71,
// hf_gpt2 6.60 -> 6.63 in runs of 40 steps; in runs of 150 (`forced_coexec_lanes_150.md`)
// hf_bert 5.59 -> 5.59, hf_llama 4.48 -> 4.52: the program thread's CPU rose by the kernels it
// ran (2.14 -> 3.14 ms per step) while the GraphRunner's did not fall (4.68 -> 4.76), waiting
// for them. Off by default: `terra.config(lanes=True)` or TERRA_LANES=1.
#pragma once

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

namespace terra::runtime {

struct LanePlan {
  std::vector<uint8_t> barrier;       // per kernel of the item (local index)
  std::vector<uint32_t> dep_offsets;  // kernel i waits for deps[dep_offsets[i] .. dep_offsets[i + 1])
  std::vector<uint32_t> deps;         // local indices, each below the kernel's own
  uint32_t free = 0;                  // kernels that are not barriers
  // Per kernel: free, and long enough for another thread (kHelpNs when recorded): a shorter one
  // costs more in cache lines moving between the cores than it saves.
  std::vector<uint8_t> helped;
  // Per kernel: a barrier run with more than one intra-op thread (its bits need the program's
  // count): the OpenMP worker it wakes needs the core, so a helper leaves rather than spin.
  std::vector<uint8_t> parallel;

  uint32_t size() const { return static_cast<uint32_t>(barrier.size()); }
  // Plans are made for items of at least this many kernels, at least kMinFree of them worth a
  // helping thread (free, and at least kHelpNs when recorded).
  static constexpr uint32_t kMinKernels = 16;
  static constexpr uint32_t kMinFree = 4;
  static constexpr uint32_t kHelpNs = 10'000;
};

// Builds a plan from each kernel's table reads and writes. `reads[i]`: table entries kernel i
// reads; `outs[i]`: entries it makes; `drops[i]`: entries it drops after it (its release list);
// `free[i]`: whether it may run beside others. Null where the item is not worth it (too few
// kernels, too few free ones).
std::unique_ptr<LanePlan> make_lane_plan(const std::vector<std::vector<uint32_t>>& reads,
                                         const std::vector<std::vector<uint32_t>>& outs,
                                         const std::vector<std::vector<uint32_t>>& drops,
                                         const std::vector<bool>& free, const std::vector<bool>& helped,
                                         const std::vector<bool>& parallel);

class KernelLanes {
 public:
  // `on_job`: called on the GraphRunner as a job opens (to wake a program thread asleep in a
  // wait, which may then help).
  explicit KernelLanes(std::function<void()> on_job = {}) : on_job_(std::move(on_job)) {}
  KernelLanes(const KernelLanes&) = delete;
  KernelLanes& operator=(const KernelLanes&) = delete;

  // GraphRunner thread: runs kernels 0 .. plan.size() - 1 with `run(i, helped)`, on this thread
  // or, for free kernels, on a thread inside `help` (`helped` true there), whose dispatch keys
  // are then `keys` (the GraphRunner's own, less its recording hook). Returns when every kernel
  // is done and no other thread is inside, with the number of kernels another thread ran;
  // rethrows the exception of the lowest-numbered kernel that threw.
  uint32_t run(const LanePlan& plan, c10::impl::LocalDispatchKeySet keys,
           const std::function<void(uint32_t, bool)>& run);
  // Another thread (the program thread while it waits for the GraphRunner): takes ready free
  // kernels of the open job, with one intra-op thread, while `waiting()` holds. Returns when the
  // job has no kernel left to take, `waiting()` turned false, or no kernel became ready for
  // kIdleNs (the GraphRunner is on a long barrier; it calls `on_job` again once it is past it).
  // `seen`: the call that let this thread in, which does not let it in again.
  void help(const std::function<bool()>& waiting, uint64_t& seen);
  // Whether help() has work for a thread that last came in on `seen`.
  bool has_job(uint64_t seen) const {
    return job_.load() != nullptr && calls_.load() != seen;
  }
  static constexpr int64_t kIdleNs = 50'000;

 private:
  struct Job;
  // Claims and runs ready kernels of `job` until none is left to claim (`helper`: only free
  // ones, and only while `waiting()`).
  // Returns whether it left idle (helper only).
  bool work(Job& job, bool helper, const std::function<bool()>* waiting);

  void call_for_help();  // GraphRunner thread
  std::function<void()> on_job_;
  std::atomic<Job*> job_{nullptr};  // the open job (null: none)
  std::atomic<uint64_t> calls_{0};  // calls for help: a job opened, or a barrier passed after a helper left idle
  std::atomic<bool> left_idle_{false};  // a helper left the open job idle
  std::atomic<int> inside_{0};     // threads inside help() that may hold job_
};

}  // namespace terra::runtime
