"""Instructions the GraphRunner executes per co-executed step of a benchmark program (callgrind).

Timings of one GraphRunner change of a few percent drown in this host's noise (a program's step
time moves by 10-30% between processes of one build). Instruction counts do not: they say how much
work the GraphRunner does per step (not how long its cache misses take, which
bench/forced_coexec.py still measures). Each child makes the program (`make(0)`), co-executes it
(the payoff check off) with one intra-op thread (no OpenMP pool under valgrind), and callgrind
counts the instructions inside `GraphRunner::execute` (the items, the replayed kernels and their
bookkeeping; its idle spinning not). Per step: the difference between a run of N2 and one of N1
steps, over N2 - N1, so warm-up, tracing and recording cancel. Variants run the same build with
other environment settings (`--variant NAME=VAR=VALUE`, repeatable), or another build through
PYTHONPATH.

    .venv/bin/python bench/replay_instructions.py [--variant allocate=TERRA_OUT_FORM=0] tabular_mlp gpt

Needs valgrind. Results: bench/results/replay_instructions.{json,md} (`--name` for another name).
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from per_op_instructions import annotate  # bench/per_op_instructions.py

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
N1, N2 = 20, 60
WARM = 10


def child(name, steps):
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    prog = importlib.import_module("bench.programs." + name)
    import terra
    state = prog.make(0)
    terra.run(prog.train, state, WARM)
    terra.run(prog.train, state, steps)
    s = terra.stats("train")
    print(json.dumps({k: s[k] for k in ("iterations_coexecuted", "iterations_replayed", "kernels_replayed",
                                        "kernels_into_kept_outputs", "results_reused")}))


def counted(name, steps, env, outdir):
    out = Path(outdir) / f"cg.{name}.{steps}.{abs(hash(json.dumps(env, sort_keys=True)))}"
    run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=yes",
                          "--toggle-collect=terra::runtime::GraphRunner::execute*",
                          sys.executable, __file__, "--child", name, str(steps)],
                         env={**os.environ, "TERRA_ADAPTIVE": "0", **env}, check=True, capture_output=True, text=True)
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    total = 0
    for path in sorted(Path(outdir).glob(out.name + "-*")):
        t, functions = annotate(path)
        if t is not None and any("GraphRunner::execute" in k for k in functions):
            total += t
    return total, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=VALUE: this build again with an environment setting (PYTHONPATH for another build)")
    ap.add_argument("--name", default="replay_instructions")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    builds = [("this", {})] + [(v.split("=", 1)[0], dict([v.split("=", 1)[1].split("=", 1)])) for v in args.variant]
    rows = []
    with tempfile.TemporaryDirectory() as outdir:
        for name in args.programs:
            row = {"program": name}
            for label, env in builds:
                (i1, s1), (i2, s2) = (counted(name, n, env, outdir) for n in (N1, N2))
                steps = N2 - N1
                row[label] = {"instructions": (i2 - i1) / steps,
                              **{k: (s2[k] - s1[k]) / steps for k in s1}}
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(rows, builds, args.name)  # after each program: a long run stopped keeps what it measured


def write(rows, builds, name):
    labels = [b for b, _ in builds]
    lines = ["# GraphRunner instructions per co-executed step (callgrind)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, bench/replay_instructions.py: one intra-op thread, the "
             f"payoff check off; instructions inside GraphRunner::execute per step, from runs of {N2} and {N1} "
             "steps after " + str(WARM) + " (their difference over " + str(N2 - N1) + "); kernels replayed and "
             "kernels that wrote into kept results (out_form.h, elementwise_replay.h) per step. Variants: "
             + (", ".join(f"{b} = {e}" for b, e in builds[1:]) or "none") + ".", "",
             "| program | " + " | ".join(f"{b} instructions | {b} kernels | {b} kept" for b in labels) + " |",
             "|---|" + "---:|---:|---:|" * len(labels)]
    for r in rows:
        cells = []
        for b in labels:
            c = r[b]
            cells += [f"{c['instructions']:,.0f}", f"{c['kernels_replayed']:.0f}",
                      f"{c['kernels_into_kept_outputs'] + c['results_reused']:.0f}"]
        lines.append(f"| {r['program']} | " + " | ".join(cells) + " |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
