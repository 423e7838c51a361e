"""Benchmark harness: every program of bench/programs/ side by side under eager, Terra,
torch.compile (default and fullgraph=True), torch.jit.script and torch.jit.trace.

    .venv/bin/python bench/run.py                          # everything (about 15-20 min on 2 cores)
    .venv/bin/python bench/run.py --quick                  # fewer rounds, no torch.compile modes (< 3 min)
    .venv/bin/python bench/run.py --program gpt            # one program (merged into the results)
    .venv/bin/python bench/run.py --program gpt,bert --modes eager,terra,compile

Every speed figure is against eager run in a fresh process: per program, the parent alternates
child processes (an eager-only child, a Terra child, again, `--process-rounds` times), then one
child for the compiler modes; each child times its modes in interleaved rounds. A child that is
not eager-only also runs eager, as the correctness reference of its own modes (bitwise for Terra)
and as "eager in the same process", recorded for comparison but never the baseline. A crash or a
hang in one child is recorded and does not stop the others; the parent writes
bench/results/bench_cpu.json, bench/results/bench_cpu.md and bench/results/speedup_cpu.png.
See bench/README.md for what every column means.
"""
import argparse
import datetime
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ALL_MODES = ["eager", "terra", "compile", "compile_fullgraph", "jit_script", "jit_trace"]
COMPILE_MODES = {"compile", "compile_fullgraph"}
SEED = 0
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------------------------
# child: one program, all modes in one process
# ----------------------------------------------------------------------------------------------
def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Peak resident set size (VmRSS from /proc/self/statm) sampled every 1 ms while active."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        self.base = _rss_bytes()
        self.peak = self.base
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        return False


def _error_text(exc):
    first = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(tb).strip().splitlines()[-6:]
    return first[:400], [line[:300] for line in tail]


def _random_objects(module):
    import random
    found = []
    for m in module.modules():
        for v in vars(m).values():
            if isinstance(v, random.Random):
                found.append(v)
    return found


def _jit_swap(state, prog, how):
    """Replace each jit target module in `state` by torch.jit.script / torch.jit.trace of it. The
    wrapper shares the parameters with the original module (the optimizer's tensors). Tracing runs
    the module once: parameters, buffers (BatchNorm statistics), the torch RNG and any
    random.Random held by the module are restored afterwards so the run starts from make(seed)."""
    import torch
    for key, example in prog.jit_targets(state).items():
        module = state[key]
        if how == "script":
            state[key] = torch.jit.script(module)
            continue
        saved = {k: v.detach().clone() for k, v in module.state_dict().items()}
        rng = torch.get_rng_state()
        pyrngs = [(r, r.getstate()) for r in _random_objects(module)]
        try:
            state[key] = torch.jit.trace(module, example, check_trace=False)
        finally:
            with torch.no_grad():
                for k, v in module.state_dict().items():
                    v.copy_(saved[k])
            torch.set_rng_state(rng)
            for r, s in pyrngs:
                r.setstate(s)


def _counters_snapshot():
    from torch._dynamo.utils import counters
    return {k: dict(v) for k, v in counters.items()}


def _counters_delta(before, after):
    out = {}
    for k, v in after.items():
        for kk, vv in v.items():
            d = vv - before.get(k, {}).get(kk, 0)
            if d:
                out.setdefault(k, {})[kk] = d
    return out


class Mode:
    """One way of running a program: builds its state and runs `steps` iterations."""

    def __init__(self, name, prog):
        self.name, self.prog = name, prog
        self.state = None
        self.rng_state = None
        self.dynamo = {}
        self.fn = None

    def setup(self):
        import torch
        prog = self.prog
        self.state = prog.make(SEED)
        rng = torch.get_rng_state()  # jit_targets() may draw example inputs: keep make()'s RNG state
        if self.name in ("jit_script", "jit_trace"):
            _jit_swap(self.state, prog, self.name[4:])
        elif self.name == "compile_fullgraph":
            # the model's forward (each jit target) captured whole; the step around it stays eager
            for key in prog.jit_targets(self.state):
                self.state[key] = torch.compile(self.state[key], fullgraph=True)
        elif self.name == "compile":
            # the whole training step (forward, backward, optimizer, Python logic), graph breaks allowed
            code = prog.step.__code__
            code = code.replace(co_name=f"step_{self.name}", co_qualname=f"step_{self.name}")
            fresh = types.FunctionType(code, prog.step.__globals__, f"step_{self.name}")
            self.fn = torch.compile(fresh, fullgraph=(self.name == "compile_fullgraph"))
        elif self.name == "terra":
            import terra
            terra.reset()
        self.rng_state = rng

    def run(self, steps):
        """Runs `steps` iterations; returns the wall time in seconds (Terra: until synced)."""
        import torch
        torch.set_rng_state(self.rng_state)
        before = _counters_snapshot() if self.name in COMPILE_MODES else None
        t0 = time.perf_counter()
        if self.name == "terra":
            import terra
            terra.run(self.prog.train, self.state, steps)
            terra.sync()
        elif self.name == "compile":
            fn, state = self.fn, self.state
            for _ in range(steps):
                fn(state)
        else:
            self.prog.train(self.state, steps)
        dt = time.perf_counter() - t0
        self.rng_state = torch.get_rng_state()
        if before is not None:
            delta = _counters_delta(before, _counters_snapshot())
            for k, v in delta.items():
                for kk, vv in v.items():
                    self.dynamo.setdefault(k, {})
                    self.dynamo[k][kk] = self.dynamo[k].get(kk, 0) + vv
        return dt


