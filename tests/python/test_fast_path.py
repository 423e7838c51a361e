"""The program thread's C fast path (terra_core/python/fast_path.cpp): hot Tensor methods and
torch functions, replaced while a session is open, enter the engine without PyTorch's argument
parser and dispatcher. Every entry point is run co-executed on argument variants and compared
bitwise with eager PyTorch and with the dispatcher route (the fast path off); the graph's
counters say which route the ops took.
"""
import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import terra
from terra import _C

ENTRIES = [(owner, name) for owner, name, _ in
           _C.fast_path_entries(torch.Tensor, torch, torch.nn.functional)]


@pytest.fixture(autouse=True)
def fast_path_on(fresh_graphs):  # tests/python/conftest.py
    terra.config(fast_path=True)


def operands():
    g = torch.Generator().manual_seed(3)
    a = torch.rand(4, 3, generator=g) + 0.5
    return {
        "a": a,
        "row": torch.rand(3, generator=g) + 0.5,        # broadcasts
        "ints": torch.arange(12).reshape(4, 3) + 1,     # int64: promotion with floats
        "w": torch.nn.Parameter(torch.rand(5, 3, generator=g)),
        "b": torch.nn.Parameter(torch.rand(5, generator=g)),
        "sq": torch.rand(3, 3, generator=g),
        "w9": torch.rand(9, 3, generator=g) - 0.5,   # a GRU cell's weights, hidden size 3
        "b9": torch.rand(9, generator=g) - 0.5,
    }


# Each variant: a function of the operands dict, run inside the loop, returning tensors.
BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}
VARIANTS = {}
for sym, fn in BINARY.items():
    VARIANTS[f"tensor {sym} tensor"] = lambda o, fn=fn: fn(o["a"], o["a"] * 2)
    VARIANTS[f"tensor {sym} broadcast"] = lambda o, fn=fn: fn(o["a"], o["row"])
    VARIANTS[f"tensor {sym} float"] = lambda o, fn=fn: fn(o["a"], 1.5)
    VARIANTS[f"tensor {sym} int"] = lambda o, fn=fn: fn(o["a"], 3)
    if sym != "-":  # eager refuses subtracting a bool
        VARIANTS[f"ints {sym} bool"] = lambda o, fn=fn: fn(o["ints"], True)
    VARIANTS[f"ints {sym} floats"] = lambda o, fn=fn: fn(o["ints"], o["a"])
