"""Python entry points that never reach the PyTorch dispatcher, redirected while Terra is active.

Everything a program does with tensors through ATen operators is seen by the engine's dispatcher
hook. A few things bypass the dispatcher and are patched here for as long as a co-execution
session is open (and restored exactly afterwards):
- `backward`: the autograd engine is one pseudo-op of the graph;
- `Tensor.grad` (get/set): reads and writes of gradients are pseudo-ops too, ordered with the ops;
- reading data from Python (`repr`/`format`/`numpy`/`tolist`/`__array__`/`data_ptr`/pickling):
  a fetch: wait for the value, make the tensor concrete, then run PyTorch's own code untraced;
- `Tensor._version` of an ordinary tensor: waits for the in-place ops issued to it;
- `Tensor.grad_fn` and `Tensor.is_leaf` of a placeholder: its value (and history) first;
  `Tensor._base` and `_is_view()` of a placeholder made by a view op: the base eager's view names;
- the global RNG state (`manual_seed`, `get_rng_state`, ...) and process-wide settings kernels
  read (`set_default_dtype`, `use_deterministic_algorithms`): wait for the GraphRunner first,
  since ops already issued must see the old state;
- changes of a tensor's autograd identity from Python (`requires_grad_`, `.requires_grad =`,
  `.data =`, `Tensor._make_subclass`, which `nn.Parameter` uses, `retain_grad`, hooks): wait for
  the GraphRunner, then make the tensors involved real, so a parameter made in a co-executed
  iteration is a real leaf and a hook lands on the real autograd node;
- custom `autograd.Function.apply`: an opaque unit run eagerly in the program's thread;
- `threading.Thread.start`: other threads are not intercepted, so the iteration leaves
  co-execution (every placeholder becomes real) before one starts;
- `torch.clear_autocast_cache` (torch.autocast's exit): the GraphRunner's autocast weight cache
  is its own, cleared in issue order too;
- forward-mode AD's dual levels (`torch.autograd.forward_ad.dual_level`): leaving one deletes
  every tangent made in it, so entering and leaving wait for the GraphRunner first.
"""
import functools
import importlib
import sys
import threading
import weakref

import torch
import torch._functorch.predispatch as _predispatch
import torch.autograd as _autograd
import torch.backends

from . import _C

_saved = []
_base_grad = torch._C.TensorBase.grad


def _made_once(factory):
    """`factory(original, *options)`, made once per original object and options: every session
    installs the same wrappers. (Making them, about 70 `functools.wraps`, cost every terra.run and
    every cell about 0.3 ms.) A replacement the program made between sessions is a new original."""
    made = {}  # by the original's identity (pybind11's instancemethods do not hash): (original, made)

    @functools.wraps(factory)
    def once(original, *options, **keywords):
        key = (id(original), options, tuple(sorted(keywords.items())))
        if key not in made:
            made[key] = (original, factory(original, *options, **keywords))  # kept: its id stays its own
        return made[key][1]

    return once


@_made_once
def _fetching(original, exposes=False):
    """`original` on the tensor's value; `exposes`: it hands Python the tensor's memory itself
    (_EXPOSING), so it also waits for everything issued, and a NumPy array it returns is
    tracked: while it lives, the program may write the tensor through it at any time, so ops
    read the tensor when issued (PythonRunner::expose)."""
    @functools.wraps(original)
    def fetch(self, *args, **kwargs):
        _C.materialize(self)
        if exposes:
            _C.sync()
        _C.pause()
        try:
            result = original(self, *args, **kwargs)
        finally:
            _C.resume()
        if exposes and _is_ndarray(result):
            key = _C.expose(self)
            if key:
                weakref.finalize(result, _C.unexpose, key)
        return result

    return fetch


def _is_ndarray(value):
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


