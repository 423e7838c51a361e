"""Terra's IPython magics.

Real IPython magics (a ``Magics`` class registered on the shell), so ``%lsmagic``, ``%terra?``,
completion of ``%ter`` and history all work. Bad arguments raise ``UsageError``, which IPython
shows as a short message, never a traceback.
"""
import json
import shlex
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from . import static_views, viewdata

USAGE = """\
%terra on              co-execute the following cells (the default)
%terra off             run the following cells eagerly
%terra status          one row per graph: iterations traced / co-executed / fallen back
%terra explain [N]     every fallback to eager: reason, op and source line (N: one cell)
%terra graph [N]       interactive view of a cell's TraceGraph: blocks, last path, fallbacks
                       (N: In [N] or a graph name; default: the cell run last; it follows
                       new runs live); --text: a text summary instead
%terra timeline [N]    Python thread and GraphRunner over recent iterations, and the step
                       time of each (--all: every graph's iterations)
%terra timeline [N] --export FILE.json
                       write them as a Chrome trace (open it in Perfetto or chrome://tracing)
%terra steps [N]       step time of each recent iteration, by how it ran (Vega-Lite chart)
%terra reset           drop every recorded graph
%terra config          list the settings; %terra config key=value ... to change them
%terra version         the engine's version
%%terra [off]          (cell magic) co-execute this cell (or run it eagerly) whatever the mode
"""

# The kernel's own setting; the engine's come from its table (terra.settings(), terra/policy.h).
SUMMARY_HELP = "print a one-line summary after each co-executed cell (on/off)"


def _bool(text):
    if text.lower() in ("on", "true", "1", "yes"):
        return True
    if text.lower() in ("off", "false", "0", "no"):
        return False
    raise UsageError(f"%terra config: expected on/off, got {text!r}")


