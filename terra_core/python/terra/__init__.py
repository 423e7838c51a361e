"""Terra: imperative-symbolic co-execution of PyTorch programs.

    import terra
    result = terra.run(train)          # runs train() co-executed; its loops mark iterations
    with terra.coexecute("eval"):      # or co-execute a block,
        for batch in data:
            with terra.iteration():    # marking iterations explicitly
                ...
    terra.stats(), terra.explain()

The program runs for real in Python, every iteration; its PyTorch ops are recorded into a
TraceGraph and, once the graph covers what the program does, executed by a GraphRunner thread
while Python runs ahead. Whatever the graph has not seen runs eagerly. Results are those of eager
PyTorch.
"""
import ast
import builtins
import collections
import contextlib
import dis
import importlib
import inspect
import sys
import textwrap
import threading
import types

from . import _loops

__all__ = ["run", "coexecute", "iteration", "sync", "stats", "explain", "reset", "config",
           "configure", "settings",
           "graph_json", "timeline"]

_depth = threading.local()
_last_graph = None  # the graph most recently entered


def _c():
    """The engine (terra._C). It links LibTorch, so it is loaded on first use: `import terra`
    (and the kernel's loop marking) costs nothing until a program touches it."""
    module = sys.modules.get(f"{__name__}._C")
    if module is None:
        importlib.import_module("torch")
        module = importlib.import_module(f"{__name__}._C")
    return module


def _patches_module():
    return importlib.import_module(f"{__name__}._patches")


def __getattr__(name):
    if name in ("_C", "_patches"):
        _c()
        return importlib.import_module(f"{__name__}.{name}")
    if name == "__version__":
        return _c().__version__
    raise AttributeError(f"module 'terra' has no attribute {name!r}")


def _enter(name, depth=1, stop_code=None):
    """Opens a session; ops are keyed by their stack up to the frame `depth` above the caller of
    this function, or (with `stop_code`) up to the first frame running that code object."""
    global _last_graph
    if getattr(_depth, "n", 0) == 0:
        _patches_module().install()
        for builtin, fallback, engine_name in _MARKS:
            if getattr(builtins, builtin, None) is fallback:  # not a host's own (the kernel's)
                setattr(builtins, builtin, getattr(_c(), engine_name))  # the engine, directly
    _last_graph = name
    _depth.n = getattr(_depth, "n", 0) + 1
    try:
        if stop_code is not None:
            _c().enter(name, 0, stop_code)
        else:
            _c().enter(name, depth)
    except BaseException:
        _leave_patches()
        raise


def _leave_patches():
    _depth.n -= 1
    if _depth.n == 0:
        _patches_module().uninstall()
        for builtin, fallback, engine_name in _MARKS:
            if getattr(builtins, builtin, None) is getattr(_c(), engine_name):
                setattr(builtins, builtin, fallback)


def _exit():
    try:
        _c().exit()
    finally:
        _leave_patches()


def _engine_call(engine_name):
    """A loop boundary outside a session: the engine's, if it is loaded (it ignores it then)."""
    def mark(boundary):
        engine = sys.modules.get(f"{__name__}._C")
        if engine is not None:
            getattr(engine, engine_name)(boundary)
    return mark


_mark, _mark_helper = _engine_call("mark"), _engine_call("mark_helper")
# Builtins the marked loops call (terra/_loops.py), what they are outside a session, and the
# engine's function they become inside one.
_MARKS = ((_loops.MARK, _mark, "mark"), (_loops.HELPER_MARK, _mark_helper, "mark_helper"))
for _builtin, _fallback, _ in _MARKS:
    if not hasattr(builtins, _builtin):  # a host (the Terra kernel) may have its own
        setattr(builtins, _builtin, _fallback)
del _builtin, _fallback


class coexecute:
    """Co-executes the block; iterations are marked with `terra.iteration()` inside it.

    The frame that holds the `with` statement is the root of every op's location key, so it
    must stay alive for the whole block (it does: it is running the block).
    """

    def __init__(self, name="default"):
        self.name = name

    def __enter__(self):
        _enter(self.name, depth=2)
        return self

    def __exit__(self, *exc):
        _exit()
        return False


