"""Warm-up with and without the one-thread verdict cache (terra_core/runtime/verdicts.h).

A block's first recording checks each kernel with one intra-op thread on copies of its
arguments, unless a verdict for it is known. Verdicts persist in a cache file, so a program run
again skips the checks. Per benchmark program, in fresh processes alternated over rounds: Terra
with the cache off (TERRA_CACHE_DIR=0, as on a machine's first run) and with a cache an earlier
process filled; each child times 12 training steps from a fresh model (`make`, the first steps
traced, then recorded and co-executed) and the first co-executed iteration. Wall time, medians
over rounds. Results: bench/results/warmup_cache.{json,md}.
"""
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ["resnet", "dcgan", "gpt", "detector_numpy_nms", "hf_bert"]
STEPS, ROUNDS = 12, 3


def child(name):
    import torch
    import terra
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(2)
    prog = importlib.import_module(f"bench.programs.{name}")
    state = prog.make(0)
    t0 = time.perf_counter()
    terra.run(prog.train, state, STEPS)
    total = time.perf_counter() - t0
    first = next((it for it in terra.timeline("train")["iterations"] if it["mode"] == "coexec"), None)
    s = terra.stats("train")
    print(json.dumps({"run_ms": total * 1e3,
                      "first_coexec_ms": (first["end_ns"] - first["start_ns"]) / 1e6 if first else None,
                      "kernels_checked": s["kernels_checked"], "verdicts_reused": s["kernel_verdicts_reused"]}))


def run(name, cache):
    env = dict(os.environ, TERRA_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, __file__, "--child", name], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    rows = {}
    with tempfile.TemporaryDirectory(prefix="terra-warm-cache-") as cache:
        for name in PROGRAMS:
            run(name, cache)  # fills the cache
            cold, warm = [], []
            for _ in range(ROUNDS):
                cold.append(run(name, "0"))
                warm.append(run(name, cache))
            med = lambda rs, k: statistics.median(r[k] for r in rs)
            rows[name] = {m: {k: med(rs, k) for k in ("run_ms", "first_coexec_ms", "kernels_checked", "verdicts_reused")}
                          for m, rs in (("cold", cold), ("warm", warm))}
            print(name, rows[name], flush=True)
    results = ROOT / "bench" / "results"
    (results / "warmup_cache.json").write_text(json.dumps({"steps": STEPS, "rounds": ROUNDS,
                                                           "date": time.strftime("%Y-%m-%d %H:%M"),
                                                           "programs": rows}, indent=2) + "\n")
    lines = ["# Warm-up with and without the one-thread verdict cache", "",
             f"{STEPS} training steps from a fresh model under Terra (tracing, recording, co-execution), "
             f"in fresh processes, {ROUNDS} alternated rounds, medians, wall time. Cold: "
             "TERRA_CACHE_DIR=0 (every kernel of the first recording checked with one thread); warm: "
             "a cache file an earlier process filled.", "",
             "| program | cold: 12 steps ms | warm: 12 steps ms | cold: first co-executed iteration ms | "
             "warm: first co-executed iteration ms | kernels checked cold / warm |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        c, w = r["cold"], r["warm"]
        lines.append(f"| {name} | {c['run_ms']:.0f} | {w['run_ms']:.0f} | {c['first_coexec_ms']:.1f} | "
                     f"{w['first_coexec_ms']:.1f} | {c['kernels_checked']:.0f} / {w['kernels_checked']:.0f} |")
    (results / "warmup_cache.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
