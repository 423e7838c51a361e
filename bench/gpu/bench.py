"""GPU benchmark (run by bench/gpu/run_device.sh on the lent GPU machine): eager vs Terra vs
torch.compile(mode="reduce-overhead") vs replaying a captured CUDA graph of the step alone, on
launch-bound programs (small models, small batches), side by side in one run.

Each mode runs the same `train(steps)` function; a measurement is the wall time of `steps` steps
ending with torch.cuda.synchronize(), divided by `steps`; medians of interleaved rounds. The CUDA
graph replay is the floor for static programs (no Python at all per step). Equality with eager is
checked by tests/python/test_cuda.py (run first by run_device.sh); here each mode's parameters are
only checked to be finite. Writes JSON and Markdown to --out.
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


def modes_for(name, make, steps):
    """Builds each mode as (setup seconds, run(steps), model)."""
    out = {}
    model, step, static = make()
    out["eager"] = (0.0, lambda n: train(step, n), model)

    model_t, step_t, _ = make()
    t0 = time.perf_counter()
    terra.run(train, step_t, 3)  # warm-up: trace
    torch.cuda.synchronize()
    # terra.sync(): every op the program issued has been enqueued on the GPU before the clock stops.
    out["terra"] = (time.perf_counter() - t0, lambda n: (terra.run(train, step_t, n), terra.sync()), model_t)

    model_c, step_c, _ = make()
    compiled = torch.compile(step_c, mode="reduce-overhead")
    t0 = time.perf_counter()
    try:
        for _ in range(3):
            compiled()
        torch.cuda.synchronize()
        out["compile"] = (time.perf_counter() - t0, lambda n: train(compiled, n), model_c)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        out["compile"] = (None, repr(e)[:200], model_c)

    if static:
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu/bench.py needs a CUDA device (run it through bench/gpu/run_device.sh)")
    rows = []
    for name, make in PROGRAMS.items():
        same = equality(make)
        modes = modes_for(name, make, args.steps)
        times = {m: [] for m, v in modes.items() if callable(v[1])}
        for _ in range(args.rounds):
            for m in times:
                times[m].append(timed(modes[m][1], args.steps))
        ref = [p.detach().float().cpu() for p in modes["eager"][2].parameters()]
        row = {"program": name, "ms_per_step": {}, "setup_s": {}, "finite_params": {}, "errors": {},
               "terra_vs_eager_20_steps": same}
        for m, (setup, run, model) in modes.items():
            if not callable(run):
                row["errors"][m] = run
                continue
            row["ms_per_step"][m] = statistics.median(times[m]) * 1e3
            row["setup_s"][m] = setup
            # Modes ran different numbers of steps (warm-up), so parameters are not comparable
            # here; equality with eager is what tests/python/test_cuda.py checks.
            params = [p.detach().float().cpu() for p in model.parameters()]
            row["finite_params"][m] = all(torch.isfinite(p).all().item() and p.shape == r.shape
                                           for p, r in zip(params, ref))
        stats = terra.stats("train")
        row["terra_stats"] = {k: stats.get(k) for k in ("iterations_traced", "iterations_coexecuted",
                                                          "iterations_replayed", "kernels_replayed",
                                                          "blocks_refused")}
        terra.reset()  # the next program's `train` starts a graph of its own
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "steps": args.steps, "rounds": args.rounds}
    (out / "gpu_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# GPU benchmark ({meta['gpu']}, torch {meta['torch']})", "",
             f"{args.steps} steps per measurement, medians of {args.rounds} interleaved rounds, ms per step "
             "(speed-up over eager in parentheses).", "",
             "| program | eager | Terra | compile(reduce-overhead) | CUDA graph replay | Terra / graph replay "
             "| Terra iterations traced / co-executed / replayed | parameters after 20 steps, Terra vs eager |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        t, ts, eq = r["ms_per_step"], r["terra_stats"], r["terra_vs_eager_20_steps"]
        cell = lambda m: (f"{t[m]:.3f} ({t['eager'] / t[m]:.2f}x)" if m in t else  # noqa: E731
                          ("FAIL" if m in r["errors"] else "n/a"))
        ratio = f"{t['terra'] / t['cuda_graph']:.2f}" if "cuda_graph" in t else "n/a"
        lines.append(f"| {r['program']} | {t['eager']:.3f} | {cell('terra')} | {cell('compile')} | "
                     f"{cell('cuda_graph')} | {ratio} | {ts['iterations_traced']} / "
                     f"{ts['iterations_coexecuted']} / {ts['iterations_replayed']} | "
                     f"{'bitwise equal' if eq['bitwise'] else 'max abs diff %.3g' % eq['max_abs_diff']} |")
    (out / "gpu_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
