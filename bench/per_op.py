"""Per-op cost of co-execution against eager, each in a fresh process, side by side.

For a chain of K elementwise ops per iteration (`z = z + y`) on tensors of a given size:
- eager:  wall time and CPU time per op of the plain loop, in a process that never ran Terra;
- terra:  the same loop co-executed (after a short warm-up), in its own fresh process:
          wall time per op up to the last op issued ("issue") and including the wait for the
          GraphRunner ("total"), the program thread's CPU time per op, and the CPU time per op of
          every other thread of the process (the GraphRunner and its OpenMP workers, including
          workers that exited when the session ended): the process's CPU time less the program
          thread's.
Rounds are interleaved (eager, terra, eager, terra, ...), each child reports the median of its
repeats and the table gives the median over rounds. Results: bench/results/per_op.{json,md} (`--name` for another name).

    .venv/bin/python bench/per_op.py [threads] [--variant PYTHONPATH=/tmp/base/build/python] [--name NAME]

`--variant VAR=VALUE` runs Terra a second time per round with that environment variable (another
build through PYTHONPATH), in the same rounds. Before each round the host's core-to-core round trip
is measured (build/bench/core_to_core, bench/core/core_to_core.cpp) and listed with the rounds: on
the 2-core host of sessions 31-34 it moved between 64 and 470 ns within an hour, and per-op times
with it.
"""
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# What co-execution itself costs per op: the payoff check (terra/payoff.h), which would run a chain
# eagerly where co-executing it is slower, stays off in the children.
os.environ["TERRA_ADAPTIVE"] = "0"

K, ITERS, REPEATS, ROUNDS = 50, 60, 7, 5
SIZES = (1, 64, 256)


def add_k(z, y):
    for _ in range(K):
        z = z + y
    return z


def chain(x, y, iters):
    # The K adds in a function of their own: terra.run marks a loop written inside chain's own
    # loop as iterations of its own, so this benchmark timed an iteration (its marks, its payoff
    # bookkeeping) per op until session 13; a helper's loop inside the run function's loop is
    # part of its iteration, as a model's loop over its layers is.
    for _ in range(iters):
        z = add_k(x, y)
    return z


