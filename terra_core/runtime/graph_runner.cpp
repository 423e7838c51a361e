#include "graph_runner.h"

#include "block_replay.h"
#include "op_template.h"
#include "openmp_team.h"
#include "runner_allocator.h"
#include "spin.h"
#include "timeline.h"

#include <ATen/Parallel.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/llvmMathExtras.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/forward_grad.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace terra::runtime {

namespace {

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) {
    out.push_back(resolve_placeholder(v.toTensor()));
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out.push_back(resolve_placeholder(t));
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) out.push_back(e.isTensor() ? resolve_placeholder(e.toTensor()) : at::Tensor());
  }
  return out;
}

// A counter only the GraphRunner writes: a plain store, no locked read-modify-write per op.
void count(std::atomic<uint64_t>& counter) {
  counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Whether autograd has anything to do for an op: record a node (grad mode on and an input
// requires grad), or forward-mode AD, which only exists inside a dual level
// (torch.autograd.forward_ad.dual_level) and whose ops may create tangents from tensors without
// any (`_make_dual`): inside one, every op takes the autograd route (one global lookup per op
// that would otherwise run below it).
bool needs_autograd(const torch::jit::Stack& args, bool grad_mode) {
  auto records = [](const at::Tensor& t) {
    return t.defined() && t.unsafeGetTensorImpl()->autograd_meta() && t.requires_grad();
  };
  if (grad_mode) {
    for (const c10::IValue& v : args) {
      if (v.isTensor()) {
        if (records(v.toTensor())) return true;
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList())
          if (records(t)) return true;
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toList())
          if (e.isTensor() && records(e.toTensor())) return true;
      }
    }
  }
  return torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr;
}

}  // namespace

void advance_sequence(uint64_t floor) {
  while (at::sequence_number::peek() < floor) at::sequence_number::get_and_increment();
}

void run_grad_read(WorkItem& item) {
  at::Tensor t = resolve_placeholder(item.args.at(0).toTensor());
  const at::Tensor& g = t.grad();
  TORCH_CHECK(g.defined() == (item.outs.size() == 1 && item.outs[0] != nullptr),
              "Terra: .grad presence differs from the recorded trace");
  if (g.defined()) item.outs[0]->value = g;
}

// `p.grad = None` (zero_grad's set_to_none): run where it is issued, never part of a block, so
// that which gradients the previous step made, which decides which ones a zero_grad clears, does
// not decide which block this step replays (BlockStore::Entry).
bool clears_grad(const WorkItem& w) {
  return w.kind == OpKind::GradWrite && w.args.size() > 1 && w.args[1].isNone();
}

// Items between a block's items that no block holds: control work (run_control) and cleared
// gradients. Looking for a path (choose, replay's look-ahead, second_node) passes over them.
bool no_block_item(const WorkItem& w) {
  return (is_control(w.kind) && w.kind != OpKind::EndIteration) || clears_grad(w);
}

void run_grad_write(WorkItem& item) {
  at::Tensor t = resolve_placeholder(item.args.at(0).toTensor());
  const c10::IValue& v = item.args.at(1);
  item.released.push_back(
      std::exchange(t.mutable_grad(), v.isNone() ? at::Tensor() : resolve_placeholder(v.toTensor())));
}

void fill_output(WorkItem& item, size_t k, const at::Tensor& value) {
  if (k >= item.outs.size() || !item.outs[k]) return;
  // The placeholder handed out carries the traced metadata: a value that disagrees (an op whose
  // output shape depends on data, not declared as such) must not go unnoticed.
  TORCH_CHECK(!item.expect || matches((*item.expect)[k].meta, value),
              "Terra: the output of this op differs in shape/dtype from the traced one (",
              describe((*item.expect)[k].meta), " traced, ", describe(meta_of(value)), " now)");
  item.outs[k]->value = value;
}

