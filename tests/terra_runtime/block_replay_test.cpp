// Block replay on hand-built programs: a GraphRunner is fed work items the way the PythonRunner
// issues them (placeholders between items, iteration serials, EndIteration), and every result is
// compared bitwise with the same program run eagerly. block_replay.h says what is recorded.
#include "block_replay.h"
#include "graph_runner.h"
#include "placeholder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <thread>

// A kernel that waits until the test opens the gate: the GraphRunner stops there, so the test
// decides what the program does while the items after it wait.
static std::atomic<bool> gate_open{false};

TORCH_LIBRARY(terra_test, m) { m.def("gate(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(terra_test, CPU, m) {
  m.impl("gate", [](const at::Tensor& x) {
    while (!gate_open.load()) std::this_thread::yield();
    return x.clone();
  });
}

namespace terra::runtime {
namespace {

const c10::OperatorHandle& op(const char* name, const char* overload) {
  static std::map<std::string, c10::OperatorHandle> ops;
  const std::string key = std::string(name) + "." + overload;
  auto it = ops.find(key);
  if (it == ops.end())
    it = ops.emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)).first;
  return it->second;
}

// Issues one program's items to a GraphRunner as the PythonRunner would.
class Issuer {
 public:
  explicit Issuer(GraphRunner& r) : r_(r) {}
  // Watch the placeholders among the items' arguments, as the PythonRunner does.
  void set_watch(DeadValueWatch* w) { watch_ = w; }

  void begin_iteration() { ++iteration_; node_ = 0; }
  // The items issued from now on ran under torch.inference_mode (WorkItem::inference_mode), and
  // under this autocast state (WorkItem::autocast).
  void set_inference(bool on) { inference_ = on; }
  void set_autocast(const AutocastState& state) { autocast_ = state; }
  void end_iteration() { r_.issue_control(OpKind::EndIteration); }

  // An ATen op; returns placeholders for its `outputs` tensor outputs (metadata from `like`).
  std::vector<at::Tensor> aten(const c10::OperatorHandle& o, torch::jit::Stack args, bool grad_mode,
                               const std::vector<at::Tensor>& like) {
    if (watch_) watch_->check(r_.lightened(), /*gil=*/false);
    WorkItem& item = fill(OpKind::Aten, std::move(args), grad_mode);
    item.op = &o;
    if (watch_) watch_->watch(item.args, r_.issued() + 1);
    std::vector<at::Tensor> outs;
    uint64_t bytes = 0;
    for (const at::Tensor& l : like) {
      auto slot = std::make_shared<Slot>();
      slot->seq = r_.issued() + 1;
      slot->runner_allocated = true;
      outs.push_back(make_placeholder(meta_of(l), slot, own_group(slot)));
      item.outs.push_back(std::move(slot));
      bytes += l.nbytes();
    }
    last_ = r_.issue(bytes);
    return outs;
  }
  void backward(const at::Tensor& root, bool retain_graph = false) {
    c10::List<at::Tensor> roots({root});
    c10::impl::GenericList grads(c10::OptionalType::create(c10::TensorType::get()));
    grads.push_back(c10::IValue());
    fill(OpKind::Backward, {roots, grads, retain_graph, false}, true);
    last_ = r_.issue();
  }
  // `.grad` of `leaf` (defined: whether the program knows it is).
  at::Tensor grad_read(const at::Tensor& leaf, const at::Tensor& like) {
    WorkItem& item = fill(OpKind::GradRead, {leaf}, true);
    auto slot = std::make_shared<Slot>();
    slot->seq = r_.issued() + 1;
    at::Tensor p = make_placeholder(meta_of(like), slot, own_group(slot));
    item.outs.push_back(std::move(slot));
    last_ = r_.issue();
    return p;
  }
  void grad_write_none(const at::Tensor& leaf) {
    fill(OpKind::GradWrite, {leaf, c10::IValue()}, true);
    last_ = r_.issue();
  }
  uint64_t last() const { return last_; }

 private:
  WorkItem& fill(OpKind kind, torch::jit::Stack args, bool grad_mode) {
    WorkItem& item = r_.next_item();
    item.clear();
    item.kind = kind;
    item.op = nullptr;
    item.grad_mode = grad_mode;
    item.inference_mode = inference_;
    item.autocast = autocast_;
    item.args = std::move(args);
    item.expect = nullptr;
    item.node = ++node_;
    item.graph = 7;
    item.sequence_floor = 0;
    item.num_threads = at::get_num_threads();
    item.iteration = iteration_;
    item.stream.reset();
    return item;
  }
  GraphRunner& r_;
  DeadValueWatch* watch_ = nullptr;
  uint64_t iteration_ = 1000;
  bool inference_ = false;
  AutocastState autocast_;
  uint32_t node_ = 0;
  uint64_t last_ = 0;
};

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.sizes() == b.sizes() && at::equal(a, b)));
}

// One SGD step on y = sum((x @ w) * s) with a learning rate that changes every iteration: the
// learning rate is a Python number of the update (a feed), `s` a new tensor each iteration.
struct SgdProgram {
  at::Tensor w = at::randn({4, 3}).requires_grad_();
  at::Tensor x = at::randn({5, 4});

