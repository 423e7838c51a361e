"""Step time of every correctness-corpus program (tests/programs) under eager PyTorch and Terra,
measured side by side in one run, and Terra's warm-up.

For each program, rounds alternate an eager run and a Terra run (`terra.run(main)` after
`terra.reset()`, so every Terra run starts cold). Each eager run is in a fresh child process that
never runs Terra (after one untimed run there, for first-call costs), so the baseline is what the
program costs without Terra. Both runs execute the same loop-instrumented `main` (Terra's own AST
marking); in the eager run the marks only record a timestamp, so both sides cut the program into
the same iterations.

- steady-state step: mean step time of the loop with the most iterations under Terra (of those
  taking 20 µs or more per iteration), over the last half of that loop's iterations, so warm-up is excluded on both sides. Eager: time between
  consecutive marks. Terra: from `terra.timeline()`, the time between the completions of
  consecutive iterations, an iteration being complete when both its Python-lane span and the
  GraphRunner's work for it have ended (the pipeline's throughput, not the Python thread's alone);
- whole program: wall time of main(), including Terra's tracing, warm-up and final sync;
- warm-up: iterations before the first co-executed one, and wall time from the first iteration's
  start to that iteration's start;
- co-executed share: co-executed iterations / all iterations Terra ran (traced, co-executed,
  fallen back).
Medians over the rounds. Results: bench/results/corpus_cpu.{json,md} (or --name). Terra runs as
users get it, with the payoff check on (terra/payoff.h); TERRA_ADAPTIVE=0 measures co-execution
alone:

    .venv/bin/python bench/corpus.py [--rounds 3] [program-name-substring ...]
    TERRA_ADAPTIVE=0 .venv/bin/python bench/corpus.py --name corpus_cpu_coexec
    .venv/bin/python bench/corpus.py --threads 1 --name corpus_cpu_1thread  # no OpenMP contention
"""
import argparse
import builtins
import collections
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# Each program's runs time the payoff check's two modes afresh, as on a first run (the engine
# reads its settings when it loads; runtime/payoff_memory.h).
os.environ.setdefault("TERRA_REMEMBER_PAYOFF", "0")
import terra  # noqa: E402
from terra import _loops

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "programs"))
import corpus  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def steady(durations):
    """Mean of the last half of a loop's step durations (seconds), and how many there were.

    The mean, not the median: under Terra the GraphRunner finishes iterations in bursts (it runs
    behind the program thread, then catches up), so most gaps between completions are short and
    their median overstated Terra's throughput many times over where the program thread was the
    bottleneck (corpus p11 showed 0.14x eager's step time; the program thread alone took 1.6x)."""
    if not durations:
        return None
    last = durations[len(durations) // 2:]
    return sum(last) / len(last), len(durations)


def program_marks(main):
    """The loops of main's own file marked for the duration, as terra.run marks them (eager runs
    always use this checkout's terra)."""
    return terra._marking(terra._program_functions(main))


class _Marks:
    """Timestamps of the boundaries terra.run would take: a helper's loop counts only while no
    loop of the run function is open. The rule of PythonRunner::track_loop, for eager runs,
    which have no engine session to ask."""

    def __init__(self):
        self.marks, self.open = [], []  # open: [loop id, is a helper's], innermost last

    def __call__(self, boundary, helper=False):
        exit = boundary & 1
        base = boundary ^ _loops.EXIT if exit else boundary
        at = next((i for i in range(len(self.open) - 1, -1, -1) if self.open[i][0] == base), None)
        if helper and at is None and any(not h for _, h in self.open):
            return
        if at is not None:
            del self.open[at if exit else at + 1:]
        elif not exit:
            self.open.append((boundary, helper))
        elif helper:
            return
        self.marks.append((boundary, time.perf_counter_ns()))


def run_eager(target, loop=None):
    recorder = _Marks()
    marks = recorder.marks
    saved = getattr(builtins, _loops.MARK), getattr(builtins, _loops.HELPER_MARK)
    setattr(builtins, _loops.MARK, recorder)
    setattr(builtins, _loops.HELPER_MARK, lambda boundary: recorder(boundary, helper=True))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            t0 = time.perf_counter()
            target()
            wall = time.perf_counter() - t0
    finally:
        setattr(builtins, _loops.MARK, saved[0])
        setattr(builtins, _loops.HELPER_MARK, saved[1])
    durations = [(end - start) * 1e-9 for (mark, start), (_, end) in zip(marks, marks[1:])
                 if mark == loop]
    return wall, steady(durations)


def run_terra(main):
    terra.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        t0 = time.perf_counter()
        terra.run(main)
        wall = time.perf_counter() - t0
    timeline = terra.timeline()
    its = timeline["iterations"]
    done = {it["index"]: it["end_ns"] for it in its}
    for e in timeline["events"]:
        if e["lane"] == "graph" and e["iteration"] in done:
            done[e["iteration"]] = max(done[e["iteration"]], e["end_ns"])
    # The loop with the most iterations, of those whose iterations take 20 µs or more on average:
    # a loop of a few microseconds per iteration (corpus p13, p27) gave ratios of 150-1500 that
    # say nothing about the program.
    count, spent = collections.Counter(), collections.Counter()
    for it in its:
        count[it["loop"]] += 1
        spent[it["loop"]] += it["end_ns"] - it["start_ns"]
    real = [l for l in count if spent[l] >= 20_000 * count[l]] or list(count)
    loop = max(real, key=lambda l: count[l])
    mine = [it for it in its if it["loop"] == loop]
    # The pipeline has finished an iteration once it has finished every one before it too: an
    # eager iteration's Python can end before the GraphRunner finishes the co-executed one before
    # it (corpus p23 once measured a negative mean step that way).
    finished = 0
    for it in mine:
        finished = done[it["index"]] = max(done[it["index"]], finished)
    durations = [(done[b["index"]] - done[a["index"]]) * 1e-9 for a, b in zip(mine, mine[1:])
                 if b["index"] == a["index"] + 1]
    first = next((i for i, it in enumerate(its) if it["mode"] == "coexec"), None)
    warm_iters = first if first is not None else len(its)
    warm_s = (its[first]["start_ns"] - its[0]["start_ns"]) * 1e-9 if first is not None else None
    coexec = sum(it["mode"] == "coexec" for it in its)
    eager = sum(it["mode"] == "eager" for it in its)  # eager because faster (terra/payoff.h)
    return (wall, steady(durations), warm_iters, warm_s, coexec / max(1, len(its)), len(its), loop,
            eager / max(1, len(its)))


def eager_child(name, loop, threads):
    """In a fresh process: one untimed eager run, then the timed one; prints it as JSON."""
    torch.set_num_threads(threads)
    main = corpus.load(name).main
    target = terra._instrument(main) or main
    with program_marks(main):
        run_eager(target, loop)
        print(json.dumps(run_eager(target, loop)))


def run_eager_fresh(name, loop):
    out = subprocess.run([sys.executable, __file__, "--eager-child", name, str(loop),
                          "--threads", str(torch.get_num_threads())],
                         check=True, capture_output=True, text=True).stdout
    wall, step = json.loads(out.strip().splitlines()[-1])
    return wall, tuple(step) if step else None


def measure(name, rounds):
    main = corpus.load(name).main
    eager, tr = [], []
    loop = run_terra(main)[6]  # untimed: first-call costs (lazy initialisation)
    for _ in range(rounds):
        eager.append(run_eager_fresh(name, loop))
        tr.append(run_terra(main))
    med = statistics.median
    e_steps = [r[1][0] for r in eager if r[1]]
    t_steps = [r[1][0] for r in tr if r[1]]
    e_step = med(e_steps) if e_steps else None
    t_step = med(t_steps) if t_steps and e_step else None
    warm_s = [r[3] for r in tr if r[3] is not None]
    return {
        "program": name,
        "iterations": tr[0][5],
        "loop_iterations": eager[0][1][1] if eager[0][1] else 0,
        "eager_step_ms": e_step * 1e3 if t_step else None,
        "terra_step_ms": t_step * 1e3 if t_step else None,
        "step_ratio": t_step / e_step if t_step else None,
        "eager_wall_s": med(r[0] for r in eager),
        "terra_wall_s": med(r[0] for r in tr),
        "wall_ratio": med(r[0] for r in tr) / med(r[0] for r in eager),
        "warmup_iterations": med(r[2] for r in tr),
        "warmup_s": med(warm_s) if warm_s else None,
        "coexec_share": med(r[4] for r in tr),
        "eager_share": med(r[7] for r in tr),
    }


def write(rows, args):
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rounds": args.rounds,
        "adaptive": terra.config()["adaptive"],
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "programs": rows}, indent=1))
    geo = lambda xs: statistics.geometric_mean(xs) if xs else float("nan")  # noqa: E731
    lines = [
        "# Correctness corpus: step time under eager and Terra (CPU)",
        "",
        f"Generated by `bench/corpus.py` ({meta['date']}, torch {meta['torch']}, {meta['machine']}, "
        f"{args.rounds} interleaved rounds, medians; eager in fresh processes that never ran Terra). "
        "Ratio = Terra / eager (lower is faster). "
        "Steady step: mean over the last half of the iterations of the loop with the most iterations (of those taking 20 µs or more each). Warm-up: iterations and wall time "
        "before the first co-executed iteration. "
        + ("Payoff check on (the default): loops whose co-execution measured slower run eagerly "
           "(column 'eager, faster')." if meta["adaptive"] else
           "Payoff check off (TERRA_ADAPTIVE=0): co-execution wherever the trace allows, whatever "
           "its speed."),
        "",
        "| program | iterations | co-executed | eager, faster | eager ms/step | Terra ms/step | step ratio | whole-program ratio | warm-up iterations | warm-up ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        warm = f"{r['warmup_s'] * 1e3:.1f}" if r["warmup_s"] is not None else "never"
        step = (f"{r['eager_step_ms']:.3f} | {r['terra_step_ms']:.3f} | {r['step_ratio']:.2f}"
                if r["step_ratio"] else "n/a | n/a | n/a (too few steady iterations)")
        lines.append(
            f"| {r['program']} | {r['iterations']} | {r['coexec_share'] * 100:.0f}% | "
            f"{r.get('eager_share', 0) * 100:.0f}% | {step} | "
            f"{r['wall_ratio']:.2f} | {r['warmup_iterations']:.0f} | {warm} |")
    lines += [
        "",
        f"Geometric mean step ratio {geo([r['step_ratio'] for r in rows if r['step_ratio']]):.2f}, "
        f"whole-program ratio {geo([r['wall_ratio'] for r in rows]):.2f}; faster than eager in steady "
        f"state on {sum((r['step_ratio'] or 9) < 1 for r in rows)} of {len(rows)} programs.",
        "",
    ]
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("only", nargs="*", help="substrings of program names to run")
    parser.add_argument("--name", default="corpus_cpu", help="results file name under bench/results")
    parser.add_argument("--threads", type=int, default=2,
                        help="intra-op threads (torch.set_num_threads) on both sides (default 2)")
    parser.add_argument("--eager-child", nargs=2, metavar=("NAME", "LOOP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eager_child:
        eager_child(args.eager_child[0], int(args.eager_child[1]), args.threads)
        return
    torch.set_num_threads(args.threads)
    names = [n for n in corpus.PROGRAMS if not args.only or any(s in n for s in args.only)]
    rows = []
    for name in names:
        t0 = time.perf_counter()
        rows.append(measure(name, args.rounds))
        r = rows[-1]
        print(f"{name}: step ratio {r['step_ratio'] or float('nan'):.2f}, whole {r['wall_ratio']:.2f}, "
              f"co-executed {r['coexec_share'] * 100:.0f}% ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr)
    write(rows, args)


if __name__ == "__main__":
    main()
