"""Engine behaviours, each compared against eager PyTorch in the same process.

The corpus (test_corpus.py) covers whole programs; these tests pin single mechanisms: co-execution
actually happening, divergence and its explanation, errors raised by ops in the GraphRunner,
exceptions and KeyboardInterrupt in the middle of a co-executed iteration, placeholders that
outlive the session, and the explicit `coexecute`/`iteration` API.
"""
import collections
import gc
import importlib.util
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

import pytest
import torch

import terra


@pytest.fixture(autouse=True)
def fresh_graphs():
    terra.reset()
    yield
    terra.reset()


def train(steps, lr=0.1, log=None, branch_at=None, raise_at=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        out = model(x)
        if branch_at is not None and step >= branch_at:
            out = out * 2.0 - 1.0  # a path the early iterations never took
        loss = torch.nn.functional.mse_loss(out, y)
        if raise_at is not None and step == raise_at:
            raise ValueError(f"stop at {step}")
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if log is not None:
            log.append(f"{loss.item():.6f}")
    return model, losses


def same_params(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_steady_state_is_coexecuted_and_bitwise_equal():
    eager, eager_losses = train(30)
    model, losses = terra.run(train, 30)
    assert same_params(eager, model)
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses))
    stats = terra.stats("train")
    assert stats["iterations_coexecuted"] >= 25, stats
    assert stats["ops_coexecuted"] > stats["ops_traced"], stats


def test_placeholders_kept_past_the_session_become_real_tensors():
    _, losses = terra.run(train, 12)
    eager = train(12)[1]
    # Each kept loss is a tensor whose value is readable after the session ended.
    assert [float(x) for x in losses] == [float(x) for x in eager]
    assert losses[-1].data_ptr() != 0


def test_new_branch_diverges_with_a_reason_and_stays_correct():
    eager, _ = train(20, branch_at=12)
    model, _ = terra.run(train, 20, branch_at=12)
    assert same_params(eager, model)
    stats = terra.stats("train")
    assert stats["iterations_fallback"] >= 1 and stats["fallbacks"] >= 1, stats
    reasons = terra.explain("train")
    assert any("trace" in r["reason"] for r in reasons), reasons
    where = reasons[0]["where"]
    assert where is not None and where[0].endswith("test_engine.py"), reasons
    # One entry per reason and place, named (terra/policy.h's FallbackReason); frames outermost
    # first, the user's own frame among them.
    assert all(r["kind"] in ("new_branch", "new_op", "new_arguments") for r in reasons), reasons
    assert reasons[0]["source"][0][2] == "run" and tuple(where) in map(tuple, reasons[0]["source"]), reasons
    assert len({(r["kind"], r["op"], tuple(r["where"])) for r in reasons}) == len(reasons), reasons


def alternating(x, w, steps):
    """Two known branches taken in turn: the op after `h` has two successors, and the one taken
    last (tried first when the next op is validated) is the wrong one every other time."""
    out = []
    for i in range(steps):
        h = x @ w
        if i % 2:
            z = (h + 1).relu() * 3
        else:
            z = (h - 1).tanh() / 2
        out.append(z.sum())
    return out


def test_branches_taken_in_turn_are_validated_along_either_successor():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 5, generator=g), torch.randn(5, 3, generator=g)
    eager = alternating(x, w, 40)
    got = terra.run(alternating, x, w, 40)
    assert all(torch.equal(a, b) for a, b in zip(eager, got))
    stats = terra.stats("alternating")
    # Once both branches are in the graph, every iteration follows a recorded path.
    assert stats["iterations_coexecuted"] >= 30, stats
    assert stats["fallbacks"] <= 2, stats


def test_python_scalars_are_feeds_not_constants():
    # A learning rate that changes after warm-up must not force a re-trace.
    eager, _ = train(10, lr=0.05)
    terra.run(train, 10, lr=0.1)  # records the graph with another lr
    model, _ = terra.run(train, 10, lr=0.05)
    assert same_params(eager, model)


KEPT = {}


