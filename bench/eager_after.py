"""Eager steps after a Terra session, against the same steps before it, in one process.

What a notebook sees when a cell that co-executed is followed by plain eager cells (or a session's
loop is held eager by the payoff check and then left): per process, a benchmark program's
`k` eager steps are timed (after 10 untimed), then `terra.run` runs `n` steps, then the same `k`
eager steps are timed again. Reported per program: eager's median step before and after the
session, the page faults per step (the process's minor faults, getrusage) and the program
thread's CPU per step, medians over rounds of fresh processes; with `--base` (a baseline build's
PYTHONPATH, as bench/ab.py makes one) both builds in the same rounds, alternated.

    .venv/bin/python bench/eager_after.py [--base /tmp/base/build/python] [--rounds 3] [programs ...]
"""
import argparse
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
sys.path.insert(0, str(ROOT))

from bench import ab  # noqa: E402

DEFAULT = ["resnet", "dcgan", "gpt", "hf_bert"]


def child(name, k, n):
    run_eager, run_terra = ab.benchmark_program(name, "both")  # one program state
    import terra

    def timed():
        steps = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu = time.thread_time()
        for _ in range(k):
            t = time.perf_counter()
            run_eager(1)
            steps.append(time.perf_counter() - t)
        return {"step_ms": statistics.median(steps) * 1e3, "mean_ms": statistics.mean(steps) * 1e3,
                "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / k,
                "cpu_ms": (time.thread_time() - cpu) / k * 1e3}

    run_eager(10)
    before = timed()
    run_terra(n)
    stats = terra.stats()
    after = timed()
    print(json.dumps({"before": before, "after": after, "coexecuted": stats.get("iterations_coexecuted", 0)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*", default=DEFAULT)
    ap.add_argument("--base", help="PYTHONPATH of the baseline build's terra package")
    ap.add_argument("--base-label", default="baseline", help="what the baseline is (a commit)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=30, help="eager steps timed before and after")
    ap.add_argument("--n", type=int, default=60, help="steps of the Terra session")
    ap.add_argument("--name", default="eager_after", help="results file name under bench/results")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, k, n = args.child
        return child(name, int(k), int(n))
    builds = {args.base_label: args.base, "this": None} if args.base else {"this": None}
    med = statistics.median
    rows = []
    for name in args.programs:
        runs = {b: [] for b in builds}
        for _ in range(args.rounds):
            for b, path in builds.items():
                runs[b].append(ab.run_child(__file__, (name, args.k, args.n), path))
        for b, rs in runs.items():
            row = {"program": name, "build": b, "coexecuted": med(r["coexecuted"] for r in rs)}
            for when in ("before", "after"):
                for key in ("step_ms", "mean_ms", "faults", "cpu_ms"):
                    row[f"{when}_{key}"] = med(r[when][key] for r in rs)
            row["after_over_before"] = med(r["after"]["step_ms"] / r["before"]["step_ms"] for r in rs)
            rows.append(row)
            print(f"{name:12s} {b:10s} eager {row['before_step_ms']:6.2f} -> {row['after_step_ms']:6.2f} ms "
                  f"({row['after_over_before']:.2f}), faults {row['before_faults']:6.0f} -> {row['after_faults']:6.0f}, "
                  f"CPU {row['before_cpu_ms']:6.2f} -> {row['after_cpu_ms']:6.2f} ms", flush=True)
    write(args, rows, builds)


def write(args, rows, builds):
    import torch
    out = ROOT / "bench" / "results" / args.name
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
            "python": platform.python_version(), "rounds": args.rounds, "k": args.k, "n": args.n,
            "builds": list(builds), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)")}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    L = ["# Eager steps after a Terra session (bench/eager_after.py)", "",
         f"{meta['date']}, torch {meta['torch']}, 2 intra-op threads, OMP_WAIT_POLICY {meta['OMP_WAIT_POLICY']}; "
         f"{args.rounds} rounds of fresh processes, the builds alternated in each round. Per process: "
         f"{args.k} eager steps timed (after 10 untimed), a {args.n}-step `terra.run` session, the same "
         f"{args.k} eager steps timed again. Medians over rounds: step (median of the {args.k}), minor page "
         "faults per step (the process's), the mean step and the program thread's CPU per step (means: "
         "they include the first step after the session); after/before is the median of each process's "
         "own ratio of median steps.", "",
         "| program | build | eager ms before | after | after/before | faults/step before | after | "
         "mean ms before | after | CPU ms before | after |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        L.append(f"| {r['program']} | {r['build']} | {r['before_step_ms']:.2f} | {r['after_step_ms']:.2f} | "
                 f"{r['after_over_before']:.2f} | {r['before_faults']:.0f} | {r['after_faults']:.0f} | "
                 f"{r['before_mean_ms']:.2f} | {r['after_mean_ms']:.2f} | "
                 f"{r['before_cpu_ms']:.2f} | {r['after_cpu_ms']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