@_made_once
def _synced(original, needed=None):
    """`original`, run once the GraphRunner has caught up; `needed(*args, **kwargs)` says when a
    call must wait (default: always)."""
    @functools.wraps(original)
    def synced(*args, **kwargs):
        if needed is None or needed(*args, **kwargs):
            _C.sync()
        return original(*args, **kwargs)

    return synced


def _default_generator(self, *args, **kwargs):
    """Whether a torch.Generator method's `self` is a default generator, whose draws the
    GraphRunner runs in issue order (a generator of the program's own draws in its thread)."""
    return self.device.type != "cpu" or self is torch.default_generator


def _run_backward(t_outputs, *args, **kwargs):
    return _C.backward(_original_run_backward, tuple(t_outputs), *args, **kwargs)


@_made_once
def _opaque_call(original, why, what):
    """`original`, run as an opaque region: eagerly in the program's thread, untraced (`what` of
    its arguments names it in `%terra explain`)."""
    @functools.wraps(original)
    def call(*args, **kwargs):
        _C.opaque_begin(why, what(*args))
        try:
            return original(*args, **kwargs)
        finally:
            _C.opaque_end()

    return call


# A custom autograd.Function: its forward (and, through the backward-hook check, its backward)
# runs eagerly in the program's thread, untraced.
def _function_apply(cls, *args):
    return f"{cls.__qualname__}.apply"


# TorchScript. A scripted or traced module or a scripted function: its graph executor runs the
# ops and, from the third call, makes a backward node of its own (DifferentiableGraphBackward)
# holding the values it saved, which the GraphRunner could not fill (placeholders), and whose
# backward may call Python (`@torch.jit.ignore`d functions): so the call runs as an opaque region,
# and its backward in the program's thread (runtime/backward_hooks.cpp), as a custom
# autograd.Function's. And `torch.jit.trace` (its entries into the tracer, which ONNX export
# takes too): the tracer records the ops the program's thread runs, so none may go elsewhere.
_TORCHSCRIPT = "TorchScript runs eagerly in the program's thread"
_SCRIPT_CALLS = ((torch.jit.ScriptModule, lambda m, *a: f"{type(m).__qualname__} (a TorchScript module)"),
                 (torch.jit.ScriptFunction, lambda f, *a: f"{f.name} (a TorchScript function)"))
_TRACER_ENTRIES = ((torch._C, "_create_function_from_trace"), (torch._C, "_create_function_from_trace_with_dict"),
                   (torch._C, "_create_graph_by_tracing"), (torch._C.ScriptModule, "_create_method_from_trace"),
                   (torch._C.ScriptModule, "_create_method_from_trace_with_dict"))


def _tracing(*args):
    return "torch.jit.trace (the tracer)"


# TorchDynamo's compilations (a torch.compile'd model's first call, a recompile, AOTAutograd's
# lazy backward): the backend traces the model with fake tensors, its forward and backward
# together (`torch.autograd.grad` inside a forward), which the engine took for the program's
# ops: inductor's first compile in a session raised "TraceGraph::add: key ... is in the graph
# already" (session 52). A compilation runs as an opaque region, bounded by Dynamo's compile
# callbacks, registered once per process as soon as torch._dynamo is imported (at a session's
# start, or by torch.compile inside one; outside a session a region only pauses nothing).
_compiles_open = 0  # opaque regions a start callback began and its end callback has not ended


def _compile_started(args):
    global _compiles_open
    _C.opaque_begin("TorchDynamo compiles in the program's thread, untraced", "torch.compile")
    _compiles_open += 1


def _compile_ended(args):
    global _compiles_open
    if _compiles_open:
        _compiles_open -= 1
        _C.opaque_end()


