// GraphRunner: the thread that executes the symbolic graph's ops while Python keeps running.
//
// The PythonRunner validates each op against the TraceGraph and issues a WorkItem; the
// GraphRunner executes items strictly in issue order through the PyTorch dispatcher (autograd
// included), so results, RNG consumption and in-place updates of parameters, gradients and
// optimizer state are those of eager execution. It never takes the GIL and never calls Python.
//
// Items live in a fixed ring owned by the Python thread: the Python thread fills an item, the
// GraphRunner executes it and advances `done`, and only the Python thread clears an item (when it
// reuses it or drains), so references to user-visible tensors are dropped on the Python side.
// The one exception goes the other way: values the GraphRunner allocated whose placeholders die
// in the Python thread travel back in an item's `garbage` and are freed by the GraphRunner, so
// memory is freed by the thread that allocated it (no cross-thread frees on malloc's arena locks).
//
// Waking: the GraphRunner spins briefly when it runs out of work, then sleeps; the Python thread
// wakes it once a batch of items is pending (or when it waits for one), not per item, and is
// itself woken only when the item it waits for is done.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernel_counts.h"
#include "placeholder.h"
#include "streams.h"
#include "thread_state.h"

namespace terra::runtime {

class PlaceholderPool;  // placeholder.h

// The time on a CPU-time clock (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID, a thread's
// pthread_getcpuclockid), in seconds.
inline double cpu_clock_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct OutSpec;  // op_template.h

enum class OpKind : uint8_t {
  Aten,       // an ATen operator called through the dispatcher
  Backward,   // torch.autograd.backward(roots, grad_tensors, retain_graph, create_graph)
  GradRead,   // reading `tensor.grad`
  GradWrite,  // assigning `tensor.grad = value` (or None)
  Marker,     // an iteration boundary (TraceGraph node only; never executed)
  ReleaseTeam,  // runner control, never a graph node: give up the OpenMP team (openmp_team.h)
                // and clear the autocast weight cast cache (the program runs ops itself next)
  ClearAutocastCache,  // runner control: the program's autocast region ended (thread_state.h)
  EndIteration,  // runner control: the co-executed iteration whose items precede it is complete
                 // (its block may be recorded, block_replay.h)
  DropGraph,     // runner control: the graph `WorkItem::graph` was dropped (terra.reset): its
                 // blocks go, with their kept results (out_form.h)
};

// Runner control (GraphRunner::run_control), never a graph node: the kinds from ReleaseTeam on.
constexpr bool is_control(OpKind kind) { return kind >= OpKind::ReleaseTeam; }

struct WorkItem {
  OpKind kind = OpKind::Aten;
  const c10::OperatorHandle* op = nullptr;
  bool grad_mode = true;
  bool inference_mode = false;
  AutocastState autocast;                   // thread_state.h
  torch::jit::Stack args;                   // as the program passed them; placeholders resolved late
  std::vector<std::shared_ptr<Slot>> outs;  // slots of the placeholders handed out, by return index
  const std::vector<OutSpec>* expect = nullptr;  // traced metadata of those outputs
  uint32_t node = 0;                        // TraceGraph node, for error reports
  uint64_t graph = 0;                       // Graph::serial of the node's graph (0: none)
  uint64_t sequence_floor = 0;              // autograd sequence number of the issuing thread
  int num_threads = 0;                      // intra-op threads of the issuing thread
  uint64_t iteration = 0;                   // serial number of the issuing iteration (timeline)
  std::optional<c10::Stream> stream;        // accelerator ops: the program thread's stream (streams.h)
  std::vector<at::Tensor> garbage;          // GraphRunner-made values to free there, after executing
  // Tensors the GraphRunner let go of that the program may have seen (a gradient replaced by
  // `.grad =` or by a replayed backward): freed with the item, in the Python thread, since the
  // last reference but one to a tensor with a Python object takes the GIL (GraphRunner::reclaim).
  std::vector<at::Tensor> released;
  void clear() {
    args.clear();
    outs.clear();
    released.clear();
  }
  // Once executed: what only the Python thread references (the outputs' slots, the placeholders
  // among the arguments: the GraphRunner resolves those to their slots' values), so temporaries
  // the program dropped are freed as they would be eagerly. Real tensors stay until `clear`.
  void drop_placeholders();
};

// An op that failed in the GraphRunner: its exception, rethrown in the Python thread with the op
// and source line added (so a c10::IndexError stays an IndexError for Python).
struct RunnerError {
  std::exception_ptr exception;
  uint32_t node = 0;
  explicit operator bool() const { return static_cast<bool>(exception); }
};

// A warning a kernel raised on the GraphRunner (TORCH_WARN), and the op whose item raised it:
// the program thread raises it as a Python warning, as the op's binding does eagerly
// (PythonRunner::raise_warnings). Without a handler of its own, the GraphRunner thread printed
// them to stderr, where Python's warning filters never saw them.
struct RunnerWarning {
  c10::Warning warning;
  uint64_t graph = 0;
  uint32_t node = 0;
};

// Autograd orders the nodes of a backward pass by their sequence numbers, which each thread
// counts on its own. Nodes made by the GraphRunner and by the Python thread (while tracing) meet
// in one autograd graph, so both counters are kept moving forward together: a thread about to
// make nodes first advances its counter past the other's. The relative order of all nodes is
// then their creation order, as in eager execution, and so is the order gradients accumulate in.
void advance_sequence(uint64_t floor);

// Pieces of an item's execution that block replay shares (block_replay.h).
void run_grad_read(WorkItem& item);
void run_grad_write(WorkItem& item);
// Output `k` of an Aten item is `value`: checked against the traced metadata, put in its slot.
void fill_output(WorkItem& item, size_t k, const at::Tensor& value);

class BlockRecorder;
struct BlockStore;  // graph_runner.cpp
class KernelLanes;  // kernel_lanes.h

class GraphRunner {
 public:
  explicit GraphRunner(size_t capacity = 4096);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // Python thread: the next free item (waits, GIL released by the caller's policy, while the ring
  // is full). Fill it, then call `issue()`, which returns its sequence number (1-based).
  WorkItem& next_item();
  // `out_bytes`: the size of the item's outputs (how much memory waits on `reclaim`).
  uint64_t issue(uint64_t out_bytes = 0);

