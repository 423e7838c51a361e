"""The program thread's cost of tracing, per op, in a graph's first iteration (every op makes a
new node) and in a later traced one (every op matches a node), against the same ops run eagerly.

A loop of ITERS iterations, each a chain of K adds of 4x4 tensors issued from K distinct source
lines and call stacks (a helper called from K places, as a model's layers and an optimizer's
updates are), run with `terra.run` in trace-only mode (`terra.config(enabled=False)`: every
iteration traced, nothing co-executed, one thread). The figure is the program thread's CPU time
(time.thread_time), so other processes on the host move it less than wall time; medians over
REPEATS runs per process, each run after `terra.reset()` (a new graph). Eager runs the same loop
in the same process, run by run.

    .venv/bin/python bench/first_trace.py [--variant PYTHONPATH=/tmp/base] [--rounds 5] [--name NAME]

Processes on this host run at one of two speeds (eager 1.5 or 3 us per op, for a whole process),
so each round's traced times are also given over that round's own eager time, and builds are
compared by those ratios.

`--variant VAR=VALUE` runs a second Terra child per round with that environment variable (another
build through PYTHONPATH), so two builds are compared in the same rounds. Results in
bench/results/NAME.{json,md} (default first_trace).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K, ITERS = 240, 3
REPEATS = int(os.environ.get("FIRST_TRACE_REPEATS", "15"))


def child():
    import torch
    import terra
    torch.set_num_threads(1)
    x = torch.randn(4, 4)
    # K call sites: one line each, so each add has its own stack and its own node.
    src = "def chain(z, y):\n" + "".join(f"    z = step(z, y)  # {i}\n" for i in range(K)) + "    return z\n"
    scope = {"step": lambda z, y: z + y}
    exec(compile(src, "<first_trace_chain>", "exec"), scope)
    chain = scope["chain"]
    times = []

    def main():
        for _ in range(ITERS):
            t = time.thread_time()
            chain(x, x)
            times.append(time.thread_time() - t)

    out = {"eager": [], "first": [], "later": []}
    terra.config(enabled=False)
    for _ in range(REPEATS):
        times.clear()
        main()
        out["eager"].append(statistics.median(times) / K)
        times.clear()
        terra.reset()
        terra.config(enabled=False)
        terra.run(main)
        out["first"].append(times[0] / K)
        out["later"].append(statistics.median(times[1:]) / K)
    print(json.dumps({k: statistics.median(v) * 1e6 for k, v in out.items()}))


def run_child(env_extra):
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", default="first_trace")
    a = ap.parse_args()
    if a.child:
        return child()
    builds = {"this build": {}}
    if a.variant:
        var, _, value = a.variant.partition("=")
        builds[a.variant] = {var: value}
    rows = {b: [] for b in builds}
    for r in range(a.rounds):
        for b, env in builds.items():
            rows[b].append(run_child(env))
            print(f"round {r} {b}: " + ", ".join(f"{k} {v:.2f} us/op" for k, v in rows[b][-1].items()), flush=True)
    # Processes on this host run at one of two speeds (eager 1.5 or 3 us per op, whole processes):
    # each round's times over its own eager time compare builds across them.
    for rs in rows.values():
        for x in rs:
            x["first_ratio"], x["later_ratio"] = x["first"] / x["eager"], x["later"] / x["eager"]
    med = {b: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for b, rs in rows.items()}
    lines = [f"# Tracing's cost per op on the program thread (bench/first_trace.py)", "",
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; {a.rounds} rounds, each a fresh process per build; "
             f"{K} adds of 4x4 tensors per iteration from {K} call sites, one thread; program-thread CPU time per op, "
             f"medians of {REPEATS} runs per process, then over rounds.", "",
             "| build | eager | first traced iteration (new nodes) | later traced iteration (matched) | "
             "first / eager (per round) | later / eager (per round) |",
             "|---|---:|---:|---:|---:|---:|"]
    for b, m in med.items():
        lines.append(f"| {b} | {m['eager']:.2f} us | {m['first']:.2f} us | {m['later']:.2f} us | "
                     f"{m['first_ratio']:.2f} | {m['later_ratio']:.2f} |")
    out = ROOT / "bench" / "results"
    (out / f"{a.name}.json").write_text(json.dumps({"rounds": rows, "medians": med}, indent=1) + "\n")
    (out / f"{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