// The blocks recorded so far and the iteration being recorded or replayed (GraphRunner thread).
struct BlockStore {
  // One path through the iteration: a block recorded from it.
  struct Path {
    std::unique_ptr<Block> block;
    int misses = 0;  // consecutive iterations that left the block (then it is dropped)
    uint64_t uses = 0, last_used = 0;  // replays begun; the iteration of the last (an LRU clock)
  };
  // The blocks of one iteration start. A loop whose iterations take one of several paths, chosen
  // by Python from a draw or from the data (stochastic downsampling: where it pools and by how
  // much; an RNN's unrolled length), keeps a block per path, up to kMaxPaths, and chooses by
  // looking ahead at the items issued (GraphRunner::choose). One block per start was left by
  // every iteration that took another path than the last recorded one, and recorded again after
  // kMaxMisses: stochastic downsampling, kept co-executing, replayed 29 of 287 iterations (219
  // with a block per path). `zero_grad` writes None only to the gradients the previous step
  // made, so its writes are no block's items (clears_grad): with them, stochastic depth's
  // iterations depended on two steps' draws and replayed 1 in 28.
  struct Entry {
    std::vector<Path> paths;
    int refusals = 0;  // recordings refused (after kMaxRefusals, no more tries)
    // An iteration left a block where the program took another path: later ones look ahead and
    // choose among the paths (or record theirs).
    bool several = false;
    int unused_dropped = 0;  // paths dropped never replayed: at kMaxPaths, no more are recorded
    // Every path recorded here so far, dropped ones too (`signature`). While each recording was
    // of a new path, the next one is taken for the program's warm-up
    // (GraphRunner::new_path_iteration); once one was not (a dropped path recorded again, or a
    // refusal), recordings are a recurring cost of co-executing the loop.
    std::set<uint64_t> signatures;
    bool recurring = false;
  };
  static constexpr int kMaxRefusals = 3;
  static constexpr int kMaxMisses = 4;
  // rnn_lengths draws 17 lengths (8..24): with 16 blocks per start, the least recently used was
  // recorded again and again (4.4% of its co-executed iterations).
  static constexpr size_t kMaxPaths = 32;
  static constexpr size_t kMaxSignatures = 1024;  // past it, recordings count as recurring
  static constexpr size_t kMaxEntries = 4096;
  // By the iteration's first item (graph, node, kind) and its second item's node: the branches of
  // a loop that alternates them (a GAN's generator and discriminator steps) mostly begin with the
  // same op (a noise draw), and one block per first item was left at the second item by every
  // iteration of the other branch (corpus p10: 27 of 85 co-executed iterations).
  // The second item is looked at only for first items whose block was left at its second item
  // (`forks`): waiting for it at every iteration's start kept the GraphRunner from starting the
  // first item while the program ran Python (corpus p01 and p21: 0.46 -> 0.55 and 0.58 -> 0.79
  // of eager's step time).
  using FirstItem = std::tuple<uint64_t, uint32_t, int>;
  static constexpr uint32_t kNoSecond = UINT32_MAX;  // not a fork, or its second item unknown
  std::map<std::tuple<uint64_t, uint32_t, int, uint32_t>, Entry> entries;
  std::set<FirstItem> forks;
  FirstItem first{};  // the current iteration's
  void note_fork() {  // the current iteration left its block at its second item
    if (forks.size() < kMaxEntries) forks.insert(first);
  }
  // What the recorded blocks found about each item's kernels (by graph, node, kind): all give the
  // program's bits with one thread (RecordedKernel::one_thread; ATen items only), or not. Run op
  // by op (not replayed), an item of the first kind runs with one thread; any other runs with the
  // hook choosing per kernel from the process's verdicts (a RecordingScope without a recorder: a
  // boxed call and a signature per kernel, which the first kind is spared). On 2 cores each
  // parallel region there waited for a worker the program thread kept off the other core: p05's
  // first co-executed iteration after an eager phase took 12 ms for 58 ops (MKL splits even small
  // matmuls). Always co-executing, whole program, 5 interleaved runs, medians: p10 150 ms with
  // only the first kind, 56 ms with the hook for the others too (eager 67); p28 47 against 39.
  std::map<std::tuple<uint64_t, uint32_t, int>, bool> one_thread_items;  // false: per kernel
  uint64_t items_one_thread = 0;  // this iteration's items of the first kind, until flush_counts
  enum class State { PerOp, Recording, Replaying } state = State::PerOp;
  uint64_t iteration = ~uint64_t{0};
  uint64_t graph = 0;  // Graph::serial of the iteration's items
  Entry* entry = nullptr;
  int path = -1;           // the replayed path of `entry`
  std::vector<uint32_t> alive;  // choose: the paths that still follow (scratch)
  uint64_t iterations_started = 0;  // the LRU clock of Path::last_used
  std::unique_ptr<BlockRecorder> recorder;
  BlockReplayer replayer;
  // Sequence numbers of the block's items known to follow it (replayed or looked ahead at), and
  // the last sequence number looked ahead at.
  std::vector<uint64_t> seqs;
  uint64_t scanned = 0;
  uint64_t items = 0, items_bound = 0;  // this iteration's, until flush_counts
  uint64_t extra_reads = 0;             // GraphRunner::extra_grad_read, until flush_counts
  KernelCounts counted;  // replayer.counts() at the last flush_counts
  bool binding = false;  // the forward's items run through autograd, bound to the block
  bool bound = false;    // some item of this iteration was bound
  // The grad_fns of partial items' consumed outputs (ItemPlan::partial), by the index of the
  // backward after which what it reached of their graphs is freed.
  std::vector<std::pair<uint32_t, NodePtr>> partial_roots;
  void abandon() {
    seqs.clear();
    scanned = 0;
    binding = bound = false;
    partial_roots.clear();
    recorder.reset();
    replayer.finish();
    state = State::PerOp;
    entry = nullptr;
    path = -1;
  }
  void replay_path(int i) {
    Path& p = entry->paths[static_cast<size_t>(i)];
    path = i;
    ++p.uses;
    p.last_used = iterations_started;
    replayer.start(*p.block);
    state = State::Replaying;
  }
  // Keeps a recorded path: where the entry is full, in place of the least recently replayed one.
  void add_path(std::unique_ptr<Block> block) {
    auto& paths = entry->paths;
    if (paths.size() < kMaxPaths) {
      paths.push_back({std::move(block), 0, 0, iterations_started});
      return;
    }
    auto lru = std::min_element(paths.begin(), paths.end(),
                                [](const Path& a, const Path& b) { return a.last_used < b.last_used; });
    entry->unused_dropped += lru->uses == 0;
    *lru = {std::move(block), 0, 0, iterations_started};
  }
  // Whether an iteration that follows none of the entry's paths (or finds none) records its own.
  bool records_new_path() const {
    return entry->refusals < kMaxRefusals && entry->unused_dropped < static_cast<int>(kMaxPaths);
  }
};

namespace {

// Items pending before the Python thread wakes a sleeping GraphRunner: a wake-up (a futex call on
// both threads) is paid once per batch, not per op.
constexpr uint64_t kWakeBatch = 32;
// After running out of work the GraphRunner naps this long (timed, so it needs no wake-up when
// work arrives in the meantime), then sleeps until woken.
constexpr auto kNap = std::chrono::microseconds(200);
// How long the Python thread spins, waiting for a value, before it sleeps (the value it waits for
// is often imminent), and how long the GraphRunner spins for new work before it naps while the
// program co-executes: a wake-up costs tens of microseconds of latency on each side, which a
// program that fetches a value every few ops (an `.item()` per environment step) would pay twice
// per fetch; the Python between two fetches takes tens to hundreds of microseconds. Outside
// co-execution the GraphRunner does not spin at all: the cores are the program's.
constexpr int64_t kSpinNs = 20000;
constexpr int64_t kIdleSpinNs = 1000000;

template <typename Pred>
bool spin_until(Pred&& ready, int64_t budget_ns) {
  if (ready()) return true;
  const int64_t until = now_ns() + budget_ns;
  do {
    for (int i = 0; i < 16; ++i) cpu_relax();
    if (ready()) return true;
  } while (now_ns() < until);
  return false;
}

enum Sleep : int { kAwake = 0, kNapping = 1, kAsleep = 2 };

}  // namespace

GraphRunner::GraphRunner(size_t capacity)
    : ring_(c10::llvm::PowerOf2Ceil(std::max<size_t>(capacity, 1))),
      issued_bytes_(ring_.size()),
      ring_mask_(ring_.size() - 1) {
  blocks_ = std::make_unique<BlockStore>();
  blocks_->replayer.set_program_waits([this] { return python_backlog(); });
  lanes_ = std::make_unique<KernelLanes>([this] {
    // A program thread asleep in wait_for may help with the job.
    if (wait_target_.load() != 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_all();
    }
  });
  install_record_hook();
  thread_ = std::thread([this] { loop(); });
  thread_clock_ok_ = pthread_getcpuclockid(thread_.native_handle(), &thread_clock_) == 0;
}