  // The same program on copies of this one's tensors (the co-executed side of a comparison).
  SgdProgram twin() const {
    SgdProgram t;
    t.w = w.detach().clone().requires_grad_();
    t.x = x.clone();
    return t;
  }

  void eager_step(double lr, const at::Tensor& s, bool set_to_none) {
    if (set_to_none) w.mutable_grad() = at::Tensor();
    at::Tensor loss = (x.mm(w) * s).sum();
    torch::autograd::backward({loss});
    at::NoGradGuard no_grad;
    w.add_(w.grad(), -lr);
  }
  // One eager step whose loss is `loss_of(h)`, h = x @ w (gradients set to None first).
  void eager_step_on(const std::function<at::Tensor(const at::Tensor&)>& loss_of, double lr = 0.1) {
    eager_step_with([&](const at::Tensor& h) { torch::autograd::backward({loss_of(h)}); }, lr);
  }
  // One eager step whose backwards `backward_of(h)` runs, h = `h_of()` (x @ w by default).
  void eager_step_with(const std::function<void(const at::Tensor&)>& backward_of, double lr,
                       const std::function<at::Tensor()>& h_of = {}) {
    w.mutable_grad() = at::Tensor();
    backward_of(h_of ? h_of() : x.mm(w));
    at::NoGradGuard no_grad;
    w.add_(w.grad(), -lr);
  }
  // The co-executed side's start of such a step: its iteration, the gradient set to None, and
  // h = x @ w (its placeholder); `like` gets h's metadata.
  at::Tensor issue_forward_start(Issuer& is, at::Tensor* like) {
    is.begin_iteration();
    is.grad_write_none(w);
    *like = x.mm(w.detach()).requires_grad_();
    return is.aten(op("aten::mm", ""), {x, w}, true, {*like})[0];
  }
  // And its end: the backward of `loss`, the gradient read and the update.
  void issue_backward_and_update(Issuer& is, const at::Tensor& loss, double lr = 0.1) {
    is.backward(loss);
    const at::Tensor g = is.grad_read(w, w.detach());
    is.aten(op("aten::add_", "Tensor"), {w, g, -lr}, false, {});
    is.end_iteration();
  }
  // `before_backward(loss)`: what the program does between the forward and the backward.
  void issue_step(Issuer& is, double lr, const at::Tensor& s, bool set_to_none,
                  const std::function<void(const at::Tensor&)>& before_backward = {}) {
    is.begin_iteration();
    if (set_to_none) is.grad_write_none(w);
    const at::Tensor h_like = x.mm(w.detach()).requires_grad_();
    at::Tensor h = is.aten(op("aten::mm", ""), {x, w}, true, {h_like})[0];
    at::Tensor m = is.aten(op("aten::mul", "Tensor"), {h, s}, true, {h_like})[0];
    at::Tensor loss = is.aten(op("aten::sum", ""), {m, c10::IValue()}, true,
                              {h_like.sum()})[0];
    if (before_backward) before_backward(loss);
    is.backward(loss);
    at::Tensor g = is.grad_read(w, w.detach());
    is.aten(op("aten::add_", "Tensor"), {w, g, -lr}, false, {});
    is.end_iteration();
  }
};

TEST(BlockReplay, AnSgdStepIsReplayedBitwiseWithANewLearningRateEachIteration) {
  at::manual_seed(1);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  const int64_t eager_version = eager.w._version(), coexec_version = coexec.w._version();
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 8; ++i) {
    const double lr = 0.1 / (1 + i);
    const at::Tensor s = at::randn({5, 3});
    eager.eager_step(lr, s, /*set_to_none=*/true);
    coexec.issue_step(is, lr, s.clone(), /*set_to_none=*/true);
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_TRUE(same(eager.w.grad(), coexec.w.grad()));
  EXPECT_EQ(eager.w._version() - eager_version, coexec.w._version() - coexec_version);
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 1u) << c.last_refusal;
  EXPECT_EQ(c.iterations, 7u) << c.last_left;
  EXPECT_GT(c.run.kernels, 7u * 6u);
}

TEST(BlockReplay, TheBackwardOfAnotherLossOfTheSameShapeLeavesTheBlock) {
  // One forward, two losses of one shape; the recorded iterations take the first loss's backward
  // and the last one the second's. Replaying the recorded backward gave the first's gradients
  // (BlockReplayer::made_as_recorded).
  at::manual_seed(4);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  const at::Tensor two = at::full({5, 3}, 2.0);
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 6; ++i) {
    const bool second = i == 5;
    eager.eager_step_on([&](const at::Tensor& h) {
      const at::Tensor a = (h * two).sum(), b = (h * h).sum();  // both made, as the program does
      return second ? b : a;
    });
    at::Tensor h_like;
    const at::Tensor h = coexec.issue_forward_start(is, &h_like);
    const at::Tensor am = is.aten(op("aten::mul", "Tensor"), {h, two}, true, {h_like})[0];
    const at::Tensor a = is.aten(op("aten::sum", ""), {am, c10::IValue()}, true, {h_like.sum()})[0];
    const at::Tensor bm = is.aten(op("aten::mul", "Tensor"), {h, h}, true, {h_like})[0];
    const at::Tensor b = is.aten(op("aten::sum", ""), {bm, c10::IValue()}, true, {h_like.sum()})[0];
    coexec.issue_backward_and_update(is, second ? b : a);
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_TRUE(same(eager.w.grad(), coexec.w.grad()));
  const auto c = runner.replay_counts();
  EXPECT_GE(c.iterations, 3u) << c.last_left;
  EXPECT_GE(c.left, 1u);
}