  uint64_t issued() const { return issued_; }
  // Python thread: items up to this one have dropped their placeholders (reclaim).
  uint64_t lightened() const { return lightened_; }
  uint64_t done() const { return done_.load(std::memory_order_acquire); }
  // The iteration (WorkItem::iteration) of the last recording begun while every recording of
  // its iteration start had been of a new path, plus one (0: none): the program's warm-up, which
  // the payoff check leaves out of co-execution's times (once a dropped path was recorded again,
  // recordings are a recurring cost and stay in). Any thread.
  uint64_t new_path_iteration() const { return new_path_iteration_.load(std::memory_order_acquire); }
  // Blocks until every item up to `seq` has been executed (or skipped after an error): a short
  // spin (`spin`), then sleep until the GraphRunner reaches `seq`.
  void wait_for(uint64_t seq, bool spin = true);
  void drain() { wait_for(issued_); }
  // Python thread: a control item, executed in issue order: ReleaseTeam (the GraphRunner gives up
  // its OpenMP team, so the program thread's own ops that follow have the only one) or
  // ClearAutocastCache.
  uint64_t issue_control(OpKind kind, uint64_t graph = 0);
  // Python thread: whether the program is co-executing (more work is imminent), which decides
  // whether an idle GraphRunner spins before it sleeps.
  void set_active(bool active) { active_.store(active, std::memory_order_relaxed); }
  // Python thread: drop the references held by executed items (in batches of kDropItems items
  // or kDropBytes bytes of outputs, all of them with `all`), except (unless `all`: the ring is
  // full, or everything was drained) the real tensors among the arguments of the iteration the
  // GraphRunner is in. Dropping the last C++ reference but one to a tensor with a Python object
  // decrefs the object under the GIL (torch's PyObject preservation); were that the GraphRunner's
  // (a replayed block's value table, an autograd graph's saved tensors), it would wait for the
  // GIL and hand it back: two futex calls on each thread, up to ten per step of a small MLP.
  // `pool`: dead output placeholders among the dropped arguments go there (GIL held).
  void reclaim(bool all = false, PlaceholderPool* pool = nullptr);
  // Python thread: the output bytes of the items issued after item `done` (a `done()` it read).
  uint64_t pending_bytes(uint64_t done) const { return bytes_ - bytes_before(done); }
  // Python thread: whether `next_item` will return without waiting for the GraphRunner.
  bool has_room() const { return issued_ - reclaimed_ < ring_.size(); }

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Warnings its kernels raised since the last take_warnings (any thread may ask, and take).
  bool has_warnings() const { return has_warnings_.load(std::memory_order_acquire); }
  std::vector<RunnerWarning> take_warnings();
  static constexpr size_t kMaxWarnings = 4096;  // kept between two takes; later ones are dropped
  // Takes the pending error (Python thread, after a wait); the runner resumes normal work.
  RunnerError take_error();