def run_and_keep(steps, raise_at):
    """The training loop, keeping its model where the test can see it after an exception."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    KEPT["model"] = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == raise_at:
            raise ValueError(f"stop at {step}")
        loss.backward()
        opt.step()


def test_exception_mid_iteration_leaves_eager_state():
    with pytest.raises(ValueError, match="stop at 15"):
        run_and_keep(20, 15)
    eager_model = KEPT["model"]
    with pytest.raises(ValueError, match="stop at 15"):
        terra.run(run_and_keep, 20, 15)
    assert terra.stats("run_and_keep")["iterations_coexecuted"] > 0
    assert same_params(eager_model, KEPT["model"])


def index_error_program(bad_step):
    torch.manual_seed(0)
    table = torch.randn(10, 4, requires_grad=True)
    total = torch.zeros(())
    for step in range(12):
        idx = torch.tensor([step % 10 if step != bad_step else 50])
        total = total + table.index_select(0, idx).sum()
    return total


def test_op_error_in_graphrunner_raises_same_exception_type():
    with pytest.raises(IndexError) as eager_error:
        index_error_program(9)
    with pytest.raises(IndexError) as terra_error:
        terra.run(index_error_program, 9)
    assert "index out of range" in str(eager_error.value)
    assert "index out of range" in str(terra_error.value)
    assert "index_error_program" in str(terra_error.value) or "test_engine.py" in str(terra_error.value)
    # The engine is usable afterwards.
    assert float(terra.run(index_error_program, -1)) == float(index_error_program(-1))


def interrupted(steps, stop):
    torch.manual_seed(0)
    w = torch.zeros(8, requires_grad=True)
    KEPT["w"] = w
    opt = torch.optim.SGD([w], lr=0.01)
    x = torch.randn(64, 8)
    for step in range(steps):
        opt.zero_grad()
        (x @ w - 1.0).pow(2).mean().backward()
        opt.step()
        if step == stop:
            raise KeyboardInterrupt


def test_keyboard_interrupt_leaves_state_as_eager():
    with pytest.raises(KeyboardInterrupt):
        interrupted(40, 25)
    eager_w = KEPT["w"].detach().clone()
    with pytest.raises(KeyboardInterrupt):
        terra.run(interrupted, 40, 25)
    assert terra.stats("interrupted")["iterations_coexecuted"] > 0
    assert torch.equal(eager_w, KEPT["w"].detach())
    assert not terra._C.active()


def test_coexecute_block_with_explicit_iterations():
    torch.manual_seed(0)
    w = torch.randn(5, 5)
    eager = w.clone()
    for _ in range(10):
        eager = torch.tanh(eager @ w) + 0.5
    out = w.clone()
    with terra.coexecute("block"):
        for _ in range(10):
            with terra.iteration():
                out = torch.tanh(out @ w) + 0.5
    assert torch.equal(out, eager)
    assert terra.stats("block")["iterations_coexecuted"] >= 5


def test_patches_are_removed_after_the_session():
    names = ("grad", "_version", "grad_fn", "is_leaf", "_base", "_is_view")
    before = {n: torch.Tensor.__dict__.get(n) for n in names}
    inside = terra.run(lambda: {n: torch.Tensor.__dict__.get(n) for n in names})
    terra.run(train, 3)
    assert {n: torch.Tensor.__dict__.get(n) for n in names} == before
    assert all(inside[n] is not None and inside[n] is not before[n] for n in names[1:])
    assert torch.autograd._engine_run_backward.__module__ == "torch.autograd.graph"


def test_sessions_install_the_same_wrappers_and_wrap_a_replacement_made_between_them():
    # The wrappers are made once (each session made about 70 of them again); a function the
    # program replaced between sessions is what the next session's wrapper calls.
    def during():
        return torch.Tensor.tolist, torch.manual_seed, torch.Tensor.__dict__["requires_grad"]

    first = terra.run(during)
    second = terra.run(during)
    assert all(a is b for a, b in zip(first, second))
    assert first[0] is not torch.Tensor.tolist  # a wrapper, taken out after the session
    original, calls = torch.manual_seed, []

    def seeding(seed):
        calls.append(seed)
        return original(seed)

    torch.manual_seed = seeding
    try:
        def reseed():
            torch.manual_seed(5)
            return torch.manual_seed

        wrapper = terra.run(reseed)
        assert wrapper is not second[1] and wrapper is not seeding and calls == [5]
        assert torch.manual_seed is seeding
    finally:
        torch.manual_seed = original


def rnn_grads(steps):
    """An RNN whose inner time loop is its own iteration: its timesteps co-execute while the
    outer step is still traced, so one backward pass meets autograd nodes made by both threads."""
    torch.manual_seed(0)
    w_xh = torch.nn.Parameter(torch.randn(1, 8) * 0.3)
    w_hh = torch.nn.Parameter(torch.randn(8, 8) * 0.3)
    b = torch.nn.Parameter(torch.zeros(8))
    grads = []
    for _ in range(steps):
        x = torch.rand(4, 5, 1)
        h = torch.zeros(4, 8)
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ w_xh + torch.addmm(b, h, w_hh))
        for p in (w_xh, w_hh, b):
            p.grad = None
        h.pow(2).mean().backward()
        grads.append([p.grad.clone() for p in (w_xh, w_hh, b)])
    return grads


def test_gradient_accumulation_order_matches_eager_across_threads():
    eager = rnn_grads(6)
    coexec = terra.run(rnn_grads, 6)
    for step, (a, b) in enumerate(zip(eager, coexec)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step}"


def loops_in_sequence(n):
    """New iteration starts and new nodes appear while earlier iterations are still being executed
    by the GraphRunner (its pending work refers to the templates of existing nodes)."""
    torch.manual_seed(0)
    x = torch.randn(32, 32)
    for _ in range(n):
        x = torch.tanh(x @ x.t() * 0.01)
    outs = []
    for k in range(n):
        for j in range(k % 3):
            x = x + j * 0.5
        outs.append(x.sum())
    return x, outs


def double(x):
    return x * 2.0


def alternating_callers(steps):
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    outs = []
    for i in range(steps):
        if i % 2:
            y = double(x)  # the same op from the same frame as below, called from another line
        else:
            y = double(x + 0.0) * 1.0
        x = y.tanh()
        outs.append(x.sum())
    return x, outs


def test_the_same_op_from_the_same_frame_via_another_caller_runs_as_eagerly():
    # The predicted next node is accepted on the calling frame alone (PythonRunner::predicted_node):
    # `double`'s multiply is met from two call sites, alternately.
    eager_x, eager_outs = alternating_callers(30)
    x, outs = terra.run(alternating_callers, 30)
    assert torch.equal(eager_x, x)
    assert all(torch.equal(a, b) for a, b in zip(eager_outs, outs))
    stats = terra.stats("alternating_callers")
    assert stats["iterations_coexecuted"] >= 20, stats
    assert not terra.explain("alternating_callers")


def scale_four_times(x, last):
    for k in range(4):  # one line, one stack: the 4 multiplies are occurrences 0-3 of one location
        x = x * (last if k == 3 else 1.5)
    return x


def alternating_last_factor(steps):
    x = torch.ones(3)
    outs = []
    for i in range(steps):
        # an int or a float: the 4th multiply's template alternates, so it is found through its
        # location key, whose occurrence count must include the 3 accepted without a key
        outs.append(scale_four_times(x, 2 if i % 2 else 0.5))
    return outs


def test_occurrences_accepted_without_a_key_are_counted_for_the_next_key():
    eager = alternating_last_factor(30)
    outs = terra.run(alternating_last_factor, 30)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(eager, outs))
    stats = terra.stats("alternating_last_factor")
    assert stats["iterations_coexecuted"] >= 20, stats
    assert not terra.explain("alternating_last_factor")  # no divergence: every key was right


def test_the_graphrunners_busy_time_counts_its_work_and_not_its_idle_time():
    import time
    before = terra._c().runner_busy_ns()
    t0 = time.perf_counter()
    terra.run(train, 30)
    terra.sync()
    worked = terra._c().runner_busy_ns() - before
    assert terra.stats("train")["iterations_coexecuted"] > 0
    assert worked > 0  # it executed the co-executed steps' items
    # Idle, it spins or sleeps: none of that is busy time.
    time.sleep(0.05)
    assert terra._c().runner_busy_ns() - before == worked
    assert worked < (time.perf_counter() - t0) * 1e9


def test_new_nodes_while_graphrunner_busy():
    eager_x, eager_outs = loops_in_sequence(40)
    x, outs = terra.run(loops_in_sequence, 40)
    assert torch.equal(eager_x, x)
    assert [float(v) for v in eager_outs] == [float(v) for v in outs]


def test_equal_code_in_two_modules_runs_the_right_function(tmp_path, monkeypatch):
    # Two modules whose `train` has identical code (their code objects compare equal) but
    # different globals: terra.run must run each one with its own module's globals.
    import importlib

    body = ("import torch\n"
            "SCALE = {scale}\n"
            "def train(n):\n"
            "    out = []\n"
            "    for i in range(n):\n"
            "        out.append(float(torch.ones(1) * SCALE))\n"
            "    return out\n")
    (tmp_path / "twin_a.py").write_text(body.format(scale=2.0))
    (tmp_path / "twin_b.py").write_text(body.format(scale=3.0))
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = importlib.import_module("twin_a"), importlib.import_module("twin_b")
    assert a.train.__code__ == b.train.__code__
    assert terra.run(a.train, 3) == [2.0] * 3
    assert terra.run(b.train, 3) == [3.0] * 3
    assert terra.stats("train")["iteration_starts"] > 1  # the loops were instrumented


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * grad


def _custom_function_program(order):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    lin.weight.register_hook(lambda g: order.append("hook") or g)
    x = torch.randn(8, 4)
    for _ in range(12):
        loss = _Cube.apply(lin(x)).mean()
        opt.zero_grad()
        loss.backward()
        order.append("after backward")
        opt.step()
    return lin.weight.detach().clone()


def test_custom_function_and_hooks_run_in_program_order():
    eager_order, terra_order = [], []
    eager = _custom_function_program(eager_order)
    result = terra.run(_custom_function_program, terra_order)
    assert torch.equal(eager, result)
    assert terra_order == eager_order  # each hook ran inside its backward, before the next line
    stats = terra.stats("_custom_function_program")
    assert stats["iterations_coexecuted"] > 0
    reasons = [f["reason"] for f in terra.explain()]
    assert any("custom autograd.Function" in r for r in reasons)


def test_thread_start_leaves_coexecution_with_a_reason():
    def program():
        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        seen = []
        for _ in range(10):
            y = (w @ w).sum()
            worker = threading.Thread(target=lambda: seen.append(float(y)))
            worker.start()
            worker.join()
        return seen

    assert terra.run(program) == program()
    assert any(f["op"] == "threading.Thread.start" for f in terra.explain())


def _make_closure_trainer(lr):
    w = torch.randn(4, 4, requires_grad=True)

    def train(steps):
        for _ in range(steps):
            loss = (w @ w).sin().sum()
            loss.backward()
            with torch.no_grad():
                w.sub_(lr * w.grad)
                w.grad.zero_()
        return w.detach().clone()

    return train


def test_closures_get_their_loops_marked():
    torch.manual_seed(0)
    eager = _make_closure_trainer(0.05)(12)
    torch.manual_seed(0)
    result = terra.run(_make_closure_trainer(0.05), 12)
    assert torch.equal(eager, result)
    assert terra.stats("_make_closure_trainer.<locals>.train")["iterations_coexecuted"] >= 8


def _fresh_model_each_call(out):
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    for _ in range(10):
        h = model(x)
        h.retain_grad()
        loss = h.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        out.append(float(h.grad.abs().sum()))
        opt.step()
    return model.weight.detach().clone()


def test_models_created_inside_coexecuted_code():
    # The function's setup (parameters made with nn.Parameter, retain_grad) is co-executed from
    # the third call on: new leaves and hooks must land on real tensors.
    for seed in range(4):
        eager_out, terra_out = [], []
        torch.manual_seed(seed)
        eager = _fresh_model_each_call(eager_out)
        torch.manual_seed(seed)
        result = terra.run(_fresh_model_each_call, terra_out)
        assert torch.equal(eager, result) and eager_out == terra_out
    assert terra.stats("_fresh_model_each_call")["iterations_coexecuted"] > 20


def autocast_train(steps, amp_until=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    dtypes = []
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp_until is None or step < amp_until):
            out = model(x)
        dtypes.append(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], dtypes


def test_autocast_runs_in_the_graphrunner_under_the_programs_state():
    # The GraphRunner runs each op under the autocast state it was issued with: bfloat16 linears,
    # bitwise the eager result, and nearly every iteration co-executed.
    eager_params, eager_dtypes = autocast_train(40)
    terra_params, terra_dtypes = terra.run(autocast_train, 40)
    assert terra_dtypes == eager_dtypes == [torch.bfloat16] * 40
    for a, b in zip(eager_params, terra_params):
        assert torch.equal(a, b)
    st = terra.stats("autocast_train")
    assert st["iterations_coexecuted"] >= 36, st


def test_autocast_switched_off_mid_run_is_a_new_path_not_a_wrong_result():
    eager_params, eager_dtypes = autocast_train(30, amp_until=15)
    terra_params, terra_dtypes = terra.run(autocast_train, 30, amp_until=15)
    assert terra_dtypes == eager_dtypes
    assert eager_dtypes[14] == torch.bfloat16 and eager_dtypes[15] == torch.float32
    for a, b in zip(eager_params, terra_params):
        assert torch.equal(a, b)
    assert any("autocast state differs" in e["reason"] for e in terra.explain("autocast_train"))


def test_dataloader_worker_batches_are_graph_inputs_not_constants():
    # Batches from worker processes are rebuilt onto the shared-memory Storage each worker sent
    # (aten::set_.source_Storage): a new Storage object every batch, which must validate as an
    # input. After three epochs (warm-up, then the epoch boundary's own paths) most iterations
    # co-execute, bitwise like eager. Not all: when a worker's batch arrives before the one the
    # program waits for, the DataLoader buffers it and skips a Queue.get later, a path that depends
    # on the workers' timing (new ops or a new branch, never different arguments). A storage
    # recorded as a constant would make every batch diverge with "the arguments differ".
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))
    import corpus
    module = corpus.load("p31_dataloader_workers")
    eager_out, eager_state = corpus.run_eager("p31_dataloader_workers")
    terra_out, terra_state = corpus.capture(lambda: terra.run(module.main))
    assert terra_out == eager_out
    corpus.assert_same_state(eager_state, terra_state, names=("eager", "terra"))
    modes = [it["mode"] for it in terra.timeline("main")["iterations"]]
    steady = modes[len(modes) * 3 // 5:-1]  # the last two of five epochs, without the exit segment
    assert sum(m == "coexec" for m in steady) >= 0.6 * len(steady), modes
    reasons = [e["reason"] for e in terra.explain("main")]
    assert not any(r.startswith("the arguments differ") for r in reasons), reasons


def thread_count_program(steps):
    torch.manual_seed(0)
    x = torch.randn(400_000)
    sums = []
    threads = torch.get_num_threads()
    for step in range(steps):
        if step == steps // 2:
            torch.set_num_threads(1)  # a reduction over 400k elements splits by thread count
        sums.append((x * 1.5).sum())
    torch.set_num_threads(threads)
    return torch.stack(sums)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="needs 2 intra-op threads")
def test_set_num_threads_mid_run_applies_from_the_next_op():
    try:
        eager = thread_count_program(20)
        coexec = terra.run(thread_count_program, 20)
    finally:
        torch.set_num_threads(max(2, torch.get_num_threads()))
    assert torch.equal(eager, coexec)
    assert terra.stats("thread_count_program")["iterations_coexecuted"] > 0


def backend_flag_program(steps, switch_at):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    opt = torch.optim.SGD(conv.parameters(), lr=0.01)
    img = torch.randn(4, 3, 16, 16)
    for step in range(steps):
        if step == switch_at:
            torch.backends.mkldnn.enabled = False  # the convolution kernel changes from here
        opt.zero_grad()
        conv(img).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in conv.parameters()]


def test_backend_flag_changed_mid_run_applies_from_the_next_op():
    # torch.backends setters wait for the GraphRunner: ops issued before the change run with the
    # old kernels, as in eager.
    try:
        eager = backend_flag_program(16, 10)
        torch.backends.mkldnn.enabled = True
        coexec = terra.run(backend_flag_program, 16, 10)
    finally:
        torch.backends.mkldnn.enabled = True
    for a, b in zip(eager, coexec):
        assert torch.equal(a, b)
    assert terra.stats("backend_flag_program")["iterations_coexecuted"] > 0


def no_grad_updates(steps):
    # Manual SGD: the update runs under no_grad on leaves that require grad, through views and
    # in-place ops (version counters must move as in eager); metrics on detached values.
    torch.manual_seed(0)
    w = torch.randn(8, 4, requires_grad=True)
    b = torch.zeros(4, requires_grad=True)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    versions, metrics = [], []
    for step in range(steps):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w.view(-1).sub_(0.1 * w.grad.view(-1))
            b -= 0.1 * b.grad
            w.grad.zero_()
            b.grad = None
            metrics.append((loss.detach() * 2).clone())
        versions.append(w._version)
    return w, b, versions, metrics


def test_ops_without_autograd_work_run_below_autograd_and_match_eager():
    eager = no_grad_updates(30)
    before = terra._c().runner_counts()
    ours = terra.run(no_grad_updates, 30)
    after = terra._c().runner_counts()
    assert torch.equal(eager[0], ours[0]) and torch.equal(eager[1], ours[1])
    assert eager[2] == ours[2]  # version counters
    assert all(torch.equal(a, b) for a, b in zip(eager[3], ours[3]))
    assert not ours[0].grad.any() and ours[1].grad is None
    below = after["ops_below_autograd"] - before["ops_below_autograd"]
    through = after["ops_autograd"] - before["ops_autograd"]
    assert below > 0 and through > 0, (below, through)


def forward_mode_tangents(steps):
    # Dual tensors (forward-mode AD) on inputs that do not require grad: autograd has work for
    # every op (the tangents), so none of them may run below it.
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    w, x = torch.randn(4, 4), torch.randn(4)
    out = []
    for step in range(steps):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x * (step + 1), torch.ones(4))
            y = torch.tanh(w @ dual) * 2
            out.append(fwAD.unpack_dual(y).tangent.clone())
    return out


def test_forward_mode_tangents_match_eager():
    eager = forward_mode_tangents(12)
    ours = terra.run(forward_mode_tangents, 12)
    assert all(t is not None for t in ours)
    assert all(torch.equal(a, b) for a, b in zip(eager, ours))


def indexed_views(x, steps=12):
    # Python ints that move every iteration, never repeating, place these views (a loop's batch
    # start, a time step).
    out, offsets = [], []
    for i in range(steps):
        rows = x[i:i + 3]
        out.append(rows * 2)
        out.append(x[i] + 1)
        out.append(x[:, i - 12].sin())
        out.append(x.narrow(1, i, 2).exp())
        offsets.extend(t.storage_offset() for t in (rows, x[i], x[:, i - 12]))
        out.append(x[i + 1] * 3)
    return out, offsets


def test_indexed_views_with_moving_python_ints_are_co_executed_bitwise():
    torch.manual_seed(0)
    x = torch.randn(16, 16)
    eager = indexed_views(x)
    terra.reset()
    ours = terra.run(indexed_views, x)
    assert ours[1] == eager[1]  # the placeholders' storage offsets, computed per call
    assert len(ours[0]) == len(eager[0])
    assert all(torch.equal(a, b) for a, b in zip(eager[0], ours[0]))
    s = terra.stats("indexed_views")
    # Were the positions constants, every new i would be new trace nodes: nothing co-executed.
    assert s["iterations_coexecuted"] >= 8, s
    assert not any("arguments differ" in e["reason"] for e in terra.explain("indexed_views"))


def view_out_of_range(x, out):
    for step in range(12):
        i = 50 if step == 9 else step
        out.append(x[i:i + 3] * 2)  # x[50:53] is an empty slice: a new path, no error
        out.append(x[i] + 1)        # x[50] raises IndexError


def test_indexed_view_out_of_range_raises_where_eager_raises():
    torch.manual_seed(0)
    x = torch.randn(16, 7)
    eager_out, terra_out = [], []
    with pytest.raises(IndexError) as eager_error:
        view_out_of_range(x, eager_out)
    terra.reset()
    with pytest.raises(IndexError) as terra_error:
        terra.run(view_out_of_range, x, terra_out)
    assert str(terra_error.value) == str(eager_error.value)
    assert len(terra_out) == len(eager_out) == 19
    assert all(torch.equal(a, b) for a, b in zip(eager_out, terra_out))
    assert terra.stats("view_out_of_range")["iterations_coexecuted"] >= 3


def inference_slices(x, w):
    out = []
    with torch.inference_mode():
        for i in range(8):
            rows = x[i:i + 4]  # a view of a normal tensor: a normal tensor, even in inference mode
            out.append(((rows @ w).sum().item(), rows.is_inference(), (rows * 2).is_inference()))
    return out


def test_views_of_normal_tensors_in_inference_mode_are_normal_tensors():
    torch.manual_seed(0)
    x, w = torch.randn(20, 5), torch.randn(5, 3)
    eager = inference_slices(x, w)
    assert terra.run(inference_slices, x, w) == eager
    assert terra.stats("inference_slices")["iterations_coexecuted"] >= 4


def gather_rows(x, steps=10, mask=False):
    out = []
    for step in range(steps):
        idx = torch.randperm(x.shape[0])[:3]
        rows = x[x[:, 0] > 0] if mask else x[idx]
        out.append(rows * 2)
    return out


def test_integer_indexing_is_co_executed_and_a_mask_is_fetched():
    x = torch.randn(8, 4)
    for mask in (False, True):
        torch.manual_seed(1)
        eager = gather_rows(x, mask=mask)
        torch.manual_seed(1)
        terra.reset()
        coexec = terra.run(gather_rows, x, mask=mask)
        assert all(torch.equal(a, b) for a, b in zip(eager, coexec))
        s = terra.stats("gather_rows")
        assert s["iterations_coexecuted"] >= 5, s
        # x[idx]: the output's shape follows from idx's; x[mask]: from the mask's values.
        assert (s["fetches"] > 0) == mask, s


def host_scalar_counters(steps):
    torch.manual_seed(0)
    a = torch.randn(384, 384)
    counters = [torch.zeros(()), torch.zeros(())]  # 0-d CPU tensors, as Adam's `step` states
    w = torch.ones(4)
    seen = []
    for _ in range(steps):
        busy = a @ a  # keeps the GraphRunner busy while the program reaches the read below
        torch._foreach_add_(counters, 1.0)  # host scalars written inside a tensor list
        seen.append((counters[0].item(), counters[1].item()))
        w.mul_(busy[0, :4].sign()).add_(counters[1].item())
    return seen, w


def test_reading_a_host_scalar_waits_for_a_list_op_that_writes_it():
    eager_seen, eager_w = host_scalar_counters(20)
    seen, w = terra.run(host_scalar_counters, 20)
    assert seen == eager_seen
    assert torch.equal(w, eager_w)
    assert terra.stats("host_scalar_counters")["iterations_coexecuted"] >= 10


def host_scalar_read_then_bumped(steps):
    torch.manual_seed(0)
    a = torch.randn(384, 384) / 20
    w = torch.randn(384, 384)
    scale = torch.tensor(1.0)  # a 0-d CPU tensor the program changes in place
    for _ in range(steps):
        w = torch.tanh(w @ a) * scale  # the GraphRunner reads `scale`, behind the program
        scale += 0.5  # must wait for that read: it runs in order, on the GraphRunner
    return w, scale


def test_a_host_scalar_an_op_only_reads_is_not_changed_before_that_op_runs():
    # The read is recorded only for ops whose template has such an argument (OpTemplate::
    # host_scalar_args): unrecorded, `scale += 0.5` ran on the host at once (tried).
    eager = host_scalar_read_then_bumped(20)
    coexec = terra.run(host_scalar_read_then_bumped, 20)
    assert all(torch.equal(a, b) for a, b in zip(eager, coexec))
    assert terra.stats("host_scalar_read_then_bumped")["iterations_coexecuted"] >= 10


def gradient_reads(steps, set_to_none, replace_every=None):
    """Reads `.grad` the ways training loops do: zero_grad's and the optimizer's own reads, a
    gradient read twice and scaled in place through one of the reads, and (`replace_every`) a
    gradient assigned anew, then read back in the same iteration."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    seen = []
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        torch.nn.functional.mse_loss(model(x), y).backward()
        g = model.weight.grad
        same = g is model.weight.grad
        g.mul_(0.5)
        if replace_every and step % replace_every == 0:
            model.bias.grad = torch.full_like(model.bias, float(step))
        seen.append((same, float(model.bias.grad.sum()), float(g.norm())))
        opt.step()
    return seen, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("replace_every", [None, 3])
