"""Interrupts over the protocol, stressed.

Whenever the SIGINT lands (before a cell starts, inside it, as it ends, after it ended, while the
kernel is idle), with Terra on or off, the interrupted cell either raises KeyboardInterrupt or is
left alone, and the cell sent right after its reply (as a frontend does with the next queued cell)
runs normally: its reply, its output and its idle status all arrive. Cells queued behind an
interrupted one are aborted the protocol's way. Nothing here asserts how long anything takes; a
lost interrupt, reply or idle status shows up as a timeout."""
import time

import pytest

from kernel_helpers import collect, execute, shell_reply, stdout, wait_for_stdout

SETUP = '''
import time, torch
torch.set_grad_enabled(True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 8), torch.randn(64, 1)
def step():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
step()
'''

# Torch cells turn grad mode back on first: an interrupt inside torch.optim's `finally` can leave
# it off (PyTorch's hazard with any asynchronous exception, in any kernel), and the next backward
# would fail for a reason that is not the kernel's.
GRAD_ON = "torch.set_grad_enabled(True)\n"

# Cells short enough that the interrupt, sent after each delay below, finds them starting,
# running, finishing or already done.
FINITE_CELLS = [
    GRAD_ON + "for i in range(200):\n    step()",       # torch (co-executed when Terra is on)
    "n = 0\nfor i in range(200000):\n    n += i",       # pure Python
    "time.sleep(0.2)",                                 # a blocking call
]
DELAYS = (0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.6)

# Cells that run until interrupted; each prints "looping" once it is inside its loop.
LOOPING = "    i += 1\n    if i == 3: print('looping', flush=True)"
ENDLESS_CELLS = [
    GRAD_ON + "i = 0\nwhile True:\n    step()\n" + LOOPING,
    "i = 0\nwhile True:\n" + LOOPING,
    "print('looping', flush=True)\ntime.sleep(600)",
]


def ok(kc, code):
    reply, messages = execute(kc, code, timeout=120)
    assert reply["status"] == "ok", reply
    return stdout(messages)


def next_cell_runs(kc, token):
    """Sends a cell at once (without waiting for the previous request's idle status); it must run
    and print exactly its token."""
    reply, messages = execute(kc, f"print({token!r})")
    assert reply["status"] == "ok", (token, reply)
    assert stdout(messages) == f"{token}\n", (token, messages)


@pytest.fixture(params=["on", "off"])
def terra_mode(request, kernel):
    km, kc = kernel
    ok(kc, f"%terra {request.param}")
    ok(kc, SETUP)
    yield request.param
    ok(kc, "%terra on")


def test_interrupt_at_any_moment_then_next_cell_runs(kernel, terra_mode):
    km, kc = kernel
    outcomes = set()
    for c, cell in enumerate(FINITE_CELLS):
        for delay in DELAYS:
            msg_id = kc.execute(cell)
            time.sleep(delay)
            km.interrupt_kernel()
            reply = shell_reply(kc, msg_id)["content"]
            # Too early (not started) or too late (finished): the cell is left alone.
            assert reply["status"] == "ok" or reply.get("ename") == "KeyboardInterrupt", reply
            outcomes.add(reply["status"])
            next_cell_runs(kc, f"{terra_mode}-{c}-{delay}")
            # Now the kernel is idle: this SIGINT must not reach the cell sent next.
            km.interrupt_kernel()
            next_cell_runs(kc, f"{terra_mode}-{c}-{delay}-idle")
    assert km.is_alive()
    assert "error" in outcomes, "no interrupt landed inside a cell: nothing was tested"


def test_interrupt_inside_a_running_cell_then_next_cell_runs(kernel, terra_mode):
    km, kc = kernel
    for c, cell in enumerate(ENDLESS_CELLS):
        for delay in (0, 0.1, 0.3):
            msg_id = kc.execute(cell)
            wait_for_stdout(kc, msg_id, "looping")
            time.sleep(delay)
            km.interrupt_kernel()
            reply = shell_reply(kc, msg_id)["content"]
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
            next_cell_runs(kc, f"{terra_mode}-endless-{c}-{delay}")
    assert km.is_alive()


def test_interrupt_while_the_kernel_prepares_a_cell_stops_it_before_it_runs(kernel, tmp_path):
    """A Ctrl-C that lands in the work around a cell's code (here a slow pre_run_cell hook, as
    opening a Terra session can be) is raised where the cell's code starts: the cell does not run,
    and the hook is not cut short (IPython used to catch the KeyboardInterrupt in the hook, print
    it, and run the cell anyway)."""
    km, kc = kernel
    release = tmp_path / "release"
    ok(kc, "import os, time\n"
           "hook_done = []\n"
           "def _slow_hook(info):\n"
           "    print('in hook', flush=True)\n"
           f"    while not os.path.exists({str(release)!r}):\n"
           "        time.sleep(0.01)\n"
           "    hook_done.append(True)\n"
           "get_ipython().events.register('pre_run_cell', _slow_hook)")
    try:
        msg_id = kc.execute("cell_ran = True")
        wait_for_stdout(kc, msg_id, "in hook")
        km.interrupt_kernel()
        time.sleep(0.5)  # time for the kernel to take the SIGINT while the hook still runs
        release.touch()
        reply = shell_reply(kc, msg_id)["content"]
    finally:
        release.touch()
        ok(kc, "get_ipython().events.unregister('pre_run_cell', _slow_hook)")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert ok(kc, "print('cell_ran' in globals(), hook_done[:1])") == "False [True]\n"


def test_interrupt_aborts_the_cells_queued_behind(kernel):
    """"Run All", then interrupt: the running cell raises KeyboardInterrupt, the queued ones are
    aborted (reply status "aborted", busy and idle status, nothing run), later ones run."""
    km, kc = kernel
    ok(kc, "aborted_ran = []")
    running = kc.execute(ENDLESS_CELLS[1])
    queued = [kc.execute(f"aborted_ran.append({n})\nprint('queued {n}')") for n in range(3)]
    wait_for_stdout(kc, running, "looping")
    km.interrupt_kernel()
    reply = shell_reply(kc, running)["content"]
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    for msg_id in queued:
        assert shell_reply(kc, msg_id)["content"]["status"] == "aborted"
        assert [m["msg_type"] for m in collect(kc, msg_id)] == ["status"]  # busy, then idle
    assert ok(kc, "print(aborted_ran)") == "[]\n"
