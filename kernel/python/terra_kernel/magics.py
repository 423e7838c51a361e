"""Terra's IPython magics.

Real IPython magics (a ``Magics`` class registered on the shell), so ``%lsmagic``, ``%terra?``,
completion of ``%ter`` and history all work. Bad arguments raise ``UsageError``, which IPython
shows as a short message, never a traceback.
"""
import shlex
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

USAGE = """\
%terra on              co-execute the following cells (the default)
%terra off             run the following cells eagerly
%terra status          one row per graph: iterations traced / co-executed / fallen back
%terra explain [N]     every fallback to eager: reason, op and source line (N: one cell)
%terra graph [N]       the TraceGraph of a cell as text (N: In [N]; default: the last)
%terra reset           drop every recorded graph
%terra config          list the settings; %terra config key=value ... to change them
%terra version         the engine's version
%%terra [off]          (cell magic) co-execute this cell (or run it eagerly) whatever the mode
"""

SETTINGS = {
    "warmup": "traced iterations that add nothing before an iteration is co-executed",
    "max_divergences": "fallbacks at one iteration start before it stays eager",
    "max_nodes": "TraceGraph nodes past which a graph stays eager",
    "summary": "print a one-line summary after each co-executed cell (on/off)",
}


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

    @line_magic
    def terra(self, line):
        """Controls and inspects Terra's co-execution of this notebook.

        %terra on              co-execute the following cells (the default)
        %terra off             run the following cells eagerly
        %terra status          one row per graph: iterations traced / co-executed / fallen back
        %terra explain [N]     every fallback to eager: reason, op and source line
        %terra graph [N]       the TraceGraph of a cell (In [N]; default: the last) as text
        %terra reset           drop every recorded graph
        %terra config          list settings; %terra config key=value ... changes them
        %terra version         the engine's version
        %%terra [off]          (cell magic) co-execute this cell, or run it eagerly
        """
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
        graphs = _graphs(terra)
        if not graphs:
            print("no graphs yet: run a cell with a PyTorch loop")
            return
        header = ("graph", "cell", "nodes", "traced", "co-exec", "fell back", "eager", "time traced",
                  "time co-exec")
        rows = []
        for name in graphs:
            s = terra.stats(name)
            rows.append((name, self.cells.labels.get(name, "-"), s["nodes"], s["iterations_traced"],
                         s["iterations_coexecuted"], s["iterations_fallback"], s["iterations_eager"],
                         f"{s['traced_seconds']:.2f} s", f"{s['coexec_seconds']:.2f} s"))
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))

    def _graph_for(self, args, command):
        terra = self._engine()
        graphs = _graphs(terra)
        if not args:
            recent = [name for name in self.cells.labels if name in graphs]
            if recent:
                return recent[-1]
            if graphs:
                return graphs[-1]
            raise UsageError("no graphs yet: run a cell with a PyTorch loop")
        want = args[0]
        for name, label in self.cells.labels.items():
            if want in (name, label, label[4:-1]):
                return name
        if want in graphs:
            return want
        raise UsageError(f"%terra {command}: no graph for {want!r} (see %terra status)")

    def _cmd_explain(self, args):
        terra = self._engine()
        names = [self._graph_for(args, "explain")] if args else _graphs(terra)
        found = False
        for name in names:
            for f in terra.explain(name):
                found = True
                where = f["where"]
                place = f"{_place(self.shell, where[0])}, line {where[1]}" if where else "?"
                print(f"{self.cells.labels.get(name, name)}: {place}: {f['op']} ×{f['count']}")
                print(f"    {f['reason']}")
        if not found:
            print("Terra: no fallbacks: every traced path was co-executed as recorded")

    def _cmd_graph(self, args):
        terra = self._engine()
        name = self._graph_for(args, "graph")
        nodes = terra._C.nodes(name)
        s = terra.stats(name)
        print(f"{self.cells.labels.get(name, name)} ({name}): {s['nodes']} nodes, {s['edges']} edges, "
              f"{s['iteration_starts']} iteration starts")
        branches = [(i, n) for i, n in enumerate(nodes) if len(n["succ"]) > 1]
        print(f"branch points: {len(branches)}")
        for i, n in branches[:20]:
            where = next((f for f in n["source"] if "/torch/" not in f[0] and "/terra/" not in f[0]), None)
            line = f" (line {where[1]})" if where else ""
            taken = ", ".join(f"→{to} ×{count}" for to, count in n["succ"])
            print(f"  #{i} {n['label']}{line}: {taken}")

    def _cmd_config(self, args):
        terra = self._engine()
        if not args:
            policy = terra.config()
            for key, help_text in SETTINGS.items():
                value = ("on" if self.cells.summary else "off") if key == "summary" else policy[key]
                print(f"{key} = {value}    # {help_text}")
            return
        changes = {}
        for arg in args:
            key, sep, value = arg.partition("=")
            if not sep or key not in SETTINGS:
                raise UsageError(f"%terra config: expected key=value with key in {', '.join(SETTINGS)}; "
                                 f"got {arg!r}")
            if key == "summary":
                changes[key] = _bool(value)
            else:
                try:
                    changes[key] = int(value)
                except ValueError:
                    raise UsageError(f"%terra config: {key} needs a whole number, got {value!r}")
                if changes[key] < 0:
                    raise UsageError(f"%terra config: {key} cannot be negative")
        if "summary" in changes:
            self.cells.summary = changes.pop("summary")
        if changes:
            terra.config(**changes)
        print("Terra: settings updated")


def _graphs(terra):
    """Graphs that recorded at least one op (cells without PyTorch work leave empty ones)."""
    names = []
    for name in terra._C.graphs():
        s = terra.stats(name)
        if s["ops_traced"] + s["ops_coexecuted"]:
            names.append(name)
    return names


def _place(shell, filename):
    """`In [n]` for a cell's file name, else the file name."""
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", {}) or {}
    if filename in mapping:
        return f"In [{mapping[filename]}]"
    return filename


def register(shell, cells):
    shell.register_magics(TerraMagics(shell, cells))
