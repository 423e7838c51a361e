"""Where a co-executed step's time goes: how busy the GraphRunner is, what the program thread
waits for, and each thread's CPU, per benchmark program (payoff check on, as a user runs it).

Per program, in a fresh process: `make(0)`, 50 untimed steps under terra.run, then one call of
`--steps` steps timed; from `terra.timeline(last=100)`, over the co-executed iterations among
the last 100: the wall time per iteration, the GraphRunner's busy time per iteration (its "busy"
spans clipped to those iterations) and the program thread's waits by what it waited for; from
the process, the program thread's and the other threads' CPU per step. A GraphRunner busy for
nearly the whole iteration bounds the step: what it runs decides the speed, not Python. Results:
bench/results/time_split.{json,md}.

    .venv/bin/python bench/time_split.py [--steps 300] [program ...]
"""
import argparse
import collections
import json
import time
from pathlib import Path

from ab import ROOT, benchmark_program, run_child  # bench/ab.py
from per_op import other_threads_cpu_ns  # the GraphRunner and OpenMP workers, ended ones too

RESULTS = ROOT / "bench" / "results"
DEFAULT = ["hf_llama", "hf_bert", "hf_gpt2", "gpt", "bert", "music_transformer", "resnet", "dcgan", "dropblock"]
ITERATION_KINDS = ("tracing", "coexec", "fallback", "eager")


def child(name, steps):
    import terra
    run = benchmark_program(name, "terra")
    run(50)
    terra.sync()
    o0, c0, t0 = other_threads_cpu_ns(), time.thread_time(), time.perf_counter()
    run(steps)
    terra.sync()
    wall = (time.perf_counter() - t0) / steps * 1e3
    program, others = (time.thread_time() - c0) / steps * 1e3, (other_threads_cpu_ns() - o0) / steps / 1e6
    tl = terra.timeline(last=100)
    its = [i for i in tl["iterations"] if i["mode"] == "coexec"]
    out = {"step_ms": wall, "program_cpu_ms": program, "others_cpu_ms": others, "coexec_iterations": len(its)}
    if its:
        start, end, n = its[0]["start_ns"], its[-1]["end_ns"], len(its)
        busy = sum(min(e["end_ns"], end) - max(e["start_ns"], start) for e in tl["events"]
                   if e["lane"] == "graph" and e["end_ns"] > start and e["start_ns"] < end)
        waits = collections.Counter()
        for e in tl["events"]:
            if e["lane"] == "python" and e["kind"] not in ITERATION_KINDS and start <= e["start_ns"] < end:
                waits[e.get("detail") or e["kind"]] += e["end_ns"] - e["start_ns"]
        out.update(iteration_ms=(end - start) / n / 1e6, runner_busy_ms=busy / n / 1e6,
                   waits_ms={k: v / n / 1e6 for k, v in waits.most_common(3)})
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help=f"bench/programs names (default {DEFAULT})")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    rows = {name: run_child(__file__, (name, args.steps)) for name in args.programs or DEFAULT}
    lines = ["# Where a co-executed step's time goes (bench/time_split.py)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, payoff check on, one fresh process per program, "
             f"{args.steps} steps timed after 50; iteration and busy times over the co-executed "
             "iterations among the last 100 (terra.timeline). busy share: the GraphRunner's busy "
             "time over the iteration's; waits: the program thread's three longest kinds, ms per "
             "iteration.", "",
             "| program | step ms | co-executed of last 100 | iteration ms | GraphRunner busy ms | busy share | "
             "program CPU ms/step | other threads CPU ms/step | program waits |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in rows.items():
        it, busy = r.get("iteration_ms"), r.get("runner_busy_ms")
        waits = "; ".join(f"{k} {v:.2f}" for k, v in r.get("waits_ms", {}).items()) or "-"
        cells = [f"{r['step_ms']:.2f}", str(r["coexec_iterations"]),
                 f"{it:.2f}" if it else "-", f"{busy:.2f}" if busy else "-",
                 f"{busy / it:.2f}" if it and busy else "-",
                 f"{r['program_cpu_ms']:.2f}", f"{r['others_cpu_ms']:.2f}", waits]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    (RESULTS / "time_split.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "time_split.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