def test_settled_gradients_are_read_directly_and_replaced_ones_wait(set_to_none, replace_every):
    eager_seen, eager_params = gradient_reads(24, set_to_none, replace_every)
    seen, params = terra.run(gradient_reads, 24, set_to_none, replace_every)
    assert [s[1:] for s in seen] == [s[1:] for s in eager_seen]
    assert all(torch.equal(a, b) for a, b in zip(params, eager_params))
    stats = terra.stats("gradient_reads")
    assert stats["iterations_coexecuted"] >= 15, stats
    if not set_to_none:
        # Gradients kept across steps are the real tensors: read without an item, and one Python
        # object per gradient, as in eager execution.
        assert stats["grad_reads_direct"] >= 15 * 6, stats
        assert seen == eager_seen


def finalizer_threads(steps):
    """Inputs made from NumPy (real tensors with Python objects) that the program drops while the
    GraphRunner still uses them; each one's finalizer records the thread it runs on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    threads = []
    for step in range(steps):
        x = torch.from_numpy(np.full((8, 4), step * 0.01, dtype=np.float32))
        weakref.finalize(x, lambda: threads.append(threading.get_ident()))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        del x
    return threads, [p.detach().clone() for p in model.parameters()]


def assert_finalized_in_program_thread(program, steps, finalized):
    """Runs `program` (returning its finalizers' threads and its final tensors) eagerly and under
    Terra: the same tensors, and at least `finalized` finalizers, every one in this thread.
    Returns Terra's stats for the program."""
    main = threading.get_ident()
    eager_threads, eager_state = program(steps)
    threads, state = terra.run(program, steps)
    gc.collect()
    assert set(eager_threads) == {main}
    assert all(torch.equal(a, b) for a, b in zip(state, eager_state))
    assert len(threads) >= finalized and set(threads) == {main}, collections.Counter(threads)
    return terra.stats(program.__name__)


def test_tensors_the_program_dropped_are_freed_in_the_program_thread():
    # A tensor's Python object dies where its last C++ reference but one is dropped. Were that
    # the GraphRunner (a replayed block's values, an autograd graph's saved tensors), it would
    # take the GIL in the middle of the program's Python, and finalizers would run on its thread.
    stats = assert_finalized_in_program_thread(finalizer_threads, 30, finalized=25)
    assert stats["iterations_coexecuted"] >= 20


def replaced_gradient_threads(steps):
    """Gradients the program reads, then replaces (`.grad =`); each one's finalizer records the
    thread it runs on."""
    w = torch.nn.Parameter(torch.ones(3))
    w.grad = torch.zeros(3)
    threads = []
    for step in range(steps):
        (w * step).sum().backward()
        # A temporary: once the read is done, only the leaf keeps the gradient alive.
        weakref.finalize(w.grad, lambda: threads.append(threading.get_ident()))
        w.grad = torch.zeros(3)
    return threads, [w.detach().clone()]


def test_gradients_replaced_in_the_graphrunner_are_freed_in_the_program_thread():
    stats = assert_finalized_in_program_thread(replaced_gradient_threads, 20, finalized=19)
    assert stats["iterations_coexecuted"] >= 10 and stats["grad_reads_direct"] >= 1, stats


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def nested_loop_memory(outer, inner):
    """A nested loop whose inner iterations make 1 MB temporaries the program drops at once;
    returns the largest resident-memory growth seen, in MB, and the result."""
    torch.manual_seed(0)
    w = torch.randn(1 << 18)
    start, peak = _rss_mb(), 0.0
    with torch.no_grad():
        for _ in range(outer):
            z = w
            for _ in range(inner):
                z = torch.tanh(z * 1.01 + 0.1)
            peak = max(peak, _rss_mb() - start)
    return peak, z.sum()


def test_values_of_dropped_placeholders_are_freed_within_the_session():
    # A dead placeholder kept its value while the engine's weak list of handed-out placeholders
    # still named it (pruned only past 4096 entries): 16 x 24 inner iterations of 1 MB temporaries
    # grew by about 1.1 GB, against a few MB eagerly.
    eager_peak, eager_sum = nested_loop_memory(16, 24)
    peak, total = terra.run(nested_loop_memory, 16, 24)
    assert torch.equal(total, eager_sum)
    # Most of the 16 x 24 x 3 ops co-executed (the inner loop, 3 ops per iteration, is part of the
    # outer loop's iterations once seen: PythonRunner::absorbs).
    assert terra.stats("nested_loop_memory")["ops_coexecuted"] >= 16 * 24 * 3 // 2
    assert peak < eager_peak + 256, (peak, eager_peak)


KEEPS = {
    "nothing": lambda z: None,
    "views": lambda z: z[:4],
    "detached copies": lambda z: z.detach(),
    "the tensors": lambda z: z,
}


def chain_of_dropped_values(iters, keep):
    """Chains of 4 MB values the program drops as it goes (`z = tanh(z * a + y)`), keeping what
    `keep` returns for each; returns the largest resident-memory growth seen (MB), the result and
    what it kept."""
    torch.manual_seed(0)
    w, y = torch.randn(1 << 20), torch.randn(1 << 20)
    start, peak, kept = _rss_mb(), 0.0, []
    with torch.no_grad():
        for _ in range(iters):
            z = w
            for _ in range(6):
                z = torch.tanh(z * 1.01 + y)
                k = KEEPS[keep](z)
                if k is not None:
                    kept.append(k)
            peak = max(peak, _rss_mb() - start)
    return peak, z.sum(), kept


@pytest.mark.parametrize("keep", list(KEEPS))
def test_values_dropped_before_their_last_reader_ran_are_freed_right_after_it(keep):
    # Running ahead, the program drops each `z` while the items that make and read it are still
    # pending; the reading item alone then holds it, and the GraphRunner drops the value right
    # after that item ran (placeholder.h: DeadValueWatch), as eager execution frees it. Values the
    # program can still reach (a view, a detached copy sharing the slot, the tensor itself) stay.
    eager_peak, eager_sum, eager_kept = chain_of_dropped_values(12, keep)
    before = terra._c().runner_counts()["values_released_early"]
    peak, total, kept = terra.run(chain_of_dropped_values, 12, keep)
    released = terra._c().runner_counts()["values_released_early"] - before
    assert torch.equal(total, eager_sum)
    assert len(kept) == len(eager_kept) and all(torch.equal(a, b) for a, b in zip(kept, eager_kept))
    assert terra.stats("chain_of_dropped_values")["ops_coexecuted"] >= 12 * 6 * 3 // 2
    if keep == "nothing":
        # 4 MB values: before, dozens of them waited for the program to drop their items
        # (resident memory grew 275 MB more than eagerly, 64 items ahead); now each is freed after
        # its one reader (87 MB more, the first iterations' recording included, 64 items ahead;
        # with up to 32 MiB of outputs ahead, each iteration's last value, which nothing reads,
        # waits for the program to wake: 66-114 MB more here, more on a busy machine).
        assert released >= 12 * 6, released
        assert peak < eager_peak + 224, (peak, eager_peak)


def read_through_weak_references(iters):
    """A chain whose previous value the program reads through a weak reference, if it has one."""
    torch.manual_seed(0)
    w, y = torch.randn(1 << 12), torch.randn(1 << 12)
    seen = []
    with torch.no_grad():
        for i in range(iters):
            z, ref = w, None
            for k in range(6):
                z = torch.tanh(z * 1.01 + y)
                prev = ref() if ref is not None else None
                if prev is not None:
                    seen.append((i, k, prev.clone()))
                ref = weakref.ref(z)
    return z.sum(), seen


def test_a_value_a_weak_reference_reaches_is_never_released():
    # Eagerly the previous `z` is gone once rebound, and its weak reference dead. Under Terra the
    # item that reads it keeps its Python object alive until the program drops that item (torch's
    # PyObject preservation), so the weak reference may still return it (a known difference): the
    # value must then be there, never released behind it.
    total, seen = terra.run(read_through_weak_references, 10)
    assert torch.equal(total, read_through_weak_references(10)[0])
    torch.manual_seed(0)
    w, y = torch.randn(1 << 12), torch.randn(1 << 12)
    chain = [w]
    for _ in range(6):
        chain.append(torch.tanh(chain[-1] * 1.01 + y))
    for _, k, value in seen:
        assert torch.equal(value, chain[k]), k


def foreach_optimizer(opt_class, steps, **options):
    """A small model trained with a foreach optimizer: Adam and its kin pass per-parameter step
    sizes and bias corrections as Python number lists (`Scalar[]`), new every step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = opt_class(model.parameters(), lr=3e-3, foreach=True, **options)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    state = [p.detach() for p in model.parameters()]
    for s in opt.state.values():
        state += [v for v in s.values() if torch.is_tensor(v)]
    return state


@pytest.mark.parametrize("opt_class,options", [
    (torch.optim.Adam, {}), (torch.optim.AdamW, {"amsgrad": True}), (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {})])
def test_number_lists_of_foreach_optimizers_are_feeds(opt_class, options):
    # Were they constants, every step would be a new path: the loop traced to the end, its graph
    # growing by a node per step.
    terra.config(adaptive=False)
    expected = foreach_optimizer(opt_class, 30, **options)
    got = terra.run(foreach_optimizer, opt_class, 30, **options)
    assert len(got) == len(expected)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(expected, got))
    s = terra.stats("foreach_optimizer")
    assert s["iterations_coexecuted"] >= 20, s
    assert s["iterations_replayed"] >= 15, s


def growing(steps):
    x = torch.zeros(1)
    for _ in range(steps):
        x = torch.cat([x, torch.ones(1)]) * 0.5  # a longer tensor every iteration: never steady
    return x


def test_a_loop_that_never_becomes_steady_is_explained_at_the_op_that_changes():
    assert torch.equal(terra.run(growing, 20), growing(20))
    s = terra.stats("growing")
    assert s["iterations_coexecuted"] == 0 and s["iterations_traced"] >= 20, s
    never = [e for e in terra.explain("growing") if e["reason"].startswith("never steady")]
    assert len(never) == 1, terra.explain("growing")
    assert never[0]["op"] == "aten::cat"
    assert "element 0 is Float[" in never[0]["reason"], never[0]
    line = growing.__code__.co_firstlineno + 3
    assert never[0]["where"][1:] == (line, "growing"), never[0]
    # Entered again and growing further: the same entry, counted twice.
    terra.run(growing, 40)
    never = [e for e in terra.explain("growing") if e["reason"].startswith("never steady")]
    assert len(never) == 1 and never[0]["count"] == 2, never
    # A loop that becomes steady after its warm-up is not explained so.
    terra.run(train, 30)
    assert not any(e["reason"].startswith("never steady") for e in terra.explain("train"))


TRAINER_PROGRAM = '''
import sys
import threading
import torch


class Trainer:
    """Keras-style: the training loop lives in a method of a class next to main()."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def fit(self, x, y, steps):
        losses = []
        for step in range(steps):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            losses.append(loss.detach())
        return losses


def busy(n, out):
    total = 0
    for i in range(n):  # a loop of this file, run by another thread during the session
        total += i
    out.append(total)


def main(steps, with_thread=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    out = []
    worker = threading.Thread(target=busy, args=(200_000, out)) if with_thread else None
    if worker:
        worker.start()
    losses = Trainer(model, opt).fit(x, y, steps)
    if worker:
        worker.join()
    return [p.detach() for p in model.parameters()] + losses, out
'''


@pytest.fixture
def program_file(tmp_path, monkeypatch):
    """`load(name, text)`: `text` written to a file `name`.py and imported (terra.run reads a
    program's loops from its file); the modules are forgotten after the test."""
    import importlib
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def load(name, text):
        (tmp_path / f"{name}.py").write_text(text)
        names.append(name)
        return importlib.import_module(name)

    yield load
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def trainer_program(program_file):
    return program_file("trainer_program", TRAINER_PROGRAM)


def test_run_marks_the_loops_of_the_programs_own_functions(trainer_program):
    # The loop is in Trainer.fit, defined in main's file: without marking it, the whole run was one
    # iteration, traced op by op (corpus p17: 3.2x eager's time), and never co-executed.
    original = trainer_program.Trainer.fit.__code__
    expected, _ = trainer_program.main(30)
    got, _ = terra.run(trainer_program.main, 30)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats("main")
    assert stats["iterations_coexecuted"] >= 20, stats
    assert trainer_program.Trainer.fit.__code__ is original  # its own code back after the run
    # Outside a run the method is the user's, unmarked: run eagerly, it leaves no trace.
    terra.reset()
    trainer_program.main(5)
    assert terra.stats() == {} or terra.stats().get("iterations_traced", 0) == 0


def test_loops_run_by_another_thread_mark_no_iterations(trainer_program):
    # busy() is marked too (same file), but runs in a thread: its 200k boundaries are not the
    # session's iterations.
    expected, total = trainer_program.main(30, with_thread=True)
    alone, _ = terra.run(trainer_program.main, 30)
    counts = {k: v for k, v in terra.stats("main").items() if k.startswith("iterations_")}
    terra.reset()
    got, got_total = terra.run(trainer_program.main, 30, with_thread=True)
    assert got_total == total
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    with_thread = {k: v for k, v in terra.stats("main").items() if k.startswith("iterations_")}
    assert sum(with_thread.values()) == sum(counts.values()), (counts, with_thread)


EDITED_PROGRAM = '''
import torch


def helper(x, k):
    for i in range(k):
        x = x * 1.5 + i
    return x


def main():
    y = torch.ones(3)
    for step in range(6):
        y = helper(y, 3) / 2
    return y
'''


def test_a_file_edited_after_import_does_not_replace_the_code_that_runs(program_file, tmp_path):
    # terra.run reads the loops' source from the file to mark them; if the file changed since
    # the module was imported, that source is not the running code, and compiling it would run
    # the edit instead (main and helper both).
    module = program_file("edited_program", EDITED_PROGRAM)
    expected = module.main()
    (tmp_path / "edited_program.py").write_text(
        EDITED_PROGRAM.replace("x * 1.5 + i", "x * 2.5 - i").replace("/ 2", "/ 3"))
    got = terra.run(module.main)
    assert torch.equal(got, expected), (got, expected)
    assert terra._instrument(module.main) is None and terra._instrument(module.helper) is None


def test_the_cache_of_instrumented_code_is_bounded_and_keeps_what_is_used(tmp_path):
    # A notebook defines its functions again each time a cell runs: each definition is new code.
    path = tmp_path / "steps.py"
    path.write_text("def step(xs):\n    total = 0\n    for x in xs:\n        total = total + x\n    return total\n")

    def load():
        spec = importlib.util.spec_from_file_location("steps", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.step

    first = load()
    assert terra._instrument(first)([1, 2, 3]) == 6
    for _ in range(terra._INSTRUMENTED_MAX + 50):
        assert terra._instrument(load()) is not None
        terra._instrument(first)  # used all along: kept
    assert len(terra._instrumented) <= terra._INSTRUMENTED_MAX
    assert any(entry[0] is first.__code__ for entry in terra._instrumented.values())
    assert terra._instrument(first)([4, 5]) == 9



LOOP_SHAPES_PROGRAM = """
import torch


def for_loop(xs):
    for x in xs:
        return x


def while_that_leaves(x):
    while True:
        return x + 1


def while_loop(n):
    while n > 0:
        n -= 1
    return n


async def async_for(xs):
    async for x in xs:
        pass


def comprehension_only(xs):
    return [x * 2 for x in xs] + list(y for y in xs)


def nested_definition_only(xs):
    def inner():
        for x in xs:
            yield x
    return inner


def no_loop(x):
    return torch.tanh(x) * 2
"""


def test_functions_without_loops_are_not_instrumented_and_no_loop_is_missed(program_file):
    # terra.run instruments the program's functions that have loops of their own; the rest are
    # skipped from their bytecode and source alone (compiling each function twice to find no loop
    # was a third of gpt's first call). Skipped must mean that marking finds no loop.
    import ast
    import inspect
    import textwrap
    from terra import _loops

    module = program_file("loop_shapes", LOOP_SHAPES_PROGRAM)
    functions = [getattr(module, n) for n in ("for_loop", "while_that_leaves", "while_loop", "async_for",
                                              "comprehension_only", "nested_definition_only", "no_loop")]
    root = str(Path(__file__).resolve().parents[2])
    sys.path.insert(0, root)
    try:
        for name in ("tabular_mlp", "gpt", "rl_cartpole", "resnet", "rnn_lengths"):
            prog = importlib.import_module(f"bench.programs.{name}")
            functions += terra._program_functions(prog.train)
    finally:
        sys.path.remove(root)
    skipped = 0
    for f in functions:
        source = textwrap.dedent(inspect.getsource(f))
        loops = _loops.mark_loops(ast.parse(source).body[0].body, f.__qualname__)
        may_loop = terra._may_loop(f.__code__, source)
        assert may_loop or loops == 0, f.__qualname__
        assert may_loop or terra._instrument(f) is None, f.__qualname__
        skipped += not may_loop
    names = {f.__name__: terra._may_loop(f.__code__, textwrap.dedent(inspect.getsource(f))) for f in functions[:7]}
    assert names == {"for_loop": True, "while_that_leaves": True, "while_loop": True, "async_for": True,
                     "comprehension_only": False, "nested_definition_only": False, "no_loop": False}
    assert skipped >= 10, skipped  # the bench programs' constructors and forwards
    assert module.for_loop([3, 4]) == terra.run(module.for_loop, [3, 4]) == 3

# A model whose forward loops over its layers: in a program's file, a helper's loop (part of the
# training step where a loop of the run function is open).
LAYERED_NET = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x
'''

LAYER_LOOP_PROGRAM = LAYERED_NET + '''

def main(steps):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for step in range(steps):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    return [p.detach() for p in net.parameters()]
'''


def iterations(stats):
    """Every iteration of a graph, however it ran."""
    return sum(stats[k] for k in ("iterations_traced", "iterations_coexecuted",
                                  "iterations_fallback", "iterations_eager"))


def test_a_helpers_loop_inside_the_run_functions_loop_is_part_of_its_iteration(program_file):
    # Net.forward's loop is marked (same file), but it runs inside main's training loop: its
    # layers are part of the training step's iteration, not iterations of their own (marked, an
    # RNN's 4-op time steps and two benchmark transformers' layers ran 1.2x slower).
    module = program_file("layer_loop_program", LAYER_LOOP_PROGRAM)
    expected = module.main(20)
    got = terra.run(module.main, 20)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats("main")
    assert iterations(stats) <= 20 + 3, stats  # the steps, the entry and the tail after the loop
    assert stats["iterations_coexecuted"] >= 15, stats


EPOCH_LOOP_PROGRAM = LAYERED_NET + '''

def train_one_epoch(net, opt, batches, losses):
    for x in batches:  # a helper's loop of training steps, called from main's epoch loop
        opt.zero_grad()
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())


def main(epochs, steps):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    batches = [torch.randn(4, 8) for _ in range(steps)]
    losses = []
    for epoch in range(epochs):
        train_one_epoch(net, opt, batches, losses)
        for group in opt.param_groups:
            group["lr"] *= 0.9
    return [p.detach() for p in net.parameters()] + losses
'''


def test_a_helpers_loop_of_training_steps_inside_the_run_functions_loop_is_the_iteration(program_file):
    # main's epoch loop calls a function whose loop runs the steps (a notebook's
    # `for epoch in range(E): train_one_epoch(...)`): each step is an iteration (each epoch was
    # one, its whole trace traced twice before co-executing), the model's layer loop still part
    # of the step, and every step's loss and the parameters as eager execution's.
    module = program_file("epoch_loop_program", EPOCH_LOOP_PROGRAM)
    expected = module.main(4, 25)
    got = terra.run(module.main, 4, 25)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats("main")
    assert iterations(stats) >= 4 * 25 - 3, stats  # each step (the first epoch's first three in one)
    # And not the layers (3 per step): per epoch, besides its steps, the epoch's own iteration
    # and the part after the steps' loop; the entry and the tail after main's loop.
    assert iterations(stats) <= 4 * 25 + 4 * 4 + 3, stats
    assert stats["iterations_coexecuted"] >= 60, stats
    assert stats["nodes"] < 400, stats  # one step's ops, not an epoch's


LIBRARY_TRAINER = '''
import torch


def fit(model, opt, batches, losses):
    """A library's training loop: its file is not the run function's, so no loop of it is marked."""
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())


def fit_checkpointed(model, opt, batches, losses):
    """The same with the model's activations recomputed in the backward (a reentrant checkpoint:
    its backward calls backward again)."""
    from torch.utils.checkpoint import checkpoint
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(checkpoint(model, x.requires_grad_(), use_reentrant=True), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())


def two_backwards(model, opt, x, y, losses):
    """One step with two backwards (as a GAN's discriminator and generator), no loop."""
    for target in (y, -y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
'''

LIBRARY_USER = LAYERED_NET + '''
import library_trainer


def main(steps, with_loop=False, checkpointed=False, gan_like=False, layered=False):
    torch.manual_seed(0)
    if layered:  # a forward with a marked loop over its layers, inside the library's loop
        model = torch.nn.Sequential(Net(), torch.nn.Linear(8, 1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(steps)]
    losses = []
    if with_loop:
        for _ in range(3):  # a marked epoch loop around it
            library_trainer.fit(model, opt, batches, losses)
    elif gan_like:
        for x, y in batches:  # a marked loop whose iterations run two backwards each
            library_trainer.two_backwards(model, opt, x, y, losses)
    elif checkpointed:
        library_trainer.fit_checkpointed(model, opt, batches, losses)
    else:
        library_trainer.fit(model, opt, batches, losses)
    return [p.detach() for p in model.parameters()] + losses
'''


def test_a_training_loop_no_pass_marks_is_cut_into_iterations_at_its_backwards(program_file):
    # A library's Trainer.fit (a loop in a module of its own, unmarked) ran as one iteration: the
    # whole run one trace, never co-executed. Its backwards repeat: each ends an iteration.
    program_file("library_trainer", LIBRARY_TRAINER)
    module = program_file("library_user", LIBRARY_USER)
    expected = module.main(60)
    got = terra.run(module.main, 60)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats("main")
    assert iterations(stats) >= 58, stats
    assert stats["iterations_coexecuted"] >= 40, stats
    assert stats["nodes"] < 300, stats  # about one step's ops
    # Inside a marked loop of the run function (an epoch loop calling it), cut once an
    # iteration ran 4 backwards, and that loop's later iterations from their first backward.
    terra.reset()
    expected = module.main(10, with_loop=True)
    got = terra.run(module.main, 10, with_loop=True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert 3 * 10 - 4 <= iterations(terra.stats("main")) <= 3 * 10 + 3 * 2 + 3, terra.stats("main")
    # A marked loop whose iterations run two backwards each (a GAN's step) keeps them whole.
    terra.reset()
    expected = module.main(20, gan_like=True)
    got = terra.run(module.main, 20, gan_like=True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert iterations(terra.stats("main")) <= 20 + 3, terra.stats("main")
    # A model whose forward loops over its layers in a marked loop: those loops counted as the
    # iterations where no loop of the run function was open (3 per step, the backward count
    # reset by each); inside the library's loop they are part of its step.
    terra.reset()
    expected = module.main(30, layered=True)
    got = terra.run(module.main, 30, layered=True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats("main")
    assert 28 <= iterations(stats) <= 30 + 3 * 2 + 3, stats
    assert stats["iterations_cut_at_backward"] >= 27, stats
    # A backward inside the backward (a reentrant checkpoint's) ends no iteration: one per step.
    terra.reset()
    expected = module.main(20, checkpointed=True)
    got = terra.run(module.main, 20, checkpointed=True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert 18 <= iterations(terra.stats("main")) <= 23, terra.stats("main")


def test_an_iteration_that_never_ends_stops_growing_the_graph_at_max_nodes():
    # A comprehension is not a marked loop: its 3000 adds are one iteration, every op a new node
    # (as a library's training loop would be). max_nodes was checked only where an iteration
    # begins, so the graph grew past it; now the rest of the iteration runs eagerly.
    x = torch.zeros(1)

    def main():
        return [x + float(i) for i in range(3000)]

    expected = main()
    before = terra.config()["max_nodes"]
    terra.config(max_nodes=500)
    try:
        got = terra.run(main)
    finally:
        terra.config(max_nodes=before)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    stats = terra.stats()
    assert stats["nodes"] <= 500, stats
    assert stats["iterations_eager"] >= 1, stats
    assert any("node cap" in f["reason"] for f in terra.explain()), terra.explain()


def ema_training(steps):
    """A training loop that keeps an exponential moving average of the weights, updated in a loop
    over the parameters written inside the training loop: two ops per parameter."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.05)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, params):
                e.mul_(0.9).add_(p, alpha=0.1)
    return params + ema


def test_a_nested_loop_of_a_few_ops_per_iteration_becomes_part_of_the_enclosing_iteration():
    # Each parameter's EMA update was an iteration of its own (4 per step, with the rest of the
    # step cut into pieces around them): 242 iterations for 40 steps, 15 co-executed.
    eager = ema_training(40)
    coexec = terra.run(ema_training, 40)
    assert all(torch.equal(a, b) for a, b in zip(eager, coexec))
    s = terra.stats("ema_training")
    # Before the loop is absorbed: 6 of its iterations seen, in 2 steps (the step, 4 parameters,
    # the rest of the step after the loop, each an iteration), plus the code around the loops.
    assert iterations(s) <= 40 + 2 * 5 + 4, s
    assert s["iterations_coexecuted"] >= 25, s


def busy(x, w, n):
    """Slow work (n 256x256 products), so that the ops a test issues after it are still pending
    in the GraphRunner when the program reaches what comes next."""
    for _ in range(n):
        x = torch.tanh(x @ w)
    return x


def same_values(a, b):
    return all(torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v for u, v in zip(a, b))


def coexecuted_as_eager(fn, *args, **kwargs):
    """`fn` run eagerly, then under Terra (timeline cleared first): asserts the same results and
    returns Terra's stats for fn and the indices of its co-executed iterations."""
    eager = fn(*args, **kwargs)
    terra._C.clear_timeline()
    coexec = terra.run(fn, *args, **kwargs)
    assert len(eager) == len(coexec) and same_values(eager, coexec)
    co = {it["index"] for it in terra.timeline()["iterations"] if it["mode"] == "coexec"}
    return terra.stats(fn.__name__), co


def slow_descent():
    """A 256x256 weight trained by SGD on slow work (`busy`), and the input the work reads."""
    torch.manual_seed(0)
    w = torch.randn(256, 256, requires_grad=True)
    return w, torch.optim.SGD([w], lr=1e-4), torch.randn(256, 256)


def descend(opt, loss, out):
    """One SGD step on `loss`, which goes to `out`."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    out.append(loss.detach())


def fresh_tensor_each_step(steps=24):
    """Each step makes a tensor from Python data while slow work is still pending, as Hugging
    Face models do in every forward (`torch.tensor([])` for an empty key/value cache)."""
    w, opt, x = slow_descent()
    out = []
    for _ in range(steps):
        h = busy(x, w, 4)
        empty = torch.tensor([], dtype=h.dtype)  # ends with detach_() on the tensor it made
        loss = torch.cat([empty, h.flatten()]).square().mean()
        descend(opt, loss, out)
    return [w.detach().clone()] + out


def fetch_waits(iterations):
    return [e for e in terra.timeline()["events"]
            if e["kind"] == "fetch_wait" and e["iteration"] in iterations]


def test_a_tensor_made_from_python_data_does_not_wait_for_the_graph_runner():
    # torch.tensor(data) detaches the tensor it just made in place: an in-place op on a real
    # tensor, which waited for every issued item in case one of them read it (hf_llama: two
    # waits of 1-4 ms per step). Nothing but the program holds that tensor.
    s, co = coexecuted_as_eager(fresh_tensor_each_step)
    assert len(co) >= 12, s
    assert fetch_waits(co) == []


def reshaped_in_place_while_read(steps=24):
    """A tensor that pending work reads, changed in place (its shape) and back in each step."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    x = torch.randn(256, 256)
    out = []
    for _ in range(steps):
        h = busy(x, w, 4)
        w.unsqueeze_(0)  # read after this, `h @ w` would be a batched product
        out.append((w * 2).sum())
        w.squeeze_(0)
        out.append(h.sum())
    return out


def test_changing_in_place_a_tensor_that_pending_work_reads_waits_for_that_work():
    s, co = coexecuted_as_eager(reshaped_in_place_while_read)
    assert len(co) >= 12, s
    assert len(fetch_waits(co)) >= len(co)  # unsqueeze_ waited in each


def versions_of_a_tensor_written_in_place(steps=16):
    """A plain tensor written in place through a view while slow work is pending, its version
    counter read from Python after each write (what `torch.utils.checkpoint` and saved-tensor
    checks read); no `.grad` anywhere, so nothing else makes the program wait."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    x = torch.randn(256, 256)
    versions, out = [], []
    for _ in range(steps):
        h = busy(x, w, 4)
        v = w.view(-1)  # a view of an ordinary tensor: its counter is w's
        v.add_(0.001)
        w.mul_(0.999)
        u = h.t()  # a view of a value the program has not seen yet: shares h's counter
        h.add_(1.0)
        versions.append([w._version, v._version, h._version, u._version])
        out.append(h.sum())
    return [torch.tensor(versions)] + out


def test_a_tensors_version_read_from_python_counts_the_writes_issued_to_it():
    # The GraphRunner's in-place op bumps an ordinary tensor's counter when it runs: read before
    # that, the program saw an older version than eager execution shows.
    s, co = coexecuted_as_eager(versions_of_a_tensor_written_in_place)
    assert len(co) >= 10, s
    assert any(e["detail"] == "a tensor's version" for e in fetch_waits(co))


def autograd_history_read_each_step(steps=24):
    """Python reads of intermediate tensors' autograd history: their nodes' names, whether they
    are leaves, the node's inputs, the bases of views (what a debugger, a printout or a library
    check looks at)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    seen, out = [], []
    for _ in range(steps):
        y = lin(x)
        z = y.relu()
        rows, zt, flat, detached, xs = z[1:], z.t(), z.view(-1), z.detach(), x[2:]
        loss = rows.sum() + zt[1:].mean() + flat.square().mean()
        bases = [next((name for name, t in (("z", z), ("x", x), ("y", y)) if v._base is t), v._base)
                 for v in (rows, zt, zt[1:], flat, detached, xs, xs.unsqueeze(0), y)]
        seen.append((y.grad_fn.name(), type(y.grad_fn).__name__, y.is_leaf, z.is_leaf, x.is_leaf,
                     [type(f).__name__ for f, _ in y.grad_fn.next_functions], loss.grad_fn.name(),
                     lin.weight.is_leaf, lin.weight.grad_fn is None, bases,
                     [v._is_view() for v in (rows, zt, flat, detached, xs, y)]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return [seen] + out + [lin.weight.detach().clone()]


def test_intermediates_show_their_autograd_history_as_in_eager():
    # A placeholder has no grad_fn until the GraphRunner made its value: it read as a leaf
    # without a node (`y.grad_fn is None`, `y.is_leaf`), where eager shows AddmmBackward0; and a
    # view op's placeholder is no autograd view (`_base` None, where eager names the root base).
    s, co = coexecuted_as_eager(autograd_history_read_each_step)
    assert len(co) >= 12, s
    assert s["iterations_replayed"] >= 10, s


def small_model_steps(model, opt, x, y, steps):
    out = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out


def test_a_sessions_first_gradient_reads_do_not_wait_for_the_graph_runner():
    # A new session (each terra.run, each cell) knows nothing yet of which leaves have a gradient:
    # `zero_grad`'s reads asked the GraphRunner, waiting for every item issued before them,
    # including the previous parameter's `p.grad = None`: a round trip per parameter (gpt, 5-step
    # calls: 2.7 ms of each call). Only a pending backward can change a gradient no write names.
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    eager_model, eager_opt = make()
    model, opt = make()
    expected, got = [], []
    terra._C.clear_timeline()
    for _ in range(4):
        expected += small_model_steps(eager_model, eager_opt, x, y, 5)
        got += terra.run(small_model_steps, model, opt, x, y, 5)
    assert all(torch.equal(a, b) for a, b in zip(expected, got)) and len(expected) == len(got) == 20
    assert all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), model.parameters()))
    assert terra.stats("small_model_steps")["iterations_coexecuted"] >= 12
    waits = [e for e in terra.timeline()["events"]
             if e["kind"] == "fetch_wait" and e["detail"] == "whether .grad exists"]
    assert waits == []


def two_models_steps(a, opt_a, b, opt_b, x, steps):
    """A GAN's shape: model a's step, then model b's, on a's output detached; b's `zero_grad`
    reads its gradients while a's backward is still pending."""
    out = []
    for _ in range(steps):
        h = a(x)
        loss_a = h.square().mean()
        opt_a.zero_grad()
        loss_a.backward()
        opt_a.step()
        loss_b = (b(h.detach()) - x).square().mean()
        opt_b.zero_grad()
        loss_b.backward()
        opt_b.step()
        out += [loss_a.detach(), loss_b.detach()]
    return out


def test_gradient_reads_after_another_models_backward_do_not_wait_for_it():
    # Traced, a's backward saw b's gradients and did not reach them: in a new session, b's reads
    # need not wait for it (dcgan, 5-step calls: 2.4 ms of each call's first step).
    def make():
        torch.manual_seed(0)
        models = [torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)]) for _ in range(2)]
        return [m_or_opt for m in models for m_or_opt in (m, torch.optim.Adam(m.parameters(), lr=1e-3))]
    x = torch.randn(256, 128)
    eager, ours = make(), make()
    expected, got = [], []
    terra._C.clear_timeline()
    for _ in range(4):
        expected += two_models_steps(*eager, x, 4)
        got += terra.run(two_models_steps, *ours, x, 4)
    assert len(expected) == len(got) == 32 and all(torch.equal(u, v) for u, v in zip(expected, got))
    for m, n in ((eager[0], ours[0]), (eager[2], ours[2])):
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), n.parameters()))
    assert terra.stats("two_models_steps")["iterations_coexecuted"] >= 9
    waits = [e for e in terra.timeline()["events"]
             if e["kind"] == "fetch_wait" and e["detail"] == "whether .grad exists"]
    assert waits == []