VARIANTS.update({
    "float + tensor": lambda o: 2.5 + o["a"],
    "int * tensor": lambda o: 3 * o["a"],
    "a += row": lambda o: operator.iadd(o["a"].clone(), o["row"]),
    "a -= 1.5": lambda o: operator.isub(o["a"].clone(), 1.5),
    "a *= a": lambda o: operator.imul(o["a"].clone(), o["a"]),
    "a /= 4": lambda o: operator.itruediv(o["a"].clone(), 4),
    "add_ / sub_ / mul_ / div_": lambda o: o["a"].clone().add_(o["row"]).sub_(0.25).mul_(o["a"]).div_(3),
    "methods": lambda o: (o["a"].add(o["row"]), o["a"].sub(2), o["a"].mul(o["a"]), o["a"].div(o["row"])),
    "alpha keyword": lambda o: (o["a"].add(o["row"], alpha=2), o["a"].sub(o["a"], alpha=0.5),
                                o["a"].clone().add_(o["row"], alpha=-1e-3), torch.add(o["a"], 1, alpha=3),
                                o["ints"].add(o["ints"], alpha=2)),
    "alpha as a tensor (the original)": lambda o: o["a"].add(o["row"], alpha=o["a"].sum()),
    "lerp / addcmul / addcdiv (Adam)": lambda o: (
        o["a"].clone().lerp_(o["row"], 0.1), o["a"].lerp(o["a"] * 2, 0.5),
        o["a"].clone().mul_(0.999).addcmul_(o["row"], o["row"], value=1 - 0.999),
        o["a"].clone().addcdiv_(o["a"], o["a"].sqrt() + 1e-8, value=-0.01),
        o["a"].addcmul(o["a"], o["row"]), o["a"].addcdiv(o["row"], o["a"], value=2)),
    "lerp with a tensor weight (the original)": lambda o: o["a"].lerp(o["row"], o["a"] / 8),
    "rounding_mode (the original)": lambda o: o["a"].div(o["row"], rounding_mode="floor"),
    "unary methods": lambda o: (o["a"].relu(), o["a"].tanh(), o["a"].sigmoid(), o["a"].exp(),
                                o["a"].sqrt(), o["a"].abs(), o["a"].neg(), -o["a"], o["a"].t(),
                                (o["a"] - 1).relu_()),
    "reductions, copies, detach, zero_": lambda o: (
        o["a"].sum(), o["a"].mean(), o["ints"].sum(), torch.sum(o["a"]), torch.mean(o["a"]),
        o["a"].clone(), o["a"].detach(), o["a"].clone().zero_(), o["w"].detach() * 2,
        (o["a"] * o["a"]).sum() / o["a"].numel()),
    "reductions with arguments (the original)": lambda o: (
        o["a"].sum(0), o["a"].mean(dim=1), o["a"].sum(dtype=torch.float64),
        o["a"].clone(memory_format=torch.contiguous_format)),
    "torch functions": lambda o: (torch.relu(o["a"] - 1), torch.tanh(o["a"]), torch.sigmoid(o["a"]),
                                  torch.exp(o["a"]), torch.sqrt(o["a"]), torch.abs(o["a"] - 1),
                                  torch.neg(o["a"]), torch.add(o["a"], o["row"]),
                                  torch.sub(o["a"], 1), torch.mul(o["a"], 2.0),
                                  torch.div(o["a"], o["row"]), torch.add(o["a"], o["row"], alpha=3)),
    "matmul": lambda o: (o["a"] @ o["sq"], o["a"].matmul(o["sq"]), torch.matmul(o["a"], o["sq"])),
    "linear": lambda o: (F.linear(o["a"], o["w"], o["b"]), F.linear(o["a"], o["w"]),
                         F.linear(o["a"], o["w"], None), F.linear(o["a"], o["w"], bias=o["b"])),
    "item": lambda o: (o["a"].sum().item(), o["ints"][1, 2].item(), (o["a"] > 1).any().item(),
                       o["ints"].sum().item() + 0.5, torch.tensor(2.5).item()),
    "item of a tensor with more than one element (raises)": lambda o: raises(
        lambda: o["a"].item(), RuntimeError),
    "x[i]": lambda o: (o["a"][0], o["a"][-1], o["a"][3], o["ints"][2] * 2, o["row"][1],
                       o["w"][4], o["a"][1][2], o["a"][2].clone().add_(1)),
    "x[i] in place": lambda o: setitem_then(o["a"].clone(), 1, 7.0),
    "x[i] out of range, of a 0-dim tensor (raises)": lambda o: (
        raises(lambda: o["a"][4], IndexError), raises(lambda: o["a"][-5], IndexError),
        raises(lambda: o["a"].sum()[0], IndexError)),
    "x[other index kinds] (the original)": lambda o: (
        o["a"][1:3], o["a"][:, 1], o["a"][None], o["a"][True], o["a"][..., 0],
        o["a"][torch.tensor(1)], o["a"][[0, 2]], o["a"][o["a"] > 1]),
    "embedding": lambda o: (F.embedding(o["ints"] % 5, o["w"]), F.embedding(o["ints"] % 5, o["w"], 1),
                            torch.embedding(o["w"], o["ints"] % 5)),
    "cross entropy": lambda o: (
        F.cross_entropy(o["a"], o["ints"][:, 0] % 3), F.cross_entropy(o["a"], o["ints"][:, 1] % 3, o["row"]),
        F.cross_entropy(o["a"], o["ints"][:, 2] % 3, ignore_index=1, reduction="sum"),
        F.cross_entropy(o["a"], o["ints"][:, 0] % 3, label_smoothing=0.1),
        F.cross_entropy(o["a"], o["a"].softmax(1))),  # probabilities as the target
    "softmax, log_softmax, gelu": lambda o: (
        o["a"].softmax(1), o["a"].softmax(-1), F.softmax(o["a"], dim=0), o["a"].log_softmax(1),
        F.log_softmax(o["a"], 0), F.gelu(o["a"] - 1), torch.nn.GELU()(o["a"])),
    "transpose, unsqueeze": lambda o: (o["a"].transpose(0, 1), o["a"].transpose(-1, 0) * 2,
                                       o["a"].unsqueeze(0), o["a"].unsqueeze(-1) + 1,
                                       o["ints"].unsqueeze(1).transpose(1, 2)),
    "dropout, gru_cell (torch._VF)": lambda o: dropout_and_gru_cell(o),
    "dropout with keywords, F.dropout in place (the original)": lambda o: seeded(lambda: (
        torch._VF.dropout(o["a"], p=0.5, train=True), F.dropout(o["a"].clone(), 0.5, True, True))),
    "keywords by name, dtypes, strings": lambda o: (
        o["a"].softmax(dim=1), o["a"].softmax(0, torch.float64), F.gelu(o["a"], approximate="tanh"),
        o["a"].transpose(dim0=0, dim1=1), o["a"].log_softmax(1, dtype=torch.float64),
        o["a"].masked_fill(mask=o["a"] > 1, value=0.0), F.layer_norm(o["a"], (3,), eps=1e-3)),
    "bools for ints, unknown or repeated keywords, NumPy ints (the original)": lambda o: (
        raises(lambda: o["a"].unsqueeze(True), TypeError), o["a"].softmax(axis=1),
        raises(lambda: o["a"].transpose(0, dim0=1), TypeError), o["a"].view(np.int64(3), 4),
        o["a"].reshape((np.int64(2), 6)), raises(lambda: o["a"].permute(True, 0), TypeError)),
    "views, reshapes, permutes, expands by sizes": lambda o: (
        o["a"].view(2, 6), o["a"].view((12,)), o["a"].view([3, 4]) + 1, o["a"].view(-1), o["a"].view(o["a"].shape),
        o["a"].view(torch.Size([2, 2, 3])), o["a"].reshape(3, 4), o["a"].reshape((2, -1)),
        o["a"].t().reshape(-1), o["ints"].reshape([12]), o["a"].permute(1, 0), o["a"].permute((1, 0)).contiguous(),
        o["a"].permute([-1, 0]).reshape(3, 4), o["a"].unsqueeze(0).expand(2, 4, 3), o["row"].expand((4, -1)) * 2,
        o["a"].transpose(0, 1).contiguous(), o["a"].contiguous()),
    "a view by sizes that does not fit (raises)": lambda o: raises(lambda: o["a"].view(5, 5), RuntimeError),
    "a view of a dtype, view by a tensor's sizes (the original)": lambda o: (
        o["a"].view(torch.int32), o["a"].view(torch.tensor(12)), o["a"].view_as(o["a"].t())),
    "masked_fill, ~mask": lambda o: (
        o["a"].masked_fill(o["a"] > 1, float("-inf")), o["a"].masked_fill(o["a"] > 1, 0),
        o["ints"].masked_fill(o["ints"] > 6, 7), o["a"].masked_fill(~(o["a"] > 1), 2.5), ~(o["ints"] > 3),
        ~o["ints"]),
    "masked_fill with a tensor value (the original)": lambda o: o["a"].masked_fill(o["a"] > 1, o["a"].sum()),
    # The binding raises TypeError before any op; bitwise_not's kernel raised NotImplementedError.
    "~ of a float tensor beside other ops: TypeError as the binding raises it": lambda o: (
        o["a"] * 2, raises(lambda: ~o["a"], TypeError)),
    "layer_norm": lambda o: (
        F.layer_norm(o["a"], (3,), o["row"], o["row"] - 1), F.layer_norm(o["a"], [3]),
        F.layer_norm(o["a"], o["a"].shape), F.layer_norm(o["a"] * 4, (3,), None, o["row"], 1e-3),
        torch.nn.functional.layer_norm(o["ints"].float(), (4, 3))),
    "sum, mean over dims": lambda o: (
        o["a"].sum(0), o["a"].sum(-1, keepdim=True), o["a"].mean(1), o["a"].mean(-1, True), o["a"].sum((0, 1)),
        o["a"].mean(dim=[0]), torch.sum(o["a"], 1), torch.mean(o["a"], -1, keepdim=True), o["ints"].sum(0),
        o["a"].sum(1, dtype=torch.float64), o["a"].sum(), torch.sum(o["a"]), o["a"].mean(None)),
    "sum of ints to floats, mean of ints (raises)": lambda o: raises(lambda: o["ints"].mean(0), RuntimeError),
    "sum, mean by dim names, dtype alone (the original)": lambda o: (
        o["a"].sum(dtype=torch.float64), o["a"].sum(axis=0), torch.sum(input=o["a"], dim=0)),
    "pow, rsqrt (RMSNorm)": lambda o: (
        o["a"].pow(2), o["a"].pow(0.5), o["ints"].pow(2), o["a"].rsqrt(), torch.rsqrt(o["a"] + 1e-6),
        o["a"] * torch.rsqrt(o["a"].pow(2).mean(-1, keepdim=True) + 1e-6)),
    "pow with a tensor exponent (the original)": lambda o: o["a"].pow(o["row"]),
    "cat": lambda o: (
        torch.cat((o["a"], o["a"] * 2)), torch.cat([o["a"], o["a"]], 1), torch.cat((-o["a"][:, 1:], o["a"][:, :1]), dim=-1),
        torch.cat([o["a"]]), torch.cat((o["ints"], o["a"]), 0)),
    "cat of a list with a number (raises)": lambda o: raises(lambda: torch.cat([o["a"], 1]), TypeError),
    "addmm": lambda o: (
        torch.addmm(o["row"], o["a"], o["sq"]), torch.addmm(o["b"], o["a"], o["w"].t()), torch.addmm(o["a"], o["a"], o["sq"])),
    "addmm with beta and alpha (scalars by name)": lambda o: torch.addmm(o["row"], o["a"], o["sq"], beta=0.5, alpha=2),
    "conv2d, batch_norm, pooling, flatten": lambda o: conv_ops(o),
    "conv2d with padding by name (the original)": lambda o: F.conv2d(o["a"].reshape(1, 1, 4, 3), o["sq"].reshape(1, 1, 3, 3),
                                                                     padding="same"),
    "to(dtype), to(device)": lambda o: (
        o["a"].to(torch.float64), o["a"].to(torch.float32) * 1, o["ints"].to(torch.float32) / 2,
        o["a"].to(torch.device("cpu")) + 1, o["a"].to(torch.float32) is o["a"],
        o["a"].to(torch.device("cpu")) is o["a"], o["w"].to(torch.float64).sum(), o["ints"].float(),
        o["a"].float() is o["a"], o["a"].double().float() * 3),
    "to(other forms) (the original)": lambda o: (
        o["a"].to("cpu"), o["a"].to(o["ints"]), o["a"].to(torch.float64, copy=True), o["a"].to("cpu", torch.float64),
        o["a"].to(dtype=torch.float16), o["a"].to(torch.device("cpu"), non_blocking=False),
        o["ints"].float(memory_format=torch.contiguous_format)),
    "transpose out of range (raises)": lambda o: raises(lambda: o["a"].transpose(0, 2), IndexError),
    "autograd through the fast path": lambda o: backward_then_grads(
        (F.linear(o["a"], o["w"], o["b"]).tanh() * 2 + 1).sum(), o["w"], o["b"]),
})