@magics_class
class TerraMagics(Magics):
    def __init__(self, shell, cells):
        super().__init__(shell)
        self.cells = cells
        self._views = None

    @line_magic
    def terra(self, line):
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%terra: {e}\n{USAGE}")
        command, args = (words[0], words[1:]) if words else ("status", [])
        handler = getattr(self, f"_cmd_{command}", None)
        if handler is None:
            raise UsageError(f"%terra: unknown command {command!r}\n{USAGE}")
        return handler(args)

    @cell_magic("terra")
    def terra_cell(self, line, cell):
        """%%terra runs this cell co-executed; %%terra off runs it eagerly."""
        mode = line.strip()
        if mode not in ("", "on", "off"):
            raise UsageError(f"%%terra: expected nothing, 'on' or 'off', got {mode!r}")
        self.cells.forced = mode != "off"
        try:
            self.shell.run_cell(cell)
        finally:
            self.cells.forced = None

    # -- commands ---------------------------------------------------------------------------
    def _no_args(self, name, args):
        if args:
            raise UsageError(f"%terra {name} takes no arguments\n{USAGE}")

    def _cmd_on(self, args):
        self._no_args("on", args)
        self.cells.enabled = True
        print("Terra: co-execution on")

    def _cmd_off(self, args):
        self._no_args("off", args)
        self.cells.enabled = False
        print("Terra: co-execution off (cells run eagerly)")

    def _cmd_version(self, args):
        self._no_args("version", args)
        import terra

        print(terra.__version__)

    def _engine(self):
        import terra

        return terra

    def _cmd_reset(self, args):
        self._no_args("reset", args)
        self._engine().reset()
        self.cells.labels.clear()
        print("Terra: all graphs dropped")

    def _cmd_status(self, args):
        self._no_args("status", args)
        terra = self._engine()
        mode = "on" if self.cells.enabled else "off"
        print(f"Terra {terra.__version__}: co-execution {mode}")
        cached = terra.cached_memory()
        if cached:
            print(f"{cached / 2**20:.1f} MiB of freed CPU blocks kept for eager cells to reuse "
                  "(%terra config program_cache=off frees them)")
        graphs = viewdata.graph_names(terra)
        if not graphs:
            print("no graphs yet: run a cell with a PyTorch loop")
            return
        header = ("graph", "cell", "nodes", "traced", "co-exec", "replayed", "fast path", "fell back",
                  "eager", "eager (faster)", "time traced", "time co-exec")
        rows = []
        for name in graphs:
            s = terra.stats(name)
            rows.append((name, self.cells.labels.get(name, "-"), s["nodes"], s["iterations_traced"],
                         s["iterations_coexecuted"], s["iterations_replayed"], fast_share(s),
                         s["iterations_fallback"],
                         s["iterations_eager"] - s["iterations_eager_chosen"], s["iterations_eager_chosen"],
                         f"{s['traced_seconds']:.2f} s", f"{s['coexec_seconds']:.2f} s"))
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))

    def _graph_for(self, args, command):
        terra = self._engine()
        if len(args) > 1:
            raise UsageError(f"%terra {command}: expected at most one cell or graph, got {args}\n{USAGE}")
        if not args:
            latest = viewdata.latest_graph(terra, self.cells.labels)
            if latest is None:
                raise UsageError("no graphs yet: run a cell with a PyTorch loop")
            return latest
        graphs = viewdata.graph_names(terra)
        want = args[0]
        for name, label in self.cells.labels.items():
            if want in (name, label, label[4:-1]):
                return name
        if want in graphs:
            return want
        raise UsageError(f"%terra {command}: no graph for {want!r} (see %terra status)")

    def _cmd_explain(self, args):
        terra = self._engine()
        names = [self._graph_for(args, "explain")] if args else viewdata.graph_names(terra)
        found = False
        for name in names:
            for f in terra.explain(name):
                found = True
                where = f["where"]
                place = f"{viewdata.place(self.shell, where[0])}, line {where[1]}" if where else "?"
                print(f"{self.cells.labels.get(name, name)}: {place}: {f['op']} ×{f['count']}")
                print(f"    {f['reason']}")
        for name in names:
            stats = terra.stats(name)
            line = payoff_line(stats["payoff"])
            if line:
                found = True
                print(f"{self.cells.labels.get(name, name)}: {line}")
            line = spin_line(stats)
            if line:
                found = True
                print(f"{self.cells.labels.get(name, name)}: {line}")
            line = replay_line(stats)
            if line:
                found = True
                print(f"{self.cells.labels.get(name, name)}: {line}")
            line = iterations_line(stats)
            if line:  # not a fallback: how the iterations were found
                print(f"{self.cells.labels.get(name, name)}: {line}")
        if not found:
            print("Terra: no fallbacks: every traced path was co-executed as recorded")
        for name in names:
            line = dispatch_line(terra.stats(name))
            if line:  # not a fallback: where the program thread's fast path would help next
                print(f"{self.cells.labels.get(name, name)}: {line}")

    def _views_of(self):
        if self._views is None:
            from .views import Views  # imports anywidget: only when a view is first shown

            self._views = Views(self.shell, self.cells)
        return self._views

    def _cmd_graph(self, args):
        flags, args = _options("graph", args, {"--text": False})
        name = self._graph_for(args, "graph")
        if flags["--text"]:
            self._graph_text(name)
            return
        display(self._views_of().graph_view(name, follow=not args))

    def _graph_text(self, name):
        graph = self._engine().graph_json(name)
        s = graph["stats"]
        print(f"{self.cells.labels.get(name, name)} ({name}): {s['nodes']} nodes, {s['edges']} edges, "
              f"{s['iteration_starts']} iteration starts")
        nodes = static_views.op_nodes(graph)
        taken = {}
        for _, e in static_views.op_edges(graph, nodes):
            taken.setdefault(e["from"], []).append((e["to"], e["count"]))
        branches = [(i, succ) for i, succ in sorted(taken.items()) if len(succ) > 1]
        print(f"branch points: {len(branches)}")
        for i, succ in branches[:20]:
            where = nodes[i]["where"]
            line = f" (line {where['line']})" if where else ""
            print(f"  #{i} {nodes[i]['label']}{line}: " + ", ".join(f"→{to} ×{count}" for to, count in succ))

    def _cmd_timeline(self, args):
        flags, args = _options("timeline", args, {"--export": True, "--all": False})
        if flags["--all"] and args:
            raise UsageError(f"%terra timeline: --all takes no cell or graph\n{USAGE}")
        if flags["--all"]:
            name = viewdata.latest_graph(self._engine(), self.cells.labels)
        else:
            name = self._graph_for(args, "timeline")
        if flags["--export"]:
            data = viewdata.timeline(self._engine(), None if flags["--all"] else name)
            trace = viewdata.chrome_trace(data)
            path = Path(flags["--export"]).expanduser()
            try:
                path.write_text(json.dumps(trace))
            except OSError as error:
                raise UsageError(f"%terra timeline: cannot write {path}: {error.strerror}")
            spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
            print(f"Terra: wrote {spans} spans of {len(data['iterations'])} iterations to {path} "
                  "(Chrome trace format: open it in https://ui.perfetto.dev or chrome://tracing)")
            return
        display(self._views_of().timeline_view(name, follow=not args, every_graph=flags["--all"]))

    def _cmd_steps(self, args):
        from . import static_views

        name = self._graph_for(args, "steps")
        data = viewdata.timeline(self._engine(), name, window=1000)
        data["graph"] = self.cells.labels.get(name, name)
        rows = static_views.steps(data)
        text = (f"Terra: step time of {len(rows)} recent iterations of {data['graph']}\n"
                + static_views.steps_text(rows))
        display({static_views.VEGA_LITE: static_views.steps_vegalite(data), "text/plain": text},
                raw=True)

    def _cmd_config(self, args):
        terra = self._engine()
        if not args:
            for setting in terra.settings():
                print(f"{setting['key']} = {setting['value']}    # {setting['help']}")
            print(f"summary = {'on' if self.cells.summary else 'off'}    # {SUMMARY_HELP}")
            return
        summary = None
        engine = []
        for arg in args:
            key, sep, value = arg.partition("=")
            if key == "summary" and sep:
                summary = _bool(value)
            else:
                engine.append(arg)
        if engine:
            try:  # the engine parses its settings and applies all of them or none
                terra.configure(" ".join(engine))
            except ValueError as error:
                raise UsageError(f"%terra config: {error}") from None
        if summary is not None:
            self.cells.summary = summary
        print("Terra: settings updated")


