"""The 1x1 chain's program thread and wall time per op, this build against another, in alternated
fresh processes.

bench/per_op.py gives five rounds per size against eager; on the 2-core host of sessions 31-35 a
process lands in a fast or a slow mode (twice the time per op at the same instruction counts), so
comparing two builds of the program thread needs more processes than that. Each pair runs this
build, then the other (`--base`, a build's python directory through PYTHONPATH), each in a fresh
process: per_op.py's chain (50 `z = z + y` on 1x1 tensors per iteration, 2 intra-op threads), 5
iterations traced, then one co-executed session of 10 x 60 iterations (30,000 ops) with the payoff
check off; each reports the program thread's CPU time per op and the wall time per op. Where the
program thread's CPU time is close to the wall time, the program thread was the bottleneck; where
the wall time is well above it, it waited for the GraphRunner.

    .venv/bin/python bench/per_op_pairs.py --base /tmp/base/build/python [--pairs 12] [--name NAME]

Results: bench/results/<name>.md (default per_op_pairs).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SESSIONS, ITERS = 10, 60


def child():
    from per_op import K, chain  # bench/per_op.py (it sets TERRA_ADAPTIVE=0 before terra loads)

    import torch

    import terra
    terra.config(adaptive=False)  # what co-execution itself costs: the payoff check stays off
    torch.set_num_threads(2)
    x, y = torch.randn(1, 1), torch.randn(1, 1)
    marked = terra._instrument(chain)
    terra.run(chain, x, y, 5)  # traced, then co-executed
    ops = SESSIONS * ITERS * K
    terra._enter("chain-pairs", depth=1)
    try:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        for _ in range(SESSIONS):
            marked(x, y, ITERS)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    finally:
        terra._exit()
    print(f"{cpu / ops * 1e6:.3f} {wall / ops * 1e6:.3f}")


def run(pythonpath):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=False, help="PYTHONPATH of the other build's terra package")
    ap.add_argument("--base-label", help="what the other build is (a commit), for the results file")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--name", default="per_op_pairs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    if not args.base:
        ap.error("--base is required")
    rows = []
    for i in range(args.pairs):
        rows.append((run(None), run(args.base)))
        print(f"pair {i + 1}: this prog {rows[-1][0][0]:.2f} wall {rows[-1][0][1]:.2f} | "
              f"base prog {rows[-1][1][0]:.2f} wall {rows[-1][1][1]:.2f}", flush=True)
    import torch
    med = lambda xs: statistics.median(xs)  # noqa: E731
    lines = [f"# Program thread and wall time per op, this build against {args.base_label or args.base}",
             "", f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, torch {torch.__version__}, bench/per_op_pairs.py: "
             f"{args.pairs} pairs of alternated fresh processes, each one co-executed session of "
             f"{SESSIONS} x {ITERS} iterations of 50 `z = z + y` on 1x1 tensors (2 intra-op threads, "
             "payoff check off). µs per op.", "",
             "| pair | this: program thread CPU | this: wall | base: program thread CPU | base: wall |",
             "|---:|---:|---:|---:|---:|"]
    for i, ((tp, tw), (bp, bw)) in enumerate(rows):
        lines.append(f"| {i + 1} | {tp:.2f} | {tw:.2f} | {bp:.2f} | {bw:.2f} |")
    lines.append(f"| median | {med([r[0][0] for r in rows]):.2f} | {med([r[0][1] for r in rows]):.2f} | "
                 f"{med([r[1][0] for r in rows]):.2f} | {med([r[1][1] for r in rows]):.2f} |")
    lines.append(f"| minimum | {min(r[0][0] for r in rows):.2f} | {min(r[0][1] for r in rows):.2f} | "
                 f"{min(r[1][0] for r in rows):.2f} | {min(r[1][1] for r in rows):.2f} |")
    out = Path(__file__).resolve().parent / "results" / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