@contextlib.contextmanager
def iteration():
    """Marks one iteration of a loop inside `coexecute`."""
    caller = sys._getframe(2)
    loop_id = _loops.stable_id(caller.f_code.co_qualname, caller.f_code.co_filename, caller.f_lineno)
    _c().mark(loop_id)
    try:
        yield
    finally:
        _c().mark(loop_id ^ _loops.EXIT)


# Instrumented copies of code, by (code, globals, mark), the most recently used last. Bounded: a
# notebook defines new functions each time a cell runs again, and each entry holds its code and
# globals; the oldest go (made again if used again).
_instrumented = collections.OrderedDict()
_INSTRUMENTED_MAX = 1024


def _compile_def(fn, fdef):
    """The code of the function definition `fdef` (from `fn`'s source), compiled inside a factory
    taking `fn`'s free variables as parameters, at `fn`'s lines; None if it does not compile."""
    code = fn.__code__
    factory = ast.FunctionDef(
        name="__terra_factory__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in code.co_freevars],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[fdef, ast.Return(ast.Name(fn.__name__, ast.Load()))], decorator_list=[])
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, code.co_firstlineno - 1)
    namespace = {}
    try:
        exec(compile(module, code.co_filename, "exec"), fn.__globals__, namespace)
    except SyntaxError:
        return None
    return next(c for c in namespace["__terra_factory__"].__code__.co_consts
                if isinstance(c, type(code)) and c.co_name == fn.__name__)


def _shape(code):
    """A code object's instructions and their arguments, without what compiling a definition
    inside a factory changes (jump offsets, LOAD_METHOD for LOAD_ATTR, caches and no-ops)."""
    out = []
    for ins in dis.get_instructions(code):
        op = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if op in ("CACHE", "EXTENDED_ARG", "NOP", "RESUME", "PRECALL", "KW_NAMES"):
            continue
        jump = ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs
        arg = None if jump else ins.argval
        out.append((op, _shape(arg) if isinstance(arg, types.CodeType) else repr(arg)))
    return out


# A `for` loop compiles to FOR_ITER (END_ASYNC_FOR for `async for`) in its function's own code,
# a `while` loop that repeats to a backward jump; one whose body always leaves may compile to
# neither, so the source is searched for the word as well.
_LOOP_OPCODES = frozenset(op for name, op in dis.opmap.items()
                          if name in ("FOR_ITER", "END_ASYNC_FOR") or name.startswith("JUMP_BACKWARD"))


def _may_loop(code, source):
    """False only where `code` (compiled from `source`) has no `for` or `while` loop of its own
    (a comprehension's or a nested function's are theirs); most of a program's functions (a
    module's forward, a constructor) have none: compiling each twice to find no loop made the
    instrumenting of gpt's eight functions on its first `terra.run` 20 ms, now 8
    (bench/instrument_time.py)."""
    return "while" in source or any(op in _LOOP_OPCODES for op in code.co_code[::2])


def _instrumented_code(fn, mark=_loops.MARK):
    """`fn`'s code recompiled with iteration boundaries on its loops, with the same free variables
    (compiled inside a factory taking them as parameters), or None if not possible. The source is
    read from the file, so it is compiled unmarked first and must give `fn`'s own instructions: a
    file edited since it was imported must not replace the code that runs."""
    code = fn.__code__
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        if not _may_loop(code, source):
            return None  # nothing to mark: what mark_loops would find, without compiling twice
        tree, copy_tree = ast.parse(source), ast.parse(source)  # parsing is faster than deepcopy
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) or fdef.name != fn.__name__:
        return None
    fdef.decorator_list = []
    unmarked = _compile_def(fn, copy_tree.body[0])
    if unmarked is None or _shape(unmarked) != _shape(code):
        return None
    if not _loops.mark_loops(fdef.body, fn.__qualname__, mark=mark):
        return None
    new_code = _compile_def(fn, fdef)
    if new_code is None or not set(new_code.co_freevars) <= set(code.co_freevars):
        return None
    return new_code.replace(co_qualname=code.co_qualname)  # not "__terra_factory__.<locals>..."


