"""Instructions per op on the program thread, counted by Valgrind's callgrind, against eager.

Timings on this host swing by up to 2x between runs of one build (neighbours share the cores), so
a change of 10% in what the program thread does per op is invisible in bench/per_op.py's CPU times
without dozens of rounds. Instruction counts do not swing: they say how much work a path does (not
how long its cache misses take, which bench/per_op.py and bench/forced_coexec.py still measure).

The program is per_op.py's chain of `z = z + y` on 1x1 tensors, K ops per iteration. The
GraphRunner's instructions inside GraphRunner::execute (the replayed kernel included, its idle
spinning not) are counted in the same run, one output file per thread. Each op enters
the interpreter's PyNumber_Add, and only instructions inside that call are counted
(`--toggle-collect`; counting the whole thread instead varied by 15% between runs: exits, cycles).
Eagerly the call is the whole op (argument parsing, dispatcher, the kernel); co-executed it is what
the program thread does for the op (the C fast path, validation, the placeholder, the work item,
reclaiming executed items), the kernel running on the GraphRunner. One cost sits on different
sides: eagerly, freeing the Python object of the `z` that is replaced happens outside the call,
when the name is rebound; co-executed, an item still holds that tensor then, torch keeps the
object alive ("resurrects" it), and it is freed inside a later call, by reclaim (the row
"resurrected Python objects freed"). So the co-executed figure is pessimistic by up to that row.
Per op: the difference between a run of N2 and one of N1 iterations, over (N2 - N1) * K ops, so
warm-up and tracing cancel. Co-executed totals vary by up to 16% between runs (one build: 6,256
to 7,279; more when other work shares the cores), in the parts that depend on how the threads
interleaved (how many executed items a reclaim finds, whether a result's Python object was
resurrected, wrapping the result); compare builds by the parts that do not depend on the
GraphRunner (argument building, location key, validation), which barely vary.

    .venv/bin/python bench/per_op_instructions.py [--base /tmp/base/build/python]

Needs valgrind (Debian package `valgrind`). About a minute per child; children run two at a time.
Results: bench/results/per_op_instructions.{json,md}.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from per_op import K, chain  # bench/per_op.py (it sets TERRA_ADAPTIVE=0: co-execution itself)

N1, N2 = 20, 60
WARM = 100  # co-executed iterations before the counted ones (terra mode)

# Parts of the co-executed path, by function name (inclusive counts: a part includes what it calls).
PARTS = [
    ("fast path entry (all of it)", "entry_point<"),
    ("argument building (fast path)", "(anonymous namespace)::build("),
    ("location key (stack hash + occurrence)", "PythonRunner::lookup_key("),
    ("stack hash", "PythonStack::hash("),
    ("validation against the predicted node (its frame alone)", "PythonRunner::predicted_node("),
    ("validation against the successors", "PythonRunner::matching_successor("),
    ("validation through the location index", "PythonRunner::match_node("),
    ("issue (item, placeholders, reclaim)", "PythonRunner::issue(unsigned int, terra::runtime::OpTemplate const&, std::vector<c10::IValue, std::allocator<c10::IValue> >*) ["),
    ("reclaiming executed items", "GraphRunner::reclaim("),
    ("resurrected Python objects freed", "TensorImpl::decref_pyobject("),
    ("wrapping the result (THPVariable_Wrap)", "THPVariable_Wrap("),
]


def child(mode, iterations):
    import torch
    torch.set_num_threads(1)  # a 1x1 add never runs parallel; no OpenMP pool under valgrind
    x, y = torch.randn(1, 1), torch.randn(1, 1)
    if mode == "eager":
        chain(x, y, 5)
        chain(x, y, iterations)
        return
    import terra
    marked = terra._instrument(chain)
    terra.run(chain, x, y, 5)  # traced, then co-executed
    terra._enter("chain-instructions", depth=1)
    try:
        # First round the GraphRunner's ring of work items (4096) once: an item's argument
        # vector gets its capacity on its first use, and before that every op allocated two
        # vectors (about 600 instructions per op that a running program does not pay).
        marked(x, y, WARM)
        marked(x, y, iterations)
    finally:
        terra._exit()
    st = terra.stats("chain-instructions")
    assert st["iterations_coexecuted"] >= (WARM + iterations) * 0.9, st


def annotate(path):
    """(total Ir, {function: inclusive Ir}) of one callgrind output file; total None if it collected nothing."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", str(path)],
                          check=True, capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text)
    functions = {}
    for line in text.splitlines():
        f = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if f and "PROGRAM TOTALS" not in line:
            functions[f.group(2)] = functions.get(f.group(2), 0) + int(f.group(1).replace(",", ""))
    return (int(m.group(1).replace(",", "")) if m else None), functions


