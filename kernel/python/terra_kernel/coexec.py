"""Co-execution of notebook cells: what makes the Terra kernel run ordinary cells at graph speed.

Each cell execution is one Terra session, so nothing changes in the user's code:
- an IPython AST transformer marks every loop of the cell (including loops inside functions the
  cell defines) with iteration boundaries, using ids stable across re-runs of the same source;
- `pre_run_cell` opens the session (if torch is already imported; otherwise the first iteration
  boundary reached after the cell imported torch opens it), `post_run_cell` closes it, whether
  the cell finished, raised or was interrupted: the GraphRunner finishes what was issued, so the
  program state is what eager execution would have left;
- ops are keyed by their call stack up to the cell's own statement frame (the walk stops at
  IPython's `run_code`), so re-running a cell grows the same TraceGraph and functions defined in
  other cells are shared;
- after a cell that co-executed, one summary line (configurable) says what happened;
- while live views are displayed (`views.Views`), iteration boundaries also call their `push`
  once it is due; otherwise a boundary is the engine's C function alone.
"""
import ast
import builtins
import hashlib
import sys
import time

from IPython.core.interactiveshell import InteractiveShell

from terra import _loops

from . import viewdata
from .interrupts import kernel_code


class CellCoexecution:
    def __init__(self, shell):
        self.shell = shell
        self.enabled = True      # %terra on|off
        self.forced = None       # %%terra [off]: overrides `enabled` for the cell it runs
        self.summary = True      # the one-line summary after each co-executed cell
        self.graph = None        # graph name of the cell being run (None: Terra off for it)
        self.labels = {}         # graph name -> "In [n]" of its last run, in the order run
        self.boundary_hook = None  # live views: `push()` once `due` (perf_counter) has passed
        self.session_depth = None
        self.depth = 0
        self.before = None
        self.started = 0.0
        self.stop_code = InteractiveShell.run_code.__code__
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        shell.ast_transformers.append(_CellLoops(self))
        setattr(builtins, _loops.MARK, self.mark)
        setattr(builtins, _loops.HELPER_MARK, self.mark_helper)

    # -- cell lifecycle -------------------------------------------------------------------
    def wanted(self):
        return self.forced if self.forced is not None else self.enabled

    def pre_run_cell(self, info):
        self.depth += 1
        if self.session_depth is not None:
            return  # a cell run from inside another one belongs to the outer session
        raw = info.raw_cell or ""
        first = raw.lstrip()
        if first.startswith("%%terra") or first.startswith("%terra") or not self.wanted():
            self.graph = None
            return
        self.graph = "cell-" + hashlib.sha1(raw.encode()).hexdigest()[:10]
        self.labels.pop(self.graph, None)
        self.labels[self.graph] = f"In [{self.shell.execution_count}]"
        if "torch" in sys.modules:
            self.open()

    def post_run_cell(self, result):
        if self.session_depth == self.depth:
            self.close()
        self.depth -= 1
        if self.depth == 0:
            self.graph = None

    def mark(self, boundary, helper=False):
        if self.session_depth is None:
            if self.graph is None or "torch" not in sys.modules:
                return
            self.open()  # the cell imported torch before this loop
        engine = sys.modules["terra._C"]
        (engine.mark_helper if helper else engine.mark)(boundary)

    def mark_helper(self, boundary):
        """A loop of a function a cell defined: an iteration only while no loop of the running
        cell is open (a model's loop over its layers is part of the training step's iteration)."""
        self.mark(boundary, helper=True)

    def open(self):
        # Also reached from the user's code (a loop's first iteration): a Ctrl-C meanwhile waits,
        # so a session is never left half-open.
        with kernel_code():
            self._open()

    def _open(self):
        import terra

        self.before = _counts(self.graph)
        self.started = time.perf_counter()
        terra._C.set_file_label(self.cell_label)
        terra._enter(self.graph, stop_code=self.stop_code)
        self.session_depth = self.depth
        self.bind_mark()

    def cell_label(self, filename):
        """`In [n]` for a cell's file (what GraphRunner errors name, as `%terra explain` does)."""
        label = viewdata.place(self.shell, filename)
        return label if label != filename else None

    def bind_mark(self):
        """What loop boundaries call while the session is open: the engine's C function (no
        Python call per boundary), or with live views a wrapper that also pushes their updates."""
        if self.session_depth is None:
            return
        engine = sys.modules["terra._C"]
        hook = self.boundary_hook
        if hook is None:
            setattr(builtins, _loops.MARK, engine.mark)
            setattr(builtins, _loops.HELPER_MARK, engine.mark_helper)
            return

        def with_views(engine_mark):
            def mark(boundary, engine_mark=engine_mark, clock=time.perf_counter, hook=hook):
                engine_mark(boundary)
                if clock() >= hook.due:
                    hook.push()
            return mark

        setattr(builtins, _loops.MARK, with_views(engine.mark))
        setattr(builtins, _loops.HELPER_MARK, with_views(engine.mark_helper))

    def close(self):
        with kernel_code():  # inside the user's code when a %%terra cell ends
            self._close()

    def _close(self):
        import terra

        self.session_depth = None
        setattr(builtins, _loops.MARK, self.mark)
        setattr(builtins, _loops.HELPER_MARK, self.mark_helper)
        try:
            terra._exit()
        finally:
            if self.summary:
                line = summary_line(self.before, _counts(self.graph), time.perf_counter() - self.started)
                if line:
                    print(line)


class _CellLoops(ast.NodeTransformer):
    """Marks the loops of the cell being run (when Terra is on for it)."""

    def __init__(self, owner):
        self.owner = owner

    def visit_Module(self, node):
        if self.owner.graph is None:
            return node
        _loops.mark_loops(node.body, self.owner.graph, into_functions=True)
        return node


COUNTERS = ("iterations_traced", "iterations_coexecuted", "iterations_fallback", "iterations_eager",
            "iterations_eager_chosen", "ops_traced", "ops_coexecuted")


def _counts(graph):
    engine = sys.modules.get("terra._C")
    if engine is None or graph not in engine.graphs():
        return dict.fromkeys(COUNTERS, 0)
    stats = engine.stats(graph)
    return {k: stats[k] for k in COUNTERS}


def summary_line(before, after, seconds):
    d = {k: after[k] - before[k] for k in COUNTERS}
    if d["ops_traced"] + d["ops_coexecuted"] == 0:
        return ""
    total = sum(d[k] for k in COUNTERS if k.startswith("iterations") and k != "iterations_eager_chosen")
    parts = [f"{total} iterations", f"{d['iterations_coexecuted']} co-executed",
             f"{d['iterations_traced']} traced"]
    if d["iterations_fallback"]:
        parts.append(f"{d['iterations_fallback']} fell back (%terra explain)")
    if d["iterations_eager"] > d["iterations_eager_chosen"]:
        parts.append(f"{d['iterations_eager'] - d['iterations_eager_chosen']} eager")
    if d["iterations_eager_chosen"]:
        parts.append(f"{d['iterations_eager_chosen']} eager because faster (%terra explain)")
    return "Terra: " + " · ".join(parts) + f" · {seconds:.2f} s"