  // The autograd sequence number the GraphRunner thread has reached (see advance_sequence).
  uint64_t sequence() const { return sequence_.load(std::memory_order_acquire); }
  // ATen items executed through autograd, and below it (autograd had nothing to record).
  uint64_t ops_autograd() const { return ops_autograd_.load(std::memory_order_relaxed); }
  uint64_t ops_below_autograd() const { return ops_below_autograd_.load(std::memory_order_relaxed); }
  // Values dropped right after their last reading item ran (placeholder.h: DeadValueWatch).
  uint64_t values_released_early() const { return released_early_.load(std::memory_order_relaxed); }
  // Wall time the runner thread spent executing items, in nanoseconds.
  uint64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }
  // CPU time the runner thread has used so far, in seconds (its kernels' own threads not
  // counted); any thread may ask.
  double cpu_seconds() const { return thread_clock_ok_ ? cpu_clock_seconds(thread_clock_) : -1.0; }
  // The runner thread's id (its OpenMP workers are the threads it made: WorkerCpuClock); 0 until
  // it has started.
  pid_t thread_id() const { return tid_.load(std::memory_order_relaxed); }

  // Block replay (block_replay.h): on by default; set by the Python thread.
  // `accelerators`: blocks on accelerator streams too (Policy::accelerator_blocks).
  // `lanes`: a waiting program thread runs independent replayed kernels (Policy::lanes).
  void set_replay(bool on, bool accelerators = false, bool lanes = false) {
    replay_.store(on, std::memory_order_relaxed);
    accelerator_blocks_.store(accelerators, std::memory_order_relaxed);
    lanes_on_.store(lanes, std::memory_order_relaxed);
  }
  // How far below the GraphRunner its OpenMP workers run (Policy::worker_nice,
  // lower_openmp_workers); set by the Python thread, applied from the next iteration on.
  void set_worker_nice(int nice) { worker_nice_.store(nice, std::memory_order_relaxed); }
  struct ReplayCounts {
    uint64_t iterations = 0;  // co-executed iterations replayed whole
    uint64_t items = 0;       // items replayed
    KernelCounts run;         // what the replayed kernels did (block_replay.h)
    uint64_t recorded = 0;    // blocks recorded
    uint64_t one_thread = 0;  // of which replayed with one intra-op thread (block_replay.h)
    // Kernels run again on copies to check them with one thread, and kernels whose verdict an
    // earlier recording in the process had found (then run with one thread while recorded).
    uint64_t checked = 0, verdicts_reused = 0;
    // Items run op by op (not replayed) with one thread: the recorded blocks found each of their
    // kernels gives the program's bits so (BlockStore::one_thread_items).
    uint64_t one_thread_per_op = 0;
    std::string not_one_thread;  // the kernel that kept the last such block to the program's count
    uint32_t program_count_kernels = 0;  // how many of its kernels did (Block::program_count_kernels)
    uint64_t parallel_large = 0, parallel_small = 0;  // over the blocks recorded (Block::parallel_large)
    uint64_t chosen = 0;      // iterations that chose their block among several paths (choose)
    uint64_t refused = 0;     // recordings refused
    std::string last_refusal;
    uint64_t bound = 0;       // items run through autograd with their kernels bound to a block
    // `.grad` reads a replayed block had not recorded, run between its items (extra_grad_read)
    uint64_t extra_reads = 0;
    uint64_t left = 0;        // replayed iterations the program left before their end
    // Why the last one was left: "item" (another item came), "ahead" (an item looked ahead at
    // did not follow), "blocked" (the program waited before the block's backward was issued).
    std::string last_left;
  };
  // Of one graph (Graph::serial), or summed over all graphs (0).
  ReplayCounts replay_counts(uint64_t graph = 0) const;