def fast_share(stats):
    """The share of a graph's co-executed ATen ops that entered through the C fast path."""
    total = stats.get("ops_fast", 0) + stats.get("ops_dispatched", 0)
    return f"{100 * stats['ops_fast'] / total:.0f}%" if total else "-"


def dispatch_line(stats):
    """The operators that most often took the dispatcher route while co-executing (where the
    fast path would help next), or None."""
    top = stats.get("ops_dispatched_top") or []
    if not top:
        return None
    ops = ", ".join(f"{name} ({count})" for name, count in top[:5])
    return f"fast path: {fast_share(stats)} of co-executed ops; through the dispatcher most often: {ops}"


def iterations_line(stats):
    """Where a graph's iterations came from when the program's own loops did not give them
    (runtime/python_runner_loops.cpp), or None."""
    parts = []
    if stats.get("helper_step_loops"):
        parts.append(f"{stats['helper_step_loops']} loop(s) of a function called inside this cell's loop "
                     "run a backward in each iteration: each of their iterations is one (training steps)")
    if stats.get("iterations_cut_at_backward"):
        parts.append(f"{stats['iterations_cut_at_backward']} iteration(s) ended at a backward: a training "
                     "loop Terra does not mark (a library's, an imported module's) runs here")
    return "iterations: " + "; ".join(parts) if parts else None


def replay_line(stats):
    """What block replay (the GraphRunner running recorded kernels below autograd) could not do
    for a graph, or None."""
    parts = []
    if stats.get("blocks_refused"):
        parts.append(f"{stats['blocks_refused']} iteration(s) kept the autograd route: "
                     f"{stats['replay_refusal']}")
    if stats.get("replays_left"):
        why = {"blocked": "the program waited for a value before the iteration's backward",
               "grads": "gradients present where the recorded iteration had none (or the reverse)",
               "item": "the iteration took another path",
               "ahead": "the iteration took another path"}.get(stats["replay_left_why"],
                                                             stats["replay_left_why"])
        parts.append(f"left a replayed iteration {stats['replays_left']} time(s) (last: {why})")
    return "block replay: " + "; ".join(parts) if parts else None


