"""Correctness corpus: every program in tests/programs/ must be deterministic eagerly, and must
print the same text and end in a bitwise-equal state when run under Terra.

- test_eager_deterministic[name]: main() run twice in one process, with the global RNGs scrambled
  to different states before each run, gives identical stdout and bitwise-equal state. This is
  the precondition of the Terra comparison (a program that forgets to seed fails here).
- test_terra_matches_eager[name]: main() run eagerly, then through `terra.run(main)`; stdout and
  state must be identical. Records (record_property, and printed) the share of iterations that ran
  co-executed when `terra.stats()` reports "iterations_coexecuted" and "iterations_traced".
  Then main() runs through Terra a second time on the graphs of the first, as a re-executed
  notebook cell does: mostly co-executed from its first iteration, and again identical.

Each test restores the global state it may disturb: torch / random / NumPy RNG states, the default
dtype, grad mode.
"""
import random
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

_PROGRAMS_DIR = Path(__file__).resolve().parents[1] / "programs"
if str(_PROGRAMS_DIR) not in sys.path:
    sys.path.insert(0, str(_PROGRAMS_DIR))

import corpus  # noqa: E402  (tests/programs/corpus.py)

PROGRAMS = corpus.PROGRAMS


@pytest.fixture(autouse=True)
def isolated_global_state():
    """Save and restore every piece of global state a program (or Terra) might change."""
    saved = {
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
        "np_rng": np.random.get_state(),
        "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(),
    }
    try:
        yield
    finally:
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["py_rng"])
        np.random.set_state(saved["np_rng"])
        torch.set_default_dtype(saved["dtype"])
        torch.set_grad_enabled(saved["grad"])


def _scramble_rngs(seed):
    """Put every global RNG in a state unrelated to the programs' own seeds, different per run, so
    a program that does not seed everything it uses gives different results on each run."""
    torch.manual_seed(10_007 + seed)
    random.seed(20_011 + seed)
    np.random.seed(30_013 + seed)


def _assert_same_stdout(a, b, names):
    diff = corpus.stdout_diff(a, b, names=names)
    assert not diff, f"stdout differs between {names[0]} and {names[1]}:\n{diff}"


def test_corpus_layout():
    assert len(PROGRAMS) >= 22, PROGRAMS
    for name in PROGRAMS:
        source = (_PROGRAMS_DIR / f"{name}.py").read_text()
        assert "set_num_threads" not in source, f"{name}: the harness controls threads"
        module = corpus.load(name)
        assert module.__doc__ and len(module.__doc__.strip()) > 40, f"{name}: needs a docstring"
        assert callable(getattr(module, "main", None)), f"{name}: needs main()"


@pytest.mark.parametrize("name", PROGRAMS)
def test_eager_deterministic(name, record_property):
    _scramble_rngs(1)
    start = time.perf_counter()
    out1, state1 = corpus.run_eager(name)
    record_property("eager_seconds", round(time.perf_counter() - start, 4))
    assert out1.strip(), f"{name} printed nothing; the comparison is on stdout"
    _scramble_rngs(2)
    out2, state2 = corpus.run_eager(name)
    _assert_same_stdout(out1, out2, ("eager run 1", "eager run 2"))
    corpus.assert_same_state(state1, state2, names=("eager run 1", "eager run 2"))


def _record_terra_stats(name, terra, record_property):
    stats = terra.stats()
    assert isinstance(stats, dict), f"terra.stats() returned {type(stats).__name__}, not a dict"
    for key, value in stats.items():
        if isinstance(value, (int, float, str, bool)):
            record_property(f"terra.{key}", value)
    if "iterations_coexecuted" in stats and "iterations_traced" in stats:
        coexec = stats["iterations_coexecuted"]
        total = coexec + stats["iterations_traced"] + stats.get("iterations_fallback", 0)
        share = coexec / total if total else 0.0
        record_property("coexecuted_share", round(share, 4))
        replayed = stats.get("iterations_replayed", 0)
        record_property("replayed_share", round(replayed / total, 4) if total else 0.0)
        print(f"{name}: {coexec} of {total} iterations co-executed ({share:.1%}), {replayed} "
              f"replayed below autograd")


@pytest.mark.parametrize("name", PROGRAMS)
def test_terra_matches_eager(name, record_property):
    import terra

    module = corpus.load(name)

    _scramble_rngs(1)
    eager_out, eager_state = corpus.run_eager(name)

    _scramble_rngs(2)
    terra.reset()
    start = time.perf_counter()
    terra_out, terra_state = corpus.capture(lambda: terra.run(module.main))
    record_property("terra_seconds", round(time.perf_counter() - start, 4))
    _record_terra_stats(name, terra, record_property)

    _assert_same_stdout(eager_out, terra_out, ("eager", "terra"))
    corpus.assert_same_state(eager_state, corpus.check_state(terra_state, f"{name} (terra)"),
                             names=("eager", "terra"))

    _scramble_rngs(3)
    again_out, again_state = corpus.capture(lambda: terra.run(module.main))
    _assert_same_stdout(eager_out, again_out, ("eager", "terra, second run"))
    corpus.assert_same_state(eager_state, corpus.check_state(again_state, f"{name} (terra, again)"),
                             names=("eager", "terra, second run"))