GraphRunner::~GraphRunner() {
  stop_ = true;
  wake();
  thread_.join();
}

WorkItem& GraphRunner::next_item() {
  if (issued_ - reclaimed_ >= ring_.size()) {
    // Full: wait until a quarter of the ring is free, not just one item, so a program thread
    // that runs ahead does not trade a wake-up with the GraphRunner for every op it issues.
    wait_for(issued_ + ring_.size() / 4 - ring_.size());
    reclaim(/*all=*/true);
  }
  return item_at(issued_);
}

void GraphRunner::wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  work_cv_.notify_one();
}

uint64_t GraphRunner::issue(uint64_t out_bytes) {
  bytes_ += out_bytes;
  issued_bytes_[issued_ & ring_mask_] = bytes_;
  ++issued_;
  // seq_cst store, then the load of `sleeping_`: either this thread sees the GraphRunner asleep
  // or the GraphRunner, which stores `sleeping_` before it looks at `published_`, sees the item.
  published_.store(issued_);
  const int sleep = sleeping_.load();
  if (sleep == kAsleep || (sleep == kNapping && issued_ - done() >= kWakeBatch)) wake();
  return issued_;
}

uint64_t GraphRunner::bytes_before(uint64_t n) const {
  return n == 0 ? 0 : issued_bytes_[(n - 1) & ring_mask_];
}

bool GraphRunner::few_to_drop(uint64_t upto) const {
  // Bytes only within kDropItems items: their tallies are still in issued_bytes_. (Were one
  // overwritten, the difference would wrap to a huge count, and the items be dropped.)
  return upto - lightened_ < kDropItems && bytes_before(upto) - bytes_before(lightened_) < kDropBytes;
}

void GraphRunner::reclaim(bool all, PlaceholderPool* pool) {
  // Executed items with tiny outputs are dropped in batches: their lines were last written by
  // the GraphRunner's core, and fetched one item per op they cost the program thread about 0.4 µs
  // per op on a 1x1 add chain; fetched in a run, the misses overlap. Larger outputs are dropped
  // at once: with batches of up to 256 KiB, corpus p01 (8 KiB activations) took 250 µs per
  // co-executed step instead of 150 (why was not found). Too little issued since the last batch
  // (counted by the program's own tallies): not even `done_` is read.
  if (!all && few_to_drop(issued_)) return;
  const uint64_t d = done();  // before the hold: a hold stored before `done` moved past it is seen
  const uint64_t held = all ? d : std::min(d, hold_.load() - 1);
  auto offer = [pool](WorkItem& item) {
    if (pool)
      for (c10::IValue& v : item.args) pool->offer(v);
  };
  for (; reclaimed_ < held; ++reclaimed_) {
    WorkItem& item = item_at(reclaimed_);
    if (reclaimed_ >= lightened_) offer(item);
    item.clear();
  }
  lightened_ = std::max(lightened_, reclaimed_);
  if (!all && few_to_drop(d)) return;
  for (; lightened_ < d; ++lightened_) {
    WorkItem& item = item_at(lightened_);
    offer(item);
    item.drop_placeholders();
  }
}

namespace {

// A tensor, or a list of tensors (a foreach op's gradients), that holds placeholders only.
bool only_placeholders(const c10::IValue& v) {
  if (v.isTensor()) return as_placeholder(v.toTensor()) != nullptr;
  bool any = false;
  auto one = [&](const at::Tensor& t) {
    any = true;
    return as_placeholder(t) != nullptr;
  };
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (!one(t)) return false;
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList())
      if (e.isTensor() && !one(e.toTensor())) return false;
  }
  return any;
}

}  // namespace

void WorkItem::drop_placeholders() {
  outs.clear();
  for (c10::IValue& v : args)
    if (only_placeholders(v)) v = c10::IValue();
}

void GraphRunner::wait_for(uint64_t seq, bool spin) {
  seq = std::min(seq, issued_);  // never wait for an item that was not issued
  if (done() >= seq) return;
  // Seen by a GraphRunner that waits for more of a block to be issued (await_published): this
  // thread issues nothing until the wait is over. seq_cst, before `sleeping_` is read.
  waiter_.store(seq);
  struct Clear {
    std::atomic<uint64_t>& w;
    ~Clear() { w.store(0); }
  } clear{waiter_};
  if (sleeping_.load() != kAwake) wake();  // pending work below the batch size: start it now
  // With lanes on (Policy::lanes), this thread meanwhile runs free kernels of the GraphRunner's
  // item (kernel_lanes.h) each time the GraphRunner calls for help; off, no job ever opens.
  uint64_t helped = 0;
  const std::function<bool()> waiting = [&] { return done() < seq; };
  lanes_->help(waiting, helped);
  if (spin && spin_until([&] { return done() >= seq || lanes_->has_job(helped); }, kSpinNs) && done() >= seq)
    return;
  for (;;) {
    lanes_->help(waiting, helped);
    std::unique_lock<std::mutex> lock(mutex_);
    wait_target_.store(seq);
    done_cv_.wait(lock, [&] { return done() >= seq || lanes_->has_job(helped); });
    wait_target_.store(0);
    if (done() >= seq) return;
  }
}

uint64_t GraphRunner::issue_control(OpKind kind, uint64_t graph) {
  WorkItem& item = next_item();  // only `kind` and `graph` are read (run_control); the rest is a past item's
  item.kind = kind;
  item.graph = graph;
  item.outs.clear();
  return issue();
}

RunnerError GraphRunner::take_error() {
  RunnerError e = std::move(error_);
  error_ = RunnerError{};
  failed_.store(false, std::memory_order_release);
  return e;
}