PAIRING = "timing both in alternating blocks"  # the payoff check's phase name (runtime/graph.cpp)


def payoff_line(payoff):
    """What the payoff check decided for a graph, for explain; None before its first check or
    while co-execution is kept. While it times both modes in alternating blocks (a check it could
    not tell from one phase of each), it says so: the timeline then shows eager and co-executed
    iterations taking turns."""
    if payoff.get("phase") == PAIRING:
        # by_call: its cells (calls) are short, and each runs wholly one way (terra/payoff.h)
        turns = "a whole cell (or call) each way in turn" if payoff.get("by_call") else "in alternating blocks"
        # pairs_remembered: the pairing goes on from pairs an earlier run on this machine completed
        # before it ended (runtime/payoff_memory.h)
        earlier = payoff.get("pairs_remembered", 0)
        since = f", going on from {earlier} pair(s) of blocks an earlier run on this machine timed" if earlier else ""
        return (f"is being timed co-executed and eagerly, {turns} (one phase of each was too close "
                f"to tell on this host{since}); the faster then runs")
    if payoff.get("python_backward"):
        # held before any check: co-executing such a backward costs more than it saves
        return (f"runs eagerly: its backward runs Python (a hook or a custom autograd.Function), which "
                f"co-execution would run on this thread between waits for the GraphRunner; co-execution "
                f"is timed after {payoff['next_check_in']} more iterations "
                f"(%terra config adaptive=off co-executes it anyway)")
    if not _decided(payoff) or payoff["choice"] != "eager":
        return None
    # remembered: the choice held is an earlier run's on this machine (its cache file)
    when = "in an earlier run on this machine " if payoff["checks"] == 0 else ""
    return (f"runs eagerly: co-executed {when}it took {payoff['coexec_ms']:.3f} ms per iteration, eagerly "
            f"{payoff['eager_ms']:.3f} ms (checked again in {payoff['next_check_in']} iterations; "
            f"%terra config adaptive=off co-executes it anyway)")


def _decided(payoff):
    """A check of this run or, remembered, of an earlier one chose the mode held."""
    return payoff["checks"] > 0 or payoff.get("remembered", False)


def spin_line(stats):
    """For explain: a graph that co-executes with the GraphRunner's idle OpenMP workers asleep
    because the kernels its blocks run in parallel regions all work on small tensors, or because
    with them spinning (as eager execution's do) it measured slower, than eager execution or than
    with them asleep; else None."""
    payoff = stats["payoff"]
    if not stats.get("workers_asleep") or payoff["choice"] == "eager":
        return None
    if stats.get("workers_asleep_by_blocks"):
        return ("co-executes with the GraphRunner's idle OpenMP workers asleep: the kernels it runs "
                "with the program's thread count work on small tensors, so a spinning worker would "
                "only take the program's core (%terra config worker_spin=spin|sleep fixes it)")
    if not _decided(payoff):
        return None
    return ("co-executes with the GraphRunner's idle OpenMP workers asleep: with them spinning, "
            "co-execution was slower (than eager execution, or than with them asleep; "
            "%terra config worker_spin=spin|sleep fixes it)")


def _options(command, args, known):
    """Splits `--flag` / `--flag VALUE` options (`known`: flag -> takes a value) from the
    positional arguments; unknown flags are usage errors."""
    flags = dict.fromkeys(known, False)
    rest = []
    words = iter(args)
    for word in words:
        if not word.startswith("--"):
            rest.append(word)
            continue
        flag, eq, value = word.partition("=")
        if flag not in known:
            raise UsageError(f"%terra {command}: unknown option {flag!r}\n{USAGE}")
        if known[flag]:
            value = value if eq else next(words, "")
            if not value:
                raise UsageError(f"%terra {command}: {flag} needs a value\n{USAGE}")
            flags[flag] = value
        elif eq:
            raise UsageError(f"%terra {command}: {flag} takes no value\n{USAGE}")
        else:
            flags[flag] = True
    return flags, rest


TerraMagics.terra.__doc__ = "Controls and inspects Terra's co-execution of this notebook.\n\n" + USAGE


def register(shell, cells):
    shell.register_magics(TerraMagics(shell, cells))
