"""Helpers for the correctness corpus: list the programs, load one, run it eagerly capturing stdout,
and compare two final states bitwise.

Every program is a module `pNN_short_name.py` in this folder that defines `main()`. `main()` seeds
every RNG it uses itself, prints its progress to stdout, and returns a dict `{name: tensor}` of its
final state (parameters and buffers, optimizer state, anything else it keeps). A run under Terra
must print exactly the same text and return a bitwise-equal state.

Usable both as `tests.programs.corpus` (repository root on sys.path) and as a top-level module
loaded from this folder.
"""
import contextlib
import difflib
import importlib
import importlib.util
import io
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PROGRAMS = sorted(p.stem for p in HERE.glob("p[0-9][0-9]_*.py"))


def load(name):
    """Import the program module `name` (one of PROGRAMS) once and return it."""
    if name not in PROGRAMS:
        raise KeyError(f"unknown corpus program {name!r}; known: {PROGRAMS}")
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    modname = f"_terra_corpus_{name}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[modname]
        raise
    return module


def capture(fn):
    """Call `fn()` with stdout redirected; return `(stdout_text, fn's return value)`."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = fn()
    return buf.getvalue(), result


def check_state(state, label="state"):
    """Raise AssertionError unless `state` is a non-empty dict of str -> torch.Tensor."""
    assert isinstance(state, dict), f"{label}: main() must return a dict, got {type(state).__name__}"
    assert state, f"{label}: main() returned an empty dict"
    for k, v in state.items():
        assert isinstance(k, str), f"{label}: key {k!r} is not a str"
        assert isinstance(v, torch.Tensor), f"{label}[{k!r}] is {type(v).__name__}, not a tensor"
    return state


def run_eager(name):
    """Run program `name` eagerly; return `(stdout_text, state_dict_of_tensors)`."""
    module = load(name)
    out, state = capture(module.main)
    return out, check_state(state, f"{name} (eager)")


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _plain(t):
    """A detached, contiguous, ordinary (non-inference) copy of `t` that can be freely viewed."""
    with torch.inference_mode(False), torch.no_grad():
        return t.detach().clone().contiguous()


def _bits(t):
    """Reinterpret the elements of `t` as integers of the same width (bitwise identity)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.view(_INT_VIEW[t.element_size()])


def _max_abs_diff(a, b):
    """Max |a - b| over positions where neither is NaN (as a Python float), and NaN-mask agreement."""
    if a.is_floating_point() or a.is_complex():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        both = ~(nan_a | nan_b)
        diff = (a[both].to(torch.complex128 if a.is_complex() else torch.float64)
                - b[both].to(torch.complex128 if b.is_complex() else torch.float64)).abs()
        return (diff.max().item() if diff.numel() else 0.0), torch.equal(nan_a, nan_b)
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs()
    return (diff.max().item() if diff.numel() else 0.0), True


def tensor_difference(a, b, check_requires_grad=True):
    """Return None if `a` and `b` are identical (metadata and bits), else a short description."""
    if check_requires_grad and a.requires_grad != b.requires_grad:
        return f"requires_grad {a.requires_grad} vs {b.requires_grad}"
    if check_requires_grad and isinstance(a, torch.nn.Parameter) != isinstance(b, torch.nn.Parameter):
        return f"type {type(a).__name__} vs {type(b).__name__}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.device != b.device:
        return f"device {a.device} vs {b.device}"
    pa, pb = _plain(a), _plain(b)
    if a.is_floating_point() or a.is_complex():
        nan_a, nan_b = torch.isnan(pa), torch.isnan(pb)
        values_equal = torch.equal(nan_a, nan_b) and torch.equal(pa[~nan_a], pb[~nan_b])
    else:
        values_equal = torch.equal(pa, pb)
    bits_equal = torch.equal(_bits(pa), _bits(pb))
    if values_equal and bits_equal:
        return None
    max_diff, same_nans = _max_abs_diff(pa, pb)
    ne = _bits(pa) != _bits(pb)
    if pa.is_complex():
        ne = ne.any(dim=-1)
    n_diff = int(ne.sum())
    what = "values differ" if not values_equal else "values equal but bits differ (signed zero or NaN payload)"
    nan_note = "" if same_nans else ", NaN positions differ"
    return f"{what}: {n_diff} of {pa.numel()} elements, max abs diff {max_diff:.6g}{nan_note}"


def assert_same_state(a, b, names=("eager", "terra"), check_requires_grad=True):
    """Assert two final states are identical: same keys, and per tensor the same requires_grad,
    Parameter-ness, dtype, shape, device and bits (NaN-aware). The message names the first
    differing tensor (in the order of `a`) and its max abs difference."""
    na, nb = names
    check_state(a, na)
    check_state(b, nb)
    missing = [k for k in a if k not in b]
    extra = [k for k in b if k not in a]
    assert not missing and not extra, (
        f"state keys differ: only in {na}: {missing[:10]}{'...' if len(missing) > 10 else ''}; "
        f"only in {nb}: {extra[:10]}{'...' if len(extra) > 10 else ''}")
    differing = []
    for k in a:
        d = tensor_difference(a[k], b[k], check_requires_grad=check_requires_grad)
        if d is not None:
            differing.append((k, d))
    if differing:
        first, desc = differing[0]
        others = ", ".join(k for k, _ in differing[1:6])
        raise AssertionError(
            f"{len(differing)} of {len(a)} tensors differ between {na} and {nb}; first {first!r}: {desc}"
            + (f"; also: {others}{'...' if len(differing) > 6 else ''}" if others else ""))


def stdout_diff(a, b, names=("eager", "terra"), max_lines=40):
    """A unified diff of two stdout texts, cut to `max_lines` lines ('' if equal)."""
    if a == b:
        return ""
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), fromfile=names[0],
                                      tofile=names[1], lineterm=""))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    if not lines:  # differ only in trailing newline / line endings
        lines = [f"texts differ in whitespace: {a[-20:]!r} vs {b[-20:]!r}"]
    return "\n".join(lines)
