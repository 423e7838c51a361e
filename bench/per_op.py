"""Per-op cost of the PythonRunner during co-execution, against an eager op, side by side.

For a chain of K elementwise ops per iteration on tensors of a given size:
- eager:        wall time per op of the plain loop;
- terra issue:  time the program thread spends per op while co-executing (the GraphRunner runs
                the same ops concurrently; measured up to the last op issued, before waiting);
- terra total:  wall time per op including waiting for the GraphRunner to finish.
Repeated and interleaved; medians are reported. Results go to bench/results/per_op.{json,md}.
"""
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import terra

K, ITERS, REPEATS = 50, 60, 7


def chain(x, y, iters):
    for _ in range(iters):
        z = x
        for _ in range(K):
            z = z + y
    return z


def measure(size):
    x, y = torch.randn(size, size), torch.randn(size, size)
    eager, issue, total = [], [], []
    terra.run(chain, x, y, 5)  # warm-up: trace and build the graph
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        chain(x, y, ITERS)
        eager.append((time.perf_counter() - t0) / (K * ITERS))
        t0 = time.perf_counter()
        terra._enter("chain-bench", depth=1)
        try:
            chain_marked(x, y, ITERS)
            t1 = time.perf_counter()
        finally:
            terra._exit()
        t2 = time.perf_counter()
        issue.append((t1 - t0) / (K * ITERS))
        total.append((t2 - t0) / (K * ITERS))
    med = statistics.median
    return {"size": size, "eager_us": med(eager) * 1e6, "terra_issue_us": med(issue) * 1e6,
            "terra_total_us": med(total) * 1e6,
            "stats": {k: v for k, v in terra.stats("chain-bench").items() if k.startswith(("iter", "ops"))}}


chain_marked = terra._instrument(chain)


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads())
    rows = [measure(size) for size in (1, 64, 256)]
    out = {"machine": platform.processor() or platform.machine(), "cores": torch.get_num_threads(),
           "torch": torch.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d"), "ops_per_iteration": K, "rows": rows}
    results = Path(__file__).resolve().parent / "results"
    (results / "per_op.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Per-op cost of co-execution (CPU)", "",
             f"torch {out['torch']}, {out['cores']} intra-op threads, {K} chained `z = z + y` per iteration, "
             f"medians of {REPEATS} interleaved runs.", "",
             "| tensor | eager µs/op | Terra: program thread µs/op | Terra: total µs/op | total vs eager |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']}x{r['size']} | {r['eager_us']:.2f} | {r['terra_issue_us']:.2f} | "
                     f"{r['terra_total_us']:.2f} | {r['eager_us'] / r['terra_total_us']:.2f}x |")
    (results / "per_op.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
