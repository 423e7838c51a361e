"""A notebook's epoch loop calling an earlier cell's training function, eager against Terra.

The most common notebook shape: one cell defines `train_one_epoch(model, opt, batches)` with the
loop over the batches, another runs `for epoch in range(E): train_one_epoch(...)`. Here the two
are functions of one file run through `terra.run` (the epoch loop is the run function's, the
batch loop a helper's, as a cell's function is: runtime/python_runner_loops.cpp). Per round, one
fresh process per mode (eager, this build, and with `--base` a baseline build's PYTHONPATH as
bench/ab.py makes one), each timing one whole call of E epochs of S steps (the quick-start
notebook's MLP and Adam), after one untimed eager epoch on another model (imports, the OpenMP
pool): Terra's warm-up is in the timed call. Medians over rounds.

    .venv/bin/python bench/epoch_loop.py [--shape epochs|library] [--base /tmp/base/build/python] [--rounds 5]

`--shape library`: the run function calls a training loop in a module of its own
(bench/unmarked_trainer.py), whose loops no AST pass marks, as a library's Trainer.train;
`--shape imported`: its epoch loop calls that module's function one epoch at a time.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import ab  # noqa: E402


def train_one_epoch(model, opt, loss_fn, batches):
    from bench import unmarked_trainer
    for x, y in batches:  # marked (this file's): the step itself is the other module's
        loss = unmarked_trainer.step(model, opt, loss_fn, x, y)
    return loss


def setup(steps, seed):
    import torch
    from torch import nn
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = [(torch.randn(64, 8), torch.randn(64, 1)) for _ in range(steps)]
    return model, opt, nn.MSELoss(), batches


def fit(epochs, steps, seed=0):
    model, opt, loss_fn, batches = setup(steps, seed)
    for epoch in range(epochs):
        train_one_epoch(model, opt, loss_fn, batches)
    return [p.detach().clone() for p in model.parameters()]


def evaluate(model, loss_fn, batches):
    import torch
    total = 0.0
    with torch.no_grad():
        for x, y in batches:  # marked (this file's), no backward: the notebook's validation loop
            total += loss_fn(model(x), y).item()
    return total / len(batches)


def fit_eval(epochs, steps, seed=0):
    model, opt, loss_fn, batches = setup(steps, seed)
    val = batches[: max(1, steps // 4)]
    for epoch in range(epochs):
        train_one_epoch(model, opt, loss_fn, batches)
        evaluate(model, loss_fn, val)
    return [p.detach().clone() for p in model.parameters()]


def fit_library(epochs, steps, seed=0):
    from bench import unmarked_trainer  # a module of its own: its loops are not marked
    model, opt, loss_fn, batches = setup(steps, seed)
    unmarked_trainer.train(model, opt, loss_fn, batches, epochs)
    return [p.detach().clone() for p in model.parameters()]


def fit_imported(epochs, steps, seed=0):
    from bench import unmarked_trainer  # an imported module's epoch function (a project's utils.py)
    model, opt, loss_fn, batches = setup(steps, seed)
    for epoch in range(epochs):
        unmarked_trainer.train(model, opt, loss_fn, batches, 1)
    return [p.detach().clone() for p in model.parameters()]


SHAPES = {"epochs": fit, "eval": fit_eval, "library": fit_library, "imported": fit_imported}


def child(mode, shape, epochs, steps):
    import torch
    torch.set_num_threads(2)
    program = SHAPES[shape]
    run = program
    if mode == "terra":
        import terra
        run = lambda *a: terra.run(program, *a)  # noqa: E731
    program(1, steps, 1)  # eagerly, in every mode: Terra's warm-up is part of the timed call
    t = time.perf_counter()
    params = run(epochs, steps)
    wall = time.perf_counter() - t
    out = {"wall": wall, "digest": float(sum(p.double().sum() for p in params))}
    if mode == "terra":
        import terra
        s = terra.stats(program.__name__)
        out.update(iterations=sum(s[k] for k in ("iterations_traced", "iterations_coexecuted",
                                                 "iterations_fallback", "iterations_eager")),
                   coexecuted=s["iterations_coexecuted"], nodes=s["nodes"])
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="PYTHONPATH of the baseline build's terra package")
    ap.add_argument("--base-label", default="baseline", help="what the baseline is (a commit)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="epochs",
                    help="epochs: the run function's epoch loop calls a helper with the batch loop; "
                         "library: it calls a module of its own (bench/unmarked_trainer.py) whose loops "
                         "are not marked, as a library's Trainer; imported: the run function's epoch "
                         "loop calls that module's training function for one epoch at a time")
    ap.add_argument("--name", default="epoch_loop", help="results file name under bench/results")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, shape, epochs, steps = args.child
        return child(mode, shape, int(epochs), int(steps))
    builds = {"eager": ("eager", None), "this": ("terra", None)}
    if args.base:
        builds[args.base_label] = ("terra", args.base)
    runs = {b: [] for b in builds}
    for _ in range(args.rounds):
        for b, (mode, path) in builds.items():
            runs[b].append(ab.run_child(__file__, (mode, args.shape, args.epochs, args.steps), path))
    digests = {r["digest"] for rs in runs.values() for r in rs}
    med = statistics.median
    eager = med(r["wall"] for r in runs["eager"])
    rows = []
    for b, rs in runs.items():
        wall = med(r["wall"] for r in rs)
        row = {"build": b, "wall_s": wall, "ms_per_step": wall / (args.epochs * args.steps) * 1e3,
               "speedup": eager / wall, "walls": [r["wall"] for r in rs]}
        for k in ("iterations", "coexecuted", "nodes"):
            if k in rs[0]:
                row[k] = med(r[k] for r in rs)
        rows.append(row)
        print(f"{b:10s} {row['ms_per_step']:.3f} ms/step  {row['speedup']:.2f}x  "
              + " ".join(f"{k}={row[k]}" for k in ("iterations", "coexecuted", "nodes") if k in row), flush=True)
    print("same parameters in every process:", len(digests) == 1)
    import torch
    out = ROOT / "bench" / "results" / args.name
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "shape": args.shape,
            "python": platform.python_version(), "rounds": args.rounds, "epochs": args.epochs,
            "steps": args.steps, "same_parameters": len(digests) == 1,
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)")}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    title = {"epochs": "An epoch loop calling a training function",
             "library": "A training loop in a module of its own (a library's)",
             "imported": "An epoch loop calling an imported module's training function"}[args.shape]
    L = [f"# {title} (bench/epoch_loop.py --shape {args.shape})", "",
         f"{meta['date']}, torch {meta['torch']}, 2 intra-op threads, OMP_WAIT_POLICY {meta['OMP_WAIT_POLICY']}; "
         f"{args.rounds} rounds of fresh processes, one per mode, alternated. One whole call of {args.epochs} "
         f"epochs of {args.steps} steps (MLP 8-64-64-1, Adam, batch 64), after an untimed eager epoch; "
         "medians over rounds. Iterations, co-executed, nodes: the graph's (terra.stats). Parameters "
         f"bitwise the same in every process: {meta['same_parameters']}.", "",
         "| build | ms per step | speedup over eager | iterations | co-executed | nodes |",
         "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        L.append(f"| {r['build']} | {r['ms_per_step']:.3f} | {r['speedup']:.2f}x | {r.get('iterations', '-')} | "
                 f"{r.get('coexecuted', '-')} | {r.get('nodes', '-')} |")
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
