"""Short notebook calls: a few training steps per `terra.run`, again and again in one process.

A notebook cell often trains a handful of steps, looks at the result and runs again. Each call is
a Terra session of its own (it enters co-execution at its first iterations and leaves at its
end), so what a session costs to enter and leave counts against every call, where the long runs
(bench/long_run.py) see it once. Per program and call length, a child process makes the program,
runs CALLS calls of STEPS steps (eager: `train` itself; terra: `terra.run(train, ...)` plus
`terra.sync()`), and reports the median wall time per call after the first WARM calls and the
first call's time. Eager, Terra and an optional variant (`--variant VAR=VALUE`, another build
through PYTHONPATH) run in fresh processes, interleaved in each round; the table gives medians
over rounds. Terra's payoff check starts afresh in each process (TERRA_REMEMBER_PAYOFF=0: a
program's first run on a machine); `--remembered` adds Terra run again after an untimed run of
the same program filled a cache directory of its own (runtime/payoff_memory.h: a notebook
restarted, a script launched again). Results: bench/results/short_calls.{json,md} (`--name` for
another name).

    .venv/bin/python bench/short_calls.py [--rounds 3] [--steps 5,25] [--variant PYTHONPATH=...] [--remembered]
"""
import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from ab import benchmark_program, run_child  # bench/ab.py: a program's steps; a fresh process

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("tabular_mlp", "rl_cartpole", "gpt", "music_transformer", "dcgan", "bert")
CALLS, WARM = 14, 4


def child(mode, name, steps, threads):
    run = benchmark_program(name, "eager" if mode == "eager" else "terra", threads)
    import terra
    times = []
    for _ in range(CALLS):
        t = time.perf_counter()
        run(steps)
        if mode != "eager":
            terra.sync()
        times.append(time.perf_counter() - t)
    print(json.dumps({"first_ms": times[0] * 1e3, "call_ms": statistics.median(times[WARM:]) * 1e3}))


def run_mode(mode, name, steps, threads, variant, caches=None):
    env = {}  # run_child: the payoff check remembers nothing unless asked (a first run)
    if mode == "variant":
        key, _, value = variant.partition("=")
        env[key] = value
    if mode == "remembered":
        env.update(TERRA_REMEMBER_PAYOFF="1", TERRA_CACHE_DIR=caches[(name, steps)])
    child_mode = "terra" if mode == "remembered" else mode
    return run_child(__file__, (child_mode, name, steps, threads), env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="5,25")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--variant", help="VAR=VALUE: Terra again with this environment variable, same rounds")
    ap.add_argument("--remembered", action="store_true",
                    help="Terra again, each program after an untimed run that filled its own cache directory")
    ap.add_argument("--name", default="short_calls")
    ap.add_argument("--child", nargs=4)
    args = ap.parse_args()
    if args.child:
        mode, name, steps, threads = args.child
        child(mode, name, int(steps), int(threads))
        return
    modes = ("eager", "terra") + (("variant",) if args.variant else ()) + (("remembered",) if args.remembered else ())
    programs = args.programs.split(",")
    steps_list = [int(s) for s in args.steps.split(",")]
    caches = {}
    if args.remembered:
        root = tempfile.mkdtemp(prefix="terra-short-calls-")
        for name in programs:
            for steps in steps_list:
                caches[(name, steps)] = os.path.join(root, f"{name}-{steps}")
                run_mode("remembered", name, steps, args.threads, args.variant, caches)  # fills it
    runs = {}
    for r in range(args.rounds):
        for name in programs:
            for steps in steps_list:
                for mode in modes:
                    res = run_mode(mode, name, steps, args.threads, args.variant, caches)
                    runs.setdefault(f"{name}/{steps}/{mode}", []).append(res)
                    print(f"round {r + 1} {name} {steps} steps {mode}: {res['call_ms']:.2f} ms/call "
                          f"(first {res['first_ms']:.1f})", flush=True)
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("call_ms", "first_ms")} for k, v in runs.items()}
    doc = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
           "variant": args.variant, "remembered": args.remembered, "rounds": args.rounds, "calls": CALLS, "warm": WARM,
           "runs": runs, "medians": med, "date": time.strftime("%Y-%m-%d %H:%M")}
    out = ROOT / "bench" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Short calls: {CALLS} `terra.run` calls per process, median after the first {WARM}",
             "", f"{doc['date']}, {args.threads} intra-op threads, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, {args.rounds} rounds (medians over rounds), "
             "eager and Terra each in fresh processes, interleaved per round. Ratio: eager's time per call "
             "over Terra's (above 1: Terra faster). `bench/short_calls.py`.", ""]
    head = "| program | steps/call | eager ms/call | Terra ms/call | speedup | Terra first call ms |"
    sep = "|---|---:|---:|---:|---:|---:|"
    if args.variant:
        head += " variant ms/call | variant speedup |"
        sep += "---:|---:|"
    if args.remembered:
        head += " remembered ms/call | remembered speedup | remembered first call ms |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    ratios = {m: [] for m in modes[1:]}
    for name in programs:
        for steps in steps_list:
            e = med[f"{name}/{steps}/eager"]["call_ms"]
            t = med[f"{name}/{steps}/terra"]
            ratios["terra"].append(e / t["call_ms"])
            row = f"| {name} | {steps} | {e:.2f} | {t['call_ms']:.2f} | {e / t['call_ms']:.2f} | {t['first_ms']:.1f} |"
            if args.variant:
                v = med[f"{name}/{steps}/variant"]["call_ms"]
                ratios["variant"].append(e / v)
                row += f" {v:.2f} | {e / v:.2f} |"
            if args.remembered:
                w = med[f"{name}/{steps}/remembered"]
                ratios["remembered"].append(e / w["call_ms"])
                row += f" {w['call_ms']:.2f} | {e / w['call_ms']:.2f} | {w['first_ms']:.1f} |"
            lines.append(row)
    label = {"terra": "Terra", "variant": f"variant ({args.variant})",
             "remembered": "Terra with an earlier run's choices"}
    for m, xs in ratios.items():
        lines += ["", f"Geometric mean speedup, {label[m]}: {statistics.geometric_mean(xs):.2f}"]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
