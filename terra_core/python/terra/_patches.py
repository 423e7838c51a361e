"""Python entry points that never reach the PyTorch dispatcher, redirected while Terra is active.

Everything a program does with tensors through ATen operators is seen by the engine's dispatcher
hook. A few things bypass the dispatcher and are patched here for as long as a co-execution
session is open (and restored exactly afterwards):
- `backward`: the autograd engine is one pseudo-op of the graph;
- `Tensor.grad` (get/set): reads and writes of gradients are pseudo-ops too, ordered with the ops;
- reading data from Python (`repr`/`format`/`numpy`/`tolist`/`__array__`/`data_ptr`/pickling):
  a fetch: wait for the value, make the tensor concrete, then run PyTorch's own code untraced;
- the global RNG state (`manual_seed`, `get_rng_state`, ...) and tensor attributes changed in
  place from Python (`requires_grad_`, `.requires_grad =`, `.data =`): wait for the GraphRunner
  first, since ops already issued must see the old state;
- custom `autograd.Function.apply`: an opaque unit run eagerly in the program's thread;
- `threading.Thread.start`: other threads are not intercepted, so the iteration leaves
  co-execution (every placeholder becomes real) before one starts.
"""
import functools
import threading

import torch
import torch.autograd as _autograd

from . import _C

_saved = []
_base_grad = torch._C.TensorBase.grad


def _fetching(original):
    @functools.wraps(original)
    def fetch(self, *args, **kwargs):
        _C.materialize(self)
        _C.pause()
        try:
            return original(self, *args, **kwargs)
        finally:
            _C.resume()

    return fetch


def _synced(original):
    @functools.wraps(original)
    def synced(*args, **kwargs):
        _C.sync()
        return original(*args, **kwargs)

    return synced


def _run_backward(t_outputs, *args, **kwargs):
    return _C.backward(_original_run_backward, tuple(t_outputs), *args, **kwargs)


def _get_grad(self):
    return _C.grad_get(self)


def _opaque_apply(cls, *args, **kwargs):
    # A custom autograd.Function: its forward (and, through the backward-hook check, its
    # backward) runs eagerly in the program's thread, untraced.
    _C.opaque_begin("custom autograd.Function runs eagerly in the program's thread",
                    f"{cls.__qualname__}.apply")
    try:
        return _original_apply.__func__(cls, *args, **kwargs)
    finally:
        _C.opaque_end()


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

_FETCHES = ("__repr__", "__format__", "numpy", "tolist", "__array__", "data_ptr",
            "untyped_storage", "storage", "_typed_storage", "__reduce_ex__", "__deepcopy__")
_RNG = ("manual_seed", "seed", "get_rng_state", "set_rng_state", "initial_seed")


def _set(owner, name, value):
    _saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
    setattr(owner, name, value)


_MISSING = object()


def _synced_setter(descriptor):
    def setter(self, value):
        _C.sync()
        descriptor.__set__(self, value)

    return property(descriptor.__get__, setter, None, descriptor.__doc__)


def install():
    if _saved:
        return
    _set(_autograd, "_engine_run_backward", _run_backward)
    _set(torch.Tensor, "grad", property(_get_grad, _set_grad, _del_grad, _base_grad.__doc__))
    for name in _FETCHES:
        _set(torch.Tensor, name, _fetching(getattr(torch.Tensor, name)))
    _set(torch.Tensor, "requires_grad_", _synced(torch.Tensor.requires_grad_))
    for name in ("requires_grad", "data"):
        _set(torch.Tensor, name, _synced_setter(getattr(torch._C.TensorBase, name)))
    _set(torch.autograd.Function, "apply", classmethod(_opaque_apply))
    _set(threading.Thread, "start", _thread_start)
    for name in _RNG:
        _set(torch, name, _synced(getattr(torch, name)))
        _set(torch.random, name, _synced(getattr(torch.random, name)))


def uninstall():
    while _saved:
        owner, name, value = _saved.pop()
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