bool GraphRunner::wait_for_work(uint64_t next) {
  // Out of work right after giving the program thread what it waited for, the program runs
  // Python on it; where that took longer than the spin the last time (NumPy post-processing of
  // a fetched prediction every step), spinning would take a core from it for nothing: with the
  // OpenMP workers spinning after a parallel region, three busy threads on two cores. Elsewhere
  // (a gap between two ops, an `.item()` per environment step) the full spin saves a wake-up on
  // each side. And once some op's wait was followed by such a gap (the program does long
  // Python work between its waits), every idle spin is short while the workers spin: a short
  // spin at every idle gave detector_numpy_nms 11.6-12.2 ms per step against 13.5-13.9 with the
  // short spin after that op alone (forced co-execution), but cost gpt, whose Python issues ops
  // without such gaps, 5-8% (a nap leaves the GraphRunner behind a Python-bound program).
  // Learned per op that ended the wait (a step can wait twice, once before NumPy work and once
  // before more ops).
  const uint64_t served = std::exchange(served_wait_, 0);
  if (served == 0) return idle(next, long_gaps_ > 0 && openmp_workers_spinning() ? kSpinNs : kIdleSpinNs);
  bool& long_gap = long_after_wait_[served];
  const int64_t start = now_ns();
  const bool working = idle(next, long_gap || (long_gaps_ > 0 && openmp_workers_spinning()) ? kSpinNs : kIdleSpinNs);
  const bool was = long_gap;
  long_gap = now_ns() - start > kIdleSpinNs;
  long_gaps_ += long_gap - was;
  return working;
}

bool GraphRunner::idle(uint64_t next, int64_t spin_ns) {
  auto has_work = [&] { return published_.load() != next || stop_.load(); };
  if (active_.load(std::memory_order_relaxed) && spin_until(has_work, spin_ns)) return !stop_.load();
  std::unique_lock<std::mutex> lock(mutex_);
  sleeping_.store(kNapping);
  if (!work_cv_.wait_for(lock, kNap, has_work)) {
    sleeping_.store(kAsleep);
    work_cv_.wait(lock, has_work);
  }
  sleeping_.store(kAwake);
  return !stop_.load();
}

bool GraphRunner::await_published(uint64_t seq) {
  auto ready = [&] { return published_.load() >= seq || python_blocked() || stop_.load(); };
  if (!spin_until(ready, kIdleSpinNs)) {
    std::unique_lock<std::mutex> lock(mutex_);
    sleeping_.store(kAsleep);
    work_cv_.wait(lock, ready);
    sleeping_.store(kAwake);
  }
  return published_.load() >= seq && !stop_.load();
}

GraphRunner::ReplayCounts GraphRunner::replay_counts(uint64_t graph) const {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  if (graph != 0) {
    auto it = counts_.find(graph);
    return it != counts_.end() ? it->second : ReplayCounts{};
  }
  ReplayCounts total;
  for (const auto& [g, c] : counts_) {
    total.iterations += c.iterations;
    total.items += c.items;
    total.run += c.run;
    total.recorded += c.recorded;
    total.chosen += c.chosen;
    total.one_thread += c.one_thread;
    total.checked += c.checked;
    total.verdicts_reused += c.verdicts_reused;
    total.one_thread_per_op += c.one_thread_per_op;
    total.parallel_large += c.parallel_large;
    total.parallel_small += c.parallel_small;
    if (!c.not_one_thread.empty()) {
      total.not_one_thread = c.not_one_thread;
      total.program_count_kernels = c.program_count_kernels;
    }
    total.refused += c.refused;
    total.left += c.left;
    total.bound += c.bound;
    total.extra_reads += c.extra_reads;
    if (!c.last_refusal.empty()) total.last_refusal = c.last_refusal;
    if (!c.last_left.empty()) total.last_left = c.last_left;
  }
  return total;
}

void GraphRunner::flush_counts() {
  // Tallied per iteration in the BlockStore, not per item under the lock.
  BlockStore& b = *blocks_;
  const KernelCounts run = b.replayer.counts() - b.counted;
  if (b.items == 0 && b.items_bound == 0 && b.items_one_thread == 0 && b.extra_reads == 0 && !run.any()) return;
  std::lock_guard<std::mutex> lock(counts_mutex_);
  ReplayCounts& c = counts_[b.graph];
  c.items += b.items;
  c.bound += b.items_bound;
  c.one_thread_per_op += b.items_one_thread;
  c.extra_reads += b.extra_reads;
  b.items = b.items_bound = b.items_one_thread = b.extra_reads = 0;
  c.run += run;
  b.counted = b.replayer.counts();
}

void GraphRunner::start_iteration(const WorkItem& item, uint64_t seq) {
  BlockStore& b = *blocks_;
  flush_counts();
  b.abandon();  // an iteration that ended without EndIteration (it diverged) is not a block
  hold_.store(seq);  // seq_cst, before `done_` passes it
  b.iteration = item.iteration;
  b.graph = item.graph;
  b.replayer.set_lanes(lanes_on_.load(std::memory_order_relaxed) ? lanes_.get() : nullptr);
  lower_openmp_workers(worker_nice_.load(std::memory_order_relaxed));  // the policy's, per iteration
  if (!replay_.load(std::memory_order_relaxed) || item.graph == 0) return;
  if (b.entries.size() >= BlockStore::kMaxEntries) b.entries.clear();
  b.first = {item.graph, item.node, static_cast<int>(item.kind)};
  const uint32_t second =
      b.forks.count(b.first) ? second_node(item, seq) : BlockStore::kNoSecond;
  BlockStore::Entry& e = b.entries[{item.graph, item.node, static_cast<int>(item.kind), second}];
  b.entry = &e;
  ++b.iterations_started;
  if (e.several && !e.paths.empty()) {
    choose(item, seq);
  } else if (!e.paths.empty()) {
    b.replay_path(0);
  } else if (b.records_new_path()) {
    start_recording(item.graph);
  }
}

void GraphRunner::start_recording(uint64_t graph) {
  BlockStore& b = *blocks_;
  b.recorder = std::make_unique<BlockRecorder>(graph, accelerator_blocks_.load(std::memory_order_relaxed));
  b.state = BlockStore::State::Recording;
  // Published at the start: the payoff check reads it once the iteration's items have run,
  // possibly before its end (and the recording's) is.
  if (b.entry && !b.entry->recurring) new_path_iteration_.store(b.iteration + 1, std::memory_order_release);
}