def other_threads_cpu_ns():
    """CPU time of every thread of this process except the calling one, including threads that
    have exited: the process's CPU time (getrusage) less the calling thread's. Summing the live
    threads' /proc/self/task/*/schedstat instead, as this did until session 21, missed the
    GraphRunner's OpenMP workers, which exit when a session ends (openmp_team.h): measured on
    hf_bert's forced co-execution, 10 ms of CPU per step of a worker spinning."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round((usage.ru_utime + usage.ru_stime - time.thread_time()) * 1e9)


def child(mode, size, threads):
    import torch
    torch.set_num_threads(threads)
    x, y = torch.randn(size, size), torch.randn(size, size)
    ops = K * ITERS
    rows = []
    if mode == "eager":
        chain(x, y, 5)
        for _ in range(REPEATS):
            c0, t0 = time.thread_time(), time.perf_counter()
            chain(x, y, ITERS)
            rows.append({"wall_us": (time.perf_counter() - t0) / ops * 1e6,
                         "program_cpu_us": (time.thread_time() - c0) / ops * 1e6,
                         "others_cpu_us": 0.0})
    else:
        import terra
        marked = terra._instrument(chain)
        terra.run(chain, x, y, 5)  # warm-up: trace and build the graph
        for _ in range(REPEATS):
            o0, c0, t0 = other_threads_cpu_ns(), time.thread_time(), time.perf_counter()
            terra._enter("chain-bench", depth=1)
            try:
                marked(x, y, ITERS)
                t1 = time.perf_counter()
            finally:
                terra._exit()
            t2 = time.perf_counter()
            rows.append({"issue_us": (t1 - t0) / ops * 1e6, "wall_us": (t2 - t0) / ops * 1e6,
                         "program_cpu_us": (time.thread_time() - c0) / ops * 1e6,
                         "others_cpu_us": (other_threads_cpu_ns() - o0) / ops / 1e3})
        st = terra.stats("chain-bench")
        assert st["iterations_coexecuted"] >= REPEATS * ITERS * 0.9, st
    print(json.dumps({k: statistics.median(r[k] for r in rows) for k in rows[0]}))


def core_to_core_ns():
    """The host's core-to-core round trip now (bench/core/core_to_core.cpp, built with the project),
    or None where it was not built."""
    probe = Path(__file__).resolve().parents[1] / "build" / "bench" / "core_to_core"
    if not probe.exists():
        return None
    out = subprocess.run([str(probe)], capture_output=True, text=True).stdout.strip()
    try:
        return float(out)
    except ValueError:
        return None


def main():
    import argparse
    import torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("threads", nargs="?", type=int, default=torch.get_num_threads())
    ap.add_argument("--name", default="per_op", help="results file name under bench/results")
    ap.add_argument("--variant", help="VAR=VALUE: Terra again with this environment variable, in the "
                                      "same rounds (PYTHONPATH=<a build's python dir>: another build)")
    args = ap.parse_args()
    threads = args.threads
    modes = ("eager", "terra") + (("variant",) if args.variant else ())
    runs = {(m, s): [] for s in SIZES for m in modes}
    probes = []  # the core-to-core round trip before each round
    for _ in range(ROUNDS):
        probes.append(core_to_core_ns())
        for s in SIZES:
            for m in modes:
                env = dict(os.environ)
                if m == "variant":
                    key, _, value = args.variant.partition("=")
                    env[key] = value
                out = subprocess.run([sys.executable, __file__, "--child", "eager" if m == "eager" else "terra",
                                      str(s), str(threads)],
                                     check=True, capture_output=True, text=True, env=env).stdout
                runs[(m, s)].append(json.loads(out.strip().splitlines()[-1]))
    med = {f"{m}/{s}": {k: statistics.median(r[k] for r in v) for k in v[0]} for (m, s), v in runs.items()}
    out = {"machine": platform.processor() or platform.machine(), "threads": threads, "variant": args.variant,
           "torch": torch.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "ops_per_iteration": K, "rounds": ROUNDS,
           "median": med, "runs": {f"{m}/{s}": v for (m, s), v in runs.items()},
           "core_to_core_ns": probes}
    results = Path(__file__).resolve().parent / "results"
    (results / f"{args.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Per-op cost of co-execution (CPU), against eager in a fresh process", "",
             f"torch {out['torch']}, {threads} intra-op threads, {K} chained `z = z + y` per iteration, "
             f"{ITERS} iterations; eager and Terra each in fresh processes, {ROUNDS} interleaved rounds, "
             "medians. CPU columns are per-thread CPU time per op: the program thread, and all "
             "other threads (the GraphRunner and its OpenMP workers).", "",
             "| tensor | eager wall µs/op | eager CPU µs/op | Terra program thread CPU µs/op | "
             "Terra GraphRunner+workers CPU µs/op | Terra issue wall µs/op | Terra total wall µs/op | "
             "speedup (eager/Terra wall) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in SIZES:
        e, t = med[f"eager/{s}"], med[f"terra/{s}"]
        lines.append(f"| {s}x{s} | {e['wall_us']:.2f} | {e['program_cpu_us']:.2f} | "
                     f"{t['program_cpu_us']:.2f} | {t['others_cpu_us']:.2f} | {t['issue_us']:.2f} | "
                     f"{t['wall_us']:.2f} | {e['wall_us'] / t['wall_us']:.2f}x |")
    lines += ["", "Each round's Terra process (wall µs/op, program thread CPU µs/op): the rounds show "
              "whether a median sits between two modes (this host runs some processes at twice the "
              "time per op with the same counters).", ""]
    for s in SIZES:
        for m in modes[1:]:
            cells = ", ".join(f"{r['wall_us']:.2f} / {r['program_cpu_us']:.2f}" for r in runs[(m, s)])
            lines.append(f"- {m} {s}x{s}: {cells}")
    if any(p is not None for p in probes):
        lines.append("- core-to-core round trip before each round, ns (bench/core/core_to_core.cpp): " +
                     ", ".join("n/a" if p is None else f"{p:.0f}" for p in probes))
    if args.variant:
        lines += ["", f"Variant: Terra with `{args.variant}`, in the same rounds (medians).", "",
                  "| tensor | variant program thread CPU µs/op | variant GraphRunner+workers CPU µs/op | "
                  "variant total wall µs/op | speedup (eager/variant wall) |", "|---|---:|---:|---:|---:|"]
        for s in SIZES:
            e, v = med[f"eager/{s}"], med[f"variant/{s}"]
            lines.append(f"| {s}x{s} | {v['program_cpu_us']:.2f} | {v['others_cpu_us']:.2f} | "
                         f"{v['wall_us']:.2f} | {e['wall_us'] / v['wall_us']:.2f}x |")
    (results / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