def seeded(fn):
    torch.manual_seed(0)  # the draws, the same in every run
    return fn()


def conv_ops(o):
    x = (o["a"] - 1).reshape(1, 1, 4, 3).expand(2, 3, 4, 3).contiguous()
    w = o["w9"].reshape(1, 3, 3, 3).expand(4, 3, 3, 3).contiguous()
    bn_mean, bn_var = torch.zeros(4), torch.ones(4)
    y = F.conv2d(x, w, o["row"].repeat(2)[:4], 1, 1)
    z = F.batch_norm(y, bn_mean, bn_var, o["row"].repeat(2)[:4], None, True, 0.1, 1e-5)
    pooled = F.max_pool2d(F.relu(z), 2)
    return (y, z, bn_mean, bn_var, pooled, F.conv2d(x, w, None, (1, 2), (0, 1), 1, 1), torch.conv2d(x, w),
            F.batch_norm(y, bn_mean.clone(), bn_var.clone(), training=False), F.max_pool2d(z, (2, 3), 1),
            F.max_pool2d(z, 2, ceil_mode=True), F.adaptive_avg_pool2d(z, 1), F.adaptive_avg_pool2d(z, (2, 1)),
            torch.flatten(z, 1), z.flatten(), z.flatten(1, 2), torch.nn.Conv2d(3, 2, 3)(x).shape)