def _dynamo_summary(d):
    breaks = d.get("graph_break", {})
    stats = d.get("stats", {})
    top = sorted(breaks.items(), key=lambda kv: -kv[1])[:3]
    return {
        "unique_graphs": stats.get("unique_graphs", 0),
        "calls_captured": stats.get("calls_captured", 0),
        "graph_breaks": sum(breaks.values()),
        "distinct_break_reasons": len(breaks),
        "top_break_reasons": [f"{n}x {r[:200]}" for r, n in top],
        "recompiles": sum(d.get("recompiles", {}).values()) if "recompiles" in d else None,
        "raw_stats": stats,
    }


def child(args):
    import torch
    threads = args.threads
    torch.set_num_threads(threads)
    if "eager" not in args.modes:
        args.modes = ["eager"] + args.modes
    out = {"program": args.child, "threads": threads, "modes": {}}
    path = Path(args.json)

    def dump():
        path.write_text(json.dumps(out, indent=1))

    t_import = time.perf_counter()
    prog = importlib.import_module(f"bench.programs.{args.child}")
    from bench.programs import _common
    if "terra" in args.modes:
        import terra
        out["terra_version"] = getattr(terra, "__version__", "?")
    if COMPILE_MODES & set(args.modes):
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401  (imports paid once per process, not per program)
        import torch._inductor.config as inductor_config
        inductor_config.fallback_random = True  # same random numbers as eager, so results compare
    out["import_s"] = time.perf_counter() - t_import
    out["description"] = prog.DESCRIPTION
    check_steps = args.check_steps
    # process warm-up, not measured: one eager run on a throwaway state pays the once-per-process
    # costs (oneDNN / allocator initialization) that would otherwise land on whichever mode runs first
    t0 = time.perf_counter()
    scratch = prog.make(SEED + 1)
    prog.train(scratch, 2)
    out["process_warmup_s"] = time.perf_counter() - t0
    probe = []  # eager step time estimate (min of 3), to size the timed calls
    for _ in range(3):
        t0 = time.perf_counter()
        prog.train(scratch, 1)
        probe.append(time.perf_counter() - t0)
    del scratch
    out["loadavg_start"] = os.getloadavg()

    # phase 1: per mode, cold start from make(seed), `check_steps` steps: warm-up cost, memory,
    # correctness against eager
    modes, ref = {}, None
    for name in args.modes:
        res = out["modes"].setdefault(name, {})
        m = Mode(name, prog)
        try:
            with RssSampler() as mem:
                t0 = time.perf_counter()
                m.setup()
                setup_s = time.perf_counter() - t0
                first_s = m.run(1)
                st1 = {k: v.detach().clone() for k, v in prog.final_state(m.state).items()}
                rest_s = m.run(check_steps - 1)
            res.update(setup_s=setup_s, first_step_s=first_s + setup_s,
                       first_call_s=setup_s + first_s + rest_s,
                       peak_rss_delta_mib=(mem.peak - mem.base) / 2**20, rss_before_mib=mem.base / 2**20)
            st = prog.final_state(m.state)
            if name == "eager":
                ref1, ref = st1, {k: v.detach().clone() for k, v in st.items()}
                res.update(status="works", check="reference")
            else:
                bitwise = name == "terra"
                ok1, detail1 = _common.compare(ref1, st1, bitwise=bitwise, rtol=args.rtol, atol=args.atol)
                ok, detail = _common.compare(ref, st, bitwise=bitwise, rtol=args.rtol, atol=args.atol)
                res.update(check_1step={"ok": ok1, "detail": detail1},
                           check={"steps": check_steps, "ok": ok, "detail": detail})
                # compilers: a wrong result is one that is off after ONE step (reordered float math
                # may drift further over several steps; that is reported, not called wrong)
                res["status"] = "works" if ok1 and ok else ("drift" if ok1 and not bitwise else "wrong")
            modes[name] = m
        except Exception as exc:  # noqa: BLE001  (recorded)
            first, tail = _error_text(exc)
            res.update(status="fails", error=first, traceback_tail=tail)
        if name in COMPILE_MODES:
            res["dynamo"] = _dynamo_summary(m.dynamo)
        dump()

    # phase 2: warm-up, untimed for the steady state: `warmup_steps` more steps per mode in calls of
    # the timed calls' size (Terra: each a session, as timed), modes interleaved. Terra's payoff
    # check times co-execution against eager execution over its first tens of iterations
    # (terra/payoff.h); timed from the 7th step, those phases were the "steady" rounds (session
    # 52: dcgan 0.97 of eager's step there, 0.91 over 400-step calls). Reported in the warm-up table.
    k = max(1, min(50, round(args.target_s / max(min(probe), 1e-4))))
    out["steps_per_measurement"] = k
    out["rounds"] = args.rounds
    names = list(modes)
    warm = {n: [0, 0.0] for n in names}  # steps, seconds
    while any(warm[n][0] < args.warmup_steps for n in names):
        for n in names:
            if warm[n][0] >= args.warmup_steps:
                continue
            steps = min(k, args.warmup_steps - warm[n][0])
            try:
                warm[n][1] += modes[n].run(steps)
                warm[n][0] += steps
            except Exception as exc:  # noqa: BLE001  (recorded; the mode is not timed)
                first, tail = _error_text(exc)
                out["modes"][n].update(status="fails", error="during warm-up: " + first, traceback_tail=tail)
                names.remove(n)
                break

    # phase 3: steady state, modes interleaved round-robin (rotating the order every round)
    times = {n: [] for n in names}
    failed_late = set()
    spent = {}
    coexec_share = []  # per timed Terra call: the share of its iterations that were co-executed

    def terra_counts():
        import terra
        st = terra.stats("train")
        ran = sum(st.get(f"iterations_{w}", 0) for w in ("traced", "coexecuted", "fallback", "eager"))
        return st.get("iterations_coexecuted", 0), ran
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            if n in failed_late or spent.get(n, 0.0) > args.mode_budget_s:
                continue  # a mode that keeps recompiling is timed on the rounds it fitted in
            try:
                before = terra_counts() if n == "terra" else None
                dt = modes[n].run(k)
                spent[n] = spent.get(n, 0.0) + dt
                times[n].append(dt / k)
                if before is not None:
                    after = terra_counts()
                    coexec_share.append((after[0] - before[0]) / max(1, after[1] - before[1]))
            except Exception as exc:  # noqa: BLE001
                first, tail = _error_text(exc)
                out["modes"][n].update(status="fails", error="during timing: " + first, traceback_tail=tail)
                failed_late.add(n)
    eager_med = statistics.median(times["eager"])
    total_steps = check_steps + args.warmup_steps + args.rounds * k
    ref2 = prog.final_state(modes["eager"].state)
    for n in names:
        res = out["modes"][n]
        if n in failed_late or not times[n]:
            continue
        med = statistics.median(times[n])
        res.update(step_ms_median=med * 1e3, step_ms_all=[t * 1e3 for t in times[n]],
                   ratio_to_eager=med / eager_med, speedup=eager_med / med,
                   warmup_overhead_s=res["first_call_s"] - check_steps * med,
                   warmup_s=warm[n][1], warmup_steps_overhead_s=res["first_call_s"] + warm[n][1]
                   - (check_steps + warm[n][0]) * med)
        res["rounds_timed"] = len(times[n])
        if n != "eager" and len(times[n]) == args.rounds:
            ok, detail = _common.compare(ref2, prog.final_state(modes[n].state), bitwise=(n == "terra"),
                                         rtol=args.rtol, atol=args.atol)
            res["check_after_timing"] = {"steps": total_steps, "ok": ok, "detail": detail}
            if not ok and res["status"] == "works":
                res["status"] = "wrong" if n == "terra" else "drift"
        if n in COMPILE_MODES:
            res["dynamo"] = _dynamo_summary(modes[n].dynamo)
    if "terra" in modes:
        import terra
        st = terra.stats("train")
        out["modes"]["terra"]["terra_stats"] = {k2: v for k2, v in st.items() if not isinstance(v, (list, dict))}
        # Where the payoff check stood at the end (terra/payoff.h): a first run's timed calls may
        # still be timing the two modes against each other (some of them then run eagerly).
        payoff = st.get("payoff", {})
        out["modes"]["terra"]["payoff_end"] = {"phase": payoff.get("phase"), "choice": payoff.get("choice")}
        out["modes"]["terra"]["timed_coexec_share"] = coexec_share
        out["modes"]["terra"]["terra_explain"] = [str(e)[:300] for e in terra.explain()[:10]]
    out["eager_step_ms"] = eager_med * 1e3
    out["total_steps_per_mode"] = total_steps
    out["loadavg_end"] = os.getloadavg()
    out["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dump()


# ----------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------
def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "git_commit": commit,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
    }