void GraphRunner::choose(const WorkItem& item, uint64_t seq) {
  // Looks ahead at the items issued, without running any, to the iteration's end, where the one
  // path that followed all of them is replayed; or until none follows (this iteration's path is
  // new: it is recorded from its first item, which has not run yet); or until the program waits
  // for this thread (it issues nothing more until then: the most used path still following is
  // replayed, and left where it stops following). Each item is checked as replay's own
  // look-ahead checks it, so the chosen block's items up to `seqs` are not checked again.
  // Stopping at the first backward once one path was left chose blocks whose optimizer part
  // differed (`.grad` reads the program answered itself in one and not the other): a stochastic
  // depth variant (zero_grad(set_to_none=False), forced) left 243 of 336 chosen blocks after
  // their backward and replayed 94 iterations of 390, 229 looking to the end (10.4 ms per step
  // against 11.7-12.2; eager 11.2-11.5).
  BlockStore& b = *blocks_;
  auto& paths = b.entry->paths;
  b.alive.resize(paths.size());
  for (uint32_t i = 0; i < paths.size(); ++i) b.alive[i] = i;
  b.seqs.clear();
  auto earlier = [&](uint32_t j) -> const WorkItem* {
    return j < b.seqs.size() ? &item_at(b.seqs[j] - 1) : nullptr;
  };
  bool ended = false;  // the whole iteration was looked at
  uint64_t s = seq;
  const WorkItem* w = &item;
  while (true) {
    if (w->kind == OpKind::EndIteration || w->iteration != item.iteration) {
      ended = true;
      break;
    }
    if (!no_block_item(*w)) {
      const auto j = static_cast<uint32_t>(b.seqs.size());
      auto stays = [&](uint32_t i) {
        b.replayer.consider(*paths[i].block);
        return b.replayer.follows(j, *w, s, b.seqs, earlier) &&
               (w->kind != OpKind::Backward || b.replayer.grads_as_recorded(j, earlier, cleared_before(seq, s)));
      };
      std::vector<uint32_t>& alive = b.alive;
      const auto kept = std::partition(alive.begin(), alive.end(), stays);
      if (kept == alive.begin() && w->kind == OpKind::GradRead && s != seq) {
        // A read the paths lack (extra_grad_read): replay runs it in its place.
      } else {
        alive.erase(kept, alive.end());
        if (alive.empty()) break;
        b.seqs.push_back(s);
      }
    }
    if (!await_published(++s)) break;
    w = &item_at(s - 1);
  }
  b.scanned = b.seqs.empty() ? 0 : b.seqs.back();
  if (ended) {  // only a path that ends here matches the whole iteration
    b.alive.erase(std::remove_if(b.alive.begin(), b.alive.end(),
                                 [&](uint32_t i) { return paths[i].block->items.size() != b.seqs.size(); }),
                  b.alive.end());
  }
  if (b.alive.empty()) {
    b.replayer.finish();  // `consider` pointed it at a path
    b.seqs.clear();
    b.scanned = 0;
    if (b.records_new_path()) start_recording(item.graph);
    return;
  }
  const uint32_t chosen = *std::max_element(b.alive.begin(), b.alive.end(), [&](uint32_t x, uint32_t y) {
    return paths[x].uses < paths[y].uses;
  });
  b.replay_path(static_cast<int>(chosen));
  std::lock_guard<std::mutex> lock(counts_mutex_);
  ++counts_[b.graph].chosen;
}

BlockReplayer::ClearedBefore GraphRunner::cleared_before(uint64_t now, uint64_t looked_at) const {
  return [this, now, looked_at](uint32_t k, std::vector<const c10::TensorImpl*>& leaves) {
    const std::vector<uint64_t>& seqs = blocks_->seqs;
    leaves.clear();
    const uint64_t end = k < seqs.size() ? seqs[k] : looked_at;
    const uint64_t begin = k == 0 || k > seqs.size() ? now : std::max(now, seqs[k - 1] + 1);
    for (uint64_t s = begin; s < end; ++s) {
      const WorkItem& w = item_at(s - 1);
      if (!clears_grad(w)) continue;
      const c10::IValue& target = w.args.at(0);
      if (!target.isTensor()) return false;
      const PlaceholderImpl* p = as_placeholder(target.toTensor());
      if (p && !p->slot()->value.defined()) return false;  // not made yet: unknown
      leaves.push_back(resolve_placeholder(target.toTensor()).unsafeGetTensorImpl());
    }
    return true;
  };
}

uint32_t GraphRunner::second_node(const WorkItem& first, uint64_t seq) {
  // Usually issued already (the program thread runs ahead); otherwise waited for, unless the
  // program waits for this thread (then the block is found by the first item alone). Items no
  // block holds between the two are passed over.
  do {
    if (!await_published(seq + 1)) return BlockStore::kNoSecond;
  } while (no_block_item(item_at(seq++)));
  const WorkItem& w = item_at(seq - 1);
  const bool graph_item = w.kind == OpKind::Aten || w.kind == OpKind::Backward ||
                          w.kind == OpKind::GradRead || w.kind == OpKind::GradWrite;
  return graph_item && w.iteration == first.iteration ? w.node : BlockStore::kNoSecond;
}

