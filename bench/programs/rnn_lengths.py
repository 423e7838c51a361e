"""Character-level GRU language model stepped by hand in Python: each training step draws a
sequence length (8..24) with Python's `random`, runs a GRUCell over the time steps in a Python
loop, accumulates the per-step losses, clips gradients and takes an Adam step. The op sequence
length differs from step to step."""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "rnn_lengths"
DESCRIPTION = "GRUCell LM, Python loop over a random length 8..24 each step, Adam + clip"
VOCAB, EMB, HID, BATCH = 64, 32, 128, 16


class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.cell = nn.GRUCell(EMB, HID)
        self.out = nn.Linear(HID, VOCAB)

    def forward(self, tokens):  # tokens: (T+1, b); returns the mean next-token loss
        h = torch.zeros(tokens.shape[1], HID)
        loss = 0.0
        for t in range(tokens.shape[0] - 1):
            h = self.cell(self.emb(tokens[t]), h)
            loss = loss + F.cross_entropy(self.out(h), tokens[t + 1])
        return loss / (tokens.shape[0] - 1)


def make(seed=0):
    torch.manual_seed(seed)
    model = CharRNN()
    text = (torch.arange(20000) * 7 + torch.randint(0, 3, (20000,))) % VOCAB
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    state = {"model": model, "opt": opt, "text": text, "rng": random.Random(seed), "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    state["i"] += 1
    rng = state["rng"]
    length = rng.randint(8, 24)
    starts = [rng.randrange(0, state["text"].shape[0] - length - 1) for _ in range(BATCH)]
    idx = torch.tensor(starts)[None, :] + torch.arange(length + 1)[:, None]
    tokens = state["text"][idx]
    loss = state["model"](tokens)
    state["opt"].zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(state["model"].parameters(), 1.0)
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    idx = torch.arange(BATCH)[None, :] + torch.arange(13)[:, None]
    return {"model": (state["text"][idx],)}
