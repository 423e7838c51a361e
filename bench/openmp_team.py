"""Eager ops in a process that co-executed first, against a fresh process, side by side.

Terra's GraphRunner is a second thread that runs intra-op parallel kernels. With libgomp, every
thread that starts a parallel region keeps a pool of workers; two pools on a 2-core machine make
libgomp stop spinning, and every parallel region of the program thread becomes a futex hand-off.
Terra keeps one team per process (terra_core/runtime/openmp_team.h). This benchmark checks it as a
user would: time eager ops (a small linear, a 256x256 matmul, a conv, a 100k reduction) in

- fresh:  a new process that never ran Terra;
- after:  a new process that first co-executed a training loop with 512x512 matmuls (large
          enough for intra-op threads in the GraphRunner), then left Terra (`terra` is off again);
- traced: timed inside a Terra session that only traces (the program thread runs the ops while
          Terra records them), in a fresh process and in one that co-executed first: the
          ratio of the two isolates the teams from the cost of tracing itself.

Each round starts the three processes in turn (interleaved); medians over rounds of each
process's best-of-5 per-op time. Results: bench/results/openmp_team.{json,md}.
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = 5
# The "after" process must really co-execute its loop: the payoff check (terra/payoff.h) stays off.
os.environ["TERRA_ADAPTIVE"] = "0"


def ops():
    import torch
    import torch.nn.functional as F
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    a = torch.randn(256, 256)
    img, k = torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3)
    r = torch.randn(100_000)
    return {"linear 8x16->32": (lambda: F.linear(x, w, b), 20000),
            "matmul 256x256": (lambda: a @ a, 300),
            "conv2d 8x16x32x32 3x3": (lambda: F.conv2d(img, k, padding=1), 60),
            "sum 100k": (lambda: r.sum(), 3000)}


def time_ops():
    out = {}
    for name, (fn, n) in ops().items():
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        out[name] = best * 1e6
    return out


def coexecute_first():
    import torch
    import terra
    w = torch.randn(512, 512, requires_grad=True)
    x = torch.randn(512, 512)
    opt = torch.optim.SGD([w], lr=1e-4)

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            loss = (x @ w).relu().mean()
            loss.backward()
            opt.step()
    terra.run(train, 12)
    st = terra.stats()
    assert st["iterations_coexecuted"] > 0, st
    return st


def child(mode):
    import torch
    torch.set_num_threads(2)
    if mode == "fresh":
        result = time_ops()
    elif mode == "after":
        coexecute_first()
        result = time_ops()
    else:  # traced_*: eager ops inside a session that never co-executes (trace-only policy)
        import terra
        if mode == "traced_after":
            coexecute_first()
        terra.config(enabled=False)
        with terra.coexecute("traced"):
            result = time_ops()
    print(json.dumps(result))


def main():
    modes = ("fresh", "after", "traced_fresh", "traced_after")
    runs = {m: [] for m in modes}
    for _ in range(ROUNDS):
        for m in modes:
            out = subprocess.run([sys.executable, __file__, "--child", m], check=True,
                                 capture_output=True, text=True).stdout
            runs[m].append(json.loads(out.strip().splitlines()[-1]))
    names = list(runs["fresh"][0])
    med = {m: {n: statistics.median(r[n] for r in runs[m]) for n in names} for m in modes}
    import torch
    out = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": ROUNDS, "median_us": med,
           "runs_us": runs}
    results = Path(__file__).resolve().parent / "results"
    (results / "openmp_team.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Eager ops after co-execution vs a fresh process (CPU)", "",
             f"torch {out['torch']}, 2 intra-op threads, {ROUNDS} interleaved rounds of fresh "
             "processes, medians of each process's best-of-5 (µs per op). `after`: the process "
             "first co-executed a 512x512 training loop, then left Terra; `traced`: timed inside "
             "a trace-only Terra session (includes tracing's own cost), fresh vs after co-execution.", "",
             "| op | fresh µs | after co-execution µs | ratio | traced, fresh µs | traced, after µs | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        f, a = med["fresh"][n], med["after"][n]
        tf, ta = med["traced_fresh"][n], med["traced_after"][n]
        lines.append(f"| {n} | {f:.2f} | {a:.2f} | {a / f:.2f} | {tf:.2f} | {ta:.2f} | {ta / tf:.2f} |")
    (results / "openmp_team.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