bool GraphRunner::replay(WorkItem& item, uint64_t seq) {
  BlockStore& b = *blocks_;
  auto leave = [&](const char* why, bool stale = false) {
    // The program left the block (or may have: it waits before the block's backward is
    // issued): this item and the rest of the iteration take the autograd route.
    {
      std::lock_guard<std::mutex> lock(counts_mutex_);
      ReplayCounts& c = counts_[item.graph];
      ++c.left;
      c.last_left = why;
    }
    // A block recorded under other gradient states is stale at once (the program's gradients
    // are kept across iterations now: it is recorded again).
    if (b.entry && b.path >= 0) {
      auto& paths = b.entry->paths;
      BlockStore::Path& left = paths[static_cast<size_t>(b.path)];
      if (stale || ++left.misses >= BlockStore::kMaxMisses) paths.erase(paths.begin() + b.path);
      // The program took another path here: from now on this start chooses among its paths.
      b.entry->several = b.entry->several || !stale;
      b.path = -1;
    }
    b.replayer.finish();
    b.state = BlockStore::State::PerOp;
    return false;
  };
  auto earlier = [&](uint32_t j) -> const WorkItem* {
    return j < b.seqs.size() ? &item_at(b.seqs[j] - 1) : nullptr;
  };
  const uint32_t index = b.replayer.next();
  const bool looked_ahead = index < b.seqs.size();  // followed, gradients checked (below)
  if (looked_ahead ? b.seqs[index] != seq : !b.replayer.follows(index, item, seq, b.seqs, earlier)) {
    if (extra_grad_read(item)) return true;
    if (index == 1) b.note_fork();
    return leave("item");
  }
  if (index == b.seqs.size()) b.seqs.push_back(seq);
  const ItemPlan& p = b.replayer.block()->items[index];
  // Binding (the program waited before the block's backward was issued): the forward's items run
  // through autograd with their kernels bound to the block, until an item without autograd
  // history (the backward) is replayed again.
  if (b.binding && p.autograd) return bind(item, b);
  if (p.autograd && p.covered_by == ItemPlan::kNoBackward) return bind(item, b, /*alone=*/true);
  if (p.autograd && p.partial) {
    bind(item, b, /*alone=*/true);
    for (uint32_t o : p.consumed_outs)
      if (o < item.outs.size() && item.outs[o] && item.outs[o]->value.defined())
        if (auto fn = item.outs[o]->value.grad_fn()) b.partial_roots.emplace_back(p.covered_by, std::move(fn));
    return true;
  }
  b.binding = false;
  if (p.kind == OpKind::Backward && !looked_ahead &&
      !b.replayer.grads_as_recorded(index, earlier, cleared_before(seq, seq)))
    return leave("grads", true);
  if (p.autograd) {
    // Replayed below autograd only once the backward that consumes its history is issued and
    // everything up to it follows the block: the program cannot leave the block before that.
    // Control items between the block's items are not part of it.
    while (b.seqs.size() <= p.covered_by) {
      const uint64_t s = std::max(b.scanned, seq) + 1;
      if (!await_published(s)) return bind(item, b);
      b.scanned = s;
      const WorkItem& w = item_at(s - 1);
      if (no_block_item(w)) continue;
      const auto j = static_cast<uint32_t>(b.seqs.size());
      if (w.kind == OpKind::EndIteration || w.iteration != item.iteration ||
          !b.replayer.follows(j, w, s, b.seqs, earlier)) {
        if (w.kind == OpKind::GradRead && w.iteration == item.iteration) continue;  // extra_grad_read
        if (j == 1) b.note_fork();
        return leave("ahead");
      }
      b.seqs.push_back(s);
      if (w.kind == OpKind::Backward && !b.replayer.grads_as_recorded(j, earlier, cleared_before(seq, s)))
        return leave("grads", true);
    }
  }
  b.replayer.run(item);  // each kernel with one thread or the program's (BlockReplayer::run)
  // A backward that does not keep the graph (retain_graph) frees what it reached of bound ones.
  if (p.kind == OpKind::Backward && !item.args.at(2).toBool()) {
    if (b.bound) {
      // The forward was bound: its autograd graph exists and, as after eager's backward, its
      // saved tensors are freed.
      BlockReplayer::release_graph(tensors_of(item.args.at(0)));
      b.bound = false;
    }
    if (!p.partial_items.empty()) release_partial(b, index);
  }
  ++b.items;
  return true;
}

void GraphRunner::release_partial(BlockStore& b, uint32_t backward) {
  std::vector<torch::autograd::Node*> reached;
  auto& roots = b.partial_roots;
  for (const auto& [index, fn] : roots)
    if (index == backward) reached.push_back(fn.get());
  BlockReplayer::release_nodes(std::move(reached));
  roots.erase(std::remove_if(roots.begin(), roots.end(), [&](const auto& r) { return r.first == backward; }),
              roots.end());
}

bool GraphRunner::extra_grad_read(WorkItem& item) {
  // Whether the program thread issues a `.grad` read or answers it itself (a settled gradient,
  // PythonRunner::choose_grad_read) depends on what it has seen of the GraphRunner, so the
  // iteration a block was recorded from may lack a read this one has. A read changes nothing: it
  // runs here, in issue order (everything before it has run), and the block goes on.
  if (item.kind != OpKind::GradRead) return false;
  run_grad_read(item);
  ++blocks_->extra_reads;
  return true;
}

bool GraphRunner::bind(WorkItem& item, BlockStore& b, bool alone) {
  if (!alone) {
    b.binding = true;
    b.bound = true;
  }
  use_threads(item.num_threads);
  const bool ok = b.replayer.bind(item, [this](WorkItem& w) { run_per_op(w, nullptr); });
  ++b.items_bound;
  if (!ok) {
    // The kernels did not match the recorded ones: the item ran (op by op, through autograd), and
    // so does the rest of the iteration.
    b.replayer.finish();
    b.state = BlockStore::State::PerOp;
  }
  return true;
}

namespace {
// A path's identity: its items' nodes and kinds, in order.
uint64_t signature(const Block& block) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (const ItemPlan& p : block.items)
    h = (h ^ (uint64_t{p.node} << 8 | static_cast<uint64_t>(p.kind))) * 0x100000001b3ull;
  return h;
}
}  // namespace

void GraphRunner::end_iteration() {
  BlockStore& b = *blocks_;
  flush_counts();
  if (b.state == BlockStore::State::Recording && b.recorder && b.entry) {
    std::unique_ptr<Block> block = b.recorder->finish();
    std::lock_guard<std::mutex> lock(counts_mutex_);
    ReplayCounts& c = counts_[b.graph];
    c.checked += b.recorder->kernels_checked();
    c.verdicts_reused += b.recorder->verdicts_reused();
    if (block) {
      if (b.one_thread_items.size() >= BlockStore::kMaxEntries) b.one_thread_items.clear();
      for (const ItemPlan& p : block->items) {
        // A backward's kernels depend on the whole autograd graph, which paths that share the
        // backward's node may build differently: its kernels are always chosen for one by one.
        if (p.kind != OpKind::Aten) continue;
        bool one = true;
        for (uint32_t k = p.kernels_begin; k < p.kernels_end; ++k) one = one && block->kernels[k].one_thread;
        auto it = b.one_thread_items.try_emplace({b.graph, p.node, static_cast<int>(p.kind)}, one).first;
        it->second = it->second && one;  // every block that holds the item must agree
      }
      c.one_thread += block->one_thread;
      c.parallel_large += block->parallel_large;
      c.parallel_small += block->parallel_small;
      if (!block->one_thread) {
        c.not_one_thread = block->not_one_thread;
        c.program_count_kernels = block->program_count_kernels;
      }
      auto& seen = b.entry->signatures;
      if (seen.size() >= BlockStore::kMaxSignatures || !seen.insert(signature(*block)).second)
        b.entry->recurring = true;
      b.add_path(std::move(block));
      ++c.recorded;
    } else {
      b.entry->recurring = true;
      ++b.entry->refusals;
      ++c.refused;
      c.last_refusal = b.recorder->why();
    }
  } else if (b.state == BlockStore::State::Replaying && b.entry && b.path >= 0 &&
             b.replayer.next() == b.replayer.block()->items.size()) {
    b.entry->paths[static_cast<size_t>(b.path)].misses = 0;
    std::lock_guard<std::mutex> lock(counts_mutex_);
    ++counts_[b.graph].iterations;
  }
  b.abandon();
  b.iteration = ~uint64_t{0};
  hold_.store(kNoHold);
}

