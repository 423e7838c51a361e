"""The program thread's cost of tracing, per op, in a graph's first iteration (every op makes a
new node) and in a later traced one (every op matches a node), against the same ops run eagerly.

A loop of ITERS iterations, each a chain of K adds of 4x4 tensors issued from K distinct source
lines and call stacks (a helper called from K places, as a model's layers and an optimizer's
updates are; `--sites S`: from S call sites, K / S adds each, as a model's layers call
one line of a shared forward), run with `terra.run` in trace-only mode (`terra.config(enabled=False)`: every
iteration traced, nothing co-executed, one thread). The figure is the program thread's CPU time
(time.thread_time), so other processes on the host move it less than wall time; medians over
REPEATS runs per process, each run after `terra.reset()` (a new graph). Eager runs the same loop
in the same process, run by run.

    .venv/bin/python bench/first_trace.py [--variant PYTHONPATH=/tmp/base] [--rounds 5] [--sites S] [--name NAME]
    .venv/bin/python bench/first_trace.py --corpus [--variant ...] [--rounds 3] [--name NAME]

`--corpus`: per correctness-corpus program instead (tests/programs, not the DataLoader ones), a
first run traced throughout (co-execution off) over the eager run, by the program thread's CPU,
in a fresh process per build and round.

Processes on this host run at one of two speeds (eager 1.5 or 3 us per op, for a whole process),
so each round's traced times are also given over that round's own eager time, and builds are
compared by those ratios.

`--variant VAR=VALUE` runs a second Terra child per round with that environment variable (another
build through PYTHONPATH), so two builds are compared in the same rounds. Results in
bench/results/NAME.{json,md} (default first_trace).
"""
import argparse
import json
import math
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
    sites = int(os.environ.get("FIRST_TRACE_SITES", str(K)))
    if sites == K:
        src = "def chain(z, y):\n" + "".join(f"    z = step(z, y)  # {i}\n" for i in range(K)) + "    return z\n"
    else:  # K / sites adds from each site, as a model's layers call one line of a shared forward
        src = "def chain(z, y):\n" + "".join(f"    for _ in range({K // sites}): z = step(z, y)  # {i}\n"
                                              for i in range(sites)) + "    return z\n"
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


def corpus_child(name):
    """One corpus program's first run, trace-only, against eager: the program thread's CPU time."""
    import contextlib
    import io
    import torch
    import terra
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import corpus
    torch.set_num_threads(1)
    mod = corpus.load(name)

    def cpu(traced):
        if traced:
            terra.reset()
            terra.config(enabled=False)
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.thread_time()
            if traced:
                terra.run(mod.main)
            else:
                mod.main()
            return time.thread_time() - t

    cpu(False), cpu(True)  # untimed: once-per-process costs
    ratios = []
    for _ in range(REPEATS // 3):
        e, t = cpu(False), cpu(True)
        ratios.append(t / e)
    print(json.dumps({"traced_over_eager": statistics.median(ratios)}))


def run_child(env_extra, *args):
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def corpus_main(a, builds):
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import corpus
    names = [p for p in corpus.PROGRAMS if "dataloader" not in p and "iterable" not in p]
    table = {b: {} for b in builds}
    for name in names:
        for r in range(a.rounds):
            for b, env in builds.items():
                table[b].setdefault(name, []).append(run_child(env, name)["traced_over_eager"])
        print(name + ": " + ", ".join(f"{b} {statistics.median(table[b][name]):.3f}" for b in builds), flush=True)
    geo = {b: math.exp(statistics.fmean(math.log(statistics.median(v)) for v in t.values())) for b, t in table.items()}
    lines = ["# A first run traced throughout, over eager: the program thread's CPU (bench/first_trace.py --corpus)", "",
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; per corpus program (not the DataLoader ones) a fresh "
             f"process per build and round ({a.rounds} rounds), one thread; in it, the program's `main` eagerly and under "
             f"`terra.run` with co-execution off (every iteration traced, `terra.reset()` first), alternated "
             f"{REPEATS // 3} times: the median of traced CPU time over eager CPU time, then the median over rounds.", "",
             "| program | " + " | ".join(builds) + " |", "|---|" + "---:|" * len(builds)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{statistics.median(table[b][name]):.3f}" for b in builds) + " |")
    lines.append("| geometric mean | " + " | ".join(f"{geo[b]:.3f}" for b in builds) + " |")
    out = ROOT / "bench" / "results"
    (out / f"{a.name}.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / f"{a.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="*")
    ap.add_argument("--corpus", action="store_true", help="each corpus program's first run instead of the chain")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", default="first_trace")
    ap.add_argument("--sites", type=int, default=K, help=f"distinct call sites (default {K}: one per add)")
    a = ap.parse_args()
    if a.child is not None:
        return corpus_child(a.child[0]) if a.child else child()
    os.environ["FIRST_TRACE_SITES"] = str(a.sites)
    builds = {"this build": {}}
    if a.variant:
        var, _, value = a.variant.partition("=")
        builds[a.variant] = {var: value}
    if a.corpus:
        return corpus_main(a, builds)
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
             f"{K} adds of 4x4 tensors per iteration from {a.sites} call sites, one thread; program-thread CPU time per op, "
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