 private:
  void loop();
  bool wait_for_work(uint64_t next);  // false: stopping
  bool idle(uint64_t next, int64_t spin_ns);  // spins, naps, then sleeps until work; false: stopping
  void prefetch(const WorkItem& item);  // GraphRunner: the next item's lines, while this one runs
  static constexpr uint64_t kDropItems = 32;
  static constexpr uint64_t kDropBytes = 4 << 10;
  uint64_t bytes_before(uint64_t n) const;  // output bytes of the first n items issued
  WorkItem& item_at(uint64_t index) { return ring_[index & ring_mask_]; }  // index: seq - 1
  const WorkItem& item_at(uint64_t index) const { return ring_[index & ring_mask_]; }
  bool few_to_drop(uint64_t upto) const;    // items [lightened_, upto) are not worth a batch
  void wake();
  void execute(WorkItem& item, uint64_t seq);
  // `per_kernel_threads`: each kernel with one thread where the process's verdicts allow it.
  void run_per_op(WorkItem& item, BlockRecorder* recorder, bool per_kernel_threads = false);
  bool run_control(const WorkItem& item);  // false: not a control item
  // Block replay, GraphRunner thread: the iteration `item` (sequence number `seq`) starts;
  // replays `item` if it follows the block (false: run it op by op).
  void start_iteration(const WorkItem& item, uint64_t seq);
  bool replay(WorkItem& item, uint64_t seq);
  // BlockReplayer::bind; true: the item ran. `alone`: only this item (its history is consumed by
  // no backward of the block), not the forward up to the block's backward.
  bool bind(WorkItem& item, BlockStore& b, bool alone = false);
  bool extra_grad_read(WorkItem& item);      // true: a read the block lacks, run in its place
  // After the replayed backward `backward` (its index in the block): frees what it reached of the
  // bound graphs of the partial items it consumed in part (ItemPlan::partial).
  void release_partial(BlockStore& b, uint32_t backward);
  uint32_t second_node(const WorkItem& first, uint64_t seq);  // of the iteration starting at seq
  // Block replay: of the iteration starting with `item`, at an entry with several paths, which
  // path's block to replay (or, none following, whether to record this one's).
  void choose(const WorkItem& item, uint64_t seq);
  // BlockReplayer::grads_as_recorded's `cleared`: the gradients cleared by items issued from
  // `now` (the item about to run) on, between the block's items; `looked_at`: the issue number of
  // the block item being looked at, not yet in BlockStore::seqs.
  std::function<bool(uint32_t, std::vector<const c10::TensorImpl*>&)> cleared_before(uint64_t now,
                                                                                       uint64_t looked_at) const;
  void start_recording(uint64_t graph);
  void flush_counts();                        // the iteration's tallies into counts_
  void drop_graph(uint64_t graph);            // DropGraph: its blocks, forks and verdicts go
  void use_threads(int n);                    // intra-op threads for the next kernels
  // GraphRunner thread: grad mode as the next kernels need it; only this function changes it
  // between items (guards inside kernels and the autograd engine restore what they change).
  void set_grad_mode(bool on);
  bool grad_mode_ = true;  // the thread's GradMode (a new thread starts with it on)
  void end_iteration();
  // Waits until item `seq` is published; false where the Python thread waits for the GraphRunner
  // meanwhile (it will publish nothing more until then) or the runner stops.
  bool await_published(uint64_t seq);
  bool python_blocked() const { return python_backlog() != 0; }
  // How many items the Python thread waits for (0: it does not wait).
  uint64_t python_backlog() const {
    const uint64_t w = waiter_.load();
    if (w == 0) return 0;  // nearly always: `done_` is not read (python_blocked runs per item)
    const uint64_t d = done_.load();
    return w > d ? w - d : 0;
  }
  std::atomic<bool> replay_{true};
  std::atomic<bool> accelerator_blocks_{false};
  std::atomic<bool> lanes_on_{false};
  std::atomic<int> worker_nice_{0};
  std::unique_ptr<BlockStore> blocks_;  // GraphRunner thread only
  std::unique_ptr<KernelLanes> lanes_;  // kernel_lanes.h: the replayed items' second thread
  std::atomic<uint64_t> waiter_{0};     // the item the Python thread waits for (0: none)
  std::atomic<uint64_t> new_path_iteration_{0};
  // GraphRunner thread (wait_for_work): the last item ended a wait of the Python thread (its
  // graph and node, plus one; 0: it did not), and, by such item, whether the last idle time
  // after it exceeded kIdleSpinNs.
  uint64_t served_wait_ = 0;
  std::unordered_map<uint64_t, bool> long_after_wait_;
  uint32_t long_gaps_ = 0;  // entries of long_after_wait_ that are true
  mutable std::mutex counts_mutex_;
  std::map<uint64_t, ReplayCounts> counts_;  // by Graph::serial, under counts_mutex_
  StreamSwitcher streams_;  // GraphRunner thread only
  AutocastState autocast_;  // GraphRunner thread only: the state last applied

