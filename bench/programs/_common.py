"""Shared helpers of the benchmark programs: the state layout, final-state extraction, comparison.

Every program module in this folder defines
    NAME, DESCRIPTION           short id and one-line description
    make(seed) -> state         a dict: models, optimizers, data, Python/NumPy RNGs; seeds torch too
    step(state)                 one training iteration (what torch.compile compiles)
    train(state, steps)         `steps` iterations in a plain Python loop (what terra.run wraps)
    final_state(state)          dict[str, Tensor]: parameters, buffers, optimizer state, extras
    jit_targets(state)          {state key: example-input tuple} of the nn.Modules that the
                                TorchScript variants replace with torch.jit.script / torch.jit.trace

`make` stores the original modules and optimizers under state["_modules"] / state["_opts"], so the
final state is read from the tensors the optimizer updates even when state["model"] has been
replaced by a scripted or traced wrapper (those share the parameters with the original module).
"""
import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def register(state, modules, opts):
    state["_modules"] = dict(modules)
    state["_opts"] = dict(opts)
    return state


def final_state(state):
    out = {}
    for mname, m in state["_modules"].items():
        for k, v in m.state_dict(keep_vars=True).items():
            out[f"{mname}.{k}"] = v.detach()
    for oname, opt in state["_opts"].items():
        for pid, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                if v is None:
                    continue
                out[f"{oname}.{pid}.{k}"] = v.detach() if torch.is_tensor(v) else torch.tensor(v)
    for k, v in state.get("extra_state", {}).items():
        out[f"extra.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def _plain(t):
    with torch.no_grad():
        return t.detach().clone().contiguous()


def bitwise_equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    pa, pb = _plain(a), _plain(b)
    if pa.dtype == torch.bool:
        return torch.equal(pa, pb)
    return torch.equal(pa.view(_INT_VIEW[pa.element_size()]), pb.view(_INT_VIEW[pb.element_size()]))


def compare(ref, other, bitwise, rtol=1e-3, atol=1e-4):
    """(ok, detail): `other` equals `ref` bitwise, or within rtol/atol (per tensor, allclose).
    detail names the first differing tensor and the largest abs difference over all tensors."""
    if set(ref) != set(other):
        only_a = sorted(set(ref) - set(other))[:3]
        only_b = sorted(set(other) - set(ref))[:3]
        return False, f"state keys differ: only in eager {only_a}, only in this mode {only_b}"
    bad, max_diff = [], 0.0
    for k in ref:
        a, b = ref[k], other[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            bad.append(f"{k}: {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}")
            continue
        if a.is_floating_point():
            d = (a.double() - b.double()).abs()
            d = d[~torch.isnan(d)]
            md = float(d.max()) if d.numel() else 0.0
        else:
            md = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        max_diff = max(max_diff, md)
        same = bitwise_equal(a, b) if bitwise else torch.allclose(
            a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
        if not same:
            bad.append(f"{k}: max abs diff {md:.3g}")
    if bad:
        return False, f"{len(bad)} of {len(ref)} tensors differ; first {bad[0]}; max abs diff {max_diff:.3g}"
    return True, ("bitwise equal" if bitwise else f"max abs diff {max_diff:.3g}")
