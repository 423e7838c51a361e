"""What the second core costs the program thread: the 1x1 add chain of bench/per_op.py, co-executed
in fresh processes on both cores and with the process pinned to one core (`os.sched_setaffinity`),
in interleaved rounds. Pinned, the two threads take turns on one core and never fetch a cache line
from the other one, so the difference in the program thread's CPU time per op is what lines
moving between the cores cost it (session 14: 1.42 against 0.71 µs per op). Wall times are not
comparable between the two (pinned, the threads share one core); eager runs on both cores.
Results: bench/results/cross_core.{json,md}.
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = 5


def main():
    import torch
    runs = {"eager": [], "terra, two cores": [], "terra, one core": []}
    for _ in range(ROUNDS):
        for label in runs:
            mode = "eager" if label == "eager" else "terra"
            pin = "one core" in label
            cmd = [sys.executable, str(HERE / "per_op.py"), "--child", mode, "1", "2"]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                 preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if pin else None).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    out = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": ROUNDS, "median": med, "runs": runs}
    (HERE / "results" / "cross_core.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# What the second core costs the program thread (1x1 add chain, co-execution forced)", "",
             f"torch {out['torch']}, {ROUNDS} interleaved rounds of fresh processes, medians; "
             "bench/cross_core.py says how.", "",
             "| run | program thread CPU µs/op | other threads CPU µs/op | wall µs/op |", "|---|---:|---:|---:|"]
    for k, m in med.items():
        lines.append(f"| {k} | {m['program_cpu_us']:.2f} | {m['others_cpu_us']:.2f} | {m['wall_us']:.2f} |")
    (HERE / "results" / "cross_core.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