TEST(BlockReplay, AStartWithTwoPathsKeepsABlockForEachAndChoosesByLookingAhead) {
  // Every third iteration takes path B (its loss adds where A's multiplies). One block per start
  // was left by every B iteration and B was never recorded (GraphRunner::choose). The paths part
  // at the block's third item: the gradient set to None first is no block's item, and paths
  // that part at the second are told apart by it from the start instead (BlockStore::forks).
  at::manual_seed(5);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  const at::Tensor two = at::full({5, 3}, 2.0);
  const at::Tensor half = at::full({5, 3}, 0.5);
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 12; ++i) {
    const bool b = i % 3 == 2;
    eager.eager_step_on([&](const at::Tensor& h) {
      const at::Tensor g = h * half;
      return (b ? g + two : g * two).sum();
    });
    at::Tensor h_like;
    const at::Tensor h = coexec.issue_forward_start(is, &h_like);
    const at::Tensor g = is.aten(op("aten::mul", "Tensor"), {h, half}, true, {h_like})[0];
    const at::Tensor m = b ? is.aten(op("aten::add", "Tensor"), {g, two, 1}, true, {h_like})[0]
                           : is.aten(op("aten::mul", "Tensor"), {g, two}, true, {h_like})[0];
    coexec.issue_backward_and_update(is, is.aten(op("aten::sum", ""), {m, c10::IValue()}, true, {h_like.sum()})[0]);
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_TRUE(same(eager.w.grad(), coexec.w.grad()));
  const auto c = runner.replay_counts();
  // A recorded at the first iteration, B at its second iteration (the first left A's block);
  // every later iteration chose its own.
  EXPECT_EQ(c.recorded, 2u) << c.last_refusal;
  EXPECT_EQ(c.left, 1u) << c.last_left;
  EXPECT_EQ(c.chosen, 8u);
  EXPECT_EQ(c.iterations, 9u);
}

TEST(BlockReplay, GradientsAccumulateInPlaceAsInEager) {
  at::manual_seed(2);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  GraphRunner runner;
  Issuer is(runner);
  const c10::TensorImpl* eager_grad = nullptr;
  const c10::TensorImpl* coexec_grad = nullptr;
  for (int i = 0; i < 6; ++i) {
    const at::Tensor s = at::randn({5, 3});
    eager.eager_step(0.01, s, /*set_to_none=*/false);
    coexec.issue_step(is, 0.01, s.clone(), /*set_to_none=*/false);
    runner.drain();
    if (i == 0) {
      eager_grad = eager.w.grad().unsafeGetTensorImpl();
      coexec_grad = coexec.w.grad().unsafeGetTensorImpl();
    }
  }
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_TRUE(same(eager.w.grad(), coexec.w.grad()));
  // The first backward creates the gradient; later ones accumulate into that same tensor.
  EXPECT_EQ(eager.w.grad().unsafeGetTensorImpl(), eager_grad);
  EXPECT_EQ(coexec.w.grad().unsafeGetTensorImpl(), coexec_grad);
  // Recorded where the gradient was created, the block is stale once gradients accumulate: it is
  // recorded again (iteration 2) and replayed from then on.
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 2u);
  EXPECT_EQ(c.iterations, 3u);
}

TEST(BlockReplay, RandomOpsDrawInEagerOrder) {
  const at::Tensor x = at::randn({64});
  auto eager_step = [&] {
    at::Tensor mask = at::empty_like(x).bernoulli_(0.5);
    return (x * mask).add(at::rand({64}));
  };
  at::manual_seed(3);
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(eager_step());

  at::manual_seed(3);
  GraphRunner runner;
  Issuer is(runner);
  std::vector<at::Tensor> got;
  for (int i = 0; i < 6; ++i) {
    is.begin_iteration();
    at::Tensor e = is.aten(op("aten::empty_like", ""), {x, c10::IValue(), c10::IValue(), c10::IValue(),
                                                      c10::IValue(), c10::IValue()}, false, {x})[0];
    is.aten(op("aten::bernoulli_", "float"), {e, 0.5, c10::IValue()}, false, {});  // in place
    at::Tensor y = is.aten(op("aten::mul", "Tensor"), {x, e}, false, {x})[0];
    at::Tensor r = is.aten(op("aten::rand", ""), {std::vector<int64_t>{64}, c10::IValue(),
                                                 c10::IValue(), c10::IValue(), c10::IValue()},
                           false, {x})[0];
    got.push_back(is.aten(op("aten::add", "Tensor"), {y, r, 1}, false, {x})[0]);
    is.end_iteration();
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(same(expected[i], resolve_placeholder(got[i]))) << i;
  EXPECT_GE(runner.replay_counts().iterations, 5u);
}

TEST(BlockReplay, AnInPlaceUpdateThroughAViewBumpsItsBasesVersion) {
  at::Tensor eager = at::zeros({2, 3});
  at::Tensor coexec = at::zeros({2, 3});
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 5; ++i) {
    eager.view({6}).add_(at::ones({6}), 1.0 + i);
    is.begin_iteration();
    at::Tensor v = is.aten(op("aten::view", ""), {coexec, std::vector<int64_t>{6}}, false,
                           {coexec.view({6})})[0];
    is.aten(op("aten::add_", "Tensor"), {v, at::ones({6}), 1.0 + i}, false, {});
    is.end_iteration();
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager, coexec));
  EXPECT_EQ(eager._version(), coexec._version());
  EXPECT_GE(runner.replay_counts().iterations, 3u);
}

