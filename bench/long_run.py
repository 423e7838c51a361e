"""Steady throughput of long training runs: eager against Terra, each in fresh processes.

bench/run.py times each mode in calls of up to 50 steps (a Terra session each), and
bench/corpus.py runs programs of 30-250 steps: both mostly see warm-up and the first
iterations after a pause. A notebook that trains for real runs a loop of thousands of steps. Here
each process first runs 50 untimed steps (first-call costs), then times one call of N1 steps and
one of N2 steps on the same state (`terra.run` plus `terra.sync()` under Terra): the steady time
per step is (t(N2) - t(N1)) / (N2 - N1), so each call's warm-up (tracing, recording, the payoff
check) cancels out; the whole N2-step call is reported too. Eager and Terra processes alternate,
`--rounds` times; medians. Results: bench/results/long_run.{json,md}.

    .venv/bin/python bench/long_run.py [--rounds 3] [--n1 300] [--n2 1500] [program ...]
    .venv/bin/python bench/long_run.py --n1 100 --n2 400 --name long_run_compute resnet gpt ...

`--variant VAR=VALUE` times a second Terra setting in the same rounds (its own fresh processes,
with that environment variable), beside the default one: `--variant TERRA_PROGRAM_CACHE=0`
(`bench/results/program_cache.md`). Each child also counts the process's minor page faults per
steady step, the same difference of the two calls (below zero where the shorter call faulted more,
in its first steps).

`--new-model`: every call (the untimed one too) trains a model made anew (`make(0)`, the previous
one dropped), as a notebook does when the cell that builds the model runs again; the graph, and
what Terra learned in it, stays (`long_run_new_model.md`).
"""
import argparse
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEFAULT_PROGRAMS = ["tabular_mlp", "rnn_lengths", "rl_cartpole"]