def run_program(name, args, modes):
    with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as tmp:
        out_json = Path(tmp) / "result.json"
        env = dict(os.environ)
        env.setdefault("TERRA_REMEMBER_PAYOFF", "0")  # a first run: the payoff check times afresh
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")  # cold compile every run
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
        env.setdefault("PYTHONWARNINGS", "ignore")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--json", str(out_json),
               "--modes", ",".join(modes), "--threads", str(args.threads), "--rounds", str(args.rounds),
               "--check-steps", str(args.check_steps), "--warmup-steps", str(args.warmup_steps),
               "--target-s", str(args.target_s),
               "--rtol", str(args.rtol), "--atol", str(args.atol), "--mode-budget-s", str(args.mode_budget_s)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stderr = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        wall = time.perf_counter() - t0
        result = json.loads(out_json.read_text()) if out_json.exists() else {"program": name, "modes": {}}
    result["child_wall_s"] = wall
    if rc != 0:
        tail = [line for line in stderr.strip().splitlines()[-8:]]
        result["child_error"] = {"returncode": rc, "stderr_tail": tail}
        for m in modes:
            r = result["modes"].setdefault(m, {})
            if "status" not in r or "ratio_to_eager" not in r and r.get("status") == "works":
                r.setdefault("status", "fails")
                r["error"] = r.get("error") or f"child process {'timed out' if rc == 'timeout' else f'exited with {rc}'}"
    return result


