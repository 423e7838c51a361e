// Block replay: the GraphRunner runs a co-executed iteration as the backend kernels it ran the
// last time, below autograd, instead of op by op through autograd and the autograd engine.
//
// Recording. One co-executed iteration whose items arrive as a whole (from its first item to the
// PythonRunner's EndIteration item) is executed as usual, through autograd, with a dispatcher hook
// below autograd switched on for the GraphRunner thread (`BlockRecorder`). The hook sees every
// kernel call that reaches the backends: the forward's, the backward's nodes (the autograd engine
// runs a CPU backward on the calling thread) and the optimizer's. It records the top-level ones
// in issue order, each argument as a reference to what produced it:
//   a value made by an earlier kernel of the iteration, found by TensorImpl or, for autograd's
//     shallow copies of saved outputs, by storage and geometry;
//   an argument of one of the iteration's items (a parameter, an input batch, a placeholder from
//     an earlier iteration), re-read from that item every time;
//   a Python number of the item itself (a learning rate, Adam's bias correction), re-read too;
//   a leaf's current `.grad` (the backward accumulating into it);
//   a constant.
// What AccumulateGrad did to each leaf's `.grad` (assigned a new tensor, or accumulated in place)
// is read by comparing the gradients before and after the backward. A recording is refused (and
// the iteration keeps the autograd route) where replaying could differ from eager execution: a
// tensor from outside the iteration that no item names, a generator object, a kernel returning a
// host value inside a decomposition, hooks or Python in the backward, create_graph,
// items on more than one accelerator stream, a backward on the CPU and an accelerator, tensor
// subclasses, conjugate/negative views, autograd history that no backward of the iteration
// consumes, leaves made inside it. Items under autocast or torch.inference_mode are recorded
// (since session 53) with that state, which a replayed item must have too: autocast's casts are
// kernels below its keys, recorded as the others (a weight cast its cache kept from an earlier
// iteration is a tensor from outside the iteration, refused), and inference mode is set around
// the item's kernels as when recorded, so they make inference tensors where eager's did. A
// backward with retain_graph=True leaves the histories it reaches to a later backward; a history
// whose last backward kept the graph is bound each time (eager's graph, kept). An accelerator's backward runs on the autograd
// engine's device thread, whose kernels the hook records too (the engine carries the dispatch-key
// TLS over); they are replayed on the GraphRunner thread, on the block's stream.
//
// Replay. An iteration whose items follow the recorded block runs its kernels through
// `redispatchBoxed` with the recorded dispatch keys (below autograd, so no autograd nodes and no
// engine), bumps version counters where eager's ADInplaceOrView would, lets views share their
// base's version counter, applies the `.grad` effects and fills the placeholders. An item that
// ran through autograd while recorded is replayed only once every item up to the backward that
// consumes its history has been issued and follows the block: if the program leaves the block
// before that (a divergence, a fetch that waits), those items take the autograd route, so a
// program that goes on eagerly finds eager's autograd graph. Outputs that eager execution would
// give a grad_fn get a node that raises if a backward ever reaches it (eager's graph would have
// been freed by the backward already).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd_node.h"
#include "kernel_counts.h"
#include "kernel_lanes.h"
#include "openmp_team.h"
#include "out_form.h"
#include "random_fill.h"
#include "thread_state.h"

namespace torch::autograd {
struct Node;
}

