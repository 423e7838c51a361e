"""Two builds of Terra against each other and against eager, on corpus programs, each run in a
fresh process, in interleaved rounds.

`bench/corpus.py` times Terra in one long-lived process that idles while each eager child runs;
on this 2-core host its ratios swing by 1.5x between two runs of the same build, and which mode
the payoff check picks swings with them. A change is judged here instead: per round, one fresh
eager process and one fresh process per build, each running the program three times (one
untimed, then the median of two), so builds differ only in the `terra` package they import.

    # a baseline build of an earlier commit (its extension and Python package), once:
    git worktree add /tmp/base <commit> && cmake -S /tmp/base -B /tmp/base/build \\
        -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$PWD/.venv/bin/python && \\
        cmake --build /tmp/base/build -j2 --target terra_python
    .venv/bin/python bench/ab.py --base /tmp/base/build/python [--rounds 3] [program-substring ...]

`--idle S` sleeps S seconds before each timed run, in every mode: the machine idles first, as it
does between two notebook cells. On this 2-vCPU VM an idle second slowed Terra far more than
eager (corpus p05, 6 runs each: back to back, Terra 32 ms against eager's 35; after an idle
second, 58 against 37), and the back-to-back runs above cannot show it.

Prints, per program, eager's steady step and each build's steady-step and whole-program ratios
to eager (medians over rounds; same definitions as bench/corpus.py) and co-executed share, then
geometric means; `--out` writes them as JSON.
"""
import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(name, mode, loop):
    """In a fresh process: the program eagerly or under Terra, as bench/corpus.py times it."""
    spec = importlib.util.spec_from_file_location("bench_corpus", ROOT / "bench" / "corpus.py")
    bc = importlib.util.module_from_spec(spec)
    sys.argv = sys.argv[:1]
    spec.loader.exec_module(bc)
    import terra
    main = bc.corpus.load(name).main
    med = statistics.median
    idle = float(os.environ.get("TERRA_AB_IDLE", "0"))

    def after_idle(run, *a):
        time.sleep(idle)
        return run(*a)

    if mode == "eager":
        target = terra._instrument(main) or main
        # The loops Terra marks (terra.run: main's and its file's functions'), timestamped alone.
        with bc.program_marks(main):
            bc.run_eager(target, loop)
            runs = [after_idle(bc.run_eager, target, loop) for _ in range(2)]
        steps = [r[1][0] for r in runs if r[1]]
        out = {"wall": med(r[0] for r in runs), "step": med(steps) if steps else None}
    else:
        first = bc.run_terra(main)
        runs = [after_idle(bc.run_terra, main) for _ in range(2)]
        # A run whose steady loop had no two consecutive iterations (nested loops interleave
        # them) has no step time; the program's step ratio is then left out, not a crash.
        steps = [r[1][0] for r in runs if r[1]]
        out = {"wall": med(r[0] for r in runs), "step": med(steps) if steps else None,
               "loop": first[6], "coexec": med(r[4] for r in runs)}
    print(json.dumps(out))


