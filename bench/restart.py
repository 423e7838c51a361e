"""A program run again: one `terra.run` of STEPS steps in a fresh process, as a script launched
again or a notebook restarted and run again, with and without the payoff check's choices from an
earlier run (terra_core/runtime/payoff_memory.h).

Per program and round, fresh processes each make the program and time one call of STEPS steps
(eager: `train` itself; Terra: `terra.run(train, ...)` plus `terra.sync()`), its wall time
whole (first-call costs included, as a user sees them). Modes: eager; Terra afresh
(TERRA_REMEMBER_PAYOFF=0: the check times both modes, as on a program's first run); Terra
remembering (a cache directory of its own per program, filled by one untimed Terra run before
the rounds; each timed run then also stores its own checks there, as runs again and again do).
The one-thread verdicts stay in the default cache directory for the afresh mode and are filled
by that untimed run for the other, so both start with them. Modes interleave in each round;
medians over rounds. Results: bench/results/restart.{json,md} (`--name` for another name).

    .venv/bin/python bench/restart.py [--rounds 3] [--steps 60] [program ...]
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
PROGRAMS = ("tabular_mlp", "rnn_lengths", "rl_cartpole", "bert", "stochastic_depth", "resnet", "dropblock",
            "hf_gpt2", "hf_bert", "dcgan", "gpt", "music_transformer", "hf_llama", "detector_numpy_nms",
            "stochastic_downsampling")
MODES = ("eager", "afresh", "remembered")


def child(mode, name, steps, threads):
    run = benchmark_program(name, "eager" if mode == "eager" else "terra", threads)
    import terra
    t = time.perf_counter()
    run(steps)
    if mode != "eager":
        terra.sync()
    wall = time.perf_counter() - t
    out = {"ms": wall * 1e3}
    if mode != "eager":
        s = terra.stats()
        out.update(coexecuted=s["iterations_coexecuted"], eager_chosen=s["iterations_eager_chosen"],
                   traced=s["iterations_traced"],
                   remembered=any(terra._c().stats(g)["payoff"]["remembered"] for g in terra._c().graphs()),
                   pairing_remembered=any(terra._c().stats(g)["payoff"]["pairing_remembered"] for g in terra._c().graphs()))
    print(json.dumps(out))


def run_mode(mode, name, steps, threads, cache):
    env = {"TERRA_REMEMBER_PAYOFF": "1", "TERRA_CACHE_DIR": cache} if mode == "remembered" else {}
    return run_child(__file__, (mode, name, steps, threads), env=env)  # the others: remembers none


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="restart")
    ap.add_argument("--child", nargs=4)
    ap.add_argument("programs", nargs="*")
    args = ap.parse_args()
    if args.child:
        mode, name, steps, threads = args.child
        child(mode, name, int(steps), int(threads))
        return
    programs = args.programs or list(PROGRAMS)
    root = tempfile.mkdtemp(prefix="terra-restart-")
    caches = {name: os.path.join(root, name) for name in programs}
    for name in programs:
        run_mode("remembered", name, args.steps, args.threads, caches[name])  # fills its directory
    runs = {}
    for r in range(args.rounds):
        for name in programs:
            for mode in MODES:
                res = run_mode(mode, name, args.steps, args.threads, caches[name])
                runs.setdefault(f"{name}/{mode}", []).append(res)
                print(f"round {r + 1} {name} {mode}: {res['ms']:.1f} ms "
                      f"{ {k: v for k, v in res.items() if k != 'ms'} }", flush=True)
    med = {k: statistics.median(x["ms"] for x in v) for k, v in runs.items()}
    doc = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
           "steps": args.steps, "rounds": args.rounds, "runs": runs, "medians": med,
           "date": time.strftime("%Y-%m-%d %H:%M")}
    out = ROOT / "bench" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# A program run again: one call of {args.steps} steps in a fresh process", "",
             f"{doc['date']}, {args.threads} intra-op threads, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, {args.rounds} rounds (medians), modes interleaved "
             "per round, each run its own process, whole-call wall time (first-call costs included). "
             "Afresh: the payoff check times both modes (TERRA_REMEMBER_PAYOFF=0); remembered: it starts "
             "from the choices an earlier run stored (runtime/payoff_memory.h). Speedup: eager's time over "
             "Terra's. Co-executed / eager-chosen: the last round's iterations. `bench/restart.py`.", "",
             "| program | eager ms | afresh ms | afresh speedup | remembered ms | remembered speedup | "
             "afresh co-exec/eager | remembered co-exec/eager |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = {"afresh": [], "remembered": []}
    for name in programs:
        e, a, m = (med[f"{name}/{mode}"] for mode in MODES)
        ratios["afresh"].append(e / a)
        ratios["remembered"].append(e / m)
        la, lm = runs[f"{name}/afresh"][-1], runs[f"{name}/remembered"][-1]
        lines.append(f"| {name} | {e:.1f} | {a:.1f} | {e / a:.2f} | {m:.1f} | {e / m:.2f} | "
                     f"{la['coexecuted']}/{la['eager_chosen']} | {lm['coexecuted']}/{lm['eager_chosen']} |")
    lines += ["", f"Geometric mean speedup, afresh: {statistics.geometric_mean(ratios['afresh']):.2f}; "
              f"remembered: {statistics.geometric_mean(ratios['remembered']):.2f}"]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