namespace terra::runtime {

struct WorkItem;
class ElementwiseReplay;
enum class OpKind : uint8_t;

// What a recorded kernel argument (or an item's output, or a gradient) is at replay time.
struct Ref {
  enum class Kind : uint8_t { Value, Const, Grad, List };
  Kind kind = Kind::Const;
  uint32_t id = 0;    // Value: table index; Grad: index of the leaf in Block::leaves
  int32_t elem = -1;  // Value: element of a tensor-list value (-1: the whole value)
  c10::IValue constant;
  std::vector<Ref> list;       // List: its elements
  c10::TypePtr element_type;   // List: the list's element type
};

// A view kernel's result made again without the kernel (BlockReplayer::run_alias): where its input
// has the recorded geometry, dtype and dispatch keys and its other arguments (dims, indices,
// sizes: constants, or the item's Python numbers, then compared with the recorded ones) are the
// recorded ones, the result's geometry is the recorded one (a view's is a function of those
// alone), as long as the input's storage holds it. Kept only where the recorded result was what a
// view kernel's `as_strided` or `alias_with_sizes_and_strides` makes: a plain TensorImpl on the
// input's storage with the input's keys and dtype, metadata changes allowed (what `detach` makes
// below ADInplaceOrView too: forbidding them is that key's work, which replay skips either way).
// View kernels (t, view, transpose, select...) are a fifth to a quarter of a transformer's or an
// RNN's replayed kernels, each ~2,000 GraphRunner instructions through the dispatcher.
struct AliasGeometry {
  std::vector<int64_t> in_sizes, in_strides, out_sizes, out_strides;
  int64_t in_offset = 0, out_offset = 0;
  size_t out_bytes = 0;  // of storage the result reaches
  c10::DispatchKeySet in_keys;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<std::pair<uint32_t, c10::IValue>> numbers;  // arguments re-read from the item, as recorded
};

struct RecordedKernel {
  const c10::OperatorHandle* op = nullptr;
  c10::DispatchKeySet keys;         // what the kernel was redispatched with (below the hook)
  std::vector<Ref> args;
  uint32_t first_out = 0;           // table index of return 0
  uint32_t outs = 0;
  std::vector<uint32_t> written;    // arguments the schema marks as written (version bump)
  bool view = false;                // returns alias argument 0: share its version counter
  // Gave the same bits with one intra-op thread as with the program's count (checked while
  // recorded): replayed with one, except a long kernel while the program thread waits for the
  // GraphRunner (BlockReplayer::run); else always with the program's.
  bool one_thread = true;
  // Worth the program's intra-op threads while the program thread waits, even where that wakes
  // the OpenMP workers (while they spin anyway, any kernel is: openmp_workers_spinning): it ran
  // for at least kSpreadNs when recorded and is `large` (the time alone is no guide: a kernel's
  // first call can take 50 us and its next ones 2).
  // Cleared by a replay that ran it on one thread in under half of kSpreadNs (BlockReplayer::run:
  // the recorded time was an accident), hence mutable; GraphRunner thread only.
  mutable bool spread = false;
  static constexpr uint64_t kSpreadNs = 50'000;
  // A tensor of its call has at least ATen's grain size of elements: with more than one thread
  // it starts a parallel region, whose workers then spin (note_parallel_region). A smaller one
  // may run on one thread whatever the count, and noting it would keep every later kernel
  // spread on the strength of workers that never woke.
  bool large = false;
  // How long it ran when recorded (the fastest of the recording's one-thread runs, where made).
  uint32_t ran_ns = 0;
  std::vector<uint32_t> release;    // table entries last read by this kernel
  // An elementwise operator that replays through a kept TensorIterator (elementwise_replay.h);
  // null for the others. Used by the GraphRunner thread only.
  std::shared_ptr<ElementwiseReplay> elementwise;
  // A random fill replayed with its draws made in batches (random_fill.h); None for the others.
  RandomFill::Op random = RandomFill::Op::None;
  // A view made again without its kernel (AliasGeometry); null for the others.
  std::shared_ptr<const AliasGeometry> alias;
  // The out= form of a structured functional kernel on the CPU (out_form.h), which a replay calls
  // with the results it kept from the last one where those are free again; null for the others.
  // Cleared where its first use (BlockReplayer::run_out_form) finds that form differs; checked:
  // it did not.
  mutable const c10::OperatorHandle* out_form = nullptr;
  mutable bool out_checked = false;
  // Its results of the last replays, for its out= form (KeptResults). GraphRunner thread, or the
  // one helping thread that runs the kernel in a replay (kernel_lanes.h), hence mutable.
  mutable KeptResults kept;
};

// One item of the block: what it was, and how to run it again.
struct ItemPlan {
  OpKind kind{};  // zero: OpKind::Aten (declared in graph_runner.h)
  uint32_t node = 0;
  const c10::OperatorHandle* op = nullptr;
  // Ran through autograd when recorded and its history is consumed by the backward at item
  // `covered_by`: replayed only when every item up to that one is known to follow the block.
  // History that no backward of the iteration consumed (`kNoBackward`: a generator's output
  // detached for the discriminator's step) is made again: the item is bound (BlockReplayer::bind)
  // every time, so a tensor the program keeps has eager's autograd graph for a later backward.
  bool autograd = false;
  // Its outputs' histories, consumed in part by the backward `covered_by` (an LSTM's output is,
  // its last hidden and cell states are not): `consumed_outs` are the outputs whose history that
  // backward reached. Such an item is bound every time (its outputs get eager's autograd graph,
  // for a later backward through the others), the backward replayed below autograd, and then what
  // it reached of the bound graph from `consumed_outs` has its saved tensors freed, as eager's
  // backward frees them (a second backward through them raises as eagerly).
  bool partial = false;
  std::vector<uint32_t> consumed_outs;
  // Backward: the partial items whose bound graphs it consumed in part (their release).
  std::vector<uint32_t> partial_items;
  // Ran under torch.inference_mode: replayed under it (GraphRunner::execute sets it per item), so
  // the kernels make inference tensors where eager's did; an item in the other mode leaves.
  bool inference_mode = false;
  // Ran under autocast: its kernels are what autocast dispatched to (the casts included, below
  // the Autocast keys), so they replay as recorded; an item under another state leaves.
  AutocastState autocast;
  static constexpr uint32_t kNoBackward = UINT32_MAX;
  uint32_t covered_by = 0;
  struct Load {
    uint32_t arg = 0;   // argument position
    int32_t elem = -1;  // element of a tensor list
    uint32_t id = 0;    // table index
    // The same tensor as an earlier item's load when recorded (item index, its load), which it
    // must still be (BlockReplayer::follows). It shares that load's table index: the kernels
    // after this item read it there, and it is written again only with another tensor.
    int32_t same_item = -1;
    uint32_t same_load = 0;
    // The items of the iteration whose placeholder for the tensor the program could have passed
    // when recorded (kOutside: one from before the iteration; none: from outside only), checked
    // for the items whose autograd history the block's backward consumes, and for it.
    static constexpr int32_t kOutside = -1;
    std::vector<int32_t> made_by;
  };
  std::vector<Load> loads;
  uint32_t kernels_begin = 0, kernels_end = 0;
  // Python numbers of the item that the kernels do not re-read: they must be as recorded.
  std::vector<std::pair<uint32_t, c10::IValue>> guards;
  std::vector<Ref> outs;     // the item's outputs, in the order of WorkItem::outs
  // Per output: its grad_fn's name when recorded (an index into Block::grad_fn_names), or -1.
  std::vector<int32_t> grad_fns;
  int32_t out_table = -1;    // GradRead: where its output goes
  struct GradEffect {
    uint32_t leaf = 0;
    Ref value;
  };
  std::vector<GradEffect> effects;  // Backward: leaf.grad = value
  // Backward: whether each leaf it reaches had a gradient before it, and has one after it.
  // AccumulateGrad assigns where there was none and accumulates where there was one, so a
  // replayed backward needs the same before-states (checked before the block's forward is
  // replayed: BlockReplayer::grads_as_recorded).
  struct LeafState {
    uint32_t leaf = 0;
    bool before = false, after = false;
  };
  std::vector<LeafState> leaf_states;
  std::vector<uint32_t> release;    // table entries last read by this item (after its kernels)
  // Which of its kernels may run beside each other (kernel_lanes.h); null: in order.
  std::shared_ptr<const LanePlan> lanes;
};

struct Block {
  uint64_t graph = 0;  // Graph::serial
  std::vector<ItemPlan> items;
  std::vector<RecordedKernel> kernels;
  std::vector<Ref> leaves;  // the backward's leaves (Ref::Kind::Value)
  // Where each leaf was loaded: (item index, index in its loads).
  std::vector<std::pair<uint32_t, uint32_t>> leaf_loads;
  uint32_t table_size = 0;
  // What the outputs' grad_fns were called (MulBackward0...): the replayed outputs' stand-ins
  // carry the same names, so printing a tensor shows what eager execution shows.
  std::vector<std::string> grad_fn_names;
  // Every kernel, run again on copies of its arguments with one intra-op thread while recorded,
  // gave the same bits (and drew the same random numbers) as with the program's thread count
  // (RecordedKernel::one_thread, by which each kernel is replayed). Which code path a kernel
  // takes depends on the shapes and the thread count, not on the values, and a different path
  // (another split of a reduction, another vector/scalar boundary, an FMA in the vector loop
  // only) shows in the bits of generic data.
  bool one_thread = true;       // derived from the kernels' flags when the block is finished
  std::string not_one_thread;  // the first kernel that gave other bits with one thread
  uint32_t program_count_kernels = 0;  // kernels replayed with the program's count (not one_thread)
  // Kernels that run parallel regions on the GraphRunner: on tensors of at least the grain size
  // (RecordedKernel::large; with the program's count, or spread while the program waits), and on
  // smaller ones (with the program's count, which their bits need: an mm MKL splits, layer_norm's
  // or batch_norm's per-thread sums). A region on small tensors lasts microseconds, and the
  // worker it woke then spins about 9 ms beside the program thread (openmp_team.h); corpus
  // programs whose blocks have only such kernels ran 1.3-1.4x faster with the workers asleep
  // (docs/history.md, session 55). `terra.stats`: parallel_kernels_large, parallel_kernels_small.
  uint32_t parallel_large = 0, parallel_small = 0;
  // large_ns[i]: how long the large one-thread kernels before kernel i ran when recorded
  // (RecordedKernel::ran_ns), kernels.size() + 1 entries (index_large_work): the work a waiting
  // program waits for (large_work, BlockReplayer::spread).
  std::vector<uint64_t> large_ns;
};

// Fills block.large_ns from its kernels (BlockRecorder::finish).
void index_large_work(Block& block);
// How long the large one-thread kernels from kernel `kernel` to the end of item `last_item` ran
// when recorded (0 where that item ends before the kernel).
uint64_t large_work(const Block& block, uint32_t kernel, uint32_t last_item);

// Records one iteration (GraphRunner thread). `begin_item`/`end_item` bracket each item's
// ordinary execution; the dispatcher hook calls `kernel_begin`/`kernel_end` while `active()`.
class BlockRecorder {
 public:
  // `accelerators`: items on an accelerator stream are recorded (else the block is refused).
  BlockRecorder(uint64_t graph, bool accelerators);
  ~BlockRecorder();
  // `args`: the item's arguments with placeholders resolved. `autograd`: it takes the autograd
  // route (the caller's decision).
  void begin_item(const WorkItem& item, const torch::jit::Stack& args, bool autograd);
  // `returns`: the item's outputs (flattened in the order of WorkItem::outs); Backward: none.
  void end_item(const WorkItem& item, const std::vector<at::Tensor>& returns);
  // Around a Backward item's execution: the leaves it reaches and their gradients before, and
  // which forward items' histories it consumes.
  void before_backward(const std::vector<at::Tensor>& roots, bool retain_graph, bool create_graph);
  void after_backward();
  // Between the two, for a backward with an accelerator's nodes (run on the engine's device thread).
  bool device_backward() const;
  // `device_thread`: called on the autograd engine's device thread during a backward.
  void kernel_begin(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const torch::jit::Stack& args,
                    bool device_thread = false);
  void kernel_end(const torch::jit::Stack& returns, uint64_t ran_ns);  // ran_ns: how long it ran
  // After kernel_end: runs the kernel again on copies of its arguments with one thread.
  void check_one_thread(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const torch::jit::Stack& returns);
  // After kernel_begin: the kernel is known, from an earlier recording in this process, to give
  // the same bits with one thread (or only allocates): it runs with one now too. (On two cores a
  // GraphRunner running parallel regions competes with the program thread for the cores, and
  // every region's barrier waits for a descheduled worker: corpus p01's first co-executed
  // iteration took 3-18 ms instead of 0.5.)
  bool one_thread_known() const;
  // Kernels whose outputs are uninitialized memory (empty, empty_like...): never checked.
  static bool only_allocates(const c10::OperatorHandle& op);
  uint64_t kernels_checked() const;   // run again on copies (check_one_thread)
  uint64_t verdicts_reused() const;   // known from an earlier recording instead
  void refuse(std::string why);
  bool refused() const { return !why_.empty(); }
  const std::string& why() const { return why_; }
  // The finished block, or nullptr (refused; `why()` says why).
  std::unique_ptr<Block> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string why_;
};

// Installs the dispatcher hook (once per process).
void install_record_hook();
// Includes the hook's dispatch key on this thread for its lifetime; without a recorder, the hook
// only runs each kernel known to give the same bits with one thread with one.
class RecordingScope {
 public:
  explicit RecordingScope(BlockRecorder* r);
  ~RecordingScope();
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a recorded block, item by item in order (GraphRunner thread).
class BlockReplayer {
 public:
  void start(const Block& block);
  void finish();  // drops what the table still holds
  // Points `follows` and `grads_as_recorded` at `block` without starting it (nothing of this
  // iteration replayed yet): GraphRunner::choose asks each of several blocks.
  void consider(const Block& block) {
    block_ = &block;
    next_ = 0;
  }
  // Whether `item` (issued as `seq`) can be item `index` of the block: same graph, node and kind,
  // its Python numbers as guarded, its tensors aliasing as recorded and, where the block's
  // backward consumes its history (and for that backward), made where the recorded ones were.
  // `seqs[j]`: item j of this iteration's sequence number (up to `index`); `earlier(j)` gives
  // item j where it has not been replayed yet.
  bool follows(uint32_t index, const WorkItem& item, uint64_t seq, const std::vector<uint64_t>& seqs,
               const std::function<const WorkItem*(uint32_t)>& earlier) const;
  // Whether, when the Backward item `index` runs, each leaf it reaches will have a gradient
  // exactly where the recorded one had: from the leaves' gradients now, through the GradWrite
  // and Backward items from `next()` to `index` and the gradients cleared between them by items
  // no block holds (`cleared(k, leaves)`: the leaves whose `.grad` is set to None after item
  // k - 1 of the block and before item k runs, `next()` first; false: unknown).
  using ClearedBefore = std::function<bool(uint32_t, std::vector<const c10::TensorImpl*>&)>;
  bool grads_as_recorded(uint32_t index, const std::function<const WorkItem*(uint32_t)>& earlier,
                         const ClearedBefore& cleared) const;
  // Replays the next item (`next()`), which must follow. Throws what the kernels throw.
  // `program_waits` (set_program_waits), asked before each kernel that gives the program's bits
  // with one intra-op thread: whether the program thread waits for the GraphRunner, leaving its
  // core to the kernel's other threads (then a long kernel, RecordedKernel::spread, runs with the
  // program's count, as eagerly; else with one, leaving that core to the program's Python;
  // `spread` below has the other cases).
  // Measured with every such kernel, long or short, the program thread sleeping up to 512 ops
  // ahead (forced co-execution, 3 interleaved rounds of fresh processes, ms per step, one thread
  // always -> by this): resnet 9.3 -> 7.0, dcgan 8.0 -> 6.9, gpt 10.9 -> 8.3 (eager 7.4, 6.5,
  // 8.2). Short kernels stay on one: a parallel region wakes the OpenMP worker, which then spins
  // on the core the program's Python needs once it resumes (corpus p05, p06, p09, whole program
  // against eager: 1.18 -> 1.97, 0.88 -> 1.26, 0.73 -> 0.92, p05 then run eagerly by the payoff
  // check; p01, whose mse_loss took 53 us when recorded, 1.13 -> 2.47 by time alone).
  void run(WorkItem& item);
  // How many items the program thread waits for the GraphRunner to run, from the one running
  // (0: it does not wait); see run (bound kernels use it too).
  void set_program_waits(std::function<uint64_t()> waits) { program_waits_ = std::move(waits); }
  // Waited-for large kernels that ran this long on one thread when recorded are worth waking
  // the OpenMP workers for, short ones among them (`spread`).
  static constexpr uint64_t kSpreadBacklogNs = 200'000;
  // Items with a LanePlan run their kernels on these two threads (null: in order, on this one).
  void set_lanes(KernelLanes* lanes) { lanes_ = lanes; }
  // Binding: the next item (which must follow) runs through autograd as usual (`execute`), and
  // the backend kernels it reaches are matched, in order, with the recorded ones, their outputs
  // taking the recorded ones' places in the table, so that a later replayed item (the backward)
  // reads them. Used where the program waits for a value before the block's backward is issued:
  // the forward then builds eager's autograd graph, and the backward and the optimizer are still
  // replayed. False: the kernels did not match (the rest of the iteration runs op by op).
  bool bind(WorkItem& item, const std::function<void(WorkItem&)>& execute);
  // The hook's side of binding (block_replay.cpp).
  void bind_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  // After a replayed backward whose forward was bound: frees the saved tensors of the autograd
  // graph behind `roots`, as eager's backward does (a second backward raises as in eager).
  static void release_graph(const std::vector<at::Tensor>& roots);
  static void release_nodes(std::vector<torch::autograd::Node*> starts);  // and all they reach
  uint32_t next() const { return next_; }
  const Block* block() const { return block_; }
  // What its kernels did so far (GraphRunner::flush_counts hands the differences to the graph's
  // counts).
  const KernelCounts& counts() const { return counts_; }

