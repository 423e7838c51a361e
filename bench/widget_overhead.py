"""What the graph and timeline views cost: the loop slowdown of their live updates, and how long
the graph view takes to draw large graphs.

1. Live updates. Two terra kernels run the same training cells, rounds interleaved: kernel A
   shows no views, kernel B has `%terra graph` and `%terra timeline` displayed (following the
   running cell, so every iteration boundary checks whether a refresh is due and refreshes at
   most every 0.5 s per view, or 100x what its last refresh cost). The loop's own wall time is measured inside
   the cell (perf_counter around the loop); the first run of each cell (tracing) is left out.
2. Drawing. The graph view's ES module in Chromium without Jupyter (tests/browser/standalone.py)
   on synthetic graphs of 1k to 30k nodes: first render (collapsed above 300 nodes), "Expand
   all" (only what is in view is drawn), "Fit".

Results: bench/results/widget_overhead.{json,md}.  Run: .venv/bin/python bench/widget_overhead.py
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(ROOT / "tests" / "kernel"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from kernel_helpers import execute, stdout  # noqa: E402

SETUP = """
import time, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
def make(width, batch):
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), torch.randn(batch, 16), torch.randint(0, 4, (batch,))
# Made once: a cell that makes a fresh model on each run trips an engine bug on its third run.
setups = {"32x64": make(32, 64), "512x512": make(512, 512)}
"""
# The demo notebook's loop (data-dependent branch included), at two sizes.
LOOP = """
model, opt, X, Y = setups["{width}x{batch}"]
started = time.perf_counter()
for step in range({steps}):
    logits = model(X)
    loss = F.cross_entropy(logits, Y)
    if loss.item() > 1.2:
        loss = loss + 0.01 * logits.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loop_s", time.perf_counter() - started)
"""
PROGRAMS = {
    "demo MLP 16-32-4, batch 64": dict(width=32, batch=64, steps=12000),
    "MLP 16-512-4, batch 512": dict(width=512, batch=512, steps=2400),
}
ROUNDS = 5
PUSHES = ("import json as _j\n_v = get_ipython().magics_manager.registry['TerraMagics']._views\n"
          "print(_j.dumps([_v.pushes, _v.push_seconds]))")


def run(kc, code):
    reply, messages = execute(kc, code, timeout=600)
    assert reply["status"] == "ok", reply
    return stdout(messages)


def loop_seconds(kc, code):
    out = run(kc, code)
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("loop_s")))


def live_updates():
    kernels = {mode: start_new_kernel(kernel_name="terra", startup_timeout=60)
               for mode in ("no views", "views live")}
    rows = []
    try:
        for km, kc in kernels.values():
            run(kc, SETUP)
        for name, params in PROGRAMS.items():
            code = LOOP.format(**params)
            for mode, (km, kc) in kernels.items():
                loop_seconds(kc, code)  # traces: left out
                if mode == "views live":
                    run(kc, "%terra graph")
                    run(kc, "%terra timeline")
            before = json.loads(run(kernels["views live"][1], PUSHES))
            times = {mode: [] for mode in kernels}
            for _ in range(ROUNDS):
                for mode, (km, kc) in kernels.items():
                    times[mode].append(loop_seconds(kc, code) / params["steps"])
            after = json.loads(run(kernels["views live"][1], PUSHES))
            base = statistics.median(times["no views"])
            live = statistics.median(times["views live"])
            pushes = after[0] - before[0]
            rows.append({"program": name, "steps": params["steps"],
                         "no_views_ms_per_step": base * 1e3, "views_ms_per_step": live * 1e3,
                         "slowdown_percent": (live / base - 1) * 100,
                         "min_ratio": min(times["views live"]) / min(times["no views"]),
                         "pushes_per_loop": pushes / ROUNDS,
                         "ms_per_push": (after[1] - before[1]) / max(1, pushes) * 1e3,
                         # The refreshes' own time as a share of the loop: what the views cost
                         # without the machine's noise.
                         "refresh_share_percent": (after[1] - before[1]) * 100 /
                                                  (sum(times["views live"]) * params["steps"])})
            print(rows[-1], flush=True)
    finally:
        for km, kc in kernels.values():
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return rows


def drawing():
    from playwright.sync_api import sync_playwright

    from standalone import open_view, synthetic_graph

    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for size in (1_000, 10_000, 30_000):
            graph = synthetic_graph(size)
            page = browser.new_page(viewport={"width": 1400, "height": 800})
            root = open_view(page, "graph_view.js", {"graph": graph, "collapse_threshold": 300})
            first = page.evaluate("window.terraRenderMs")
            click = ("label => { const b = [...document.querySelectorAll('.terra-toolbar button')]"
                     ".find(x => x.textContent === label); const t = performance.now(); b.click();"
                     " return performance.now() - t; }")
            expand = page.evaluate(click, "Expand all")
            drawn = int(root.get_attribute("data-drawn-nodes"))
            fit = page.evaluate(click, "Fit")
            rows.append({"nodes": len(graph["nodes"]), "blocks": len(graph["blocks"]),
                         "first_render_ms": first, "expand_all_ms": expand,
                         "drawn_after_expand": drawn, "fit_ms": fit,
                         "drawn_after_fit": int(root.get_attribute("data-drawn-nodes"))})
            print(rows[-1], flush=True)
            page.close()
        browser.close()
    return rows


def main():
    live = live_updates()
    draw = drawing()
    results = ROOT / "bench" / "results"
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(), "rounds": ROUNDS}
    (results / "widget_overhead.json").write_text(json.dumps(
        {"meta": meta, "live_updates": live, "drawing": draw}, indent=2) + "\n")
    lines = [
        "# What the graph and timeline views cost", "",
        "Generated by `bench/widget_overhead.py` "
        f"({meta['date']}, {meta['cpus']} CPUs, load average {meta['loadavg'][0]:.2f} at the end).", "",
        "## Live updates while a loop runs", "",
        "Two terra kernels, the same training cell (the demo's loop with its data-dependent branch), "
        f"{ROUNDS} interleaved rounds after a traced first run; kernel B has `%terra graph` and "
        "`%terra timeline` displayed, which refresh from iteration boundaries at most every 0.5 s "
        "(or 100x what its last refresh cost). Loop wall time measured inside the cell; medians per step.", "",
        "| loop | steps | no views (ms/step) | views live (ms/step) | slowdown (median) | "
        "ratio of best runs | refreshes per loop | ms per refresh | refreshes' share of the loop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['program']} | {r['steps']} | {r['no_views_ms_per_step']:.3f} | "
              f"{r['views_ms_per_step']:.3f} | {r['slowdown_percent']:+.1f}% | {r['min_ratio']:.3f} | "
              f"{r['pushes_per_loop']:.1f} | {r['ms_per_push']:.1f} | {r['refresh_share_percent']:.1f}% |"
              for r in live]
    lines += ["", "## Drawing large graphs (Chromium, no Jupyter)", "",
              "Synthetic graphs (blocks of 40 ops, a two-way branch every third block). First render "
              "includes the layout; above 300 nodes blocks start collapsed. After \"Expand all\" only "
              "blocks in view (plus half a screen around) are drawn.", "",
              "| nodes | blocks | first render (ms) | expand all (ms) | nodes drawn | fit (ms) | "
              "nodes drawn after fit |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['blocks']} | {r['first_render_ms']:.0f} | {r['expand_all_ms']:.0f} | "
              f"{r['drawn_after_expand']} | {r['fit_ms']:.0f} | {r['drawn_after_fit']} |" for r in draw]
    (results / "widget_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