def adversarial_training(steps=24, detach=False):
    """Each step a fresh perturbation made a leaf by its factory (`requires_grad=True`), its
    gradient's sign taken (one FGSM/PGD step), then the model trained on the perturbed batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    out = []
    for _ in range(steps):
        delta = torch.zeros_like(x, requires_grad=True)
        noise = torch.randn(64, 16, requires_grad=True)
        attack = torch.nn.functional.mse_loss(model(x + delta + 0.01 * noise), y)
        if detach:
            noise.detach_()  # read by pending work: its history is kept, its .grad stays None
        attack.backward()
        x_adv = x + 0.1 * delta.grad.sign()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x_adv), y)
        loss.backward()
        opt.step()
        out += [loss.detach(), delta.grad, noise.grad, noise.requires_grad]
    return [p.detach().clone() for p in model.parameters()] + out


@pytest.mark.parametrize("replay", [True, False])
@pytest.mark.parametrize("detach", [False, True])
def test_a_leaf_made_by_a_factorys_requires_grad_gets_its_gradient(replay, detach):
    # `torch.zeros_like(x, requires_grad=True)` sets requires_grad on the op's result outside the
    # dispatcher: on a placeholder, the GraphRunner never saw it and raised (the first op reading
    # it was traced with history); after a divergence its .grad was None.
    before = terra.config()["replay"]
    terra.config(replay=replay)
    try:
        s, _ = coexecuted_as_eager(adversarial_training, detach=detach)
    finally:
        terra.config(replay=before)  # the tests after this one replay (they did not: left off)
    assert s["iterations_coexecuted"] >= 12, s
    assert s["iterations_fallback"] == 0, s


def reseeded_generator(steps=30):
    """Draws from a generator of the program's own, reseeded and read every step while slow work
    is pending (a reproducible noise stream per step)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256)
    out = []
    for step in range(steps):
        h = busy(x, x, 3)
        g.manual_seed(step)  # a method of an immutable type: not interceptable
        out.append(h.sum() + torch.randn(4, generator=g).sum())
        if step % 10 == 9:
            out.append(g.get_state().float().sum())
    return out