def run_program_fresh_eager(name, args, modes):
    """One program: eager-only and Terra children alternated, then one child for the other modes;
    every mode's ratio is against the eager-only children (fresh processes, never after Terra)."""
    eager_runs, terra_runs = [], []
    for _ in range(args.process_rounds):
        eager_runs.append(run_program(name, args, ["eager"]))
        if "terra" in modes:
            terra_runs.append(run_program(name, args, ["terra"]))
    others = [m for m in modes if m not in ("eager", "terra")]
    other_run = run_program(name, args, others) if others else None
    res = dict(eager_runs[0])
    res["child_wall_s"] = sum(r["child_wall_s"] for r in eager_runs + terra_runs + ([other_run] if other_run else []))
    eager = dict(eager_runs[0]["modes"].get("eager", {}))
    fresh = [r["modes"]["eager"]["step_ms_median"] for r in eager_runs
             if "step_ms_median" in r["modes"].get("eager", {})]
    modes_out = {}
    if fresh:
        eager_ms = statistics.median(fresh)
        eager.update(step_ms_median=eager_ms, step_ms_per_process=fresh, speedup=1.0, ratio_to_eager=1.0)
        res["eager_step_ms"] = eager_ms
    modes_out["eager"] = eager

    def adopt(mode, runs):
        runs = [r for r in runs if r and mode in r["modes"]]
        if not runs:
            return
        timed = [r["modes"][mode] for r in runs if "step_ms_median" in r["modes"][mode]]
        # status: the worst seen over the children (a wrong result in any run is wrong)
        order = {"works": 0, "drift": 1, "wrong": 2, "fails": 3}
        worst = max((r["modes"][mode] for r in runs), key=lambda x: order.get(x.get("status"), 3))
        m = dict(timed[0] if timed else worst)
        m["status"] = worst.get("status", "fails")
        if worst is not m and "error" in worst:
            m["error"] = worst["error"]
        if timed and fresh:
            ms = statistics.median(t["step_ms_median"] for t in timed)
            m.update(step_ms_median=ms, step_ms_per_process=[t["step_ms_median"] for t in timed],
                     ratio_to_eager=ms / eager_ms, speedup=eager_ms / ms)
            same = [r["modes"]["eager"]["step_ms_median"] for r in runs
                    if "step_ms_median" in r["modes"].get("eager", {})]
            if same:
                m["eager_same_process_step_ms"] = statistics.median(same)
            if mode == "terra":
                m["timed_coexec_share_per_process"] = [t.get("timed_coexec_share") for t in timed]
                m["payoff_end_per_process"] = [t.get("payoff_end") for t in timed]
        modes_out[mode] = m
        if mode == "terra":
            for key in ("terra_version",):
                if key in runs[0]:
                    res[key] = runs[0][key]

    adopt("terra", terra_runs)
    for m in others:
        adopt(m, [other_run])
    res["modes"] = modes_out
    res["process_rounds"] = args.process_rounds
    errors = [r.get("child_error") for r in eager_runs + terra_runs + [other_run] if r and r.get("child_error")]
    if errors:
        res["child_error"] = errors[0]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--program", help="comma-separated program names (default: all)")
    ap.add_argument("--modes", help=f"comma-separated subset of {','.join(ALL_MODES)}")
    ap.add_argument("--quick", action="store_true", help="3 rounds, 4 check steps, no torch.compile modes "
                    "unless --modes names them")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for every mode (default 2)")
    ap.add_argument("--rounds", type=int, help="timing rounds within a child (default 5, quick 3)")
    ap.add_argument("--process-rounds", type=int, help="eager/Terra child processes alternated per "
                    "program (default 3: a median of three is robust to one outlier process; quick 1)")
    ap.add_argument("--check-steps", type=int, help="steps of the cold first call (default 6, quick 4)")
    ap.add_argument("--warmup-steps", type=int, help="untimed steps per mode after the cold ones, before "
                    "the timed rounds (default 60, quick 20)")
    ap.add_argument("--target-s", type=float, help="eager seconds per measurement (default 0.2, quick 0.04)")
    ap.add_argument("--rtol", type=float, default=1e-3, help="tolerance for compilers (allclose rtol)")
    ap.add_argument("--atol", type=float, default=1e-3, help="tolerance for compilers (allclose atol)")
    ap.add_argument("--timeout", type=float, help="seconds per program child (default 400, quick 60)")
    ap.add_argument("--mode-budget-s", type=float, default=45.0,
                    help="stop timing a mode after this many seconds of timed calls (recompiling modes)")
    ap.add_argument("--out", default=str(RESULTS / "bench_cpu.json"))
    ap.add_argument("--no-merge", action="store_true", help="do not keep other programs' earlier results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    q = args.quick
    args.rounds = args.rounds or (3 if q else 5)
    args.process_rounds = args.process_rounds or (1 if q else 3)
    args.check_steps = args.check_steps or (4 if q else 6)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (20 if q else 60)
    args.target_s = args.target_s or (0.04 if q else 0.2)
    args.timeout = args.timeout or (60 if q else 400)
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in ALL_MODES]
        if bad:
            ap.error(f"unknown modes {bad}; known: {ALL_MODES}")
    else:
        modes = [m for m in ALL_MODES if not (q and m in COMPILE_MODES)]
    if args.child:
        args.modes = modes
        child(args)
        return

    from bench.programs import PROGRAMS
    programs = PROGRAMS if not args.program else [p.strip() for p in args.program.split(",")]
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        ap.error(f"unknown programs {unknown}; known: {PROGRAMS}")
    out_path = Path(args.out)
    doc = {"programs": {}}
    if out_path.exists() and not args.no_merge:
        try:
            doc = json.loads(out_path.read_text())
        except ValueError:
            pass
    doc["machine"] = machine()
    doc["settings"] = {"threads": args.threads, "rounds": args.rounds, "process_rounds": args.process_rounds,
                       "eager_baseline": "fresh eager-only processes", "check_steps": args.check_steps,
                       "warmup_steps": args.warmup_steps,
                       "target_s": args.target_s, "rtol": args.rtol, "atol": args.atol, "quick": q,
                       "modes": modes, "timeout_s": args.timeout, "seed": SEED}
    t_all = time.perf_counter()
    for name in programs:
        print(f"[bench] {name} ...", flush=True)
        res = run_program_fresh_eager(name, args, modes)
        res["settings"] = dict(doc["settings"])
        res["date"] = doc["machine"]["date"]
        doc["programs"][name] = res
        line = []
        for m in modes:
            r = res["modes"].get(m, {})
            s = r.get("status", "?")
            if "ratio_to_eager" in r:
                s += f" {r['ratio_to_eager']:.2f}x"
            line.append(f"{m}={s}")
        print(f"[bench] {name} ({res['child_wall_s']:.0f}s): " + "  ".join(line), flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=1))
    doc["last_run_wall_s"] = time.perf_counter() - t_all
    out_path.write_text(json.dumps(doc, indent=1))
    write_all(doc, out_path.parent) if out_path.name == "bench_cpu.json" else None
    print(f"[bench] wrote {out_path} and the .md/.png next to it ({doc['last_run_wall_s']:.0f}s)")