def dropout_and_gru_cell(o):
    torch.manual_seed(0)  # the draws, the same in every run
    a, w, b = o["a"], o["w9"], o["b9"]
    return (F.dropout(a, 0.5), F.dropout(a, 0.2, training=True), F.dropout(a, 0.5, training=False),
            torch.nn.Dropout(0.3)(a), torch._VF.gru_cell(a, a * 0.5, w, w * 2, b, b),
            torch._VF.gru_cell(a, a, w, w, None, None))


# Variants whose op must take the fast path (and, with it off, the dispatcher route).
FAST_OPS = {"item": "aten::item", "x[i]": "aten::select.int", "embedding": "aten::embedding",
            "cross entropy": "aten::cross_entropy_loss", "softmax, log_softmax, gelu": "aten::softmax.int",
            "transpose, unsqueeze": "aten::transpose.int", "dropout, gru_cell (torch._VF)": "aten::gru_cell",
            "views, reshapes, permutes, expands by sizes": "aten::view", "masked_fill, ~mask": "aten::masked_fill.Scalar",
            "layer_norm": "aten::layer_norm", "to(dtype), to(device)": "aten::to.dtype_layout",
            "keywords by name, dtypes, strings": "aten::softmax.int", "sum, mean over dims": "aten::mean.dim",
            "pow, rsqrt (RMSNorm)": "aten::rsqrt", "cat": "aten::cat", "addmm": "aten::addmm",
            "conv2d, batch_norm, pooling, flatten": "aten::conv2d"}