def child(name, mode, n1, n2, new_model=False):
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(2)
    import terra
    mod = importlib.import_module(f"bench.programs.{name}")
    state = mod.make(0)

    def timed(steps):
        nonlocal state
        if new_model:
            state = None
            state = mod.make(0)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        if mode == "terra":
            terra.run(mod.train, state, steps)
            terra.sync()
        else:
            mod.train(state, steps)
        t = time.perf_counter() - t0
        return t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    def counts():  # iterations co-executed and replayed so far (all of the program's graphs)
        s = terra.stats() if mode == "terra" else {}
        return s.get("iterations_coexecuted", 0), s.get("iterations_replayed", 0)

    timed(50)
    (t1, f1) = timed(n1)
    c0, r0 = counts()
    (t2, f2) = timed(n2)
    c1, r1 = counts()
    print(json.dumps({"steady_ms": (t2 - t1) / (n2 - n1) * 1e3, "whole_s": t2,
                      "faults_per_step": (f2 - f1) / (n2 - n1),
                      # iterations per step of the n2-step call: co-executed, replayed as recorded blocks
                      "coexec_share": (c1 - c0) / n2, "replayed_share": (r1 - r0) / n2}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help=f"bench/programs names (default {DEFAULT_PROGRAMS})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n1", type=int, default=300)
    ap.add_argument("--n2", type=int, default=1500)
    ap.add_argument("--name", default="long_run", help="results file name under bench/results")
    ap.add_argument("--new-model", action="store_true", help="a model made anew for every call")
    ap.add_argument("--variant", help="a second Terra setting timed in the same rounds, as VAR=VALUE "
                    "(environment; e.g. TERRA_PROGRAM_CACHE=0)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.n1, args.n2, args.new_model)
    rows = []
    for name in args.programs or DEFAULT_PROGRAMS:
        modes = ("eager", "terra") + (("variant",) if args.variant else ())
        got = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode in modes:
                # Each process times both modes afresh, as on a first run (runtime/payoff_memory.h).
                env = dict(os.environ, TERRA_REMEMBER_PAYOFF="0")
                if mode == "variant":
                    key, _, value = args.variant.partition("=")
                    env[key] = value
                out = subprocess.run([sys.executable, __file__, "--child", name, "eager" if mode == "eager" else "terra",
                                      "--n1", str(args.n1), "--n2", str(args.n2)] +
                                     (["--new-model"] if args.new_model else []),
                                     check=True, capture_output=True, text=True, env=env).stdout
                got[mode].append(json.loads(out.strip().splitlines()[-1]))
        med = {m: {k: statistics.median(r.get(k, 0.0) for r in got[m])
                   for k in ("steady_ms", "whole_s", "faults_per_step", "coexec_share", "replayed_share")}
               for m in got}
        rows.append({"program": name, "runs": got, "median": med,
                     "steady_ratio": med["terra"]["steady_ms"] / med["eager"]["steady_ms"],
                     "whole_ratio": med["terra"]["whole_s"] / med["eager"]["whole_s"]})
        if args.variant:
            rows[-1]["variant"] = args.variant
            rows[-1]["variant_steady_ratio"] = med["variant"]["steady_ms"] / med["eager"]["steady_ms"]
        print(f"{name}: steady {med['eager']['steady_ms']:.3f} -> {med['terra']['steady_ms']:.3f} ms/step "
              f"({rows[-1]['steady_ratio']:.2f}), whole {args.n2} steps {rows[-1]['whole_ratio']:.2f}", file=sys.stderr)
    import torch
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "rounds": args.rounds,
            "n1": args.n1, "n2": args.n2, "new_model": args.new_model}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    if path.exists():  # rows of other programs from an earlier run with the same settings stay
        old = json.loads(path.read_text())
        if (old["meta"]["n1"], old["meta"]["n2"], old["meta"].get("new_model", False)) == (args.n1, args.n2, args.new_model):
            names = {r["program"] for r in rows}
            rows = [r for r in old["programs"] if r["program"] not in names] + rows
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "programs": rows}, indent=1))
    lines = ["# Long training runs: steady throughput, eager against Terra (CPU)", "",
             f"Generated by `bench/long_run.py` ({meta['date']}, torch {meta['torch']}, 2 intra-op threads, "
             f"{args.rounds} rounds of fresh processes alternated, medians). Steady: (t({args.n2} steps) - "
             f"t({args.n1} steps)) / {args.n2 - args.n1}, " +
             ("each call on a model made anew (as a notebook re-running its model cell), after 50 untimed "
              "steps on another, " if args.new_model else "both calls on one state after 50 untimed steps, ") +
             f"so warm-up cancels; whole: the {args.n2}-step call. Ratio = Terra / eager (lower is faster).", "",
             "Faults: minor page faults per steady step (the process's, all threads). Co-executed and "
             f"replayed: iterations per step of the {args.n2}-step call that were co-executed (not eager, "
             "the payoff check's choice, nor traced) and that ran as replayed blocks (runtime/block_replay.h); "
             "a step is one iteration unless the program loops inside it." +
             (f" Variant: Terra with `{args.variant}`, in the same rounds." if args.variant else ""), "",
             "| program | eager ms/step | Terra ms/step | steady ratio | whole-call ratio | eager faults | Terra faults "
             "| co-executed | replayed |" +
             (" variant ms/step | variant ratio | variant faults |" if args.variant else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if args.variant else "")]
    for r in rows:
        m = r["median"]
        line = (f"| {r['program']} | {m['eager']['steady_ms']:.3f} | {m['terra']['steady_ms']:.3f} | "
                f"{r['steady_ratio']:.2f} | {r['whole_ratio']:.2f} | {m['eager'].get('faults_per_step', float('nan')):.0f} | "
                f"{m['terra'].get('faults_per_step', float('nan')):.0f} | "
                f"{m['terra'].get('coexec_share', 0.0):.0%} | {m['terra'].get('replayed_share', 0.0):.0%} |")
        if "variant" in m:
            line += (f" {m['variant']['steady_ms']:.3f} | {r['variant_steady_ratio']:.2f} | "
                     f"{m['variant']['faults_per_step']:.0f} |")
        lines.append(line)
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
