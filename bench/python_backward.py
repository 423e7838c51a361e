"""A training loop whose backward runs Python (a custom autograd.Function, optionally a tensor hook)
under eager PyTorch, Terra with its payoff check, and Terra with co-execution forced, alternated in
one process: whole-loop wall time, medians.

    .venv/bin/python bench/python_backward.py [--hook] [--rounds 5] [--steps 60] [--fresh]

`--fresh`: each mode in a fresh process of its own instead (eager in a process that never ran
Terra), the three alternated per round; each process times one untimed and three timed runs and
reports their median, and the table gives the median over rounds.

Prints one JSON line: milliseconds per mode. Such a graph is held eager before any check
(terra::Payoff::hold_eager_first); `forced` (adaptive=off) shows what co-executing it costs.
"""
import argparse
import contextlib
import io
import json
import statistics
import time

import torch
import torch.nn as nn

import terra


class RoundThrough(torch.autograd.Function):  # a straight-through estimator
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g


def train(steps, hook):
    torch.manual_seed(0)
    m1, m2 = nn.Linear(16, 64), nn.Linear(64, 1)
    if hook:
        m2.weight.register_hook(lambda g: g * 0.5)
    opt = torch.optim.SGD(list(m1.parameters()) + list(m2.parameters()), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    for s in range(steps):
        h = RoundThrough.apply(torch.tanh(m1(x)) * 3)
        loss = ((m2(h) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s % 10 == 0:
            print(loss.item())
    return m1.weight


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hook", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # a --fresh child: this mode alone
    a = ap.parse_args()
    torch.set_num_threads(2)
    terra.config(remember_payoff=False)

    def timed(mode):
        if mode != "eager":
            terra.reset()
            terra.config(adaptive=mode == "terra")
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            if mode == "eager":
                train(a.steps, a.hook)
            else:
                terra.run(train, a.steps, a.hook)
                terra.sync()
            return (time.perf_counter() - t) * 1e3

    if a.fresh:
        import subprocess
        import sys
        flags = ["--steps", str(a.steps)] + (["--hook"] if a.hook else [])
        per = {m: [] for m in ("eager", "terra", "forced")}
        for _ in range(a.rounds):
            for m in per:
                out = subprocess.run([sys.executable, __file__, "--only", m, "--rounds", "3", *flags],
                                     capture_output=True, text=True, check=True).stdout
                per[m].append(json.loads(out.strip().splitlines()[-1])[m])
        print(json.dumps({m: round(statistics.median(v), 2) for m, v in per.items()}))
        return
    modes = (a.only,) if a.only else ("eager", "terra", "forced")
    for m in modes:
        timed(m)
    times = {m: [] for m in modes}
    for _ in range(a.rounds):
        for m in modes:
            times[m].append(timed(m))
    print(json.dumps({m: round(statistics.median(v), 2) for m, v in times.items()}))


if __name__ == "__main__":
    main()