def dispatched(stats):
    return {op for op, _ in stats["ops_dispatched_top"]}


def raises(fn, kind):
    """The exception's type and message as a string tensor-free result: the same under Terra."""
    try:
        fn()
    except kind as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("no exception")


def setitem_then(t, i, value):
    t[i] = value  # __setitem__: the original route
    return t, t[i]


def backward_then_grads(loss, *leaves):
    loss.backward()
    return [p.grad.clone() for p in leaves]


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x.detach()]
    if isinstance(x, (bool, int, float, complex, str)):
        return [x]
    return [t for v in x for t in flat(v)]


def loop(variant, steps=8):
    o = operands()
    out = []
    for _ in range(steps):
        out.append(variant(o))
    return [t for r in out for t in flat(r)]


def same_value(x, y):
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and
                x.shape == y.shape and torch.equal(x, y))
    return type(x) is type(y) and x == y  # a Python number (item) or an error message


def same(xs, ys):
    return len(xs) == len(ys) and all(same_value(x, y) for x, y in zip(xs, ys))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_matches_eager_and_the_dispatcher_route(name):
    variant = VARIANTS[name]
    eager = loop(variant)
    fast = terra.run(loop, variant)
    s_fast = terra.stats("loop")
    terra.reset()
    terra.config(fast_path=False)
    slow = terra.run(loop, variant)
    s_slow = terra.stats("loop")
    assert same(eager, fast), name
    assert same(eager, slow), name
    assert s_slow["ops_fast"] == 0
    if "(raises)" in name:
        return  # an iteration whose op raised is not co-executed: the error is eager's either way
    assert s_fast["iterations_coexecuted"] >= 4 and s_slow["iterations_coexecuted"] >= 4
    if "(the original)" not in name:
        assert s_fast["ops_fast"] > 0, s_fast
    if name in FAST_OPS:
        assert FAST_OPS[name] not in dispatched(s_fast) and FAST_OPS[name] in dispatched(s_slow)


def test_entry_points_are_replaced_in_a_session_and_restored_after():
    originals = {(o, n): o.__dict__.get(n, None) for o, n in ENTRIES}
    seen_inside = {}

    def probe():
        for o, n in ENTRIES:
            seen_inside[(o, n)] = o.__dict__.get(n, None)

    terra.run(probe)
    for key, original in originals.items():
        assert seen_inside[key] is not original, key  # replaced while the session is open
        assert key[0].__dict__.get(key[1], None) is original, key  # restored exactly



FUNCTIONS = {"torch.relu": torch.relu, "torch.add": torch.add, "F.linear": F.linear, "F.gelu": F.gelu,
             "F.conv2d": F.conv2d, "torch.conv2d": torch.conv2d, "torch.embedding": torch.embedding,
             "_VF.dropout": torch._VF.dropout}