# ----------------------------------------------------------------------------------------------
# report: markdown table and PNG plot generated from the JSON
# ----------------------------------------------------------------------------------------------
MODE_LABEL = {"eager": "eager", "terra": "Terra", "compile": "compile(step)",
              "compile_fullgraph": "compile(model, fullgraph)", "jit_script": "jit.script(model)",
              "jit_trace": "jit.trace(model)"}


def _geomean(xs):
    import math
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(doc):
    progs = doc["programs"]
    out = {}
    for m in ALL_MODES[1:]:
        sp = [p["modes"][m]["speedup"] for p in progs.values()
              if p["modes"].get(m, {}).get("status") == "works" and "speedup" in p["modes"][m]]
        n = sum(1 for p in progs.values() if m in p["modes"])
        out[m] = {"geomean_speedup_over_eager": _geomean(sp), "programs_working": len(sp), "programs_run": n}
    # Terra vs torch.compile(step) on the programs where both work (ratio of step times)
    both = [p["modes"]["compile"]["step_ms_median"] / p["modes"]["terra"]["step_ms_median"]
            for p in progs.values()
            if all(p["modes"].get(m, {}).get("status") == "works" and "step_ms_median" in p["modes"][m]
                   for m in ("terra", "compile"))]
    out["terra_vs_compile_geomean_speedup"] = _geomean(both)
    out["terra_vs_compile_programs"] = len(both)
    anyc = [p["modes"]["compile"]["step_ms_median"] / p["modes"]["terra"]["step_ms_median"]
            for p in progs.values()
            if all("step_ms_median" in p["modes"].get(m, {}) for m in ("terra", "compile"))
            and p["modes"]["terra"].get("status") == "works"]
    out["terra_vs_compile_geomean_speedup_incl_compile_wrong"] = _geomean(anyc)
    return out