void GraphRunner::loop() {
  // Named for top, perf and py-spy; the OpenMP workers it starts inherit the name.
  pthread_setname_np(pthread_self(), "terra-graph");
  tid_.store(gettid(), std::memory_order_relaxed);
  RunnerAllocator::set_cached_thread(true);  // its buffers are reused across iterations
  warning_capture_.runner = this;
  c10::WarningUtils::set_warning_handler(&warning_capture_);  // for the thread's life
  uint64_t next = 0;
  // The current busy span: from the first item executed after idling (or after the issuing
  // iteration changed) to the end of the last one.
  Span busy;
  busy.lane = Lane::Graph;
  busy.kind = SpanKind::Busy;
  // A span closes when the runner goes to sleep or the next item belongs to another iteration;
  // short gaps while it waits for the Python thread stay inside (`busy_ns` says how busy it was).
  bool in_span = false;
  uint64_t span_ops = 0;
  int64_t span_busy = 0;
  auto close_span = [&] {
    if (!in_span) return;
    busy.ops = span_ops;
    busy.busy_ns = span_busy;
    Timeline::instance().add(busy);
    in_span = false;
  };
  // When the last item ended; 0 after idling. An item that follows another without a wait starts
  // when that one ended (one clock read per item instead of two: clock_gettime is a vDSO call
  // into the hypervisor's clock here).
  int64_t last_end = 0;
  while (!stop_.load()) {
    const uint64_t published = published_.load();
    if (published == next) {
      close_span();
      last_end = 0;
      if (!wait_for_work(next)) break;
      continue;
    }
    WorkItem& item = item_at(next);
    if (published > next + 1) prefetch(item_at(next + 1));
    // After a failure, later items are skipped: the program state stays as eager execution
    // would have left it at the failing op, and the error is raised in the Python thread.
    if (!failed_.load(std::memory_order_relaxed)) {
      const int64_t t0 = last_end != 0 ? last_end : now_ns();
      if (in_span && busy.iteration != item.iteration) close_span();
      if (!in_span) {
        busy.start_ns = t0;
        busy.iteration = item.iteration;
        span_ops = 0;
        span_busy = 0;
        in_span = true;
      }
      try {
        execute(item, next + 1);
        if (const uint32_t n = release_dead_values(item.args, next + 1))  // placeholder.h
          released_early_.fetch_add(n, std::memory_order_relaxed);
      } catch (...) {
        error_ = {std::current_exception(), item.node};
        failed_.store(true, std::memory_order_release);
        flush_counts();
        blocks_->abandon();  // a failed iteration is neither recorded nor replayed further
      }
      busy.end_ns = last_end = now_ns();
      ++span_ops;
      span_busy += busy.end_ns - t0;
      busy_ns_.fetch_add(static_cast<uint64_t>(busy.end_ns - t0), std::memory_order_relaxed);
    } else {
      run_control(item);  // control, not program work: done even after a failure
      last_end = 0;
    }
    item.garbage.clear();  // values this thread allocated, freed here (see the header)
    ++next;
    // seq_cst, like `wait_target_`: a waiter that set its target after this store sees the new
    // `done` when it checks under the lock, and one that set it before is seen here.
    done_.store(next);
    if (const uint64_t w = waiter_.load(std::memory_order_relaxed); w != 0 && next >= w)
      served_wait_ = (static_cast<uint64_t>(item.graph) << 32 | item.node) + 1;
    const uint64_t target = wait_target_.load();
    if (target != 0 && next >= target) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_all();
    }
  }
}

void GraphRunner::WarningCapture::process(const c10::Warning& warning) {
  // Runner thread: `done_` moves past an item only after it ran, so the item running is the next.
  const WorkItem& item = runner->item_at(runner->done_.load(std::memory_order_relaxed));
  std::lock_guard<std::mutex> lock(runner->warnings_mutex_);
  if (runner->warnings_.size() < kMaxWarnings) runner->warnings_.push_back(RunnerWarning{warning, item.graph, item.node});
  runner->has_warnings_.store(true, std::memory_order_release);
}

std::vector<RunnerWarning> GraphRunner::take_warnings() {
  std::lock_guard<std::mutex> lock(warnings_mutex_);
  has_warnings_.store(false, std::memory_order_relaxed);
  return std::exchange(warnings_, {});
}

void GraphRunner::prefetch(const WorkItem& item) {
  // The program thread wrote the item and made its slots: their lines come from its core, one
  // miss after another if touched only when the item runs. Requested now, while the current item
  // executes, they arrive meanwhile.
  const char* base = reinterpret_cast<const char*>(&item);
  for (size_t offset = 0; offset < sizeof(WorkItem); offset += 64) __builtin_prefetch(base + offset);
  if (!item.args.empty()) __builtin_prefetch(item.args.data());
  if (item.outs.empty()) return;
  __builtin_prefetch(item.outs.data());
  // For writing: only the value's line, not the slot's first one, which holds what the program
  // thread writes (Slot).
  for (const auto& slot : item.outs)
    if (slot) __builtin_prefetch(&slot->value, /*write=*/1);
}

bool GraphRunner::run_control(const WorkItem& item) {
  if (!is_control(item.kind)) return false;
  set_grad_mode(true);  // control work runs with the thread's default (items leave theirs)
  switch (item.kind) {
    case OpKind::ReleaseTeam:
      release_openmp_team();
      at::autocast::clear_cache();  // the program runs ops itself next (thread_state.h)
      break;
    case OpKind::ClearAutocastCache:
      at::autocast::clear_cache();
      break;
    case OpKind::DropGraph:
      drop_graph(item.graph);
      break;
    default:
      end_iteration();
  }
  return true;
}

