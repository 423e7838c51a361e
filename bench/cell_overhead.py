"""What Terra adds to cells that issue no PyTorch ops, measured over the Jupyter protocol.

One kernel; the same cells timed with `%terra on` and `%terra off`, interleaved in rounds:
an assignment, a pure-Python loop of 10,000 iterations (its loop is marked, so each iteration
crosses an iteration boundary), and a cell defining a function. Round-trip time per execute
request, medians. Results: bench/results/cell_overhead.{json,md}.
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JUPYTER_PATH", str(ROOT / ".venv" / "share" / "jupyter"))
sys.path.insert(0, str(ROOT / "tests" / "kernel"))
from kernel_helpers import execute  # noqa: E402

CELLS = {
    "assignment": "x = 1",
    "python loop (10k iterations)": "t = 0\nfor i in range(10000):\n    t += i",
    "function definition": "def f(a):\n    for k in range(3):\n        a = a + k\n    return a",
}
ROUNDS, REPEATS = 5, 20


def main():
    km, kc = start_new_kernel(kernel_name="terra", startup_timeout=60)
    try:
        execute(kc, "import torch")
        times = {(name, mode): [] for name in CELLS for mode in ("on", "off")}
        for _ in range(ROUNDS):
            for mode in ("on", "off"):
                execute(kc, f"%terra {mode}")
                for name, code in CELLS.items():
                    for _ in range(REPEATS):
                        t0 = time.perf_counter()
                        execute(kc, code)
                        times[(name, mode)].append(time.perf_counter() - t0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    rows = []
    for name in CELLS:
        on = statistics.median(times[(name, "on")]) * 1e3
        off = statistics.median(times[(name, "off")]) * 1e3
        rows.append({"cell": name, "terra_on_ms": on, "terra_off_ms": off, "added_ms": on - off})
    results = ROOT / "bench" / "results"
    (results / "cell_overhead.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                                             "rounds": ROUNDS, "repeats": REPEATS,
                                                             "rows": rows}, indent=2) + "\n")
    lines = ["# Per-cell overhead of Terra on cells without PyTorch ops", "",
             f"Execute round trip over the Jupyter protocol, median of {ROUNDS * REPEATS} runs per cell "
             "and mode, modes interleaved.", "",
             "| cell | Terra on (ms) | Terra off (ms) | added (ms) |", "|---|---|---|---|"]
    lines += [f"| {r['cell']} | {r['terra_on_ms']:.2f} | {r['terra_off_ms']:.2f} | {r['added_ms']:+.2f} |"
              for r in rows]
    (results / "cell_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