# Compiled code's calls (a `torch.compile`d function or module, `module.compile()`,
# `torch._dynamo.optimize(...)` as a decorator or a context): Dynamo's guards check the dispatch
# keys of the thread, which hold the engine's while a loop is traced or co-executed and not inside
# a compilation, so every call failed them and recompiled, up to Dynamo's limit of 8, after which
# the function ran uncompiled (session 52: a compiled module; session 53: a compiled function, 30
# steps ending at eager's loss, not the compiled function's). So each call runs as an opaque
# region, bounded by three of Dynamo's own calls (eval_frame.py, torch 2.13): an entry asks
# `_is_skip_guard_eval_unsafe_stance()` once, just before it sets `set_skip_guard_eval_unsafe`,
# and sets that back as it leaves; the first set after the stance begins the region, before the
# entry reads the thread's dispatch keys. The set as it leaves runs inside a dispatch-key guard
# that then puts back the keys the entry saw (the engine's off), so the region ends at the next
# `_maybe_set_eval_frame`, which the entry calls once it is out of that guard. Patched during
# sessions only.
_compiled_entering = False  # the stance was asked: the next set_skip_guard_eval_unsafe enters
_compiled_open = 0  # regions entries into compiled code began and their exits have not ended
_compiled_leaving = 0  # of those, regions whose exit was seen and end at _maybe_set_eval_frame


def _compiled_name(frame):
    """What the entering frame runs (compile_wrapper's `fn`, an `optimize` context's own)."""
    fn = frame.f_locals.get("fn")
    fn = getattr(fn, "__wrapped__", fn)
    owner = getattr(fn, "__self__", fn)
    if isinstance(owner, torch.nn.Module):
        return f"{type(owner).__qualname__} (torch.compile)"
    return f"{getattr(fn, '__name__', 'compiled code')} (torch.compile)"


@_made_once
def _compiled_entry(original):
    @functools.wraps(original)
    def stance():
        global _compiled_entering
        _compiled_entering = True
        return original()

    return stance


@_made_once
def _compiled_bounds(original):
    @functools.wraps(original)
    def set_skip_guard_eval_unsafe(value):
        global _compiled_entering, _compiled_open, _compiled_leaving
        if _compiled_entering:
            _compiled_entering = False
            _C.opaque_begin("torch.compile's code runs in the program's thread", _compiled_name(sys._getframe(1)))
            _compiled_open += 1
        elif _compiled_open > _compiled_leaving:
            _compiled_leaving += 1
        return original(value)

    return set_skip_guard_eval_unsafe


@_made_once
def _compiled_left(original):
    @functools.wraps(original)
    def maybe_set_eval_frame(callback):
        global _compiled_open, _compiled_leaving
        result = original(callback)
        while _compiled_leaving:
            _compiled_leaving -= 1
            _compiled_open -= 1
            _C.opaque_end()
        return result

    return maybe_set_eval_frame


def _watch_compiles():
    dynamo = sys.modules.get("torch._dynamo")
    handler = getattr(dynamo, "callback_handler", None)
    if handler is None:
        return
    if _compile_started not in handler.start_callbacks:
        handler.register_start_callback(_compile_started)
        handler.register_end_callback(_compile_ended)
    eval_frame = dynamo.eval_frame
    if not any(o is eval_frame for o, _, _ in _saved):
        _set(eval_frame, "_is_skip_guard_eval_unsafe_stance", _compiled_entry(eval_frame._is_skip_guard_eval_unsafe_stance))
        _set(eval_frame, "set_skip_guard_eval_unsafe", _compiled_bounds(eval_frame.set_skip_guard_eval_unsafe))
        _set(eval_frame, "_maybe_set_eval_frame", _compiled_left(eval_frame._maybe_set_eval_frame))


@_made_once
def _compile_watched(original):
    @functools.wraps(original)
    def compile(*args, **kwargs):
        result = original(*args, **kwargs)
        _watch_compiles()  # torch._dynamo is imported now
        return result

    return compile