// View kernels (t, transpose and select with the item's numbers, view, detach) are made again
// without their kernels (AliasGeometry): results, the base's writes through them and its version
// as in eager, every iteration; a select whose index changed takes the kernel.
TEST(BlockReplay, ViewsAreMadeAgainWithTheirKernelsGeometryAndTheirBasesVersion) {
  at::Tensor eager = at::zeros({3, 4}), eager_acc = at::zeros({2, 6});
  at::Tensor coexec = at::zeros({3, 4}), coexec_acc = at::zeros({2, 6});
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 6; ++i) {
    const int64_t row = i < 5 ? 1 : 2;  // the last iteration selects another row
    const at::Tensor inc = at::full({4}, 1.0 + i);
    eager.t().transpose(0, 1).select(0, row).add_(inc);
    eager_acc.add_(eager.view({2, 6}));
    eager_acc.add_(eager.detach().view({2, 6}));
    is.begin_iteration();
    const at::Tensor t = is.aten(op("aten::t", ""), {coexec}, false, {coexec.t()})[0];
    const at::Tensor tt = is.aten(op("aten::transpose", "int"), {t, int64_t{0}, int64_t{1}}, false, {coexec})[0];
    const at::Tensor r = is.aten(op("aten::select", "int"), {tt, int64_t{0}, row}, false, {coexec.select(0, row)})[0];
    is.aten(op("aten::add_", "Tensor"), {r, inc, 1.0}, false, {});
    const at::Tensor v = is.aten(op("aten::view", ""), {coexec, std::vector<int64_t>{2, 6}}, false,
                                 {coexec.view({2, 6})})[0];
    is.aten(op("aten::add_", "Tensor"), {coexec_acc, v, 1.0}, false, {});
    const at::Tensor d = is.aten(op("aten::detach", ""), {coexec}, false, {coexec})[0];
    const at::Tensor dv = is.aten(op("aten::view", ""), {d, std::vector<int64_t>{2, 6}}, false,
                                  {coexec.view({2, 6})})[0];
    is.aten(op("aten::add_", "Tensor"), {coexec_acc, dv, 1.0}, false, {});
    is.end_iteration();
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager, coexec));
  EXPECT_TRUE(same(eager_acc, coexec_acc));
  EXPECT_EQ(eager._version(), coexec._version());
  const auto c = runner.replay_counts();
  EXPECT_GE(c.iterations, 4u) << c.last_left;
  // Every replayed iteration makes its 6 views directly but the last one, whose select has
  // another index than recorded and runs its kernel.
  EXPECT_EQ(c.run.views_remade, 6u * (c.iterations - 1) + 5u) << c.iterations;
}

// An as_strided view may reach past its input's extent into the rest of the storage: made
// directly while the storage holds it; an input of the same geometry on a smaller storage takes
// the kernel, which raises as eager does (never a view past the end of the memory).
TEST(BlockReplay, AViewPastItsInputIsMadeDirectlyOnlyWhereTheStorageHoldsIt) {
  EXPECT_THROW(at::zeros({4}).as_strided({8}, {1}), c10::Error);
  GraphRunner runner;
  Issuer is(runner);
  std::vector<at::Tensor> bases;
  auto step = [&](const at::Tensor& src) {
    is.begin_iteration();
    const at::Tensor v = is.aten(op("aten::as_strided", ""),
                                 {src, std::vector<int64_t>{8}, std::vector<int64_t>{1}, c10::IValue()}, false,
                                 {at::zeros({8})})[0];
    is.aten(op("aten::add_", "Tensor"), {v, at::ones({8}), 1.0}, false, {});
    is.end_iteration();
  };
  for (int i = 0; i < 5; ++i) {
    bases.push_back(at::zeros({8}));
    step(bases.back().narrow(0, 0, 4));  // 4 elements of a storage of 8
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  for (const at::Tensor& b : bases) EXPECT_TRUE(same(b, at::ones({8})));
  const auto c = runner.replay_counts();
  ASSERT_GE(c.iterations, 3u) << c.last_left;
  EXPECT_EQ(c.run.views_remade, c.iterations);
  step(at::zeros({4}));  // the same geometry on a storage of 4
  runner.drain();
  EXPECT_TRUE(runner.failed());
  EXPECT_EQ(runner.replay_counts().run.views_remade, c.run.views_remade);
}

TEST(BlockReplay, ABackwardWithAHookKeepsTheAutogradRoute) {
  at::manual_seed(4);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  int eager_calls = 0, coexec_calls = 0;
  eager.w.register_hook([&](const at::Tensor& g) { ++eager_calls; return g * 2; });
  coexec.w.register_hook([&](const at::Tensor& g) { ++coexec_calls; return g * 2; });
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 5; ++i) {
    const at::Tensor s = at::randn({5, 3});
    eager.eager_step(0.05, s, true);
    coexec.issue_step(is, 0.05, s.clone(), true);
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_EQ(eager_calls, coexec_calls);
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.iterations, 0u);
  EXPECT_GE(c.refused, 1u);
  EXPECT_EQ(c.last_refusal, "a hook or Python code in the backward");
}