def test_torch_functions_keep_their_identity_and_take_the_fast_path_in_a_session():
    # TorchScript's builtin table and TorchDynamo's rules know torch functions by identity: the
    # fast path of a function is its own object's call slot, not a replacement object.
    relu, linear = torch.relu, F.linear  # held before the session, as `from torch import relu` does

    def prog(x, w, steps=6):
        seen, out = [], []
        for _ in range(steps):
            seen.append(all(getattr(o, n) is FUNCTIONS[f"{p}.{n}"] for p, o, n in
                            (("torch", torch, "relu"), ("torch", torch, "add"), ("F", F, "linear"),
                             ("F", F, "gelu"), ("F", F, "conv2d"), ("torch", torch, "conv2d"),
                             ("torch", torch, "embedding"), ("_VF", torch._VF, "dropout"))))
            seen.append(_C.fast_path_functions_on())
            out.append(linear(relu(x), w))
        return seen, out

    x, w = torch.rand(4, 3) - 0.5, torch.rand(5, 3)
    eager = prog(x, w)[1]
    seen, out = terra.run(prog, x, w)
    assert all(seen), seen
    assert same(flat(out), flat(eager))
    s = terra.stats(prog.__qualname__)
    assert s["iterations_coexecuted"] >= 3 and s["ops_fast"] >= 2 * s["iterations_coexecuted"], s
    assert not _C.fast_path_functions_on()  # out again after the session


class Logged(torch.Tensor):
    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Logged.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_torch_function_subclass_takes_the_original_route():
    def prog(x, steps=6):
        out = []
        for _ in range(steps):
            out.append((x + 1) * 2)
        return out

    x = torch.rand(3).as_subclass(Logged)
    Logged.calls = 0
    eager = prog(x)
    eager_calls = Logged.calls
    Logged.calls = 0
    coexec = terra.run(prog, x)
    assert Logged.calls == eager_calls > 0
    assert all(type(a) is type(b) and torch.equal(a, b) for a, b in zip(eager, coexec))
    s = terra.stats(prog.__qualname__)
    assert s["iterations_coexecuted"] >= 2 and s["ops_fast"] == 0, s


def test_ops_under_a_profiler_take_the_dispatcher_route_and_are_recorded():
    # The profiler's callbacks run where the dispatcher calls an op: with them on, the fast path
    # hands every op to the original, so the profile lists the ops it would list eagerly.
    def prog(x, steps=8, profile_from=4):
        out, names = [], []
        for i in range(steps):
            if i < profile_from:
                out.append((x + 1) * 2)
                continue
            with torch.autograd.profiler.profile() as prof:
                out.append((x + 1) * 2)
            names.append(sorted(e.name for e in prof.function_events if e.name.startswith("aten::")))
        return out, names

    x = torch.rand(3)
    eager_out, eager_names = prog(x)
    out, names = terra.run(prog, x)
    s = terra.stats(prog.__qualname__)
    assert same(flat(out), flat(eager_out))
    # (Co-executed, the kernels below add and mul run on the GraphRunner, out of the profile.)
    assert len(names) == len(eager_names) == 4
    assert all("aten::add" in n and "aten::mul" in n for n in names + eager_names), names
    assert s["ops_fast"] > 0, s  # the unprofiled iterations took the fast path


def test_wrong_operands_raise_as_in_eager():
    def prog(x, other, steps=5):
        for _ in range(steps):
            y = x * 2
        return y + other

    x = torch.rand(3)
    for other in ("text", torch.rand(4)):
        with pytest.raises(Exception) as eager:
            prog(x, other)
        with pytest.raises(Exception) as coexec:
            terra.run(prog, x, other)
        assert type(coexec.value) is type(eager.value)
        assert str(coexec.value) == str(eager.value)


def test_autograd_grad_inside_a_session_runs_eagerly():
    # torch.autograd.grad passes allow_unused positionally to the engine entry Terra patches.
    def prog(w, steps=4):
        out = []
        for _ in range(steps):
            out.append(torch.autograd.grad((w * w).sum(), [w], allow_unused=True)[0])
        return out

    w = torch.rand(3, requires_grad=True)
    assert all(torch.equal(a, b) for a, b in zip(prog(w), terra.run(prog, w)))