def test_draws_from_the_programs_own_generator_follow_its_reseeding():
    # With the draw pending in the GraphRunner, the next step's g.manual_seed ran first and the
    # draw took the later seed's numbers: different from eager's from the fifth step on.
    s, _ = coexecuted_as_eager(reseeded_generator)
    assert s["iterations_coexecuted"] >= 15, s


def reseeded_default_generator(steps=30):
    """Draws from the default generator, pending in the GraphRunner behind slow work while the
    program reseeds, saves and restores it through the generator object's own methods."""
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    out = []
    for step in range(steps):
        h = busy(x, x, 3)
        noise = torch.randn(4)  # pending behind `busy` when the program touches the generator
        if step % 3 == 0:
            torch.default_generator.manual_seed(step)
        elif step % 3 == 1:
            state = torch.default_generator.get_state()
            out.append(torch.randn(2).sum())
            torch.default_generator.set_state(state)
        out.append(h.sum() + noise.sum() + torch.randn(4).sum())
    return out


def test_the_default_generators_own_methods_wait_for_pending_draws():
    # torch.default_generator.manual_seed/get_state/set_state are methods of an immutable C type:
    # they ran at once, before the draws issued earlier and still pending, which then took the
    # new seed's (or the restored state's) numbers.
    s, _ = coexecuted_as_eager(reseeded_default_generator)
    assert s["iterations_coexecuted"] >= 15, s