 private:
  c10::IValue value(const Ref& r) const;
  at::Tensor tensor(const Ref& r) const;
  // The tensor of leaf `leaf` (from the table or, not replayed yet, its item).
  at::Tensor leaf_tensor(uint32_t leaf, const std::function<const WorkItem*(uint32_t)>& earlier) const;
  void load(const ItemPlan& p, WorkItem& item);
  // Runs one kernel of the block on the calling thread, its arguments and results in `stack`
  // (scratch, reused). `alone`: no other kernel runs meanwhile (in order, or a barrier of a
  // LanePlan), so it may be spread and timed; a free kernel of a LanePlan (possibly on a helping
  // thread) runs with one intra-op thread and writes no counter.
  void run_kernel(const RecordedKernel& k, torch::jit::Stack& stack, int num_threads, bool alone);
  const Block* block_ = nullptr;
  KernelLanes* lanes_ = nullptr;
  uint32_t next_ = 0;
  uint32_t bind_cursor_ = 0, bind_end_ = 0;  // binding: the next recorded kernel, the item's end
  bool bind_ok_ = true;
  std::vector<c10::IValue> table_;
  torch::jit::Stack scratch_;  // run: the kernels' arguments and results (empty between items)
  // The grad_fns of outputs (see the header), one per name in Block::grad_fn_names.
  std::vector<NodePtr> freed_;
  KernelCounts counts_;
  std::function<uint64_t()> program_waits_;
  uint32_t item_ = 0;  // the item running or bound (its index in the block)
  // Kernel `k`, about to run with `threads` intra-op threads, takes them although one would do.
  // follows' check that the tensors of `item` (issued as `seq`) were made where the recorded ones
  // were: outside the iteration, or by the same earlier item.
  bool made_as_recorded(const ItemPlan& p, const WorkItem& item, uint64_t seq,
                        const std::vector<uint64_t>& seqs) const;
  // Kernel `k` through its ElementwiseReplay with its arguments read in place, its result stored;
  // false: not so covered (run_kernel's stack route then). `*tried`: the ElementwiseReplay was
  // asked (the stack route need not ask it again).
  bool run_elementwise(const RecordedKernel& k, bool alone, bool* tried);
  // A view kernel's result made directly (AliasGeometry); false: run the kernel.
  bool run_alias(const RecordedKernel& k);
  // Kernel `k` (with an out_form) in its out= form into its kept results, where they are free again
  // (`stack`: its arguments in, its results out); false, the stack unchanged, where not. Its first
  // use also runs the functional form and keeps that form's results where the two differ in any
  // way (bits, geometry, where they are, a warning), and the kernel allocates from then on.
  bool run_out_form(const RecordedKernel& k, torch::jit::Stack& stack);
  // After the kernel ran (`outs`: its results): keeps them for the next replay where they are
  // small tensors (KeptResults::keep).
  static void keep_results(const RecordedKernel& k, c10::ArrayRef<c10::IValue> outs);
  // Kernel `k`, about to run with one intra-op thread, takes the program's `threads` instead: the
  // program waits, and the kernel is long, or the OpenMP workers spin anyway (openmp_team.h), or
  // the large kernels the program waits for, from this one on, are enough work to pay one
  // wake-up of the workers back (kSpreadBacklogNs). Without that last case a chain of 256x256
  // adds (5 us each on one thread, 3.5-3.8 eagerly on two) ran at 0.69x eager's speed, the
  // program waiting for hundreds of them at a time; 0.88x so (per-op benchmark, 5 rounds, the
  // previous build in the same rounds: bench/results/s44_spread_backlog.md). A waiting program's
  // workers counted as spinning after any earlier region (openmp_team.h) spread most kernels
  // anyway once one was: the case decides the first spread after the GraphRunner ran none.
  bool spread(const RecordedKernel& k, int threads) const;
};

}  // namespace terra::runtime