def run_child(script, args, pythonpath=None, env=None):
    """`script --child *args` in a fresh process (PYTHONPATH `pythonpath`, more variables `env`);
    the JSON object its last line prints."""
    environ = dict(os.environ, **(env or {}))
    environ.setdefault("TERRA_REMEMBER_PAYOFF", "0")  # a first run: the payoff check times afresh
    if pythonpath:
        environ["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, str(script), "--child", *map(str, args)], env=environ,
                         capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode:
        raise SystemExit(f"{' '.join(map(str, args))} ({pythonpath or 'this build'}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def benchmark_program(name, mode, threads=2):
    """In a child: bench/programs/<name> made with seed 0, `threads` intra-op threads, and a
    function running k of its steps eagerly or through terra.run (`mode` "terra"); `mode` "both":
    the two functions, (eager, terra), on one state."""
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(threads)
    prog = importlib.import_module("bench.programs." + name)
    state = prog.make(0)

    def eager(k):
        prog.train(state, k)

    def through_terra(k):
        import terra
        terra.run(prog.train, state, k)

    return {"eager": eager, "terra": through_terra, "both": (eager, through_terra)}[mode]


def spawn(name, mode, pythonpath=None, loop=-1):
    return run_child(__file__, (name, mode, loop), pythonpath)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*", help="substrings of corpus program names (default: all)")
    ap.add_argument("--base", required=False, help="PYTHONPATH of the baseline build's terra package")
    ap.add_argument("--base-label", help="what the baseline is (a commit), for the results file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="seconds of idling before each timed run (between notebook cells)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.idle:
        os.environ["TERRA_AB_IDLE"] = str(args.idle)  # the children read it
    if args.child:
        name, mode, loop = args.child
        return child(name, mode, int(loop))
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import corpus
    names = [n for n in corpus.PROGRAMS if not args.programs or any(p in n for p in args.programs)]
    builds = {"base": args.base, "this": None} if args.base else {"this": None}
    med = statistics.median
    rows = []
    for name in names:
        loop = spawn(name, "terra")["loop"]
        eager, runs = [], {b: [] for b in builds}
        for _ in range(args.rounds):
            eager.append(spawn(name, "eager", loop=loop))
            for b, path in builds.items():
                runs[b].append(spawn(name, "terra", path))
        e_steps = [r["step"] for r in eager if r["step"] is not None]
        e_step = med(e_steps) if e_steps else None
        e_wall = med(r["wall"] for r in eager)
        row = {"program": name, "eager_step_ms": e_step * 1e3 if e_step else None}
        line = f"{name:34s} eager {e_step * 1e3 if e_step else 0:7.3f} ms"
        for b in builds:
            steps = [r["step"] for r in runs[b] if r["step"] is not None]
            row[b] = {"step_ratio": med(steps) / e_step if steps and e_step else None,
                      "wall_ratio": med(r["wall"] for r in runs[b]) / e_wall,
                      "coexec_share": med(r["coexec"] for r in runs[b])}
            line += (f" | {b} step {fmt(row[b]['step_ratio'])} whole {row[b]['wall_ratio']:.2f}"
                     f" co {row[b]['coexec_share'] * 100:.0f}%")
        rows.append(row)
        print(line, flush=True)
    geo = statistics.geometric_mean
    for b in builds:
        print(f"{b}: geometric mean step ratio {geo_of(rows, b, 'step_ratio'):.3f}, "
              f"whole-program {geo(r[b]['wall_ratio'] for r in rows):.3f}")
    if args.out:
        write(Path(args.out), rows, builds, args)


def fmt(ratio):
    return "-" if ratio is None else f"{ratio:.2f}"


def geo_of(rows, build, key):
    """Geometric mean of a ratio over the programs that have it."""
    # A ratio of 0 (a steady step measured as no time at all) is left out, as a missing one is.
    return statistics.geometric_mean(r[build][key] for r in rows if r[build][key])


def write(out, rows, builds, args):
    """`out`.json with the rows, `out`.md with the table."""
    import torch  # loaded by the corpus programs already; here for its version
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "rounds": args.rounds,
            "base": args.base_label or args.base, "idle_s": args.idle}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    geo = statistics.geometric_mean
    head = "| program | eager ms/step | " + " | ".join(
        f"{b} step | {b} whole | {b} co-executed" for b in builds) + " |"
    lines = [f"# Terra builds side by side against eager (bench/ab.py)", "",
             f"{meta['date']}, torch {meta['torch']}, {meta['machine']}, {args.rounds} interleaved "
             f"rounds of fresh processes (eager, then each build), medians; ratios to eager, lower "
             f"is faster; {args.idle:g} s idle before each timed run. base: {meta['base'] or '-'}; this: the checkout's build.", "", head,
             "|---|---:|" + "---:|---:|---:|" * len(builds)]
    for r in rows:
        e_ms = f"{r['eager_step_ms']:.3f}" if r["eager_step_ms"] else "-"
        lines.append(f"| {r['program']} | {e_ms} | " + " | ".join(
            f"{fmt(r[b]['step_ratio'])} | {r[b]['wall_ratio']:.2f} | {r[b]['coexec_share'] * 100:.0f}%"
            for b in builds) + " |")
    lines += ["", "Geometric means: " + "; ".join(
        f"{b} step {geo_of(rows, b, 'step_ratio'):.3f}, whole "
        f"{geo(r[b]['wall_ratio'] for r in rows):.3f}" for b in builds) + "."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
