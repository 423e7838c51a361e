"""GPT-style causal language model (2 layers, d=64, 4 heads, context 32, vocab 256), hand-written
masked attention, AdamW with weight decay, gradient clipping, a cosine learning-rate schedule set
from Python every step (a new float each step), and the loss logged with .item() every 10 steps."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "gpt"
DESCRIPTION = "GPT LM 2x64d ctx32, AdamW, clip, cosine LR from Python, .item() log every 10"
VOCAB, CTX, D, HEADS, LAYERS, BATCH = 256, 32, 64, 4, 2, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.register_buffer("mask", torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q = q.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // HEADS))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.zeros(1, CTX, D))
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make(seed=0):
    torch.manual_seed(seed)
    model = GPT()
    # a token stream with some structure: a random walk over the vocabulary
    steps = torch.randint(-3, 4, (8192,))
    stream = torch.cumsum(steps, 0) % VOCAB
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    state = {"model": model, "opt": opt, "stream": stream, "i": 0, "log": [], "total_steps": 1000}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    state["i"] = i + 1
    lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * min(i, state["total_steps"]) / state["total_steps"]))
    for group in state["opt"].param_groups:
        group["lr"] = lr
    starts = torch.randint(0, state["stream"].shape[0] - CTX - 1, (BATCH,))
    offs = torch.arange(CTX + 1)
    chunk = state["stream"][starts[:, None] + offs[None, :]]
    x, y = chunk[:, :-1], chunk[:, 1:]
    logits = state["model"](x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    state["opt"].zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(state["model"].parameters(), 1.0)
    state["opt"].step()
    if i % 10 == 0:
        state["log"].append(loss.item())
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (torch.randint(0, VOCAB, (BATCH, CTX)),)}
