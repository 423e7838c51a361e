"""Two Terra settings against eager on the correctness corpus, in one process per program.

Per program (tests/programs) a child process runs the program's `main` eagerly, under `terra.run`
with settings A and under `terra.run` with settings B (`terra.reset()` before each Terra run, so
each is a first run; payoff memory off), in turns for `--rounds` rounds after one untimed run of
each, B before A in every other round. The two settings share the process, its speed and its
hour, so their ratios to eager compare them more closely than two runs of
`bench/corpus_back_to_back.py` do on this host.

    .venv/bin/python bench/corpus_configs.py --a "adaptive=on" --b "adaptive=off" [--rounds 3] [--name NAME] [program-prefix ...]

Settings are `%terra config` text (terra/policy.h). Results in bench/results/NAME.{json,md}
(default corpus_configs).
"""
import argparse
import contextlib
import io
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


def child(name, rounds, a, b):
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import torch
    import terra
    import corpus
    torch.set_num_threads(2)
    mod = corpus.load(name)

    def timed(mode):
        if mode != "eager":
            terra.reset()
            terra.configure(a if mode == "A" else b)
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            if mode == "eager":
                mod.main()
            else:
                terra.run(mod.main)
                terra.sync()
            return time.perf_counter() - t

    for m in ("eager", "A", "B"):
        timed(m)
    times = {m: [] for m in ("eager", "A", "B")}
    for r in range(rounds):
        for m in (("eager", "A", "B") if r % 2 == 0 else ("eager", "B", "A")):
            times[m].append(timed(m))
    print(json.dumps({m: statistics.median(v) for m, v in times.items()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help="program name prefixes (default: all)")
    ap.add_argument("--a", required=True, help='settings A, e.g. "adaptive=on"')
    ap.add_argument("--b", required=True, help='settings B, e.g. "adaptive=off"')
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="corpus_configs")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.a, args.b)
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import corpus
    names = [p for p in corpus.PROGRAMS if not args.programs or any(p.startswith(x) for x in args.programs)]
    env = dict(os.environ, TERRA_REMEMBER_PAYOFF="0")
    rows = {}
    for name in names:
        r = subprocess.run([sys.executable, __file__, "--a", args.a, "--b", args.b, "--child", name, str(args.rounds)],
                           env=env, capture_output=True, text=True, check=True)
        rows[name] = json.loads(r.stdout.strip().splitlines()[-1])
        d = rows[name]
        print(f"{name}: eager {d['eager'] * 1e3:.1f} ms, A {d['A'] / d['eager']:.2f}, B {d['B'] / d['eager']:.2f}", flush=True)
    geo = {k: math.exp(statistics.fmean(math.log(d[k] / d["eager"]) for d in rows.values())) for k in ("A", "B")}
    lines = ["# Two Terra settings against eager on the corpus (bench/corpus_configs.py)", "",
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; A: `{args.a}`, B: `{args.b}`; one process per "
             f"program, eager / A / B alternated, {args.rounds} rounds, medians; whole-program wall time over eager's.", "",
             "| program | eager ms | A / eager | B / eager |", "|---|---:|---:|---:|"]
    for name, d in rows.items():
        lines.append(f"| {name} | {d['eager'] * 1e3:.1f} | {d['A'] / d['eager']:.2f} | {d['B'] / d['eager']:.2f} |")
    lines.append(f"| geometric mean | | {geo['A']:.3f} | {geo['B']:.3f} |")
    out = ROOT / "bench" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
