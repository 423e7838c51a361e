"""How busy the GraphRunner is in steady co-execution, and what starting a block before its items
are issued could save at most on this host.

Issue 13 asks that a replayed block run as soon as its path is known, not item by item behind
the program thread. That pays where the GraphRunner idles while work it could already do waits
for the program to issue it, and the program later waits for that work. Per program, in a fresh
process: 120 steps, then one call of 60 steps, whose co-executed iterations are read from
`terra.timeline()`: the share of the window (first co-executed iteration's start to the last
event) the GraphRunner was busy, the share the program thread waited for it (fetch waits), and
their bound min(waits, GraphRunner idle) / window: no reordering of the GraphRunner's work saves
more than its idle time, nor more than the program waited. Programs the payoff check holds eager
have no co-executed window and are listed as such.

    .venv/bin/python bench/graphrunner_busy.py [program ...]   # default: all bench programs
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"


def overlap(spans, a, b):
    return sum(max(0, min(b, e) - max(a, s)) for s, e in spans)


def child(name):
    import importlib
    import torch
    torch.set_num_threads(2)
    import terra
    prog = importlib.import_module(f"bench.programs.{name}")
    state = prog.make(0)
    terra.run(prog.train, state, 120)
    terra.sync()
    terra.run(prog.train, state, 60)
    terra.sync()
    timeline = terra.timeline(last=60)
    events = timeline["events"]
    coexec = [i for i in timeline["iterations"] if i["mode"] == "coexec"]
    out = {"program": name, "coexec_iterations": len(coexec)}
    if coexec:
        busy = [(e["start_ns"], e["end_ns"]) for e in events if e["lane"] == "graph" and e["kind"] == "busy"]
        waits = [(e["start_ns"], e["end_ns"]) for e in events
                 if e["lane"] == "python" and e["kind"] == "fetch_wait"]
        a, b = coexec[0]["start_ns"], max(e["end_ns"] for e in events)
        window = b - a
        busy_ns, wait_ns = overlap(busy, a, b), overlap(waits, a, b)
        out.update(ms_per_iteration=window / len(coexec) / 1e6, busy_share=busy_ns / window,
                   waits_share=wait_ns / window, bound_share=min(wait_ns, window - busy_ns) / window)
    print(json.dumps(out))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    from bench.programs import PROGRAMS
    names = sys.argv[1:] or PROGRAMS
    env = dict(os.environ, TERRA_REMEMBER_PAYOFF="0")
    rows = []
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--child", name], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
            "program": name, "error": proc.stderr.strip().splitlines()[-1:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    import torch
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)")}
    out = RESULTS / "s52_graphrunner_busy"
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# The GraphRunner's busy share in steady co-execution (bench/graphrunner_busy.py)", "",
             f"{meta['date']}, torch {meta['torch']}, 2 intra-op threads, one fresh process per program: "
             "120 steps, then the 60-step call's co-executed iterations (terra.timeline). Shares of that "
             "window; bound = min(program's waits, GraphRunner's idle): the most that starting blocks "
             "before their items are issued could save.", "",
             "| program | co-executed iterations | ms per iteration | GraphRunner busy | program waits | bound |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.get("coexec_iterations"):
            lines.append(f"| {r['program']} | {r['coexec_iterations']} | {r['ms_per_iteration']:.2f} | "
                         f"{r['busy_share']:.1%} | {r['waits_share']:.1%} | {r['bound_share']:.1%} |")
        else:
            lines.append(f"| {r['program']} | {r.get('coexec_iterations', 'error')} (held eager) | - | - | - | - |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
