"""Hugging Face transformers models for the benchmarks: built from a config with random weights
(nothing is downloaded), trained with AdamW on synthetic token data. The package is installed by
the benchmark's own setup (bench/requirements-hf.txt, `ensure_installed`), not by the project's.
"""
import importlib
import subprocess
import sys
from pathlib import Path

import torch

from bench.programs import _common

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements-hf.txt"


def ensure_installed():
    """Import transformers, installing bench/requirements-hf.txt into this interpreter first if
    it is missing (from PyPI; the project's own setup never needs it)."""
    try:
        return importlib.import_module("transformers")
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
                       check=True)
        importlib.invalidate_caches()
        return importlib.import_module("transformers")


def quiet(transformers):
    transformers.logging.set_verbosity_error()
    return transformers


def update(state, loss, clip=False):
    """The training step's tail shared by the hf_* programs: backward, optional gradient
    clipping, AdamW, and the loss logged with .item() every 10 steps."""
    state["opt"].zero_grad()
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(state["model"].parameters(), 1.0)
    state["opt"].step()
    if state["i"] % 10 == 0:
        state["log"].append(loss.item())
    state["i"] += 1
    return loss


def lm_state(model, vocab):
    """State of a causal language model trained on a token stream (a random walk over the
    vocabulary) with AdamW; registered for final_state."""
    model.train()
    stream = torch.cumsum(torch.randint(-3, 4, (8192,)), 0) % vocab
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    state = {"model": model, "opt": opt, "stream": stream, "i": 0, "log": []}
    return _common.register(state, {"model": model}, {"opt": opt})


def lm_step(state, ctx, batch, clip=False):
    """One language-model step: a batch of `ctx`-token windows of the stream, the loss from the
    model itself (labels=)."""
    starts = torch.randint(0, state["stream"].shape[0] - ctx, (batch,))
    x = state["stream"][starts[:, None] + torch.arange(ctx)[None, :]]
    return update(state, state["model"](input_ids=x, labels=x).loss, clip)


def lm_jit_targets(vocab, batch, ctx):
    """What the TorchScript modes compile for a language model: the model on one batch of ids."""
    return {"model": (torch.randint(0, vocab, (batch, ctx)),)}
