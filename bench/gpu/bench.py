"""GPU benchmark (run by bench/gpu/run_device.sh on the lent GPU machine): eager vs Terra vs
torch.compile(mode="reduce-overhead") vs replaying a captured CUDA graph of the step alone, on
launch-bound programs (small models, small batches), side by side in one run.

Each mode runs the same `train(steps)` function; a measurement is the wall time of `steps` steps
ending with torch.cuda.synchronize(), divided by `steps`; medians of interleaved rounds. Each
(program, mode) pair runs in a process of its own beside eager (`--program P --modes M`, rows
appended to gpu_bench_rows.jsonl), so one mode's device-side assert cannot take the others' numbers
with it; without --program the rows are rendered to gpu_bench.{json,md}. The CUDA
graph replay is the floor for static programs (no Python at all per step). Terra's parameters
after 20 steps are compared with eager's (bitwise and largest difference); tests/python/test_cuda.py
(run first by run_device.sh) checks equality too.
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import terra

DEV = torch.device("cuda")


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64, device=DEV), torch.randint(0, 10, (32,), device=DEV)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    return model, step, True


def tiny_lm():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(512, 128), nn.TransformerEncoder(layer, 2), nn.Linear(128, 512)).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    tokens = torch.randint(0, 512, (8, 33), device=DEV)

    def step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 512), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    return model, step, True


def rnn_python():
    """Python features: per-step sequence length from a Python list, `.item()`-driven lr change."""
    torch.manual_seed(0)
    cell, head = nn.GRUCell(32, 64).to(DEV), nn.Linear(64, 4).to(DEV)
    params = list(cell.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    lengths = [5, 7, 6, 8]
    xs = torch.randn(8, 16, 32, device=DEV)
    y = torch.randint(0, 4, (16,), device=DEV)
    state = {"i": 0}

    def step():
        n = lengths[state["i"] % len(lengths)]
        state["i"] += 1
        h = torch.zeros(16, 64, device=DEV)
        for t in range(n):
            h = cell(xs[t], h)
        loss = F.cross_entropy(head(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.5:
            for g in opt.param_groups:
                g["lr"] = 0.01
        return loss
    model = nn.ModuleList([cell, head])
    return model, step, False


def chain():
    """Launch-bound elementwise work with no autograd: 100 ops on a 64x64 tensor per step."""
    torch.manual_seed(0)
    x = torch.randn(64, 64, device=DEV)
    holder = nn.Module()
    holder.out = nn.Parameter(torch.zeros(64, 64, device=DEV), requires_grad=False)

    def step():
        y = x
        for _ in range(50):
            y = y * 0.5 + 0.25
        holder.out.copy_(y)
        return y
    return holder, step, True


PROGRAMS = {"mlp": mlp, "tiny_lm": tiny_lm, "rnn_python": rnn_python, "chain": chain}


def train(step, steps):
    for _ in range(steps):
        step()


def timed(fn, steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def equality(make, steps=20):
    """Parameters after `steps` steps from the same start, eager against Terra: bitwise equal, and
    the largest absolute difference (deterministic kernels on one stream give the same bits)."""
    model_e, step_e, _ = make()
    train(step_e, steps)
    model_t, step_t, _ = make()
    terra.run(train, step_t, steps)
    terra.sync()
    torch.cuda.synchronize()
    pairs = list(zip(model_e.parameters(), model_t.parameters()))
    equal = all(torch.equal(a, b) for a, b in pairs)
    diff = max(((a.double() - b.double()).abs().max().item() for a, b in pairs), default=0.0)
    terra.reset()
    return {"bitwise": equal, "max_abs_diff": diff}


def modes_for(make, wanted):
    """Builds eager and each wanted mode as (setup seconds, run(steps) or an error, model)."""
    out = {}
    model, step, static = make()
    out["eager"] = (0.0, lambda n: train(step, n), model)

    for mode in ("terra", "terra_noreplay"):  # one per process: the setting is process-wide
        if mode not in wanted:
            continue
        terra.config(replay=mode == "terra", accelerator_blocks=True)
        model_t, step_t, _ = make()
        t0 = time.perf_counter()
        terra.run(train, step_t, 3)  # warm-up: trace
        torch.cuda.synchronize()
        # terra.sync(): every op the program issued is on the GPU's queue before the clock stops.
        out[mode] = (time.perf_counter() - t0,
                     lambda n, step_t=step_t: (terra.run(train, step_t, n), terra.sync()), model_t)

    if "compile" in wanted:
        model_c, step_c, _ = make()
        graphed = torch.compile(step_c, mode="reduce-overhead")

        def compiled():
            # A new step for cudagraph trees. mlp and tiny_lm raised "accessing tensor output of
            # CUDAGraphs that has been overwritten by a subsequent run" without it (2026-12-04),
            # and mlp still did with it (at the step's loss): not solved.
            torch.compiler.cudagraph_mark_step_begin()
            return graphed()
        t0 = time.perf_counter()
        try:
            for _ in range(3):
                compiled()
            torch.cuda.synchronize()
            out["compile"] = (time.perf_counter() - t0, lambda n: train(compiled, n), model_c)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["compile"] = (None, repr(e)[:200], model_c)

    if "cuda_graph" in wanted and static:
        model_g, step_g, _ = make()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step_g()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step_g()

        def replay(n):
            for _ in range(n):
                graph.replay()
        out["cuda_graph"] = (0.0, replay, model_g)
    return out


MODES = ("terra", "terra_noreplay", "compile", "cuda_graph")


def measure(name, wanted, steps, rounds):
    """One row: eager and the wanted modes side by side in this process, interleaved rounds."""
    make = PROGRAMS[name]
    row = {"program": name, "modes": list(wanted), "ms_per_step": {}, "setup_s": {}, "errors": {}}
    terra_mode = next((m for m in wanted if m.startswith("terra")), None)
    if terra_mode:
        terra.config(replay=terra_mode == "terra", accelerator_blocks=True)
        row["terra_vs_eager_20_steps"] = equality(make)
    modes = modes_for(make, wanted)
    times = {m: [] for m, v in modes.items() if callable(v[1])}
    for r in range(rounds):
        for m in times:
            print(f"-- {name} {m} round {r}", flush=True)  # the last line before a device assert
            times[m].append(timed(modes[m][1], steps))
    for m, (setup, run, _model) in modes.items():
        if not callable(run):
            row["errors"][m] = run
            continue
        row["ms_per_step"][m] = statistics.median(times[m]) * 1e3
        row["setup_s"][m] = setup
    if terra_mode:
        stats = terra.stats("train")
        row["terra_stats"] = {k: stats.get(k) for k in ("iterations_traced", "iterations_coexecuted",
                                                          "iterations_replayed", "kernels_replayed",
                                                          "blocks_recorded", "blocks_refused",
                                                          "replay_refusal", "replays_left",
                                                          "replay_left_why")}
    return row


def render(rows, meta):
    """Markdown: per program, each mode's ms per step and its speed-up over the eager run measured
    beside it in the same process (eager is measured in every process)."""
    lines = [f"# GPU benchmark ({meta.get('gpu')}, torch {meta.get('torch')}, Python {meta.get('python')})", "",
             f"{meta.get('steps')} steps per measurement, medians of {meta.get('rounds')} interleaved rounds, ms "
             "per step; each mode ran in a process of its own beside eager, and its speed-up is over that "
             "eager run. A mode missing from a row failed (see `errors` in the JSON).", "",
             "| program | eager | Terra | Terra, replay off | compile(reduce-overhead) | CUDA graph replay "
             "| Terra iterations traced / co-executed / replayed | parameters after 20 steps, Terra vs eager |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for name in PROGRAMS:
        mine = [r for r in rows if r["program"] == name]
        if not mine:
            continue
        cells, eager, ts, eq = {}, [], None, None
        for r in mine:
            t = r["ms_per_step"]
            if "eager" in t:
                eager.append(t["eager"])
            for m in MODES:
                if m in t and "eager" in t:
                    cells[m] = f"{t[m]:.3f} ({t['eager'] / t[m]:.2f}x)"
                elif m in r["modes"] and m not in cells:
                    cells[m] = "FAIL" if (m in r["errors"] or r.get("failed")) else "n/a"
            if "terra" in r["modes"]:  # replay on: the row's counts and equality
                ts = r.get("terra_stats") or ts
                eq = r.get("terra_vs_eager_20_steps") or eq
        counts = f"{ts['iterations_traced']} / {ts['iterations_coexecuted']} / {ts['iterations_replayed']}" if ts else "-"
        same = ("-" if eq is None else "bitwise equal" if eq["bitwise"] else f"max abs diff {eq['max_abs_diff']:.3g}")
        base = f"{statistics.median(eager):.3f}" if eager else "FAIL"
        lines.append(f"| {name} | {base} | {cells.get('terra', 'n/a')} | {cells.get('terra_noreplay', 'n/a')} | "
                     f"{cells.get('compile', 'n/a')} | {cells.get('cuda_graph', 'n/a')} | {counts} | {same} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--program", choices=list(PROGRAMS), help="measure one program (else render)")
    ap.add_argument("--modes", default=",".join(MODES), help="modes beside eager, comma-separated")
    ap.add_argument("--failed", action="store_true", help="record --program/--modes as failed")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "gpu_bench_rows.jsonl"
    wanted = [m for m in args.modes.split(",") if m]
    if args.failed:  # the process measuring them died (a device-side assert ends a CUDA context)
        with rows_file.open("a") as f:
            f.write(json.dumps({"program": args.program, "modes": wanted, "ms_per_step": {},
                                "errors": {}, "failed": True}) + "\n")
        return
    if args.program:
        if not torch.cuda.is_available():
            raise SystemExit("bench/gpu/bench.py needs a CUDA device (run it through bench/gpu/run_device.sh)")
        row = measure(args.program, wanted, args.steps, args.rounds)
        print(json.dumps(row), flush=True)
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": args.steps, "rounds": args.rounds}
    (out / "gpu_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "gpu_bench.md").write_text(render(rows, meta))
    print(render(rows, meta))


if __name__ == "__main__":
    main()
