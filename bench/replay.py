"""Block replay (terra_core/runtime/block_replay.h) side by side: a small training step run eagerly,
co-executed with block replay, and co-executed through autograd (replay off), each in fresh
processes, in interleaved rounds. Co-execution is forced (the payoff check off) so the figures show
what each route costs, not which one the check would choose.

    .venv/bin/python bench/replay.py                 # writes bench/results/replay.{json,md}
    .venv/bin/python bench/replay.py --rounds 2 --steps 600
    .venv/bin/python bench/replay.py --variant PYTHONPATH=/tmp/base/build/python   # + another build

`--variant VAR=VALUE` runs the replay mode a second time per round with that environment variable
(another build through PYTHONPATH), interleaved in the same rounds, and adds its columns.

The program: an MLP (6 -> W -> W -> 1, tanh/relu) on a batch of 32, MSE loss, Adam, for W in 16
and 128, with 2 intra-op threads (the machine's cores) and with 1. Reported: the median over
rounds of the steady step time (wall time of the second half of the steps, the GraphRunner
drained at the end) as a ratio to eager's, each thread's CPU time per step over the same steps
(the program thread, and all others: the GraphRunner and the OpenMP workers), the share of
co-executed iterations that were
replayed, and whether the replayed blocks ran with one intra-op thread. The final parameters are
checked bitwise against eager's in every Terra child.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

CHILD = r"""
import hashlib, json, sys, time, torch, terra
mode, width, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from per_op import other_threads_cpu_ns  # CPU time of every other thread (GraphRunner, OpenMP workers)
torch.set_num_threads(threads)
terra.config(adaptive=False, replay=(mode in ("replay", "variant")))

def train(steps, marks):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    for step in range(steps):
        if step == steps // 2:
            marks.append((time.perf_counter(), time.thread_time(), other_threads_cpu_ns(), terra._c().runner_busy_ns()))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return model

marks = []
model = train(steps, marks) if mode == "eager" else terra.run(train, steps, marks)
end, end_cpu, end_others, end_busy = (time.perf_counter(), time.thread_time(), other_threads_cpu_ns(),
                                     terra._c().runner_busy_ns())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
n = steps - steps // 2
out = {"step_us": (end - marks[0][0]) / n * 1e6, "program_cpu_us": (end_cpu - marks[0][1]) / n * 1e6,
       "others_cpu_us": (end_others - marks[0][2]) / n / 1e3, "digest": digest,
       "busy_us": (end_busy - marks[0][3]) / n / 1e3}
if mode != "eager":
    s = terra.stats("train")
    out.update(coexec=s["iterations_coexecuted"], replayed=s["iterations_replayed"],
               one_thread=s["blocks_one_thread"], recorded=s["blocks_recorded"])
