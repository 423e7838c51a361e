"""One OpenMP team per process (terra_core/runtime/openmp_team.h).

libgomp keeps a pool of worker threads for every thread that ever started a parallel region. Two
pools on a machine with as many cores as a pool has threads make every parallel region of the
process a futex hand-off (eager ops 10x slower; bench/results/openmp_team.md). These tests count
the process's threads, which is how the pools show: the program thread's workers while it runs
eagerly, the GraphRunner's while it co-executes, never both, and none of the GraphRunner's left
once the program runs eagerly again. Each runs in a fresh process so the count starts known.
"""
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import json, os, torch, terra
    torch.set_num_threads(2)

    def threads():
        return len(os.listdir("/proc/self/task"))

    def graph_threads():  # the GraphRunner and the workers of its team, which inherit its name
        tasks = os.listdir("/proc/self/task")
        return sum(open(f"/proc/self/task/{t}/comm").read().strip() == "terra-graph" for t in tasks)

    big = torch.randn(512, 512)
    n0 = threads()                 # no team yet: the program thread and the libraries' own threads
    big @ big
    team = threads() - n0          # the workers of one team (1 with 2 intra-op threads)

    w = torch.randn(512, 512, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-4)
    during, graph_during = [], []

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            loss = (big @ w).relu().mean()   # intra-op parallel in whichever thread runs it
            loss.backward()
            opt.step()
            float(loss)                      # the GraphRunner has run this step's matmul
            during.append(threads())
            graph_during.append(graph_threads())

    terra.run(train, 12)
    eager_again = threads()        # the GraphRunner gave its team back when the session ended
    graph_after = graph_threads()
    big @ big
    after_eager_op = threads()
    print(json.dumps({"n0": n0, "team": team, "during": during, "eager_again": eager_again,
                      "graph_during": graph_during, "graph_after": graph_after,
                      "after_eager_op": after_eager_op, "stats": terra.stats("train")}))
""")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for an intra-op team")
def test_at_most_one_openmp_team_in_any_mode(tmp_path):
    script = tmp_path / "teams.py"  # a file, so terra.run can read the loops' source
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    import json
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["stats"]["iterations_coexecuted"] >= 6, r["stats"]
    n0, team = r["n0"], r["team"]
    assert team >= 1, r
    # While tracing, the program thread's team; while co-executing, the GraphRunner's (which runs
    # the matmuls): never both, so at most the GraphRunner thread and one team on top of n0.
    assert max(r["during"]) == n0 + 1 + team, r
    # The team is the GraphRunner's (its thread is named terra-graph, and so are the workers it
    # starts) ...
    assert max(r["graph_during"]) == 1 + team, r
    # Once the session has ended the GraphRunner holds no pool ...
    assert r["eager_again"] == n0 + 1, r
    assert r["graph_after"] == 1, r
    # ... and an eager op gets the program thread's team back, the only one.
    assert r["after_eager_op"] == n0 + 1 + team, r


SETUP_THEN_TRAIN = textwrap.dedent("""
    import json, os, torch, terra
    torch.set_num_threads(2)

    def threads():
        return len(os.listdir("/proc/self/task"))

    big = torch.randn(128, 128)
    n0 = threads()
    big @ big
    team = threads() - n0

    w = torch.randn(128, 128, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-4)
    during = []

    def main():
        acc = torch.zeros(128, 128)
        for _ in range(3):         # a setup loop: its third iteration is co-executed
            acc = acc + big @ big
        for _ in range(12):        # the training loop enters co-execution a few ms later
            opt.zero_grad()
            loss = (big @ w + acc).relu().mean()
            loss.backward()
            opt.step()
            during.append(threads())

    terra.run(main)
    print(json.dumps({"n0": n0, "team": team, "during": during, "stats": terra.stats("main")}))
""")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for an intra-op team")
def test_a_loops_first_coexecuted_iterations_have_one_team(tmp_path):
    # The team moves at most once per 20 ms (kTeamMoveNs), but a loop's first entry into
    # co-execution moves it anyway: held back after the setup loop's move, the training loop
    # traced and co-executed with both teams (6 threads against 5 here), every parallel region a
    # futex hand-off.
    script = tmp_path / "setup_then_train.py"
    script.write_text(SETUP_THEN_TRAIN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    import json
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["stats"]["iterations_coexecuted"] >= 6, r["stats"]
    assert r["team"] >= 1, r
    assert max(r["during"]) == r["n0"] + 1 + r["team"], r


# Without torch.set_num_threads, which turns MKL's dynamic threading off for the whole process:
# MKL then runs a 32x64 tanh on one thread, as a fresh eager process does. The GraphRunner sets
# its thread count for itself only (set_intraop_threads), so co-executing leaves that as it was.
MKL_DYNAMIC = textwrap.dedent("""
    import ctypes, json, os, torch, terra

    def threads():
        return len(os.listdir("/proc/self/task"))

    gomp = next(line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line)
    pause = ctypes.CDLL(gomp).omp_pause_resource_all
    small = torch.randn(32, 64)

    def small_op_starts_a_team():
        pause(1)                   # the program thread's team goes: a parallel region makes one
        n = threads()
        torch.tanh(small)          # MKL's vector tanh
        return threads() > n

    before = small_op_starts_a_team()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    terra.run(train, 30)
    print(json.dumps({"before": before, "after": small_op_starts_a_team(),
                      "stats": terra.stats("train")}))
""")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for an intra-op team")
def test_coexecuting_leaves_mkls_threading_of_small_ops_as_eager_has_it(tmp_path):
    script = tmp_path / "mkl_dynamic.py"
    script.write_text(MKL_DYNAMIC)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env=env)
    import json
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # Replayed blocks ran with one thread and then the program's two: the thread count changed
    # on the GraphRunner, back and forth.
    assert r["stats"]["blocks_one_thread"] >= 1, r["stats"]
    assert r["before"] is False, r
    assert r["after"] is False, r
