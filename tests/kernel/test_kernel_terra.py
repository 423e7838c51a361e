"""Co-execution inside the kernel, over the Jupyter protocol: cells run co-executed by default,
give the same output as with `%terra off`, and the magics control and explain it."""
import json
import signal
import time
from pathlib import Path

import pytest

from jupyter_client.manager import start_new_kernel

from kernel_helpers import KERNEL, ROOT, execute, shell_reply, stdout, wait_for_stdout

PROGRAMS = sorted(p.stem for p in (ROOT / "tests" / "programs").glob("p[0-9]*.py"))

# Prints a bitwise digest of a state dict: equal digests mean bitwise-equal tensors.
DIGEST = '''
import hashlib as _h, torch as _t
def _digest(state):
    d = _h.sha256()
    for k in sorted(state):
        v = state[k].detach().contiguous()
        d.update(k.encode()); d.update(str(v.dtype).encode()); d.update(repr(tuple(v.shape)).encode())
        d.update(v.view(-1).view(_t.uint8).numpy().tobytes() if v.numel() else b"")
    return d.hexdigest()
'''

TRAIN = '''
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(64, 8), torch.randn(64, 1)
done = 0
for step in range({steps}):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    done += 1
    {extra}
print("done", done, f"{{loss.item():.6f}}")
'''


def ok(kc, code, timeout=120, summary=False):
    """Runs a cell that must succeed; its stdout, without Terra's summary line unless asked."""
    reply, messages = execute(kc, code, timeout=timeout)
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert reply["status"] == "ok" and not errors, (reply, errors)
    out = stdout(messages)
    if summary:
        return out
    return "".join(line for line in out.splitlines(True) if not line.startswith("Terra: "))


def stats(kc):
    out = ok(kc, "import terra as _terra, json as _json\n"
                 "print(_json.dumps({n: _terra.stats(n) for n in _terra._C.graphs()}))")
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kc(kernel):
    km, kc = kernel
    ok(kc, "import torch")
    ok(kc, DIGEST)
    return kc


def test_training_cell_is_coexecuted_and_matches_eager(kc):
    code = TRAIN.format(steps=60, extra="")
    on = ok(kc, code, summary=True)
    assert "Terra:" in on and "co-executed" in on, on
    off = ok(kc, "%%terra off\n" + code, summary=True)
    assert "Terra:" not in off
    assert on.splitlines()[0] == off.splitlines()[0]  # same loss, to the printed digits
    assert ok(kc, "print(_digest(model.state_dict()))")
    graphs = stats(kc)
    assert any(s["iterations_coexecuted"] >= 50 for s in graphs.values()), graphs


def test_rerunning_a_cell_grows_one_graph(kc):
    ok(kc, "%terra reset")
    code = TRAIN.format(steps=20, extra="")
    counts = []
    for _ in range(3):
        ok(kc, code)
        graphs = {n: s for n, s in stats(kc).items() if s["ops_traced"] + s["ops_coexecuted"]}
        assert len(graphs) == 1, graphs
        counts.append(next(iter(graphs.values())))
    assert counts[0]["nodes"] == counts[2]["nodes"]  # nothing new recorded on re-runs
    # Re-runs co-execute every loop iteration but one (only the short code around the loop may
    # still be traced while it warms up): the cell makes a new model, and the backward reaching
    # its parameters is traced once to learn which gradients it creates (OpTemplate::relearn),
    # instead of a wait for the GraphRunner at every gradient read of every later step.
    assert counts[1]["iterations_coexecuted"] - counts[0]["iterations_coexecuted"] >= 19
    assert counts[2]["iterations_coexecuted"] - counts[1]["iterations_coexecuted"] >= 19


