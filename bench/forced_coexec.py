"""Co-executed steps of the benchmark programs, the payoff check off, against eager, each in a
fresh process, in interleaved rounds; optionally a second Terra build (`--base`) beside this one.

bench/run.py times what a user gets: the payoff check runs each graph in the faster mode, so a
program whose co-execution lost shows eager's time plus the check's. This script times
co-execution itself (TERRA_ADAPTIVE=0), which is what an engine change moves, and reads each
thread's CPU time: the program thread's, and the others' together (the GraphRunner and any
OpenMP worker). Per child: the program's `make(0)`, 10 warm-up steps, then 5 timed runs of
`--steps` steps; medians.

    .venv/bin/python bench/forced_coexec.py [--base /tmp/base/build/python] [--rounds 3] \\
        [--worker-spin spin,sleep] [--out bench/results/forced_coexec] resnet dcgan gpt

`--worker-spin` runs this build once per listed setting of what the GraphRunner's idle OpenMP
workers do (TERRA_WORKER_SPIN; runtime/openmp_team.h) instead of once with the default.
`--variants` runs it once per listed environment instead: variants separated by commas, settings
within one by `+` (`TERRA_WORKER_SPIN=sleep+TERRA_LANES=0,TERRA_WORKER_SPIN=sleep`).
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

from ab import benchmark_program, run_child  # bench/ab.py
from per_op import other_threads_cpu_ns  # the GraphRunner and OpenMP workers, ended ones too



def program_runq_s():
    """Seconds the calling thread has waited on a run queue, runnable but not running (the second
    field of schedstat): where the program thread waits for a core, the process has more
    runnable threads than cores (a spinning OpenMP worker beside the GraphRunner, on two)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def child(name, mode, steps):
    run = benchmark_program(name, mode)
    run(10)
    rows = []
    counts = lambda: sum(terra._C.allocator_counts().get(k, 0) for k in ("hits", "misses"))  # noqa: E731
    if mode == "terra":
        import terra
        a0, k0 = counts(), terra.stats("train").get("kernels_into_kept_outputs", 0)
    for _ in range(5):
        o0, q0, c0, t0 = other_threads_cpu_ns(), program_runq_s(), time.thread_time(), time.perf_counter()
        run(steps)
        rows.append(((time.perf_counter() - t0) / steps * 1e3, (time.thread_time() - c0) / steps * 1e3,
                     (other_threads_cpu_ns() - o0) / steps / 1e6, (program_runq_s() - q0) / steps * 1e3))
    out = {k: statistics.median(r[i] for r in rows)
           for i, k in enumerate(("wall", "program", "others", "program_runq"))}
    if mode == "terra":
        import terra
        s = terra.stats("train")
        out["replayed"] = s["iterations_replayed"]
        out["spread"] = s.get("kernels_spread_while_waited", 0)
        # Data buffers the GraphRunner took from its allocator per timed step (runner_allocator.h),
        # and kernels run into their kept results (out_form.h).
        out["allocs"] = (counts() - a0) / (5 * steps)
        out["kept"] = (s.get("kernels_into_kept_outputs", 0) - k0) / (5 * steps)
    print(json.dumps(out))


def spawn(name, mode, steps, pythonpath=None, env=None):
    return run_child(__file__, (name, mode, steps), pythonpath, {"TERRA_ADAPTIVE": "0", **(env or {})})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="*", default=["resnet", "dcgan", "gpt", "hf_bert"])
    ap.add_argument("--base", help="PYTHONPATH of a baseline build's terra package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worker-spin", help="comma-separated TERRA_WORKER_SPIN settings to run this build with")
    ap.add_argument("--variants", help="comma-separated environments (NAME=VALUE, joined by +) to run this build with")
    ap.add_argument("--out", help="write <out>.json and <out>.md")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    spins = args.worker_spin.split(",") if args.worker_spin else []
    variants = [(v, None, dict(kv.split("=", 1) for kv in v.split("+"))) for v in args.variants.split(",")] \
        if args.variants else []
    builds = ([(s, None, {"TERRA_WORKER_SPIN": s}) for s in spins] + variants or [("this", None, None)]) + \
        ([("base", args.base, None)] if args.base else [])
    runs = {}
    for _ in range(args.rounds):
        for name in args.programs:
            runs.setdefault((name, "eager"), []).append(spawn(name, "eager", args.steps))
            for label, path, env in builds:
                runs.setdefault((name, label), []).append(spawn(name, "terra", args.steps, path, env))
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    lines = ["# Forced co-execution against eager (bench/forced_coexec.py)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, {args.rounds} interleaved rounds of fresh processes, "
             f"{args.steps} steps x 5 timed runs per process, medians; TERRA_ADAPTIVE=0; ms per step. "
             "program: the program thread's CPU; others: every other thread's CPU (GraphRunner, "
             "OpenMP workers); runq: the program thread's wait for a core (runnable, not running); "
             "allocs: data buffers the GraphRunner took from its allocator per step; kept: kernels "
             "per step that wrote into their kept results instead (out_form.h)."
             + (f" base: {args.base}" if args.base else ""), "",
             "| program | eager wall | " + " | ".join(f"{b} wall | {b} program | {b} others | {b} runq | "
                                                   f"{b} allocs | {b} kept | {b} / eager"
                                                   for b, _, _ in builds) + " |",
             "|---|---:|" + "---:|---:|---:|---:|---:|---:|---:|" * len(builds)]
    for name in args.programs:
        e = med(runs[(name, "eager")], "wall")
        cells = []
        for label, _, _ in builds:
            rs = runs[(name, label)]
            runq = f"{med(rs, 'program_runq'):.2f}" if all("program_runq" in r for r in rs) else "-"
            per_step = lambda k: f"{med(rs, k):.0f}" if all(k in r for r in rs) else "-"  # noqa: E731
            cells += [f"{med(rs, 'wall'):.2f}", f"{med(rs, 'program'):.2f}", f"{med(rs, 'others'):.2f}",
                      runq, per_step("allocs"), per_step("kept"), f"{med(rs, 'wall') / e:.2f}"]
        lines.append(f"| {name} | {e:.2f} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.out:
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