TEST(BlockReplay, AProgramThatWaitsBeforeTheBackwardRunsItsForwardThroughAutograd) {
  // The program fetches the loss before it calls backward: the GraphRunner cannot know yet that
  // the backward will come, so the forward must build eager's autograd graph. Its kernels are
  // bound to the block, and the backward and the update are still replayed.
  at::manual_seed(5);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 6; ++i) {
    const at::Tensor s = at::randn({5, 3});
    eager.eager_step(0.05, s, true);
    coexec.issue_step(is, 0.05, s.clone(), true, [&](const at::Tensor& loss) {
      if (i < 2) return;
      runner.wait_for(is.last());  // `loss.item()` before `loss.backward()`
      EXPECT_TRUE(resolve_placeholder(loss).requires_grad()) << i;
    });
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.left, 0u) << c.last_left;
  EXPECT_GE(c.bound, 4u * 3u);  // mm, mul, sum in each iteration that waited
  EXPECT_EQ(c.iterations, 5u);
}

TEST(BlockReplay, ASecondBackwardThroughABoundForwardRaisesAsInEager) {
  at::manual_seed(6);
  SgdProgram coexec;
  GraphRunner runner;
  Issuer is(runner);
  at::Tensor kept;
  for (int i = 0; i < 4; ++i) {
    is.begin_iteration();
    is.grad_write_none(coexec.w);
    const at::Tensor h_like = coexec.x.mm(coexec.w.detach()).requires_grad_();
    at::Tensor h = is.aten(op("aten::mm", ""), {coexec.x, coexec.w}, true, {h_like})[0];
    at::Tensor loss = is.aten(op("aten::sum", ""), {h, c10::IValue()}, true, {h_like.sum()})[0];
    if (i >= 1) runner.wait_for(is.last());
    is.backward(loss);
    is.end_iteration();
    kept = loss;
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_GE(runner.replay_counts().bound, 2u);
  at::Tensor value = resolve_placeholder(kept);
  ASSERT_TRUE(value.requires_grad());
  try {
    torch::autograd::backward({value});
    FAIL() << "a second backward through the iteration's graph did not raise";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(BlockReplay, ItemsUnderInferenceModeAreReplayedAndMakeInferenceTensorsAsInEager) {
  // acc += relu(x @ w) * lr under inference mode: the product and the activation are inference
  // tensors, `acc` a normal tensor written in place (its version bumps), `lr` a feed.
  at::manual_seed(8);
  const at::Tensor x = at::randn({5, 4}), w = at::randn({4, 3});
  at::Tensor acc_eager = at::zeros({5, 3}), acc = at::zeros({5, 3});
  const int64_t eager_version = acc_eager._version(), coexec_version = acc._version();
  GraphRunner runner;
  Issuer is(runner);
  at::Tensor last, like;
  {
    c10::InferenceMode guard;
    like = x.mm(w);
  }
  for (int i = 0; i < 6; ++i) {
    const double lr = 1.0 / (1 + i);
    {
      c10::InferenceMode guard;
      acc_eager.add_(at::relu(x.mm(w)), lr);
    }
    is.begin_iteration();
    is.set_inference(true);
    const at::Tensor h = is.aten(op("aten::mm", ""), {x, w}, false, {like})[0];
    last = is.aten(op("aten::relu", ""), {h}, false, {like})[0];
    is.aten(op("aten::add_", "Tensor"), {acc, last, lr}, false, {});
    is.set_inference(false);
    is.end_iteration();
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(acc_eager, acc));
  EXPECT_EQ(acc_eager._version() - eager_version, acc._version() - coexec_version);
  EXPECT_TRUE(resolve_placeholder(last).is_inference());
  EXPECT_FALSE(acc.is_inference());
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 1u) << c.last_refusal;
  EXPECT_EQ(c.iterations, 5u) << c.last_left;
}

TEST(BlockReplay, AnItemWhoseHistoryTheBackwardConsumesInPartIsBoundAndTheRestReplayed) {
  // An LSTM cell whose loss reads its cell state only: the hidden state's history (its own
  // nodes, into the cell state's) is left by the backward. The cell is bound each iteration, the
  // backward and the update replayed; a backward through the kept hidden state then raises as
  // eagerly (the cell state's nodes it reaches were freed by the first backward).
  at::manual_seed(9);
  at::Tensor w_ih = at::randn({16, 4}).requires_grad_(), w_hh = at::randn({16, 4}).requires_grad_();
  at::Tensor e_ih = w_ih.detach().clone().requires_grad_(), e_hh = w_hh.detach().clone().requires_grad_();
  const at::Tensor x = at::randn({3, 4}), h0 = at::randn({3, 4}), c0 = at::randn({3, 4});
  const c10::List<at::Tensor> hx({h0, c0});
  GraphRunner runner;
  Issuer is(runner);
  at::Tensor hy_kept, eager_hy;
  for (int i = 0; i < 6; ++i) {
    {
      e_ih.mutable_grad() = at::Tensor();
      e_hh.mutable_grad() = at::Tensor();
      auto [hy, cy] = at::lstm_cell(x, {h0, c0}, e_ih, e_hh);
      torch::autograd::backward({cy.sum()});
      at::NoGradGuard no_grad;
      e_ih.add_(e_ih.grad(), -0.1);
      e_hh.add_(e_hh.grad(), -0.1);
      eager_hy = hy;
    }
    is.begin_iteration();
    is.grad_write_none(w_ih);
    is.grad_write_none(w_hh);
    const at::Tensor like = h0.detach().clone().requires_grad_();
    auto outs = is.aten(op("aten::lstm_cell", ""), {x, hx, w_ih, w_hh, c10::IValue(), c10::IValue()}, true,
                        {like, like});
    const at::Tensor loss = is.aten(op("aten::sum", ""), {outs[1], c10::IValue()}, true, {like.sum()})[0];
    is.backward(loss);
    const at::Tensor g_ih = is.grad_read(w_ih, w_ih.detach()), g_hh = is.grad_read(w_hh, w_hh.detach());
    is.aten(op("aten::add_", "Tensor"), {w_ih, g_ih, -0.1}, false, {});
    is.aten(op("aten::add_", "Tensor"), {w_hh, g_hh, -0.1}, false, {});
    is.end_iteration();
    hy_kept = outs[0];
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(w_ih, e_ih));
  EXPECT_TRUE(same(w_hh, e_hh));
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 1u) << c.last_refusal;
  EXPECT_EQ(c.iterations, 5u) << c.last_left;
  EXPECT_GE(c.bound, 5u);  // the cell, every replayed iteration
  auto second_backward = [](const at::Tensor& hy) {
    try {
      torch::autograd::backward({hy.sum()});
      return std::string("no error");
    } catch (const c10::Error& e) {
      return std::string(e.what()).substr(0, 40);
    }
  };
  const at::Tensor hy = resolve_placeholder(hy_kept);
  ASSERT_TRUE(hy.requires_grad());
  EXPECT_EQ(second_backward(hy), second_backward(eager_hy));
  EXPECT_NE(second_backward(eager_hy), "no error");
}

TEST(BlockReplay, ItemsUnderAutocastAreReplayedWithTheCastsAutocastMade) {
  // h = x @ w under bf16 autocast (the mm runs in bf16 on casts of both arguments, the weight's
  // cast made afresh each step with the cache off), the loss in float32 after it, SGD.
  at::manual_seed(10);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  AutocastState bf16;
  bf16.cpu = true;
  bf16.cache = false;
  GraphRunner runner;
  Issuer is(runner);
  auto under_bf16 = [&](const std::function<at::Tensor()>& f) {
    const AutocastState before = AutocastState::current();
    bf16.apply();
    at::Tensor out = f();
    before.apply();
    return out;
  };
  at::Tensor last_h;
  for (int i = 0; i < 6; ++i) {
    eager.eager_step_with(
        [](const at::Tensor& h) {
          ASSERT_EQ(h.scalar_type(), at::kBFloat16);
          torch::autograd::backward({h.to(at::kFloat).pow(2).sum()});
        },
        0.01, [&] { return under_bf16([&] { return eager.x.mm(eager.w); }); });
    is.begin_iteration();
    is.grad_write_none(coexec.w);
    is.set_autocast(bf16);
    const at::Tensor h_like = under_bf16([&] { return coexec.x.mm(coexec.w.detach()).requires_grad_(); });
    const at::Tensor hc = is.aten(op("aten::mm", ""), {coexec.x, coexec.w}, true, {h_like})[0];
    is.set_autocast(AutocastState{});
    const at::Tensor f_like = h_like.detach().to(at::kFloat).requires_grad_();
    const at::Tensor hf = is.aten(op("aten::_to_copy", ""), {hc, at::kFloat, c10::IValue(), c10::IValue(),
                                                            c10::IValue(), false, c10::IValue()}, true, {f_like})[0];
    const at::Tensor p = is.aten(op("aten::pow", "Tensor_Scalar"), {hf, 2}, true, {f_like})[0];
    const at::Tensor loss = is.aten(op("aten::sum", ""), {p, c10::IValue()}, true, {f_like.sum()})[0];
    coexec.issue_backward_and_update(is, loss, 0.01);
    last_h = hc;
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_EQ(resolve_placeholder(last_h).scalar_type(), at::kBFloat16);
  EXPECT_TRUE(same(eager.w, coexec.w));
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 1u) << c.last_refusal;
  EXPECT_EQ(c.iterations, 5u) << c.last_left;
}

TEST(BlockReplay, ABackwardThatKeepsTheGraphLeavesItToALaterBackwardAsInEager) {
  // Two backwards through one forward, the first with retain_graph=True: both replayed, and the
  // forward waits for the second; the gradients accumulate as eagerly.
  at::manual_seed(11);
  SgdProgram eager;
  SgdProgram coexec = eager.twin();
  GraphRunner runner;
  Issuer is(runner);
  for (int i = 0; i < 6; ++i) {
    eager.eager_step_with(
        [](const at::Tensor& h) {
          torch::autograd::backward({h.sum()}, {}, /*keep_graph=*/true);
          torch::autograd::backward({h.pow(2).sum()});
        },
        0.01);
    at::Tensor like;
    const at::Tensor hc = coexec.issue_forward_start(is, &like);
    const at::Tensor l1 = is.aten(op("aten::sum", ""), {hc, c10::IValue()}, true, {like.sum()})[0];
    is.backward(l1, /*retain_graph=*/true);
    const at::Tensor p = is.aten(op("aten::pow", "Tensor_Scalar"), {hc, 2}, true, {like})[0];
    const at::Tensor l2 = is.aten(op("aten::sum", ""), {p, c10::IValue()}, true, {like.sum()})[0];
    coexec.issue_backward_and_update(is, l2, 0.01);
  }
  runner.drain();
  ASSERT_FALSE(runner.failed());
  EXPECT_TRUE(same(eager.w, coexec.w));
  EXPECT_TRUE(same(eager.w.grad(), coexec.w.grad()));
  const auto c = runner.replay_counts();
  EXPECT_EQ(c.recorded, 1u) << c.last_refusal;
  EXPECT_EQ(c.iterations, 5u) << c.last_left;
}

// Executed items are dropped by the program thread's reclaim(): those with tiny outputs in
// batches, larger ones at once, so a dead placeholder's value outlives it by a few small items at
// most. An item's output slot lives while the item holds it.
std::weak_ptr<Slot> issue_add(Issuer& is, const at::Tensor& x) {
  at::Tensor p = is.aten(op("aten::add", "Tensor"), {x, x, 1}, false, {x})[0];
  return as_placeholder(p)->slot();  // `p` dies here: only the item holds the slot
}

TEST(GraphRunnerReclaim, ItemsWithTinyOutputsAreDroppedInBatches) {
  GraphRunner runner;
  Issuer is(runner);
  const at::Tensor x = at::randn({1, 1});
  std::vector<std::weak_ptr<Slot>> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(issue_add(is, x));
  runner.drain();
  runner.reclaim();
  for (const auto& s : slots) EXPECT_FALSE(s.expired()) << "a batch of three 4-byte items";
  for (int i = 0; i < 40; ++i) slots.push_back(issue_add(is, x));
  runner.drain();
  runner.reclaim();
  for (const auto& s : slots) EXPECT_TRUE(s.expired());
  runner.reclaim(/*all=*/true);
  ASSERT_FALSE(runner.failed());
}

TEST(GraphRunnerReclaim, ItemsWithLargerOutputsAreDroppedAtOnce) {
  GraphRunner runner;
  Issuer is(runner);
  const at::Tensor x = at::randn({64, 64});  // 16 KiB of output per item
  const std::weak_ptr<Slot> slot = issue_add(is, x);
  runner.drain();
  runner.reclaim();
  EXPECT_TRUE(slot.expired());
}

// Item 1 (the gate) makes `a`, item 2 reads it into `b`; then `keep` decides what the program
// still holds of `a` when it issues item 3 (c = b + x), whose issue checks the watch. Returns
// `a`'s slot (weakly: a reference of the test's own would keep the value) and `c`.
struct GatedChain {
  std::weak_ptr<Slot> a_slot;
  std::shared_ptr<Slot> b_slot;
  at::Tensor b, c, kept;
};
GatedChain gated_chain(GraphRunner& runner, const at::Tensor& x,
                       const std::function<at::Tensor(const at::Tensor&)>& keep) {
  DeadValueWatch watch;
  Issuer is(runner);
  is.set_watch(&watch);
  gate_open = false;
  GatedChain g;
  at::Tensor a = is.aten(op("terra_test::gate", ""), {x}, false, {x})[0];
  g.b = is.aten(op("aten::add", "Tensor"), {a, x, 1}, false, {x})[0];
  g.a_slot = as_placeholder(a)->slot();
  g.b_slot = as_placeholder(g.b)->slot();
  g.kept = keep(a);
  a = at::Tensor();
  g.c = is.aten(op("aten::add", "Tensor"), {g.b, x, 1}, false, {x})[0];
  gate_open = true;
  runner.drain();
  return g;
}

TEST(DeadValues, AValueOnlyItsLastReaderHoldsIsDroppedRightAfterThatReaderRan) {
  GraphRunner runner;
  const at::Tensor x = at::randn({64, 64});
  const uint64_t before = runner.values_released_early();
  GatedChain g = gated_chain(runner, x, [](const at::Tensor&) { return at::Tensor(); });
  ASSERT_FALSE(runner.failed());
  auto a_slot = g.a_slot.lock();
  ASSERT_TRUE(a_slot) << "item 2 still holds `a` (the test has not reclaimed it)";
  EXPECT_EQ(a_slot->release_after.load(), 2u);
  EXPECT_FALSE(a_slot->value.defined());
  EXPECT_EQ(runner.values_released_early() - before, 1u);
  EXPECT_TRUE(g.b_slot->value.defined()) << "the program still holds `b`";
  EXPECT_TRUE(at::equal(resolve_placeholder(g.c), x.clone() + x + x));
  runner.reclaim(/*all=*/true);
}

TEST(DeadValues, AValueTheProgramCanStillReachIsKept) {
  const at::Tensor x = at::randn({64, 64});
  const std::vector<std::pair<const char*, std::function<at::Tensor(const at::Tensor&)>>> keeps = {
      {"the placeholder itself", [](const at::Tensor& a) { return a; }},
      {"a detached copy sharing its slot", [](const at::Tensor& a) { return a.detach(); }},
  };
  for (const auto& [what, keep] : keeps) {
    GraphRunner runner;
    GatedChain g = gated_chain(runner, x, keep);
    ASSERT_FALSE(runner.failed());
    auto a_slot = g.a_slot.lock();
    ASSERT_TRUE(a_slot);
    EXPECT_EQ(a_slot->release_after.load(), 0u) << what;
    EXPECT_TRUE(a_slot->value.defined()) << what;
    EXPECT_EQ(runner.values_released_early(), 0u) << what;
    EXPECT_TRUE(at::equal(resolve_placeholder(g.kept), x)) << what;
    runner.reclaim(/*all=*/true);
  }
}

// An item that throws hands its exception (its own type, not a name in a string) and its node
// to the program thread; the items after it are skipped, so the program's state is what eager
// execution left at the failing op; once the error is taken, the runner works again.
TEST(GraphRunnerErrors, AFailingItemsExceptionReachesTheProgramThreadAndLaterItemsAreSkipped) {
  GraphRunner runner;
  Issuer is(runner);
  const at::Tensor x = at::randn({4});
  const at::Tensor before = is.aten(op("aten::add", "Tensor"), {x, x, 1}, false, {x})[0];
  const at::Tensor bad_index = at::full({1}, 7, at::kLong);
  const at::Tensor failed =
      is.aten(op("aten::index_select", ""), {x, int64_t{0}, bad_index}, false, {at::randn({1})})[0];
  const uint64_t failing = is.last();
  const at::Tensor after = is.aten(op("aten::add", "Tensor"), {before, x, 1}, false, {x})[0];
  runner.drain();
  ASSERT_TRUE(runner.failed());
  EXPECT_TRUE(at::equal(as_placeholder(before)->slot()->value, x + x));  // ran before the failure
  EXPECT_FALSE(as_placeholder(failed)->slot()->value.defined());
  EXPECT_FALSE(as_placeholder(after)->slot()->value.defined());  // skipped
  RunnerError error = runner.take_error();
  ASSERT_TRUE(error);
  EXPECT_EQ(error.node, 2u);  // the index_select's node (Issuer numbers items 1, 2, 3)
  EXPECT_EQ(failing, 2u);
  EXPECT_THROW(std::rethrow_exception(error.exception), c10::IndexError);
  EXPECT_FALSE(runner.failed());
  const at::Tensor again = is.aten(op("aten::add", "Tensor"), {x, x, 1}, false, {x})[0];
  runner.drain();
  EXPECT_FALSE(runner.failed());
  EXPECT_TRUE(at::equal(as_placeholder(again)->slot()->value, x + x));
  runner.reclaim(/*all=*/true);
}

}  // namespace
}  // namespace terra::runtime