def test_function_from_an_earlier_cell(kc):
    ok(kc, "def step_fn(model, opt, x, y):\n"
           "    opt.zero_grad()\n"
           "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
           "    loss.backward()\n"
           "    opt.step()\n"
           "    return loss\n")
    code = ("torch.manual_seed(1)\n"
            "m = torch.nn.Linear(4, 1); o = torch.optim.Adam(m.parameters(), lr=0.01)\n"
            "a, b = torch.randn(16, 4), torch.randn(16, 1)\n"
            "for i in range(30):\n"
            "    l = step_fn(m, o, a, b)\n"
            "print(f'{l.item():.7f}', _digest(m.state_dict()))\n")
    on = ok(kc, code, summary=True)
    off = ok(kc, "%%terra off\n" + code)
    assert on.splitlines()[0] == off.splitlines()[0]
    assert "co-executed" in on


def test_loops_of_cell_functions_count_where_no_cell_loop_is_open(kc):
    # A model's loop over its layers, defined in one cell and called inside another cell's
    # training loop, is part of the step's iteration; a fit() with its own loop, called from a
    # cell without one, co-executes by its iterations.
    ok(kc, "%terra reset")
    ok(kc, "class Stack(torch.nn.Module):\n"
           "    def __init__(self):\n"
           "        super().__init__()\n"
           "        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))\n"
           "    def forward(self, x):\n"
           "        for layer in self.layers:\n"
           "            x = torch.tanh(layer(x))\n"
           "        return x\n"
           "def fit(net, opt, x, steps):\n"
           "    for _ in range(steps):\n"
           "        opt.zero_grad()\n"
           "        net(x).pow(2).mean().backward()\n"
           "        opt.step()\n")
    setup = ("torch.manual_seed(2)\n"
             "net = Stack(); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
             "xs = torch.randn(4, 8)\n")
    loop = "for _ in range(20):\n    opt.zero_grad()\n    net(xs).pow(2).mean().backward()\n    opt.step()\n"
    digest = "%%terra off\nprint(_digest(net.state_dict()))\n"  # _digest's loop: not counted
    iterations = lambda s: sum(s[k] for k in ("iterations_traced", "iterations_coexecuted",
                                              "iterations_fallback", "iterations_eager"))

    def both_ways(code):
        """`code` under Terra after `%terra reset`, then eagerly: the same final weights; the
        graphs that ran ops."""
        ok(kc, "%terra reset")
        ok(kc, setup + code)
        graphs = {n: s for n, s in stats(kc).items() if s["ops_traced"] + s["ops_coexecuted"]}
        on = ok(kc, digest)
        ok(kc, "%%terra off\n" + setup + code)
        assert on == ok(kc, digest)
        return graphs

    graphs = both_ways(loop)
    assert len(graphs) == 1 and iterations(next(iter(graphs.values()))) <= 20 + 3, graphs
    graphs = both_ways("fit(net, opt, xs, 20)\n")
    assert any(s["iterations_coexecuted"] >= 15 for s in graphs.values()), graphs
    # And called from a cell's epoch loop, fit's loop of training steps is the iteration (each
    # epoch was one trace of all its steps), the layers still part of each step.
    graphs = both_ways("for epoch in range(4):\n    fit(net, opt, xs, 20)\n")
    assert len(graphs) == 1, graphs
    steps = next(iter(graphs.values()))
    assert 4 * 20 - 3 <= iterations(steps) <= 4 * 20 + 4 * 4 + 3, steps
    assert steps["iterations_coexecuted"] >= 50 and steps["nodes"] < 300, steps
    assert steps["helper_step_loops"] == 1, steps  # fit's loop; the layers' loop stays in the step
    assert "each of their iterations is one (training steps)" in ok(kc, "%terra explain")
    # A training loop in an imported module (a library's: nothing marks it), called from a cell
    # without a loop, is cut at its backwards: an iteration per step (it was one in all).
    library = ("def fit(net, opt, x, steps):\n"
               "    for _ in range(steps):\n"
               "        opt.zero_grad()\n"
               "        net(x).pow(2).mean().backward()\n"
               "        opt.step()\n")
    ok(kc, "%%terra off\nimport sys, tempfile, pathlib\n_lib = pathlib.Path(tempfile.mkdtemp())\n"
           f"(_lib / 'libfit.py').write_text({library!r})\nsys.path.insert(0, str(_lib))\nimport libfit\n")
    graphs = both_ways("libfit.fit(net, opt, xs, 30)\n")
    assert len(graphs) == 1, graphs
    steps = next(iter(graphs.values()))
    assert iterations(steps) >= 28 and steps["iterations_coexecuted"] >= 15, steps
    assert steps["iterations_cut_at_backward"] >= 25, steps
    assert "ended at a backward: a training loop Terra does not mark" in ok(kc, "%terra explain")