  static constexpr size_t kLine = 128;  // a cache line pair: Intel's prefetcher fetches two
  std::vector<WorkItem> ring_;  // a power of two long: indexed by a mask, not a division per op
  // The counters each thread writes per item sit on cache lines of their own (kLine), so that a
  // write by one thread does not take the other's counters from its core (alone, this moved no
  // timing beyond noise; the per-op cost of lines shared between the cores is in reclaim()).
  // Written by the Python thread, per item:
  alignas(kLine) uint64_t issued_ = 0;
  uint64_t reclaimed_ = 0;
  uint64_t lightened_ = 0;  // items whose placeholders were dropped
  uint64_t bytes_ = 0;      // output bytes of the items issued so far
  std::vector<uint64_t> issued_bytes_;  // by ring index: `bytes_` once that item was issued
  uint64_t ring_mask_;                  // ring_.size() - 1
  std::atomic<uint64_t> published_{0};
  // Written by the GraphRunner, per item:
  alignas(kLine) std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> busy_ns_{0};
  std::atomic<uint64_t> ops_autograd_{0}, ops_below_autograd_{0};
  std::atomic<uint64_t> sequence_{0};
  std::atomic<uint64_t> released_early_{0};
  // Written now and then (per iteration, per wait, at a failure):
  // Sequence number of the first item of the iteration the GraphRunner is in (reclaim stops
  // before it); kNoHold between iterations.
  static constexpr uint64_t kNoHold = UINT64_MAX;
  alignas(kLine) std::atomic<uint64_t> hold_{kNoHold};
  std::atomic<bool> failed_{false};
  // Beside `failed_`: the program thread reads both at every op (one line).
  std::atomic<bool> has_warnings_{false};
  // The runner thread's c10 warning handler: keeps each warning with the item being executed
  // (the one after `done_`), found only when a warning comes: nothing is written per item here,
  // on the line of `failed_`, which the program thread reads at every op.
  struct WarningCapture : c10::WarningHandler {
    GraphRunner* runner = nullptr;
    void process(const c10::Warning& warning) override;
  } warning_capture_;
  std::mutex warnings_mutex_;
  std::vector<RunnerWarning> warnings_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> active_{false};
  RunnerError error_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> wait_target_{0};  // the item the sleeping Python thread waits for (0: none)
  std::atomic<int> sleeping_{0};  // whether and how the GraphRunner sleeps on work_cv_ (.cpp)
  std::thread thread_;
  std::atomic<pid_t> tid_{0};  // thread_'s id (thread_id)
  clockid_t thread_clock_{};  // thread_'s CPU-time clock (cpu_seconds), if thread_clock_ok_
  bool thread_clock_ok_ = false;
};

}  // namespace terra::runtime