def _instrument(fn, mark=_loops.MARK):
    """The function with iteration boundaries on its loops (calls to the builtin named `mark`;
    None if not possible), bound to the same globals, defaults and closure cells as `fn`."""
    code = fn.__code__
    # By identity: code objects of equal bytecode compare equal across modules, and the copy is
    # bound to this function's globals.
    key = (id(code), id(fn.__globals__), mark)
    cached = _instrumented.get(key)
    if cached is None or cached[0] is not code or cached[1] is not fn.__globals__:
        cached = _instrumented[key] = (code, fn.__globals__, _instrumented_code(fn, mark))
        if len(_instrumented) > _INSTRUMENTED_MAX:
            _instrumented.popitem(last=False)
    else:
        _instrumented.move_to_end(key)
    new_code = cached[2]
    if new_code is None:
        return None
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    new = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__,
                             tuple(cells[n] for n in new_code.co_freevars))
    new.__kwdefaults__, new.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return new


def _program_functions(fn):
    """The functions and methods defined in `fn`'s own source file and reachable from its module's
    globals (module-level functions, classes' methods, static and class methods, property
    accessors, and what decorators there wrap): the program's own code, as a notebook's cells are
    (the kernel marks the loops of functions a cell defines)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found, seen = [], {id(fn)}

    def add(f):
        while isinstance(f, types.FunctionType) and id(f) not in seen:
            seen.add(id(f))
            if f.__code__.co_filename == code.co_filename:
                found.append(f)
            f = getattr(f, "__wrapped__", None)

    for value in list(fn.__globals__.values()):
        if isinstance(value, type) and value.__module__ == fn.__module__:
            for attr in list(vars(value).values()):
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                if isinstance(attr, property):
                    for accessor in (attr.fget, attr.fset, attr.fdel):
                        add(accessor)
                else:
                    add(attr)
        else:
            add(value)
    return found


@contextlib.contextmanager
def _marking(functions):
    """Gives each function the instrumented code (its loops mark iterations) for the duration;
    afterwards each gets its own code back. A function whose instrumented code would need other
    free variables is left as it is."""
    swapped = []
    try:
        for f in functions:
            marked = _instrument(f, _loops.HELPER_MARK)
            if marked is not None and marked.__code__.co_freevars == f.__code__.co_freevars:
                swapped.append((f, f.__code__))
                f.__code__ = marked.__code__
        yield
    finally:
        for f, original in reversed(swapped):
            f.__code__ = original


def run(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` with co-execution and returns its result.

    Every loop in `fn`'s own body marks iterations, and so does every loop of the functions and
    methods defined in `fn`'s source file (a `Trainer.fit` next to `main`), for the duration of the
    run, as a notebook cell's functions do in the Terra kernel; other functions it calls are traced
    as part of the iteration that calls them. Marks from other threads are ignored. Results,
    printed output and side effects are those of eager PyTorch.
    """
    target = _instrument(fn) or fn
    with _marking(_program_functions(fn)):
        _enter(getattr(fn, "__qualname__", repr(fn)), depth=1)  # root: this frame
        try:
            return target(*args, **kwargs)
        finally:
            _exit()


def sync():
    """Waits until every op issued so far has been executed."""
    _c().sync()


def stats(name=None):
    """Counters of one graph (by name), or of all graphs summed when name is None."""
    if name is not None:
        return _c().stats(name)
    total = {}
    for graph in _c().graphs():
        for key, value in _c().stats(graph).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total


def cached_memory():
    """Bytes of freed CPU blocks Terra's caching allocator holds now (runtime/runner_allocator.h):
    between sessions, the blocks eager work on the thread that ran them takes again (at most 256
    MiB); `config(program_cache=False)` frees them."""
    return _c().allocator_counts().get("cached_bytes", 0)


def explain(name=None):
    """Every fallback to eager execution, one entry per reason and place: reason (a sentence and
    the detail), kind (its short name, terra/policy.h's FallbackReason), op, count, source (the
    frames, outermost first) and where (the user's own frame: file, line, function)."""
    names = [name] if name is not None else _c().graphs()
    out = []
    for graph in names:
        for f in _c().fallbacks(graph):  # frames as (file, line, function) tuples
            frames = f["source"]["frames"] if f["source"] else []
            out.append(dict(f, graph=graph, source=[_frame(x) for x in frames],
                            where=_frame(f["where"]) if f["where"] else None))
    return out


