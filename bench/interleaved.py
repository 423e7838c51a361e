"""Two values of one runtime setting against each other inside one process, in alternating blocks.

On the 2-core host of session 31 and later, one program's step time differs by up to 30% between
fresh processes, and drifts within a process over seconds, so fresh-process rounds (bench/ab.py,
bench/long_run.py --variant) cannot show a 10% change in a handful of rounds. A setting that
`terra.config` changes at run time is compared here instead: per program, one fresh process runs
50 untimed steps, then alternates the setting's values for `--blocks` blocks of `--steps` steps
each (each block one `terra.run` call and `terra.sync()`, timed whole), A B B A A B ... so that
neither value always follows the other. The ratio of each pair of neighbouring blocks cancels
the host's drift; the table gives, per program, the median ms per step of each value and the
median and quartiles of the pairwise ratios (second value / first value: below 1, the second is
faster). Runs as the user runs it (payoff check on) unless `--forced`.

    .venv/bin/python bench/interleaved.py --setting team_pause=1,0 [--blocks 16] [--steps 40]
        [--forced] [--name NAME] program ...

Results: bench/results/<NAME>.{json,md} (default interleaved_<setting>).
"""
import argparse
import ast
import json
import os
import platform
import statistics
import time
from pathlib import Path

from ab import ROOT, benchmark_program, run_child  # bench/ab.py

RESULTS = ROOT / "bench" / "results"


def parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a name: worker_spin=spin


def child(name, key, values, blocks, steps):
    import terra
    run = benchmark_program(name, "terra")
    run(50)
    terra.sync()
    order = []
    for b in range(blocks):  # A B B A A B B A ...: each value follows each as often
        order.append(values[((b + 1) // 2) % 2])
    times = {str(v): [] for v in values}
    sequence = []
    for v in order:
        terra.config(**{key: v})
        t0 = time.perf_counter()
        run(steps)
        terra.sync()
        ms = (time.perf_counter() - t0) / steps * 1e3
        times[str(v)].append(ms)
        sequence.append((str(v), ms))
    # Neighbouring blocks of the two values: (second / first) per pair.
    ratios = [sequence[i + 1][1] / sequence[i][1] if sequence[i][0] == str(values[0]) else sequence[i][1] / sequence[i + 1][1]
              for i in range(0, len(sequence) - 1, 2)]
    stats = {k: v for k, v in terra.stats().items() if k.startswith("iterations_")}
    return {"times": times, "sequence": sequence, "ratios": ratios, "stats": stats}


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--setting", help="KEY=A,B: a terra.config setting and its two values")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--forced", action="store_true", help="co-execute regardless (TERRA_ADAPTIVE=0)")
    ap.add_argument("--name")
    args = ap.parse_args()
    if args.child:
        prog, key, vals, blocks, steps = args.child
        print(json.dumps(child(prog, key, json.loads(vals), int(blocks), int(steps))))
        return
    key, _, vals = args.setting.partition("=")
    values = [parse_value(v) for v in vals.split(",")]
    if not key or len(values) != 2 or not args.programs:
        ap.error("give programs and --setting KEY=A,B (two values)")
    if args.forced:
        os.environ["TERRA_ADAPTIVE"] = "0"
    name = args.name or f"interleaved_{key}"
    rows = []
    for prog in args.programs:
        out = run_child(__file__, (prog, key, json.dumps(values), args.blocks, args.steps))
        a, b = (statistics.median(out["times"][str(v)]) for v in values)
        q1, med, q3 = quartiles(out["ratios"])
        rows.append({"program": prog, "ms": {str(values[0]): a, str(values[1]): b}, "ratio_median": med,
                     "ratio_q1": q1, "ratio_q3": q3, **out})
        print(f"{prog}: {key}={values[0]} {a:.3f} ms/step, {key}={values[1]} {b:.3f}; "
              f"pairwise {values[1]}/{values[0]} median {med:.3f} (quartiles {q1:.3f}-{q3:.3f})", flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "setting": key, "values": [str(v) for v in values],
            "blocks": args.blocks, "steps": args.steps, "forced": args.forced, "host": platform.node()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "programs": rows}, indent=1))
    lines = [f"# `{key}`: {values[0]} against {values[1]}, alternating blocks in one process (bench/interleaved.py)", "",
             f"{meta['date']}, {args.blocks} blocks of {args.steps} steps per program after 50 untimed, "
             f"{'forced co-execution' if args.forced else 'payoff check on'}. Ratio: {key}={values[1]} over "
             f"{key}={values[0]}, per pair of neighbouring blocks (below 1: {values[1]} faster).", "",
             f"| program | {key}={values[0]} ms/step | {key}={values[1]} ms/step | ratio median | quartiles |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['program']} | {r['ms'][str(values[0])]:.3f} | {r['ms'][str(values[1])]:.3f} | "
                     f"{r['ratio_median']:.3f} | {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f} |")
    if rows:
        gm = statistics.geometric_mean([r["ratio_median"] for r in rows])
        lines += ["", f"Geometric mean of the median ratios: {gm:.3f}."]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