namespace terra::runtime {
namespace {

// The work a waiting program waits for (BlockReplayer::spread): the large kernels that give the
// program's bits with one thread, from a kernel to the end of the last item waited for.
TEST(LargeWork, CountsTheLargeOneThreadKernelsUpToTheLastItemWaitedFor) {
  Block b;
  auto kernel = [&](bool large, bool one_thread, uint32_t ns) {
    RecordedKernel k;
    k.large = large;
    k.one_thread = one_thread;
    k.ran_ns = ns;
    b.kernels.push_back(std::move(k));
  };
  kernel(true, true, 5'000);     // item 0
  kernel(false, true, 70'000);   // item 0: small, however long
  kernel(true, false, 90'000);   // item 1: needs the program's count anyway
  kernel(true, true, 6'000);     // item 1
  kernel(true, true, 7'000);     // item 2
  for (uint32_t i = 0; i < 3; ++i) {
    ItemPlan p;
    p.kernels_begin = i == 0 ? 0 : (i == 1 ? 2 : 4);
    p.kernels_end = i == 0 ? 2 : (i == 1 ? 4 : 5);
    b.items.push_back(std::move(p));
  }
  index_large_work(b);
  EXPECT_EQ(large_work(b, 0, 0), 5'000u);
  EXPECT_EQ(large_work(b, 0, 2), 18'000u);
  EXPECT_EQ(large_work(b, 1, 1), 6'000u);
  EXPECT_EQ(large_work(b, 3, 2), 13'000u);
  EXPECT_EQ(large_work(b, 4, 1), 0u);  // the last item waited for ends before the kernel
}

}  // namespace
}  // namespace terra::runtime