def _frame(frame):
    return frame["file"], frame["line"], frame["function"]


def _graph_name(name):
    if name is not None:
        return name
    if _last_graph in _c().graphs():
        return _last_graph
    graphs = _c().graphs()
    if not graphs:
        raise KeyError("no Terra graph recorded yet")
    return graphs[-1]


def graph_json(name=None):
    """One graph (the most recently entered when name is None) for viewers, as plain data, in
    the engine's one export schema (terra_core/include/terra/export.h):

    nodes [{id, key, label, op, kind, shapes, count, source {op, frames [{file, line,
    function}] outermost first}, where (the user's own frame {file, line, function}), outputs,
    fallback}] (ids are the TraceGraph's: the virtual entry 0 and exit 1 have kinds "entry" and
    "exit"), control_edges [{id, from, to, count}], blocks [{id, nodes}] (basic blocks in
    switch-case order, from the core's case assignment), switch_cases [{block, entering: edge
    ids}], back_edges, last_path (node ids of the last iteration), fallbacks [{reason, kind,
    op, count, source, where, node: the node the iteration left after}], stats."""
    return _c().graph_json(_graph_name(name))


def timeline(name=None, last=None):
    """Where recent iterations' time went (a bounded window, times in steady-clock ns):

    events: [{lane: "python" | "graph", kind, start_ns, end_ns, iteration, graph, detail}] where
    Python-lane kinds are tracing / coexec / fallback / eager (one span per iteration) and
    fetch_wait / diverge (nested waits), and GraphRunner spans are "busy";
    iterations: [{graph, index, mode, loop, start_ns, end_ns}] from the Python lane's iteration
    spans (`loop`: the id of the loop whose iteration it was).
    With a name, only that graph's iterations and the GraphRunner spans of those iterations;
    with `last`, only the newest `last` iterations (of all graphs) are looked at."""
    events = _c().timeline(last or 0)
    if name is not None:
        mine = {e["iteration"] for e in events if e["lane"] == "python" and e["graph"] == name}
        events = [e for e in events if e["iteration"] in mine]
    modes = {"tracing": "traced", "coexec": "coexec", "fallback": "fallback", "eager": "eager"}
    iterations = [dict(graph=e["graph"], index=e["iteration"], mode=modes[e["kind"]],
                       loop=e["boundary"], start_ns=e["start_ns"], end_ns=e["end_ns"])
                  for e in events if e["lane"] == "python" and e["kind"] in modes]
    return {"events": events, "iterations": iterations}


def reset(name=None):
    """Drops recorded graphs (all, or one by name); dropping all also clears the timeline."""
    _c().reset(name)
    if name is None:
        _c().clear_timeline()


def settings():
    """Every engine setting as the engine holds it: dicts of key, kind ("whole number", "number",
    "on/off" or "choice"), value (text, as `config` accepts it), help, and env (the environment
    variable that sets its default). The table lives in the engine (terra/policy.h)."""
    return _c().settings()


def configure(text):
    """Applies settings written as text, "warmup=3 adaptive=off" (what `%terra config` takes),
    all of them or none: ValueError says what was wrong."""
    _c().configure(text)


_TYPES = {"on/off": lambda v: v == "on", "whole number": int, "number": float, "choice": str}


def config(**changes):
    """Reads or sets the engine's settings: `terra.config(warmup=3, adaptive=False)` applies all
    of them or none (ValueError says what was wrong) and returns every setting's value;
    `terra.settings()` lists them with what each does (`%terra config` prints that)."""
    if changes:
        items = []
        for key, value in changes.items():
            text = ("on" if value else "off") if isinstance(value, bool) else str(value)
            if not text or any(c in text for c in " ,\t="):
                raise ValueError(f"{key}: {value!r} is not a value")
            items.append(f"{key}={text}")
        configure(" ".join(items))
    return {s["key"]: _TYPES[s["kind"]](s["value"]) for s in _c().settings()}