# torch.func's transforms (vmap, grad, jvp, vjp, jacrev, functionalize, ...) run their function
# with the dispatch keys of a functorch level, which the GraphRunner's thread does not have (an op
# issued there from inside a vmap raised). Each level's entry and exit, found by name in the
# modules that imported them, bound an opaque region: the transform runs eagerly in the program's
# thread, untraced, as a custom autograd.Function does.
_FUNCTORCH_LEVELS = {
    "torch._functorch.vmap": ("vmap",),
    "torch._functorch.eager_transforms": ("grad", "jvp", "func"),
}


@_made_once
def _level_entry(original, transform):
    @functools.wraps(original)
    def entry(*args, **kwargs):
        _C.opaque_begin(f"a torch.func transform ({transform}) runs eagerly in the program's thread",
                        f"torch.func {transform}")
        try:
            return original(*args, **kwargs)
        except BaseException:
            _C.opaque_end()
            raise

    return entry


@_made_once
def _level_exit(original):
    @functools.wraps(original)
    def exit_(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            _C.opaque_end()

    return exit_


def _thread_start(self):
    _C.barrier("a Python thread started: tensor reads in other threads are not intercepted",
               "threading.Thread.start")
    return _original_thread_start(self)


def _set_grad(self, value):
    _C.grad_set(self, value, _base_grad.__set__)


def _del_grad(self):
    _C.grad_set(self, None, _base_grad.__set__)


_original_run_backward = _autograd._engine_run_backward
_original_apply = torch.autograd.Function.__dict__["apply"]
_original_thread_start = threading.Thread.start

_FETCHES = ("__repr__", "__format__", "tolist", "__reduce_ex__", "__deepcopy__")
# Fetches that hand Python the tensor's memory itself: written through (`t.numpy()[0] = 1`), it
# changes what items issued before still read, so these wait for everything issued.
_EXPOSING = ("numpy", "__array__", "data_ptr", "untyped_storage", "storage", "_typed_storage")
_RNG = ("manual_seed", "seed", "get_rng_state", "set_rng_state", "initial_seed")
# The same through a generator object's own methods (`torch.default_generator.manual_seed(0)`):
# draws from the default generators run in the GraphRunner, so these wait for it when called on
# one (a generator of the program's own draws in the program thread: no wait).
_GENERATOR = ("manual_seed", "seed", "get_state", "set_state", "get_offset", "set_offset",
              "graphsafe_get_state", "graphsafe_set_state", "clone_state", "__getstate__",
              "__setstate__", "__reduce__")
# Types Python refuses to change attributes of (immutable C types), changed through _C.
_IMMUTABLE = (torch._C.Generator,)
# Process-wide settings kernels read when they run (runtime/thread_state.h): ops issued before a
# change must run under the old setting.
_SETTINGS = ("set_default_dtype", "set_default_tensor_type", "use_deterministic_algorithms",
             "set_flush_denormal")
# The setters behind torch.backends (oneDNN, cuDNN, TF32, matmul precision, SDPA backends): kernels
# read these when they run, so a change waits for the GraphRunner too.
_BACKEND_SETTERS = tuple(n for n in dir(torch._C) if n.startswith("_set_") and any(
    k in n for k in ("cudnn", "mkldnn", "onednn", "cublas", "tf32", "matmul", "deterministic",
                     "nnpack", "sdp", "reduced_precision", "qengine")))


def _set(owner, name, value, saved=_saved):
    saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
    _setattr(owner, name, value)


def _setattr(owner, name, value):
    if owner in _IMMUTABLE:
        _C.set_type_attribute(owner, name, value)
    else:
        setattr(owner, name, value)


def _restore(saved):
    """Undoes the `_set`s recorded in `saved`, latest first: each owner gets back its own
    attribute, or none (it inherited it)."""
    while saved:
        owner, name, value = saved.pop()
        if value is _MISSING:
            delattr(owner, name)
        else:
            _setattr(owner, name, value)


_MISSING = object()


def _settle(*values):
    """Waits for everything issued, then makes the given tensors real: what follows changes a
    tensor's autograd identity (requires_grad, a new leaf made from it, its data swapped), which
    the GraphRunner could not see on a placeholder (it resolves placeholders to their values)."""
    _C.sync()
    for v in values:
        if isinstance(v, torch.Tensor):
            _C.materialize(v)


@_made_once
def _settled(original, unchanged=None):
    """`original`, run once the GraphRunner has caught up (_settle); `unchanged(*args, **kwargs)`
    says when a call changes nothing, so it need not wait."""
    @functools.wraps(original)
    def settled(*args, **kwargs):
        if unchanged is not None and unchanged(*args, **kwargs):
            return original(*args, **kwargs)
        _settle(*args, *kwargs.values())
        result = original(*args, **kwargs)
        # The result too: `_make_subclass` detaches through the dispatcher, so the new leaf would
        # otherwise be a placeholder whose requires_grad the GraphRunner never sees.
        _settle(result)
        return result

    return settled


def _requires_grad_unchanged(self, requires_grad=True):
    # Turning requires_grad off where it is off: `optimizer.zero_grad(set_to_none=False)` does
    # that to every gradient, and each wait cost a round trip of 30 µs (corpus p01: 6 per step).
    return not requires_grad and type(self) is torch.Tensor and not self.requires_grad


@_made_once
def _settled_setter(descriptor, unchanged=None):
    set_settled = _settled(descriptor.__set__, unchanged)
    return property(descriptor.__get__, set_settled, None, descriptor.__doc__)


# An ordinary tensor's version counter moves when the GraphRunner runs the in-place ops issued to
# it: read, it waits for them (a placeholder's moves as the program issues them).
_VERSION = property(_C.version, None, None, torch._C.TensorBase._version.__doc__)


# A placeholder's autograd history is made by the GraphRunner: `grad_fn` and `is_leaf` of one that
# requires grad fill it first (terra_core/python/module.cpp: history_get).
# A placeholder made by a view op names its base as eager's autograd view would (`_base`,
# `_is_view()`; the GraphRunner makes the view itself).
_base_is_view = torch._C.TensorBase._is_view


def _is_view(self):
    return _C.is_placeholder_view(self) or _base_is_view(self)


_HISTORY = {"grad_fn": property(_C.grad_fn_get, None, None, torch._C.TensorBase.grad_fn.__doc__),
            "is_leaf": property(_C.is_leaf_get, None, None, torch._C.TensorBase.is_leaf.__doc__),
            "_base": property(_C.base_get, None, None, torch._C.TensorBase._base.__doc__),
            "_is_view": functools.wraps(_base_is_view)(_is_view)}


def install():
    if _saved:
        return
    fast_path(True)
    pseudo_ops(True)
    for name in _FETCHES:
        _set(torch.Tensor, name, _fetching(getattr(torch.Tensor, name)))
    for name in _EXPOSING:
        _set(torch.Tensor, name, _fetching(getattr(torch.Tensor, name), exposes=True))
    _set(torch.Tensor, "requires_grad_", _settled(torch.Tensor.requires_grad_, _requires_grad_unchanged))
    _set(torch.Tensor, "_make_subclass", staticmethod(_settled(torch.Tensor._make_subclass)))
    for name in ("retain_grad", "register_hook", "register_post_accumulate_grad_hook"):
        _set(torch.Tensor, name, _settled(getattr(torch.Tensor, name)))
    _set(torch.Tensor, "requires_grad",
         _settled_setter(torch._C.TensorBase.requires_grad, _requires_grad_unchanged))
    _set(torch.Tensor, "data", _settled_setter(torch._C.TensorBase.data))
    _set(torch.Tensor, "_version", _VERSION)
    for name, prop in _HISTORY.items():
        _set(torch.Tensor, name, prop)
    _set(torch.autograd.Function, "apply", classmethod(_opaque_call(
        _original_apply.__func__, "custom autograd.Function runs eagerly in the program's thread", _function_apply)))
    for owner, what in _SCRIPT_CALLS:
        _set(owner, "__call__", _opaque_call(owner.__call__, _TORCHSCRIPT, what))
    for owner, name in _TRACER_ENTRIES:
        _set(owner, name, _opaque_call(getattr(owner, name), _TORCHSCRIPT, _tracing))
    for module_name, transforms in _FUNCTORCH_LEVELS.items():
        module = importlib.import_module(module_name)
        for transform in transforms:
            _set(module, f"_{transform}_increment_nesting",
                 _level_entry(getattr(module, f"_{transform}_increment_nesting"), transform))
            _set(module, f"_{transform}_decrement_nesting",
                 _level_exit(getattr(module, f"_{transform}_decrement_nesting")))
    _set(threading.Thread, "start", _thread_start)
    _watch_compiles()
    _set(torch, "compile", _compile_watched(torch.compile))
    _set(torch, "clear_autocast_cache", _C.clear_autocast_cache)
    for name in _SETTINGS:
        _set(torch, name, _synced(getattr(torch, name)))
    for name in _BACKEND_SETTERS:
        _set(torch._C, name, _synced(getattr(torch._C, name)))
    # `torch.backends.mkldnn.enabled = False` and its kin: properties that hold the setter itself
    _set(torch.backends.ContextProp, "__set__", _synced(torch.backends.ContextProp.__set__))
    for name in ("_enter_dual_level", "_exit_dual_level"):  # looked up at each call
        if hasattr(_predispatch, name):  # torch 2.12 on
            _set(_predispatch, name, _synced(getattr(_predispatch, name)))
    for name in _RNG:
        _set(torch, name, _synced(getattr(torch, name)))
        _set(torch.random, name, _synced(getattr(torch.random, name)))
    for name in _GENERATOR:
        if name in torch._C.Generator.__dict__:
            _set(torch._C.Generator, name, _synced(torch._C.Generator.__dict__[name], _default_generator))


_fast = []  # what fast_path(True) replaced, for _restore
_pseudo = []  # what pseudo_ops(True) replaced


def fast_path(on):
    """Puts in (or takes out) the C fast path (terra_core/python/fast_path.cpp): hot Tensor
    methods and functions that, while co-executing, enter the engine without PyTorch's argument
    parser and dispatcher. In for a session, except while a loop runs eagerly (eager_hold)."""
    if on and not _fast:
        for owner, name, replacement in _C.fast_path_entries(torch.Tensor, torch, torch.nn.functional):
            _set(owner, name, replacement, _fast)
        _C.set_fast_path_functions(True)  # torch.relu, F.linear...: the same objects, see fast_path.h
    elif not on and _fast:
        _restore(_fast)
        _C.set_fast_path_functions(False)


def pseudo_ops(on):
    """Puts in (or takes out) the pseudo-ops: `backward` and `Tensor.grad`, ordered with the ops.
    In for a session, except while a loop runs eagerly (eager_hold)."""
    if on and not _pseudo:
        _set(_autograd, "_engine_run_backward", _run_backward, _pseudo)
        _set(torch.Tensor, "grad", property(_C.grad_get, _set_grad, _del_grad, _base_grad.__doc__),
             _pseudo)
    elif not on:
        _restore(_pseudo)


def eager_hold(held):
    """The engine's switch for the iterations a loop runs eagerly (a payoff-chosen hold, or past
    max_divergences): it takes out what would only pass calls through to PyTorch there, and puts
    it back when the loop is traced or co-executed again. Each pass-through cost 30-60 ns per op
    on the fast path, and about 1 µs per `.grad` read and 8 µs per backward (corpus p20's eager
    iterations: 10% over eager's step)."""
    fast_path(not held)
    pseudo_ops(not held)


_C.set_eager_hold_switch(eager_hold)


def uninstall():
    eager_hold(True)  # the fast path and the pseudo-ops out, then the rest
    _restore(_saved)