def test_pass_through_entry_points_are_taken_out_while_a_loop_runs_eagerly():
    # In eager iterations every call would only pass through the replacements (the fast path, the
    # `.grad` and backward pseudo-ops): after a few eager iterations in a row the engine takes them
    # out, and it puts them back as soon as the loop is traced or co-executed again.
    import torch.autograd as autograd
    original_backward = autograd._engine_run_backward

    def prog(w, steps=12):
        seen, grads = [], []
        for _ in range(steps):
            loss = (w * 2 + 1).sum()
            loss.backward()
            grads.append(w.grad.clone())
            seen.append(("__add__" in torch.Tensor.__dict__,
                         torch.Tensor.__dict__.get("grad") is not None,
                         autograd._engine_run_backward is not original_backward))
        return seen, grads

    w = torch.rand(3, requires_grad=True)
    eager_grads = prog(w, steps=24)[1]
    w.grad = None
    seen, grads = terra.run(prog, w)
    assert seen[-1] == (True, True, True), seen  # traced and co-executed: in
    assert all(torch.equal(a, b) for a, b in zip(eager_grads, grads))
    terra.reset()
    w.grad = None
    terra.config(max_divergences=0)  # every iteration start runs eagerly from the first
    seen, grads = terra.run(prog, w, steps=24)  # (the fixture restores the policy)
    assert not any(any(s) for s in seen[12:]), seen
    assert seen[0] == (True, True, True), seen  # in for the first eager iterations
    assert len(grads) == 24 and all(torch.equal(a, b) for a, b in zip(eager_grads, grads))
    # and the session left nothing behind
    assert "__add__" not in torch.Tensor.__dict__ and "grad" not in torch.Tensor.__dict__
    assert autograd._engine_run_backward is original_backward


def test_zero_grad_in_place_does_not_wait_for_the_graph_runner():
    # zero_grad(set_to_none=False) calls requires_grad_(False) on every gradient: a no-op that
    # used to wait for everything issued (a fetch wait per parameter per step).
    def train(steps=30):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        for _ in range(steps):
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()] + [p.grad.clone() for p in model.parameters()]

    eager = train()
    _C.clear_timeline()
    coexec = terra.run(train)
    assert all(torch.equal(a, b) for a, b in zip(eager, coexec))
    s = terra.stats(train.__qualname__)
    waits = [e for e in terra.timeline()["events"] if e["kind"] == "fetch_wait"]
    assert s["iterations_coexecuted"] >= 20, s
    assert len(waits) < s["iterations_coexecuted"], len(waits)  # was 4 per iteration (4 params)


def test_the_last_result_the_fast_path_returned_dies_with_its_iteration():
    # The engine keeps the fast path's last result until the next one (PythonRunner::
    # keep_returned): never past the iteration's end, so nothing outlives the session.
    import weakref

    def results(steps=12):
        x, y = torch.randn(3), torch.randn(3)
        z, refs, doubled = x, [], []
        for _ in range(steps):
            doubled.append(z * 2)
            z = x + y  # the iteration's last op
            refs.append(weakref.ref(z))
        del z
        return refs, doubled

    refs, doubled = terra.run(results)
    s = terra.stats("test_the_last_result_the_fast_path_returned_dies_with_its_iteration.<locals>.results")
    assert s["iterations_coexecuted"] >= 5 and s["ops_fast"] > 0, s
    assert [r() for r in refs] == [None] * len(refs)


def test_contiguous_of_a_contiguous_tensor_is_the_tensor_and_no_op():
    # PyTorch's binding returns a contiguous tensor itself from `.contiguous()`, with no op: the
    # trace has none there. A transpose over a dimension of size 1 (attention over one new token,
    # `o.transpose(1, 2).contiguous()`) is contiguous; the fast path issued aten::contiguous for
    # it, an op the trace had not seen (a fallback at every such iteration).
    def attend(steps=10):
        g = torch.Generator().manual_seed(4)
        q, k, v = (torch.randn(2, 4, 1, 16, generator=g) for _ in range(3))
        w = torch.randn(2, 3, 8, generator=g)
        out = []
        for _ in range(steps):
            t = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            c = t.contiguous()
            out.append((c is t, c.reshape(2, 64).sum(1), w.transpose(1, 2).contiguous() + 1))
            q = q * 0.5
        return out

    eager, coexec = attend(), terra.run(attend)
    assert [e[0] for e in eager] == [c[0] for c in coexec] == [True] * 10
    assert all(torch.equal(a, b) for e, c in zip(eager, coexec) for a, b in zip(e[1:], c[1:]))
    s = terra.stats("test_contiguous_of_a_contiguous_tensor_is_the_tensor_and_no_op.<locals>.attend")
    assert s["iterations_coexecuted"] >= 5 and s["fallbacks"] == 0, s