print(json.dumps(out))
"""

MODES = ("eager", "replay", "autograd")


def child(mode, width, threads, steps, variant=None):
    # From a file, not `-c`: terra.run marks loop iterations from the function's source.
    env = dict(os.environ)
    if mode == "variant":
        key, _, value = variant.partition("=")
        env[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "replay_child.py"
        script.write_text(CHILD)
        r = subprocess.run([sys.executable, str(script), mode, str(width), str(threads), str(steps),
                            str(Path(__file__).resolve().parent)],
                           capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--variant", help="VAR=VALUE: the replay mode again with this environment variable")
    args = ap.parse_args()
    modes = MODES + (("variant",) if args.variant else ())
    rows = []
    for threads in (2, 1):
        for width in (16, 128):
            runs = {m: [] for m in modes}
            for _ in range(args.rounds):
                for m in modes:  # interleaved: eager, replay, autograd, eager, ...
                    runs[m].append(child(m, width, threads, args.steps, args.variant))
            eager_us = statistics.median(r["step_us"] for r in runs["eager"])
            row = {"threads": threads, "width": width, "eager_us": round(eager_us, 1)}
            for m in modes:
                for cpu in ("program_cpu_us", "others_cpu_us", "busy_us"):
                    row[f"{m}_{cpu}"] = round(statistics.median(r[cpu] for r in runs[m]), 1)
            for m in modes[1:]:
                us = statistics.median(r["step_us"] for r in runs[m])
                row[f"{m}_us"] = round(us, 1)
                row[f"{m}_ratio"] = round(us / eager_us, 3)
                row[f"{m}_bitwise"] = all(r["digest"] == runs["eager"][0]["digest"] for r in runs[m])
            last = runs["replay"][-1]
            row["replayed_share"] = round(last["replayed"] / max(1, last["coexec"]), 3)
            row["one_thread"] = last["one_thread"] >= 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    meta = {"generated": time.strftime("%Y-%m-%dT%H:%M:%S"), "rounds": args.rounds, "steps": args.steps,
            "variant": args.variant}
    (RESULTS / "replay.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    write_md(meta, rows)


def write_md(meta, rows):
    lines = [
        "# Block replay: step time against eager (CPU)",
        "",
        f"Generated by `bench/replay.py` ({meta['generated']}, {meta['rounds']} interleaved rounds of "
        f"fresh processes, {meta['steps']} steps each, medians). Co-execution forced (payoff check off). "
        "Ratio = Terra's steady step time / eager's (lower is faster). Program: MLP 6 -> W -> W -> 1, "
        "batch 32, MSE, Adam.",
        "",
        "| intra-op threads | W | eager µs/step | replay | replay bitwise | through autograd | "
        "autograd bitwise | iterations replayed | one-thread blocks |",
        "|---:|---:|---:|---:|---|---:|---|---:|---|",
    ]
    cpu_lines = [
        "",
        "CPU time per step, µs, by thread (program thread / every other thread: the GraphRunner and "
        "the OpenMP workers), medians:",
        "",
        "| intra-op threads | W | eager | replay | through autograd |",
        "|---:|---:|---:|---:|---:|",
    ]
    busy_lines = [
        "",
        "The GraphRunner's busy time per step, µs (wall time executing items: its CPU time above "
        "also counts the spinning while it waits for the program thread's next op; busy time still "
        "counts the waits inside a replayed block for the program to issue the block's next items, "
        "so it is an upper bound on the work), and as a share of eager's step time (issue 13's "
        "GraphRunner target: at most 0.35), medians:",
        "",
        "| intra-op threads | W | replay | share of eager's step | through autograd | share |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['width']} | {r['eager_us']} | {r['replay_ratio']:.2f} | "
                     f"{'yes' if r['replay_bitwise'] else 'NO'} | {r['autograd_ratio']:.2f} | "
                     f"{'yes' if r['autograd_bitwise'] else 'NO'} | {r['replayed_share']:.0%} | "
                     f"{'yes' if r['one_thread'] else 'no'} |")
    for r in rows:
        # A thread that ended between the two reads (an OpenMP team given up) takes its CPU time
        # with it: the other threads' figure is then not known.
        cells = [f"{r[f'{m}_program_cpu_us']} / "
                 f"{r[f'{m}_others_cpu_us'] if r[f'{m}_others_cpu_us'] >= 0 else 'n/a'}" for m in MODES]
        cpu_lines.append(f"| {r['threads']} | {r['width']} | " + " | ".join(cells) + " |")
        busy_lines.append(f"| {r['threads']} | {r['width']} | {r['replay_busy_us']} | "
                          f"{r['replay_busy_us'] / r['eager_us']:.2f} | {r['autograd_busy_us']} | "
                          f"{r['autograd_busy_us'] / r['eager_us']:.2f} |")
    variant_lines = []
    if meta.get("variant"):
        variant_lines = ["", f"Variant: replay with `{meta['variant']}`, in the same rounds (medians):", "",
                         "| intra-op threads | W | replay | variant | GraphRunner busy share: replay | variant | "
                         "CPU µs program / others: variant | variant bitwise |",
                         "|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            variant_lines.append(
                f"| {r['threads']} | {r['width']} | {r['replay_ratio']:.2f} | {r['variant_ratio']:.2f} | "
                f"{r['replay_busy_us'] / r['eager_us']:.2f} | {r['variant_busy_us'] / r['eager_us']:.2f} | "
                f"{r['variant_program_cpu_us']} / {r['variant_others_cpu_us']} | "
                f"{'yes' if r['variant_bitwise'] else 'NO'} |")
    (RESULTS / "replay.md").write_text("\n".join(lines + cpu_lines + busy_lines + variant_lines) + "\n")
    print("wrote", RESULTS / "replay.md")


if __name__ == "__main__":
    main()