def fit_reading_loss(model, opt, x, y, steps):
    """Regression steps that read the loss every step (so the program waits for the
    GraphRunner): the losses, then the final parameters."""
    losses = []
    for _ in range(steps):
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses + [p.detach().clone() for p in model.parameters()]


def layer_norm_steps(steps=40, rows=512):
    """A small training loop whose backward has a kernel that keeps the program's intra-op
    thread count when replayed (layer_norm's backward splits its sums by thread)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return fit_reading_loss(model, opt, torch.randn(rows, 64), torch.randn(rows, 1), steps)


@pytest.mark.parametrize("rows, large", [(16, False), (2048, True)])
def test_the_kernels_run_in_parallel_regions_are_counted_by_their_size(rows, large):
    # layer_norm's backward splits its sums by thread whatever its size, so it (and the matmuls
    # MKL splits) keeps the program's thread count when replayed: on tensors below the grain size
    # with 16 rows (a region of microseconds), above it with 2048.
    s, _ = coexecuted_as_eager(layer_norm_steps, steps=20, rows=rows)
    assert s["blocks_recorded"] >= 1 and s["program_count_kernels"] > 0, s
    if large:
        assert s["parallel_kernels_large"] > 0, s
    else:
        assert s["parallel_kernels_small"] > 0 and s["parallel_kernels_large"] == 0, s


def tiny_mlp_steps(steps=60):
    """Training on tensors far below the intra-op grain size: every kernel runs on the
    GraphRunner's thread alone, so its OpenMP workers, spinning or not, take no CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return fit_reading_loss(model, opt, torch.randn(4, 8), torch.randn(4, 1), steps)


def coexecuted_with_payoff_forced(fn, coexec_wins, **kwargs):
    """coexecuted_as_eager's stats for `fn` with the payoff check on and its margin forcing
    co-execution to win (or to lose) against eager execution."""
    terra.config(adaptive=True, payoff_margin=100.0 if coexec_wins else -1.0)
    try:
        s, _ = coexecuted_as_eager(fn, **kwargs)
    finally:
        terra.config(adaptive=False, payoff_margin=0.0)
    return s