def test_cell_raising_mid_loop_leaves_eager_state(kc):
    extra = "if step == 37: raise RuntimeError('boom at 37')"
    for mode in ("%%terra", "%%terra off"):
        reply, messages = execute(kc, mode + "\n" + TRAIN.format(steps=60, extra=extra), timeout=120)
        assert reply["status"] == "error" and reply["ename"] == "RuntimeError" and "boom" in reply["evalue"]
        digest = ok(kc, "print(done, _digest(model.state_dict()))")
        if mode == "%%terra":
            first = digest
    assert first == digest  # co-executed up to the exception == eager up to the exception
    assert ok(kc, "print(1 + 1)").strip() == "2"


def test_interrupt_during_coexecution():
    # A kernel of its own: an interrupt that went wrong must not spoil the other tests' kernel.
    km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=60)
    try:
        _interrupt_during_coexecution(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _interrupt_during_coexecution(km, kc):
    ok(kc, "import torch")
    ok(kc, DIGEST)
    code = TRAIN.format(steps=200000, extra="if step == 20: print('warm', flush=True)")
    msg_id = kc.execute(code)
    # Interrupt once the loop is past warm-up (co-executing), as reported by the cell itself.
    wait_for_stdout(kc, msg_id, "warm", timeout=120)
    time.sleep(0.5)
    km.interrupt_kernel()
    reply = shell_reply(kc, msg_id, timeout=60)["content"]
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    # Sent as soon as the reply is in, like a frontend's next queued cell.
    interrupted = ok(kc, "n_done = done; print(n_done, _digest(model.state_dict()))").split()
    n_done = int(interrupted[0])
    assert n_done > 20
    # The model is what eager execution leaves after n_done whole steps plus the ops of step
    # n_done+1 issued before the interrupt. Parameters only change in opt.step(), one parameter
    # after the other in state_dict order, so the candidates are: the first j parameters updated
    # by step n_done+1, the others as after step n_done.
    # (Grad mode back on first: an interrupt inside torch.optim's `finally` can leave it off,
    # PyTorch's hazard with any asynchronous exception.)
    candidates = ok(kc, "%%terra off\ntorch.set_grad_enabled(True)\n" +
                    TRAIN.format(steps="n_done", extra="") + """
_before = {k: v.clone() for k, v in model.state_dict().items()}
opt.zero_grad()
torch.nn.functional.mse_loss(model(x), y).backward()
opt.step()
_after = model.state_dict()
_keys = list(_before)
for _j in range(len(_keys) + 1):
    print(_digest({k: (_after if i < _j else _before)[k] for i, k in enumerate(_keys)}))
""").split()
    assert candidates[:2] == ["done", str(n_done)], candidates
    assert interrupted[1] in candidates[3:], (interrupted, candidates)
    assert ok(kc, "%terra status")


@pytest.mark.parametrize("command, expected", [
    ("%terra bogus", "unknown command"),
    ("%terra config warmup=abc", "whole number"),
    ("%terra config nosuch=1", "unknown setting 'nosuch'"),
    ("%terra config warmup", "expected key=value"),
    ("%terra on extra", "takes no arguments"),
    ("%terra config adaptive=maybe", "expected on/off"),
    ("%terra config worker_spin=fast", "one of auto, spin, sleep"),
    ("%terra config worker_nice=20", "worker_nice must be 0 to 19"),
    ("%terra graph In[999]", "no graph"),
])
def test_bad_magic_arguments_give_usage_not_traceback(kc, command, expected):
    reply, messages = execute(kc, command)
    text = "".join(m["content"].get("text", "") + m["content"].get("evalue", "") for m in messages)
    assert expected in text, (command, text)
    assert "Traceback" not in text
    assert ok(kc, "print('alive')").strip() == "alive"


def test_magics_report(kc):
    ok(kc, TRAIN.format(steps=30, extra="if step == 25: x = x * 1.5"))
    status = ok(kc, "%terra status")
    assert "co-exec" in status and "cell-" in status
    # A loop of 1 MiB tensors leaves blocks for the eager cells after it (runner_allocator.h).
    ok(kc, "big = torch.randn(512, 512)\nfor _ in range(3):\n    big = big * 1.0001")
    assert "MiB of freed CPU blocks kept" in ok(kc, "%terra status")
    ok(kc, "%terra config program_cache=off")
    assert "MiB of freed CPU blocks" not in ok(kc, "%terra status")
    ok(kc, "%terra config program_cache=on")
    assert "branch points" in ok(kc, "%terra graph --text")
    assert "warmup = " in ok(kc, "%terra config")
    ok(kc, "%terra config warmup=2 summary=off")
    assert "warmup = 2" in ok(kc, "%terra config")
    assert "Terra:" not in ok(kc, TRAIN.format(steps=5, extra=""), summary=True)
    ok(kc, "%terra config warmup=1 summary=on")
    ok(kc, "%terra config worker_spin=sleep")
    assert "worker_spin = sleep" in ok(kc, "%terra config")
    ok(kc, "%terra config worker_nice=4")
    assert "worker_nice = 4" in ok(kc, "%terra config")
    ok(kc, "%terra config worker_spin=auto")
    # What explain says of a graph whose timing chose the GraphRunner's workers asleep (the
    # choice itself follows measured times, so the line is checked on given ones).
    line = ok(kc, "from terra_kernel.magics import spin_line\n"
                  "print(spin_line({'workers_asleep': True, 'payoff': {'checks': 2, 'choice': 'co-execute'}}), "
                  "spin_line({'workers_asleep': True, 'payoff': {'checks': 1, 'choice': 'eager'}}))")
    assert "workers asleep: with them spinning, co-execution was slower" in line, line
    assert line.strip().endswith("None"), line
    # And of one whose first checks could not tell the modes apart (terra/payoff.h's pairing).
    line = ok(kc, "from terra_kernel.magics import payoff_line\n"
                  "print(payoff_line({'phase': 'timing both in alternating blocks', 'checks': 0, 'choice': 'none yet'}), "
                  "payoff_line({'phase': 'holding', 'checks': 1, 'choice': 'co-execute'}))")
    assert "in alternating blocks" in line, line
    assert line.strip().endswith("None"), line
    line = ok(kc, "from terra_kernel.magics import payoff_line\n"
                  "print(payoff_line({'phase': 'timing both in alternating blocks', 'by_call': True, 'checks': 0, "
                  "'choice': 'none yet'}))")
    assert "a whole cell (or call) each way in turn" in line, line
    # ... going on from the pairs an earlier run had timed (runtime/payoff_memory.h).
    line = ok(kc, "from terra_kernel.magics import payoff_line\n"
                  "print(payoff_line({'phase': 'timing both in alternating blocks', 'checks': 0, "
                  "'choice': 'none yet', 'pairs_remembered': 2}))")
    assert "going on from 2 pair(s) of blocks an earlier run on this machine timed" in line, line
    # And of one holding the choice an earlier run's check made (runtime/payoff_memory.h).
    line = ok(kc, "from terra_kernel.magics import payoff_line\n"
                  "print(payoff_line({'phase': 'holding', 'checks': 0, 'remembered': True, 'choice': 'eager', "
                  "'coexec_ms': 2.0, 'eager_ms': 1.0, 'next_check_in': 40}), "
                  "payoff_line({'phase': 'holding', 'checks': 0, 'remembered': False, 'choice': 'none yet'}))")
    assert "runs eagerly: co-executed in an earlier run on this machine it took 2.000 ms" in line, line
    assert line.strip().endswith("None"), line
    # And of one held eager before any check because its backward runs Python.
    line = ok(kc, "from terra_kernel.magics import payoff_line\n"
                  "print(payoff_line({'phase': 'holding', 'checks': 0, 'choice': 'eager', "
                  "'python_backward': True, 'next_check_in': 500}))")
    assert "its backward runs Python" in line and "after 500 more iterations" in line, line
    assert "%terra on" in ok(kc, "%terra?") or True  # docstring is shown through the pager
    assert ok(kc, "%terra version").strip()


def test_eager_by_choice_is_reported_and_switchable(kc):
    # The suite pins co-execution (tests/conftest.py); a margin of -1 makes eager always win.
    ok(kc, "%terra config adaptive=on")
    assert "adaptive = on" in ok(kc, "%terra config")
    ok(kc, "import terra; terra.config(payoff_margin=-1.0)")
    try:
        out = ok(kc, TRAIN.format(steps=80, extra=""), summary=True)
        assert "eager because faster" in out, out
        status = ok(kc, "%terra status")
        assert "eager (faster)" in status, status
        explain = ok(kc, "%terra explain")
        assert "runs eagerly: co-executed it took" in explain and "adaptive=off" in explain, explain
    finally:
        ok(kc, "terra.config(payoff_margin=0.0)")
        ok(kc, "%terra config adaptive=off")
    assert "adaptive = off" in ok(kc, "%terra config")


def trained(graphs):
    """The training cell's graph: the one that ran the most iterations."""
    return max(graphs.values(), key=lambda g: g["iterations_traced"] + g["iterations_coexecuted"] + g["iterations_eager"])


def test_a_restarted_kernel_starts_from_the_payoff_choice_of_the_one_before(tmp_path, monkeypatch):
    # A notebook restarted and run again (runtime/payoff_memory.h): the cell's loop holds the mode
    # the first kernel's check chose (forced eager with a margin of -1) from its first stable
    # iteration, and %terra explain says the times are an earlier run's. The suite remembers
    # nothing elsewhere (tests/conftest.py).
    monkeypatch.setenv("TERRA_REMEMBER_PAYOFF", "1")
    monkeypatch.setenv("TERRA_CACHE_DIR", str(tmp_path))
    km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=60)
    setup = "import torch, terra\nterra.config(adaptive=True, payoff_margin=-1.0, worker_spin='spin')"
    try:
        ok(kc, setup)
        cell = TRAIN.format(steps=30, extra="")  # the same cell in both: a cell edited is another graph
        ok(kc, cell)
        graph = trained(stats(kc))
        assert graph["payoff"]["checks"] >= 1 and graph["payoff"]["choice"] == "eager", graph["payoff"]
        assert graph["iterations_coexecuted"] >= 3, graph
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        ok(kc, setup)
        ok(kc, cell)  # within the hold (at least Payoff::kFirstHold, 32)
        graph = trained(stats(kc))
        assert graph["payoff"]["remembered"] and graph["payoff"]["checks"] == 0, graph["payoff"]
        assert graph["iterations_coexecuted"] == 0 and graph["iterations_eager_chosen"] > 0, graph
        explain = ok(kc, "%terra explain")
        assert "co-executed in an earlier run on this machine it took" in explain, explain
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def assert_switchable(kc, key):
    """`%terra config key=off` turns the engine's setting off (as terra.config() reads it), and
    `key=on` back on."""
    assert f"{key} = on" in ok(kc, "%terra config")
    ok(kc, f"%terra config {key}=off")
    try:
        assert f"{key} = off" in ok(kc, "%terra config")
        assert ok(kc, f"import terra; print(terra.config()[{key!r}])").strip() == "False"
    finally:
        ok(kc, f"%terra config {key}=on")
    assert f"{key} = on" in ok(kc, "%terra config")


