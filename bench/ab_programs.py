"""Two builds of Terra against each other and against eager on the benchmark programs, as a user
runs them (the payoff check on), each in a fresh process, in interleaved rounds.

bench/forced_coexec.py times co-execution itself; this times what the payoff check makes of it,
warm-up and re-checks included: per process, `make(0)`, then 300 steps through `terra.run` in 6
runs of 50 (or plain calls, eagerly). Prints per program and round the mean ms per step over
all 300 and the faster of the last two runs, for eager, the base build and this one, with how
many steps each build co-executed (and with the GraphRunner's workers asleep).

    .venv/bin/python bench/ab_programs.py --base /tmp/base/build/python [--rounds 5] \\
        [--out bench/results/ab_programs] hf_llama hf_bert gpt resnet
"""
import argparse
import json
import statistics
import time
from pathlib import Path

from ab import benchmark_program, run_child  # bench/ab.py

RUNS, STEPS = 6, 50


def child(name, mode):
    run = benchmark_program(name, mode)
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        run(STEPS)
        times.append((time.perf_counter() - t0) / STEPS * 1e3)
    out = {"whole": sum(times) / RUNS, "last": min(times[-2:])}
    if mode == "terra":
        import terra
        s = terra.stats("train")
        out["coexecuted"] = s["iterations_coexecuted"]
        out["workers_asleep"] = s.get("iterations_workers_asleep", 0)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="*", default=["hf_llama", "hf_bert", "gpt", "resnet"])
    ap.add_argument("--base", required=False, help="PYTHONPATH of the baseline build's terra package")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="write <out>.json and <out>.md")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    builds = [("this", None)] + ([("base", args.base)] if args.base else [])
    runs = {}
    for r in range(args.rounds):
        for name in args.programs:
            row = {"eager": run_child(__file__, (name, "eager"))}
            for label, path in builds:
                row[label] = run_child(__file__, (name, "terra"), path)
            runs.setdefault(name, []).append(row)
            print(r + 1, name, json.dumps(row), flush=True)
    lines = ["# Benchmark programs with the payoff check on, two builds against eager (bench/ab_programs.py)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, {args.rounds} interleaved rounds of fresh processes, "
             f"{RUNS}x{STEPS} steps each; ms per step, medians over rounds of the whole run's mean; "
             f"ratio: eager's time / the build's (above 1: faster than eager)."
             + (f" base: {args.base}" if args.base else ""), "",
             "| program | eager | " + " | ".join(f"{b} | {b} vs eager" for b, _ in builds) + " | this / base |",
             "|---|---:|" + "---:|---:|" * len(builds) + "---:|"]
    for name, rows in runs.items():
        med = lambda k: statistics.median(r[k]["whole"] for r in rows)  # noqa: E731
        cells = [f"{med(b):.2f} | {med('eager') / med(b):.2f}" for b, _ in builds]
        ratio = statistics.median(r["this"]["whole"] / r["base"]["whole"] for r in rows) if args.base else float("nan")
        lines.append(f"| {name} | {med('eager'):.2f} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