def assert_coexec_timed_again_soon():
    """The first loss is followed by a short hold (8 eager iterations), not one sized from the
    times: co-execution is timed again within 12 iterations of the first eager one."""
    modes = [it["mode"] for it in terra.timeline()["iterations"]]
    first_eager = modes.index("eager")
    assert "coexec" in modes[first_eager:first_eager + 12], modes


def test_the_graph_runners_workers_asleep_change_no_result():
    # worker_spin="sleep" holds an idle OpenMP pool so libgomp's workers spin briefly: only the
    # wait between parallel regions changes, every kernel keeps its thread count; and kernels
    # are not spread over the program's threads while it waits (each spread would wait for a
    # worker to wake), except in the drain at the end, where the limit is lifted: there the
    # last step's backward and update may be spread, at most one step's kernels (spinning,
    # every step's kernels are spread while the program waits at its `.item()`).
    terra.config(worker_spin="sleep")
    try:
        s, _ = coexecuted_as_eager(layer_norm_steps, steps=80)
    finally:
        terra.config(worker_spin="auto")
    assert s["iterations_replayed"] >= 60, s
    assert s["kernels_spread_while_waited"] <= s["kernels_replayed"] // s["iterations_replayed"], s


PAIRED_BLOCK = 6  # terra::PairedTrial::kBlock


@pytest.mark.parametrize("coexec_wins", [False, True])
def test_co_execution_is_timed_again_with_the_workers_the_other_way(coexec_wins):
    # With the payoff check on, co-execution that lost to eager execution is timed again, after
    # the eager hold, with the GraphRunner's idle workers asleep (then spinning again, ...);
    # where it wins the first time, the two ways alternate in blocks of co-executed iterations
    # (terra/paired_trial.h) and the faster stays. The margin forces each outcome against eager
    # execution; which way of the workers is faster is the machine's, so only that both were
    # timed is checked there.
    # The kernels' one-thread verdicts known first (as after an earlier recording in the process
    # or a cache file): recorded cold, a recording times each kernel on one thread and spreads
    # fewer of them over the workers while the program waits, and the workers' share of CPU
    # (0.05 against 0.3 warm, on this machine) fell below what is worth trying asleep.
    # 2048 rows: the GraphRunner's parallel regions a larger share of the step, so its workers'
    # share of CPU is 0.33-0.45 alone on this machine (0.24-0.30 with 512) and further from 0.1
    # when the suite's host is slow.
    coexecuted_as_eager(layer_norm_steps, steps=20, rows=2048)
    terra.reset()  # the verdicts stay with the GraphRunner; the graph and its timings go
    s = coexecuted_with_payoff_forced(layer_norm_steps, coexec_wins, steps=120, rows=2048)
    # Its layer_norm and matmuls run parallel regions on large tensors: spinning first.
    assert s["parallel_kernels_large"] > 0 and not s["workers_asleep_by_blocks"], s
    untried = s["workers_trial"] == "done" and s["iterations_workers_asleep"] == 0
    if s["workers_cpu_share"] < 0.1 or untried:
        # The workers' share is measured: 0.2-0.3 alone on this machine with 512 rows, once under 0.1 (kWorkersCpuShare) within
        # the whole suite, where no other way is tried (test_workers_that_took_no_cpu_are_not_tried_asleep). Once more.
        # The share may also have been under 0.1 only at the first check, which skipped the trial
        # (a win whose trial ended with no iteration asleep: session 48's CI, within the suite,
        # on a host 2-3x slower than usual; 9 of 9 alone), or a loss timed again the same way for
        # it (the last CI of session 49, within the suite: the share 0.1 or more by the end, none
        # asleep). The run again is held to the same.
        terra.reset()
        s = coexecuted_with_payoff_forced(layer_norm_steps, coexec_wins, steps=120, rows=2048)
        if s["workers_cpu_share"] < 0.1 and s["iterations_workers_asleep"] == 0:
            # Twice under 0.1: the host's other work kept the workers off the cores (session 51's
            # CI beside two compilers: none asleep in both runs of both cases, 2 of 2 alone). Then
            # no other way is worth timing, by design (the test below checks that case).
            pytest.skip(f"the GraphRunner's workers took {s['workers_cpu_share']:.2f} of the CPU twice: "
                        "no other way is tried under 0.1")
    # A win's trial runs within the hold that follows it (which may outlast the 120 steps); a loss
    # is timed again after a short eager hold.
    assert s["payoff"]["checks"] >= (1 if coexec_wins else 2), s["payoff"]
    assert s["workers_trial"] == "done", s
    if coexec_wins:
        assert s["payoff"]["choice"] == "co-execute", s["payoff"]
        # Spinning up to the first check and for the trial's first block, then asleep for its
        # second (a whole block at least), then the faster way.
        assert PAIRED_BLOCK <= s["iterations_workers_asleep"] <= s["iterations_coexecuted"] - PAIRED_BLOCK, s
    else:
        assert 0 < s["iterations_workers_asleep"] < s["iterations_coexecuted"], s
        assert_coexec_timed_again_soon()  # with the workers asleep


@pytest.mark.parametrize("coexec_wins", [False, True])
def test_workers_that_took_no_cpu_are_not_tried_asleep(coexec_wins):
    # Asleep only saves the CPU the spinning workers took. Where the GraphRunner's kernels never
    # used them, neither a loss nor a win leads to timing co-execution with them asleep (that
    # trial cost short programs its iterations and the idle pool's making and release).
    s = coexecuted_with_payoff_forced(tiny_mlp_steps, coexec_wins)
    assert s["payoff"]["checks"] >= 1, s["payoff"]
    assert 0 <= s["workers_cpu_share"] < 0.1, s
    # Asleep only in the iteration that recorded the block, right after the traced ones (until
    # the blocks show what runs in parallel regions: choose_first_workers).
    assert s["iterations_workers_asleep"] <= 1 and not s["workers_asleep"], s
    assert s["workers_trial"] == "done" and not s["workers_asleep_by_blocks"], s
    if not coexec_wins:
        # The same way: the first timing may have been disturbed (threads woken late after a pause).
        assert_coexec_timed_again_soon()


@pytest.mark.parametrize("coexec_wins", [False, True])
def test_a_graph_whose_parallel_kernels_are_all_small_co_executes_with_the_workers_asleep(coexec_wins):
    # 16 rows: layer_norm's backward (its sums split by thread) and the matmuls that keep the
    # program's thread count work on tensors below the grain size, so each of their parallel
    # regions lasts microseconds and a spinning worker would idle beside the program thread.
    # Co-executed iterations run with the workers asleep from the recording of the first block on
    # (the recording too: it follows traced iterations), whatever the checks find, and nothing
    # changes a result (coexecuted_as_eager compares).
    s = coexecuted_with_payoff_forced(layer_norm_steps, coexec_wins, steps=60, rows=16)
    assert s["parallel_kernels_small"] > 0 and s["parallel_kernels_large"] == 0, s
    assert s["workers_asleep_by_blocks"] and s["workers_asleep"] and s["workers_trial"] == "done", s
    # All but at most one: the iteration after the recording one may start before the GraphRunner
    # has finished recording the block (then nothing is chosen yet, and it follows no traced one).
    assert s["iterations_workers_asleep"] >= s["iterations_coexecuted"] - 1, s
    if not coexec_wins:
        assert_coexec_timed_again_soon()  # asleep again: spinning is not tried


def test_worker_spin_takes_auto_spin_or_sleep(fresh_graphs):
    before = terra.config()
    with pytest.raises(ValueError, match="one of auto, spin, sleep"):
        terra.config(warmup=before["warmup"] + 2, worker_spin="fast")
    assert terra.config() == before  # all or nothing
    try:
        assert terra.config(worker_spin="sleep", payoff_margin=0.25)["worker_spin"] == "sleep"
        assert terra.config()["payoff_margin"] == 0.25
    finally:
        terra.config(**before)
    assert terra.config() == before
    assert {s["key"] for s in terra.settings()} == set(before)