def _cell(r):
    s = r.get("status", "-")
    if s == "works" and "ratio_to_eager" in r:
        return f"{r['ratio_to_eager']:.2f}"
    if s in ("wrong", "drift"):
        return f"{s.upper()} {r['ratio_to_eager']:.2f}" if "ratio_to_eager" in r else s.upper()
    if s == "fails":
        return "FAIL"
    return s


def write_markdown(doc, path):
    progs, mach, st = doc["programs"], doc["machine"], doc["settings"]
    modes = [m for m in ALL_MODES if any(m in p["modes"] for p in progs.values())]
    L = ["# CPU benchmark results", "",
         f"Generated by `bench/run.py` from `bench_cpu.json` ({mach['date']}, commit {mach['git_commit']}). "
         f"Machine: {mach['cpu']}, {mach['logical_cpus']} logical CPUs, torch {mach['torch']}, Python "
         f"{mach['python']}; `torch.set_num_threads({st['threads']})` in every mode; OMP_WAIT_POLICY "
         f"{mach['OMP_WAIT_POLICY']}. Settings: {st['rounds']} interleaved rounds per child process, "
         f"{st.get('process_rounds', 1)} eager-only and Terra child processes alternated per program, "
         f"{st['check_steps']} cold steps per mode, then {st.get('warmup_steps', 0)} untimed warm-up steps "
         f"per mode in calls of the timed size, compiler tolerance rtol={st['rtol']} atol={st['atol']}. "
         f"Baseline: {st.get('eager_baseline', 'eager in the same process as the other modes')}.", "",
         "## Steady-state step time, ratio to eager (lower is faster)", "",
         "Terra's child is a first run (the payoff check remembers nothing) and these are its steps after the "
         "cold call and the untimed warm-up calls, in calls of the timed size: where the check is still timing "
         "the two modes, some of them run eagerly (the graphs table below says which). "
         "Median of the interleaved rounds, divided by eager's median. WRONG = result differs from eager "
         "(Terra: not bitwise equal; compilers: outside tolerance after one step); FAIL = raised.", "",
         "The last column is eager timed inside the Terra child, after Terra had co-executed there "
         "(what a second OpenMP team used to slow down), in ms/step; it is never the baseline.", "",
         "| program | eager ms/step | " + " | ".join(MODE_LABEL[m] for m in modes[1:]) + " | eager in Terra's process |",
         "|---|---:|" + "---:|" * (len(modes) - 1) + "---:|"]
    for name, p in progs.items():
        e = p["modes"].get("eager", {})
        eager = f"{e['step_ms_median']:.2f}" if "step_ms_median" in e else _cell(e)
        same = p["modes"].get("terra", {}).get("eager_same_process_step_ms")
        cells = [_cell(p["modes"].get(m, {})) for m in modes[1:]] + [f"{same:.2f}" if same else "-"]
        L.append(f"| {name} | {eager} | " + " | ".join(cells) + " |")
    sm = summary(doc)
    L += ["", "Geometric-mean speedup over eager (programs where the mode works): " + ", ".join(
        f"{MODE_LABEL[m]} {v['geomean_speedup_over_eager']:.2f}x ({v['programs_working']}/{v['programs_run']})"
        for m, v in sm.items() if isinstance(v, dict) and v["geomean_speedup_over_eager"]) + ".",
        f"Terra vs compile(step), geometric mean of compile time / Terra time where both work: "
        + (f"{sm['terra_vs_compile_geomean_speedup']:.2f}x ({sm['terra_vs_compile_programs']} programs)"
           if sm["terra_vs_compile_geomean_speedup"] else "n/a")
        + (f"; including programs where compile's result is outside tolerance: "
           f"{sm['terra_vs_compile_geomean_speedup_incl_compile_wrong']:.2f}x"
           if sm["terra_vs_compile_geomean_speedup_incl_compile_wrong"] else "") + ".", ""]
    L += ["## Warm-up", "",
          f"Cold first {st['check_steps']} steps from make(seed), in seconds, including compile / script / "
          "trace / Terra tracing; in parentheses the overhead over steady state "
          f"(first call minus {st['check_steps']} x median step); after the slash, the overhead of the "
          f"first {st['check_steps']} + {st.get('warmup_steps', 0)} steps (the cold call and the untimed "
          "warm-up calls, minus that many median steps): what settling costs, Terra's payoff check included.", "",
          "| program | " + " | ".join(MODE_LABEL[m] for m in modes) + " |", "|---|" + "---:|" * len(modes)]
    for name, p in progs.items():
        cells = []
        for m in modes:
            r = p["modes"].get(m, {})
            if "first_call_s" in r:
                c = f"{r['first_call_s']:.2f}"
                if "warmup_overhead_s" in r:
                    c += f" ({r['warmup_overhead_s']:+.2f})"
                if "warmup_steps_overhead_s" in r:
                    c += f" / {r['warmup_steps_overhead_s']:+.2f}"
                cells.append(c)
            else:
                cells.append(_cell(r))
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    L += ["", "## Graphs, graph breaks, Terra fallbacks", "",
          "Terra: iterations traced / co-executed / eager-fallback / eager because faster (the payoff "
          "check, terra/payoff.h), fallbacks, fetches, TraceGraph nodes "
          "(terra.stats). compile: torch._dynamo counters summed over the run (unique graphs, graph breaks, "
          "distinct break reasons). Timed Terra calls: the share of each timed call's iterations that were "
          "co-executed, and where the payoff check stood at the end of the run, per Terra child process (' / ' "
          "between processes) "
          "(a first run's timed calls may still be timing the modes against each other).", "",
          "| program | Terra it. traced/coexec/fallback/faster-eager | timed Terra calls co-executed | payoff at the end "
          "| Terra fallbacks | Terra fetches | Terra nodes | "
          "compile(step) graphs / breaks (reasons) | compile(model, fullgraph) graphs |",
          "|---|---|---|---|---:|---:|---:|---|---|"]
    for name, p in progs.items():
        t = p["modes"].get("terra", {}).get("terra_stats", {})
        chosen = t.get("iterations_eager_chosen", 0)
        tc = (f"{t.get('iterations_traced')}/{t.get('iterations_coexecuted')}/"
              f"{t.get('iterations_fallback', 0) + t.get('iterations_eager', 0) - chosen}/{chosen}") if t else "-"
        c = p["modes"].get("compile", {}).get("dynamo")
        cc = f"{c['unique_graphs']} / {c['graph_breaks']} ({c['distinct_break_reasons']})" if c else "-"
        f = p["modes"].get("compile_fullgraph", {})
        fc = (f"{f['dynamo']['unique_graphs']}" if f.get("status") != "fails" and f.get("dynamo") else _cell(f))
        terra_mode = p["modes"].get("terra", {})
        # one entry per Terra child process, separated by " / "
        shares = terra_mode.get("timed_coexec_share_per_process") or [terra_mode.get("timed_coexec_share")]
        sc = " / ".join(" ".join(f"{x:.0%}" for x in sh) for sh in shares if sh) or "-"
        ends = terra_mode.get("payoff_end_per_process") or [terra_mode.get("payoff_end")]
        pc = " / ".join(f"{pe['phase']}, {pe['choice']}" for pe in ends if pe and pe.get("phase")) or "-"
        L.append(f"| {name} | {tc} | {sc} | {pc} | {t.get('fallbacks', '-')} | {t.get('fetches', '-')} | {t.get('nodes', '-')} "
                 f"| {cc} | {fc} |")
    L += ["", "## Peak memory", "",
          "Peak resident set size above the level just before the mode's cold start, MiB (VmRSS sampled every "
          "1 ms from /proc/self/statm during setup + the first steps, which includes compilation/tracing); "
          "last column: the child process's ru_maxrss (all modes of the program together).", "",
          "| program | " + " | ".join(MODE_LABEL[m] for m in modes) + " | process ru_maxrss MiB |",
          "|---|" + "---:|" * (len(modes) + 1)]
    for name, p in progs.items():
        cells = [f"{p['modes'][m]['peak_rss_delta_mib']:.0f}" if "peak_rss_delta_mib" in p["modes"].get(m, {})
                 else _cell(p["modes"].get(m, {})) for m in modes]
        L.append(f"| {name} | " + " | ".join(cells) + f" | {p.get('ru_maxrss_mib', 0):.0f} |")
    L += ["", "## Failures and wrong results", "", "| program | mode | status | detail |", "|---|---|---|---|"]
    for name, p in progs.items():
        if "child_error" in p:
            ce = p["child_error"]
            L.append(f"| {name} | (process) | exit {ce['returncode']} | "
                     f"{' / '.join(ce['stderr_tail'][-2:]).replace('|', '/')[:300]} |")
        for m in modes:
            r = p["modes"].get(m, {})
            if r.get("status") in ("fails", "wrong"):
                d = r.get("error") or (r.get("check_1step", {}).get("detail") if not r.get("check_1step", {}).get("ok", True)
                                       else (r.get("check") or {}).get("detail") if isinstance(r.get("check"), dict) else "")
                if r.get("status") == "wrong" and r.get("check_after_timing") and not r["check_after_timing"]["ok"]:
                    d = f"{d}; after {r['check_after_timing']['steps']} steps: {r['check_after_timing']['detail']}"
                L.append(f"| {name} | {MODE_LABEL[m]} | {r['status']} | {str(d).replace('|', '/').replace(chr(10), ' ')[:300]} |")
    drift = [(n, m, p["modes"][m]) for n, p in progs.items() for m in ("compile", "compile_fullgraph", "jit_script", "jit_trace")
             if p["modes"].get(m, {}).get("status") == "drift"]
    if drift:
        L += ["", "DRIFT: within tolerance after one step, beyond it after more steps. Either reordered float "
              "math amplified by training, or a semantic difference that shows only later (e.g. jit.trace "
              "freezing the first step's Python-chosen path); not counted in the geometric means:", ""]
        for n, m, r in drift:
            c, a = r.get("check") or {}, r.get("check_after_timing") or {}
            L.append(f"- {n} / {MODE_LABEL[m]}: after {c.get('steps')} steps {c.get('detail')}; "
                     f"after {a.get('steps')} steps {a.get('detail')}")
    Path(path).write_text("\n".join(L) + "\n")


