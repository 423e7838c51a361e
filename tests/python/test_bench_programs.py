"""The benchmark programs (bench/programs/) are deterministic eagerly and end bitwise equal to eager
when their `train(state, steps)` runs under `terra.run`, for 2 steps from `make(seed)`.

No timing here (bench/run.py measures). Global RNG / dtype / grad-mode state is restored after
each test, and Terra's graphs are dropped before each program (every program's loop function is
called `train`, so their graphs would otherwise share a name).
"""
import importlib
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.programs import PROGRAMS, _common  # noqa: E402

STEPS = 2


@pytest.fixture(autouse=True)
def isolated_global_state():
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state(),
             torch.get_default_dtype(), torch.is_grad_enabled())
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
        torch.set_default_dtype(saved[3])
        torch.set_grad_enabled(saved[4])


def _eager(mod, steps=STEPS):
    state = mod.make(0)
    mod.train(state, steps)
    return {k: v.detach().clone() for k, v in mod.final_state(state).items()}


def _terra_as_eager(mod, steps=STEPS):
    """(ok, detail): the final state after `steps` steps under terra.run, bitwise against eager's."""
    import terra
    ref = _eager(mod, steps)
    terra.reset()
    state = mod.make(0)
    terra.run(mod.train, state, steps)
    terra.sync()
    return _common.compare(ref, mod.final_state(state), bitwise=True)


def test_layout():
    assert len(PROGRAMS) >= 10
    for name in PROGRAMS:
        mod = importlib.import_module(f"bench.programs.{name}")
        for attr in ("NAME", "DESCRIPTION", "make", "step", "train", "final_state", "jit_targets"):
            assert hasattr(mod, attr), f"{name} lacks {attr}"
        assert mod.NAME == name
        assert mod.train.__code__.co_freevars == (), f"{name}.train must not be a closure"


@pytest.mark.parametrize("name", PROGRAMS)
def test_eager_deterministic(name):
    mod = importlib.import_module(f"bench.programs.{name}")
    torch.manual_seed(123)
    a = _eager(mod)
    torch.manual_seed(456)
    b = _eager(mod)
    ok, detail = _common.compare(a, b, bitwise=True)
    assert ok, f"{name} is not deterministic eagerly: {detail}"


# Run in collection order in one process, so a program also runs after others under Terra (this
# is how a function-cache collision between modules with identical `train` code was caught).
@pytest.mark.parametrize("name", PROGRAMS)
def test_terra_bitwise_equal(name):
    import terra
    mod = importlib.import_module(f"bench.programs.{name}")
    ok, detail = _terra_as_eager(mod)
    assert ok, f"{name} under terra.run differs from eager after {STEPS} steps: {detail}; explain: {terra.explain()}"


def test_tabular_mlp_over_an_epoch_boundary_bitwise_equal_and_replayed():
    # 80 steps: past the 64-step epoch (a reshuffle, a randperm between iterations), three
    # .item() logs, dropout draws in every step, and a StepLR learning rate that the optimizer
    # reads as a Python number: the steady iterations run as replayed blocks, bitwise as eager.
    import terra
    ok, detail = _terra_as_eager(importlib.import_module("bench.programs.tabular_mlp"), 80)
    assert ok, f"tabular_mlp under terra.run differs from eager after 80 steps: {detail}"
    stats = terra.stats()
    assert stats["iterations_coexecuted"] >= 40, stats
    assert stats["iterations_replayed"] >= 20, stats