void GraphRunner::drop_graph(uint64_t graph) {
  // A dropped graph's serial never comes again (Graph::next_serial), so its blocks were dead
  // weight until the store filled (kMaxEntries), and their kept results held the process's
  // budget (out_form.h): a notebook that made a few models, or a test suite, left later graphs
  // none (session 52).
  BlockStore& b = *blocks_;
  if (b.graph == graph) {
    flush_counts();
    b.abandon();
  }
  auto drop = [graph](auto& keyed, auto key) {  // every element of `keyed` whose key holds `graph` first
    for (auto it = keyed.begin(); it != keyed.end();) it = std::get<0>(key(*it)) == graph ? keyed.erase(it) : std::next(it);
  };
  auto map_key = [](const auto& element) -> const auto& { return element.first; };
  drop(b.entries, map_key);
  drop(b.one_thread_items, map_key);
  drop(b.forks, [](const auto& element) -> const auto& { return element; });
  std::lock_guard<std::mutex> lock(counts_mutex_);
  counts_.erase(graph);
}

void GraphRunner::set_grad_mode(bool on) {
  if (grad_mode_ == on) return;
  c10::GradMode::set_enabled(on);
  grad_mode_ = on;
}

void GraphRunner::execute(WorkItem& item, uint64_t seq) {
  if (run_control(item)) return;
  advance_sequence(item.sequence_floor);
  streams_.use(item.stream);
  struct Publish {
    std::atomic<uint64_t>& to;
    ~Publish() { to.store(at::sequence_number::peek(), std::memory_order_release); }
  } publish{sequence_};
  if (item.autocast != autocast_) {
    item.autocast.apply();
    autocast_ = item.autocast;
  }
  // Left as the item set it, not restored: the next item sets its own, mostly the same (a guard
  // per item wrote the thread-local state twice, through __tls_get_addr, about 90 instructions).
  set_grad_mode(item.grad_mode);
  std::optional<c10::InferenceMode> inference;
  if (item.inference_mode) inference.emplace();
  BlockStore& b = *blocks_;
  if (clears_grad(item)) {  // in issue order, whatever the block's state: no block holds it
    run_per_op(item, nullptr);
    return;
  }
  if (item.iteration != b.iteration) start_iteration(item, seq);
  if (b.state == BlockStore::State::Replaying && replay(item, seq)) return;
  if (b.state == BlockStore::State::Recording) {
    use_threads(item.num_threads);
    run_per_op(item, b.recorder.get());
    return;
  }
  if (item.num_threads <= 1) {
    use_threads(item.num_threads);
    run_per_op(item, nullptr);
    return;
  }
  // While the program waits and the OpenMP workers spin anyway, the item takes the program's
  // count (openmp_workers_spinning): as eagerly, its kernels' bits are the program's.
  if (python_blocked() && openmp_workers_spinning()) {
    use_threads(item.num_threads);
    run_per_op(item, nullptr);
    return;
  }
  auto known = b.one_thread_items.find({item.graph, item.node, static_cast<int>(item.kind)});
  const bool all = known != b.one_thread_items.end() && known->second;
  b.items_one_thread += all;
  use_threads(all ? 1 : item.num_threads);
  run_per_op(item, nullptr, /*per_kernel_threads=*/!all);
}

void GraphRunner::use_threads(int n) {
  // Reductions split work by thread count: the program thread's, so results are bitwise those
  // of eager execution (or one, where a replayed block was checked to give the same bits).
  if (n > 0 && at::get_num_threads() != n) set_intraop_threads(n);
  ready_openmp_workers(n);  // its workers, once made, are lowered at the next iteration's start
}

void GraphRunner::run_per_op(WorkItem& item, BlockRecorder* recorder, bool per_kernel_threads) {
  std::optional<RecordingScope> recording;
  switch (item.kind) {
    case OpKind::Aten: {
      torch::jit::Stack stack;
      stack.reserve(item.args.size());
      for (const c10::IValue& v : item.args) stack.push_back(resolve_placeholders(v));
      const bool autograd = needs_autograd(stack, item.grad_mode);
      if (recorder) {
        recorder->begin_item(item, stack, autograd);
        recording.emplace(recorder);
      } else if (per_kernel_threads) {
        recording.emplace(nullptr);
      }
      if (autograd) {
        count(ops_autograd_);
        item.op->callBoxed(&stack);
      } else {
        count(ops_below_autograd_);
        // Nothing for autograd to record (an optimizer update under no_grad, a metric, data
        // preparation): the kernel below it, as autograd would call it. ADInplaceOrView stays, so
        // version counters and view metadata are eager's.
        at::AutoDispatchBelowAutograd below;
        item.op->callBoxed(&stack);
      }
      recording.reset();
      size_t k = 0;
      std::vector<at::Tensor> outs;  // for the recorder only
      auto out = [&](const at::Tensor& t) {
        fill_output(item, k++, t);
        if (recorder) outs.push_back(t);
      };
      for (const c10::IValue& r : stack) {
        if (r.isTensor()) {
          out(r.toTensor());
        } else if (r.isTensorList()) {
          for (const at::Tensor& t : r.toTensorList()) out(t);
        }
      }
      if (recorder) recorder->end_item(item, outs);
      break;
    }
    case OpKind::Backward: {
      auto roots = tensors_of(item.args.at(0));
      auto grads = tensors_of(item.args.at(1));
      bool retain = item.args.at(2).toBool();
      bool create = item.args.at(3).toBool();
      if (recorder) {
        torch::jit::Stack args;
        for (const c10::IValue& v : item.args) args.push_back(resolve_placeholders(v));
        recorder->begin_item(item, args, true);
        recorder->before_backward(roots, retain, create);
        recording.emplace(recorder);
      } else if (per_kernel_threads) {
        recording.emplace(nullptr);
      }
      torch::autograd::backward(roots, grads, retain, create);
      recording.reset();
      if (recorder) {
        recorder->after_backward();
        recorder->end_item(item, {});
      }
      break;
    }
    case OpKind::GradRead:
    case OpKind::GradWrite: {
      if (recorder) {
        torch::jit::Stack args;
        for (const c10::IValue& v : item.args) args.push_back(resolve_placeholders(v));
        recorder->begin_item(item, args, false);
      }
      if (item.kind == OpKind::GradRead) {
        run_grad_read(item);
      } else {
        run_grad_write(item);
      }
      if (recorder) {
        std::vector<at::Tensor> outs;
        if (item.kind == OpKind::GradRead && !item.outs.empty() && item.outs[0]) outs.push_back(item.outs[0]->value);
        recorder->end_item(item, outs);
      }
      break;
    }
    case OpKind::ReleaseTeam:  // run_control
    case OpKind::ClearAutocastCache:
    case OpKind::EndIteration:
    case OpKind::DropGraph:
    case OpKind::Marker:
      break;
  }
}

}  // namespace terra::runtime