def test_replay_is_a_setting_and_replayed_iterations_are_shown(kc):
    out = ok(kc, TRAIN.format(steps=30, extra=""))
    status = ok(kc, "%terra status")
    assert "replayed" in status, status
    assert_switchable(kc, "replay")
    assert out is not None


def test_fast_path_is_a_setting_and_its_share_is_shown(kc):
    ok(kc, TRAIN.format(steps=30, extra=""))
    status = ok(kc, "%terra status")
    header, *rows = status.splitlines()[1:]
    at = header.index("fast path")  # the table's columns are left-aligned
    shares = [row[at:].split()[0] for row in rows]
    assert any(s.endswith("%") and int(s[:-1]) > 0 for s in shares), status
    assert "through the dispatcher most often" in ok(kc, "%terra explain")
    assert_switchable(kc, "fast_path")


def test_a_model_scripted_in_a_terra_cell_trains_as_with_terra_off(kc):
    # torch.jit.script inside a Terra cell raised "Python builtin <built-in function linear> is
    # currently not supported in Torchscript" until session 52 (the fast path's replacement
    # objects), and the scripted model's backward failed on the GraphRunner.
    cell = """
torch.manual_seed(0)
class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
    def forward(self, x):
        return torch.relu(self.l(x)) * 2
scripted = torch.jit.script(_Scripted())
sopt = torch.optim.SGD(scripted.parameters(), lr=0.1)
sx = torch.randn(3, 4)
for _ in range(12):
    sloss = scripted(sx).pow(2).mean()
    sopt.zero_grad()
    sloss.backward()
    sopt.step()
print(_digest(dict(scripted.state_dict())), f"{sloss.item():.8f}")
"""
    on = ok(kc, cell, summary=True)
    assert "Terra:" in on, on
    off = ok(kc, "%%terra off\n" + cell, summary=True)
    assert on.splitlines()[0] == off.splitlines()[0], (on, off)