def counted(mode, iterations, pythonpath, outdir):
    """Runs the child under callgrind, one output per thread; returns the program thread's
    (total Ir inside PyNumber_Add, {function: inclusive Ir}) and the GraphRunner's total Ir inside
    GraphRunner::execute (None eagerly)."""
    out = Path(outdir) / f"cg.{mode}.{iterations}.{abs(hash(pythonpath or ''))}"
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=yes",
                    "--toggle-collect=PyNumber_Add", "--toggle-collect=terra::runtime::GraphRunner::execute*",
                    sys.executable, __file__, "--child", mode, str(iterations)],
                   env=env, check=True, capture_output=True, text=True)
    program, runner = (None, {}), None
    for path in sorted(Path(outdir).glob(out.name + "-*")):
        total, functions = annotate(path)
        if total is None:
            continue
        if any("PyNumber_Add" in k for k in functions):
            program = (total, functions)
        elif any("GraphRunner::execute" in k for k in functions):
            runner = total
    return program, runner


def instructions_per_op(mode, pythonpath, outdir):
    ((t1, f1), r1), ((t2, f2), r2) = (counted(mode, n, pythonpath, outdir) for n in (N1, N2))
    ops = (N2 - N1) * K
    parts = {}
    for label, needle in PARTS:
        a = sum(v for k, v in f1.items() if needle in k)
        b = sum(v for k, v in f2.items() if needle in k)
        parts[label] = (b - a) / ops
    runner = (r2 - r1) / ops if r1 is not None and r2 is not None else None
    return {"total": (t2 - t1) / ops, "parts": parts, "graph_runner": runner}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="PYTHONPATH of a baseline build's terra package")
    ap.add_argument("--base-label", help="what the baseline is (a commit), for the results file")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    if not shutil.which("valgrind"):
        sys.exit("bench/per_op_instructions.py needs valgrind (apt-get install valgrind)")
    runs = [("eager", "eager", None), ("terra", "this", None)]
    if args.base:
        runs.append(("terra", "base", args.base))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        futures = {label: pool.submit(instructions_per_op, mode, pp, tmp) for mode, label, pp in runs}
        results = {label: f.result() for label, f in futures.items()}
    import torch
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "ops_per_iteration": K,
           "iterations": [N1, N2], "base": args.base_label or args.base, "results": results}
    res = Path(__file__).resolve().parent / "results"
    (res / "per_op_instructions.json").write_text(json.dumps(out, indent=2) + "\n")
    eager = results["eager"]["total"]
    cols = [c for c in ("this", "base") if c in results]
    lines = ["# Instructions per op on the program thread (callgrind), against eager", "",
             f"{out['date']}, torch {out['torch']}: `z = z + y` on 1x1 tensors, {K} per iteration; "
             f"instructions inside CPython's PyNumber_Add per op, from runs of {N2} and {N1} iterations "
             "after the ring of work items has been used once (bench/per_op_instructions.py). "
             "Eagerly that is the whole op; co-executed, what the program thread does for it (the "
             "kernel runs on the GraphRunner), including freeing replaced results' Python objects, "
             "which eagerly happens outside the call. Parts are inclusive (a part counts what it "
             "calls; parts overlap)."
             + (f" base: {out['base']}" if args.base else ""), "",
             "| | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols),
             f"| eager op (whole) | {eager:.0f} |" + " |" * (len(cols) - 1),
             "| co-executed op, program thread | " + " | ".join(f"{results[c]['total']:.0f}" for c in cols) + " |",
             "| as a share of the eager op | " + " | ".join(f"{results[c]['total'] / eager:.2f}" for c in cols) + " |",
             "| GraphRunner per op (GraphRunner::execute: replay and kernel) | "
             + " | ".join(f"{results[c]['graph_runner']:.0f}" if results[c].get("graph_runner") is not None else "-"
                          for c in cols) + " |"]
    for label, _ in PARTS:
        lines.append(f"| {label} | " + " | ".join(f"{max(0.0, results[c]['parts'][label]):.0f}" for c in cols) + " |")
    (res / "per_op_instructions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