def fresh_generator_per_epoch(epochs=16):
    """A DataLoader-style shuffle: a new generator each epoch, seeded from the default one."""
    torch.manual_seed(0)
    w = torch.zeros(8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    data = torch.randn(64, 8)
    for _ in range(epochs):
        g = torch.Generator()
        g.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        for idx in torch.randperm(64, generator=g).split(16):
            loss = (data[idx] @ w - 1).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.detach().clone()


def test_a_new_generator_each_epoch_follows_the_trace():
    # Generators were compared by identity: a DataLoader's new one each epoch was an op the trace
    # had not seen, so every epoch's iteration was traced (16 of 16, "never steady").
    eager = fresh_generator_per_epoch()
    coexec = terra.run(fresh_generator_per_epoch)
    assert torch.equal(eager, coexec)
    s = terra.stats("fresh_generator_per_epoch")
    assert s["iterations_traced"] <= 12 and s["iterations_fallback"] == 0, s
    assert not any("never steady" in f["reason"] for f in terra.explain()), terra.explain()


def numpy_observation_buffer(steps=30):
    """An RL-style observation buffer: a NumPy array refilled in place every step, seen by torch
    through `from_numpy` (shared memory), read by ops, by a view, and scaled in place by torch
    before NumPy reads it back."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    buf = np.zeros((256, 256), dtype=np.float32)
    obs = torch.from_numpy(buf)
    top = obs[:128]  # a view of the shared memory, made once
    table = np.zeros((1024, 512), dtype=np.float32)  # 2 MiB: indexed where it lies, not copied
    rows = torch.from_numpy(table)
    w = torch.randn(256, 256)
    out = []
    for step in range(steps):
        h = busy(w, w, 3)  # the ops below are still pending...
        buf[:] = rng.standard_normal((256, 256), dtype=np.float32)  # ...when NumPy refills it
        out.append((h * obs).sum())
        out.append(top.sum())
        table[step] = float(step)
        out.append(rows[torch.tensor([step, step + 1])].sum())
        out.append(torch.stack([obs, obs]).sum(dim=0).sum())  # in a list argument
        if step % 2:
            obs.mul_(0.5)  # torch writes the shared memory; NumPy reads it right after
            out.append(torch.tensor(float(buf.sum())))
    return out


def test_memory_numpy_shares_is_read_when_the_op_is_issued():
    # The GraphRunner read the buffer when it ran the op, after NumPy had refilled it for a later
    # step: a silent difference from eager from the fifth step on.
    s, _ = coexecuted_as_eager(numpy_observation_buffer)
    assert s["iterations_coexecuted"] >= 15, s


def batches_sliced_from_a_numpy_dataset(steps=30):
    """A dataset from `from_numpy`, its batch sliced each step (and a slice of that) while the
    previous step's training is pending; NumPy changes the dataset in place after the slicing,
    which the batch, a view, must see as eagerly."""
    torch.manual_seed(0)
    data = np.random.default_rng(0).standard_normal((64, 16), dtype=np.float32)
    dataset = torch.from_numpy(data)
    model = torch.nn.Linear(12, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256)
    out = []
    for step in range(steps):
        h = busy(w, w, 3)  # pending while the batch is sliced
        batch = dataset[(step % 8) * 8:(step % 8 + 1) * 8]
        x, y = batch[:, :12], batch[:, 12:13]
        data[(step % 8) * 8, :] += 1.0  # through NumPy, after the slicing: the views see it
        loss = torch.nn.functional.mse_loss(model(x), y) + h.mean() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out + [p.detach() for p in model.parameters()] + [dataset.clone()]


def test_a_view_of_numpy_memory_is_made_at_once_without_waiting():
    # A view of memory NumPy owns must be a real tensor over it; it was issued and waited for,
    # so the program thread waited for everything before it (the previous step's training) at
    # every batch it sliced. It is made on the program thread now, at once.
    s, _ = coexecuted_as_eager(batches_sliced_from_a_numpy_dataset)
    assert s["iterations_coexecuted"] >= 15, s
    waits = [e["detail"] for e in terra.timeline()["events"] if e["kind"] == "fetch_wait"]
    assert not [w for w in waits if w.startswith("aten::slice")], waits


def views_of_numpy_memory(steps=24):
    """Views of every kind over `from_numpy` memory (select, narrow and transpose, a strided
    slice of a reshaped view, an expand whose elements overlap, a diagonal, an unfold), written
    through NumPy after they are made and read by a training step."""
    torch.manual_seed(0)
    data = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8) / 100
    t = torch.from_numpy(data)
    w = torch.randn(8, 8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    x = torch.randn(256, 256)
    out = []
    for step in range(steps):
        h = busy(x, x, 2)
        a = t[step % 4]
        b = a.narrow(0, 1, 3).t()
        c = t.view(24, 8)[::2]
        d = t[:, 0].unsqueeze(1).expand(4, 5, 8)
        e = t.diagonal(0, 1, 2)
        f = t.reshape(-1).unfold(0, 8, 4)
        data[step % 4] += 0.5
        loss = (a @ w).sum() + (b.t() @ w).sum() + (c @ w).mean() + d.sum() + e.sum() + f.sum()
        opt.zero_grad()
        (loss + h.mean() * 0).backward()
        opt.step()
        out.append(loss.detach())
    return out + [w.detach().clone(), t.clone()]


def test_views_of_numpy_memory_see_later_numpy_writes_as_eager():
    s, _ = coexecuted_as_eager(views_of_numpy_memory)
    assert s["iterations_coexecuted"] >= 10, s


def written_through_numpy(steps=30):
    """A tensor that pending work reads, then written through the array `.numpy()` returns."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    p = torch.zeros(256, 256)
    out = []
    for step in range(steps):
        h = busy(w, w, 3)
        out.append((h * p).sum())  # reads p: still pending when...
        p.numpy()[0, 0] = float(step)  # ...the program writes p through NumPy
    return out


def test_writing_through_numpy_waits_for_the_work_that_reads_the_tensor():
    s, _ = coexecuted_as_eager(written_through_numpy)
    assert s["iterations_coexecuted"] >= 15, s


def written_through_a_kept_array(steps=30):
    """A tensor written through an array `.numpy()` returned before the loop, which the program
    keeps (a buffer a simulator fills), while ops that read the tensor are pending; and arrays
    taken and dropped each step (logging), which must leave the tensor's ops alone."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    buf = torch.zeros(64)
    view = buf.numpy()
    out = []
    for step in range(steps):
        h = busy(w, w, 3)
        out.append(h.sum() + buf.sum())  # reads buf: still pending when...
        view[:] = float(step)  # ...the program refills it through the kept array
        out.append(float(w[0].numpy().sum()))
    return out


def test_writing_through_a_kept_numpy_array_leaves_pending_reads_alone():
    # The array outlived the fetch that made it: the op reading `buf` ran in the GraphRunner after
    # the refill, a silent difference from eager. While such an array lives, ops read the tensor
    # when issued (a copy) as they do from_numpy memory.
    s, _ = coexecuted_as_eager(written_through_a_kept_array)
    assert s["iterations_coexecuted"] >= 15, s


def masked_batches(steps=24, dropout=False):
    """Each step draws a batch of lengths, builds its padding mask and checks it (`mask.all()`,
    as Hugging Face's masking does before choosing an attention kernel), while the previous
    step's slow work is still pending; then draws again after the steps."""
    w, opt, x = slow_descent()
    out = []
    for _ in range(steps):
        lengths = torch.randint(2, 9, (8,))
        mask = (torch.arange(8)[None, :] < lengths[:, None]).long()
        ids = torch.randint(0, 256, (8, 8)) * mask
        full = bool(mask.all())  # a fetch of this step's own batch
        out += [full, int(mask.sum()), ids.clone()]
        h = busy(x, w, 3)
        if dropout:
            h = torch.nn.functional.dropout(h, 0.1)  # random items: the draws above become items
        loss = h[ids[:, 0]].square().mean()
        descend(opt, loss, out)
    out.append(torch.rand(4))  # the generator where eager leaves it
    return [w.detach().clone()] + out


def test_a_check_of_the_steps_own_batch_does_not_wait_for_the_previous_step():
    # The mask is made by the program thread from tensors it made itself (host ops), so checking
    # it needs nothing from the GraphRunner; before, each check waited for everything issued
    # (the previous step's backward and update).
    s, co = coexecuted_as_eager(masked_batches)
    assert len(co) >= 12, s
    assert s["host_ops"] >= 8 * len(co), s
    assert fetch_waits(co) == []


def test_draws_after_random_items_keep_the_generators_order():
    # With dropout in the step, the draws of the next step run as items again, in program order.
    s, co = coexecuted_as_eager(masked_batches, dropout=True)
    assert len(co) >= 12, s


def own_tensors_written_by_pending_work(steps=20):
    """Tensors the program thread makes itself, then hands to items that write them (through a
    view, as a `.grad` a backward accumulates into): reads after that must see the writes."""
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    x = torch.randn(256, 256)
    p = torch.ones(3, requires_grad=True)
    out = []
    for _ in range(steps):
        h = busy(x, w, 3)
        m = torch.zeros(4)
        m[:2].add_(h[0, :2])  # an item writes m through a view of it
        out.append(float((m * 2).sum()))
        g = torch.zeros(3)
        p.grad = g
        (p * h[1, :3]).sum().backward()  # accumulates into g in place
        out.append((g + 1).sum().item())
        k = torch.arange(6).reshape(2, 3)
        k.mul_(h[2, :3].sign().long())  # written in place by an item reading a placeholder
        out.append(k.sum().item())
    return out


def test_own_tensors_written_by_pending_work_are_read_after_the_writes():
    s, co = coexecuted_as_eager(own_tensors_written_by_pending_work)
    assert len(co) >= 10, s
    assert s["host_ops"] > 0, s


def resized_out_each_step(steps=20):
    """Each step writes a sum into an `out=` tensor of the wrong shape: PyTorch resizes it and
    raises its deprecation warning (a TORCH_WARN in C++) at every call."""
    w = torch.ones(3, requires_grad=True)
    losses = []
    for _ in range(steps):
        out = torch.empty(2)
        torch.add(w.detach(), 1.0, out=out)
        loss = (w * out).sum()
        loss.backward()
        losses.append(float(loss))
    return losses


def test_warnings_of_ops_run_by_the_graph_runner_are_python_warnings(capfd):
    # The GraphRunner thread had no warning handler: a kernel's warning there went to stderr, not
    # through Python's warnings (8 of 20 here), and the op's outputs' shapes disagreed with the
    # program's view until it ran. Now each is raised on the program thread, and the op runs as a
    # fetch from then on: the same warnings as eagerly, each once per call.
    def messages(fn):
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
        return result, [(w.category, str(w.message)) for w in caught if "was resized" in str(w.message)]
    eager, eager_warnings = messages(resized_out_each_step)
    coexec, terra_warnings = messages(lambda: terra.run(resized_out_each_step))
    assert coexec == eager
    assert len(eager_warnings) == 20 and terra_warnings == eager_warnings
    assert "was resized" not in capfd.readouterr().err
    assert terra.stats("resized_out_each_step")["iterations_coexecuted"] >= 5
    # `%terra explain` says why the op waits now, at its line.
    told = [f for f in terra.explain("resized_out_each_step") if "raised a warning" in f["reason"]]
    assert len(told) == 1 and told[0]["op"].startswith("aten::add"), terra.explain("resized_out_each_step")
    assert told[0]["where"][2] == "resized_out_each_step", told


def assert_runs_as_in_eager(program, coexecuted_at_least):
    """`program` (a loop returning tuples of tensors per step) under Terra, bitwise as eagerly."""
    eager = program()
    coexecuted = terra.run(program)
    assert terra.stats(program.__name__)["iterations_coexecuted"] >= coexecuted_at_least
    for k, (a, b) in enumerate(zip(eager, coexecuted)):
        for i, (p, q) in enumerate(zip(a, b)):
            assert torch.equal(p, q), (k, i)


def batch_norm_statistics_program(steps=12):
    """Running statistics that batch_norm and instance_norm update in place (their schemas do not
    mark those arguments written), read by the program right after: a clone of statistics the
    program made itself, a module's buffers read from Python, an eval pass on clones."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 5, 5, generator=g)
    bn = torch.nn.BatchNorm2d(3)
    out = []
    for _ in range(steps):
        mean, var = torch.zeros(3), torch.ones(3)
        y = torch.nn.functional.batch_norm(x, mean, var, None, None, True, 0.1, 1e-5)
        evaluated = torch.nn.functional.batch_norm(x, mean.clone(), var.clone(), training=False)
        z = bn(x * 2)
        seen = bn.running_mean.tolist() + bn.running_var.tolist()
        im, iv = torch.zeros(3), torch.ones(3)
        w = torch.nn.functional.instance_norm(x, im, iv, use_input_stats=True)
        out.append((y, evaluated, mean.clone(), var.clone(), z, torch.tensor(seen), im.clone(), iv * 1, w))
    return out


def test_running_statistics_written_by_batch_norm_are_read_after_the_update():
    assert_runs_as_in_eager(batch_norm_statistics_program, coexecuted_at_least=6)


def tensor_index_beside_slices_program(steps=10):
    """Advanced indexing beside full slices and an ellipsis (`d[:, idx]`): PyTorch boxes the dims
    it does not index as undefined tensors in the `Tensor?[]` list, which tracing once read as
    tensors ("strides() called on an undefined Tensor"); reads, writes and gradients through them."""
    torch.manual_seed(0)
    w = torch.randn(5, 5, requires_grad=True)
    acc = torch.zeros(5, 5)
    out = []
    for i in range(steps):
        d = w * (i + 1)
        idx = torch.tensor([i % 5, (i + 2) % 5])
        a, b, c, e = d[:, idx], d[..., idx], d[idx, :][:, idx], d[1:, idx]
        acc[:, idx] = acc[:, idx] + 1
        acc[idx, 1:] *= 0.5
        (a.sum() + b.pow(2).sum() + c.sum() + e.sum()).backward()
        with torch.no_grad():
            w -= 0.01 * w.grad
            w.grad = None
        out.append((a.detach().clone(), b.detach().clone(), c.detach().clone(), acc.clone(), w.detach().clone()))
    return out


def test_tensor_indices_beside_full_slices_run_as_in_eager():
    assert_runs_as_in_eager(tensor_index_beside_slices_program, coexecuted_at_least=5)


def numpy_memory_in_autograd_program(steps=10):
    """A tensor over NumPy memory (`torch.from_numpy`) that an op with autograd history reads, the
    array then changed from Python before the backward: eager's forward reads the old values and
    its backward, through the tensor autograd saved, the new ones."""
    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    arr = np.ones(3, dtype=np.float32)
    shared = torch.from_numpy(arr)
    out = []
    for i in range(steps):
        v = (w * 2) * shared
        arr[:] = i
        loss = v.pow(2).mean()
        loss.backward()
        arr[:] = -i  # after the backward: not what it reads
        with torch.no_grad():
            w -= 0.01 * w.grad
            w.grad = None
        out.append((loss.detach().clone(), w.detach().clone()))
    return out


def test_numpy_memory_saved_for_the_backward_is_read_when_the_backward_runs():
    assert_runs_as_in_eager(numpy_memory_in_autograd_program, coexecuted_at_least=5)