@pytest.mark.parametrize("name", PROGRAMS)
def test_corpus_as_notebook_cells(kc, name):
    source = (ROOT / "tests" / "programs" / f"{name}.py").read_text()
    ok(kc, source.replace('if __name__ == "__main__":', "if False:"))
    run = "_state = main()\nprint(_digest(_state))\n"
    on = ok(kc, run)
    off = ok(kc, "%%terra off\n" + run)
    assert on.splitlines() == off.splitlines(), (name, on, off)


def test_graphrunner_error_names_the_cell_and_line(kernel):
    # An op that fails in the GraphRunner is reported at the user's cell and line, the way
    # `%terra explain` names it, not at the interpreter's temporary file for the cell.
    km, kc = kernel
    reply, messages = execute(kc, (
        "import torch\n"
        "table = torch.randn(10, 4, requires_grad=True)\n"
        "total = torch.zeros(())\n"
        "for step in range(12):\n"
        "    idx = torch.tensor([step % 10 if step != 9 else 50])\n"
        "    total = total + table.index_select(0, idx).sum()\n"
        "print(float(total))\n"), timeout=120)
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert reply["status"] == "error" and errors and errors[0]["ename"] == "IndexError", (reply, errors)
    count = reply["execution_count"]
    text = errors[0]["evalue"]
    assert "GraphRunner" in text and f"In [{count}], line 6" in text, text
    assert "xpython_" not in text, text