# a 3x5 bitmap font (rows top to bottom, 3 bits each) for the plot's labels
_FONT = {
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111", "0": "111101101101111", "1": "010110010010111",
    "2": "110001010100111", "3": "110001010001110", "4": "101101111001001", "5": "111100110001110",
    "6": "011100111101111", "7": "111001010010010", "8": "111101111101111", "9": "111101111001110",
    ".": "000000000000010", "_": "000000000000111", "-": "000000111000000", " ": "000000000000000",
    "(": "010100100100010", ")": "010001001001010", ",": "000000000010100", ":": "000010000010000",
    "=": "000111000111000", "/": "001001010100100", "+": "000010111010000",
}


def write_png(doc, path):
    import math
    import struct
    import zlib
    progs = doc["programs"]
    modes = [m for m in ALL_MODES[1:] if any(m in p["modes"] for p in progs.values())]
    colors = {"terra": (214, 39, 40), "compile": (31, 119, 180), "compile_fullgraph": (158, 202, 225),
              "jit_script": (44, 160, 44), "jit_trace": (152, 223, 138)}
    names = list(progs)
    S = 2  # font scale
    bar_w, gap = 9, 14
    group_w = bar_w * len(modes) + gap
    left, top, plot_h = 70, 40, 360
    legend_w = 330
    W = left + group_w * len(names) + 20 + legend_w
    H = top + plot_h + 60
    img = [[(255, 255, 255)] * W for _ in range(H)]

    def rect(x0, y0, x1, y1, c):
        for y in range(max(0, y0), min(H, y1)):
            row = img[y]
            for x in range(max(0, x0), min(W, x1)):
                row[x] = c

    def text(x, y, s, c=(0, 0, 0)):
        for ch in s.upper():
            g = _FONT.get(ch, _FONT[" "])
            for i, bit in enumerate(g):
                if bit == "1":
                    rect(x + (i % 3) * S, y + (i // 3) * S, x + (i % 3 + 1) * S, y + (i // 3 + 1) * S, c)
            x += 4 * S

    lo, hi = math.log2(1 / 8), math.log2(4)  # y range: 0.125x .. 4x, log scale

    def ypos(v):
        v = min(max(math.log2(v), lo), hi)
        return top + int((hi - v) / (hi - lo) * plot_h)

    for t in (0.125, 0.25, 0.5, 1, 2, 4):
        y = ypos(t)
        rect(left, y, left + group_w * len(names), y + 1, (0, 0, 0) if t == 1 else (215, 215, 215))
        text(8, y - 5, f"{t:g}X")
    text(left, 10, "SPEEDUP OVER EAGER (LOG SCALE, HIGHER IS FASTER), CPU")
    for gi, name in enumerate(names):
        x = left + gi * group_w + gap // 2
        for mi, m in enumerate(modes):
            r = progs[name]["modes"].get(m, {})
            c = colors.get(m, (120, 120, 120))
            bx = x + mi * bar_w
            if "speedup" in r and r.get("status") in ("works", "wrong", "drift"):
                y1, y0 = ypos(1), ypos(r["speedup"])
                if r.get("status") != "works":  # pale: wrong result or drift
                    c = tuple(int(v * 0.5 + 127) for v in c)
                rect(bx, min(y0, y1), bx + bar_w - 1, max(y0, y1) + 1, c)
            else:  # failed / not run: a small x mark under the baseline
                text(bx + 1, ypos(1) + 4, "X", c)
        text(x + 2, top + plot_h + 8, str(gi + 1))
    lx = left + group_w * len(names) + 20
    y = top
    for m in modes:
        rect(lx, y, lx + 12, y + 10, colors.get(m, (120, 120, 120)))
        text(lx + 18, y, MODE_LABEL[m].replace("(", " (").replace(".", " "))
        y += 18
    text(lx, y, "PALE: WRONG OR DRIFT  X: FAILED")
    y += 26
    for gi, name in enumerate(names):
        text(lx, y, f"{gi + 1} {name}")
        y += 14
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    Path(path).write_bytes(png)


def _normalize_status(doc):
    """Compilers that agree after one step but not after more: 'drift' (also for older JSON)."""
    for p in doc["programs"].values():
        for m, r in p["modes"].items():
            if m in ("eager", "terra") or r.get("status") != "works":
                continue
            chk, after = r.get("check"), r.get("check_after_timing")
            if (isinstance(chk, dict) and not chk["ok"]) or (after and not after["ok"]):
                r["status"] = "drift"


def write_all(doc, folder):
    folder = Path(folder)
    _normalize_status(doc)
    doc["summary"] = summary(doc)
    (folder / "bench_cpu.json").write_text(json.dumps(doc, indent=1))
    write_markdown(doc, folder / "bench_cpu.md")
    write_png(doc, folder / "speedup_cpu.png")


if __name__ == "__main__":
    main()
