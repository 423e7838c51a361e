"""Music Transformer (Huang et al. 2018), small: decoder-only with relative positional attention
using the memory-efficient "skewing" trick (pad, reshape, slice), 2 layers, d=64, 4 heads,
sequence 64 over a 128-event vocabulary, Adam with a Python-side inverse-sqrt LR schedule."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "music_transformer"
DESCRIPTION = "relative-attention music transformer 2x64d seq64 (skewing), Adam + inv-sqrt LR"
VOCAB, SEQ, D, HEADS, LAYERS, BATCH = 128, 64, 64, 4, 2, 8


def skew(qe):
    # qe: (b, h, t, t) logits against relative positions -(t-1)..0 ; returns S_rel (b, h, t, t)
    b, h, t, _ = qe.shape
    padded = F.pad(qe, (1, 0))
    padded = padded.reshape(b, h, t + 1, t)
    return padded[:, :, 1:, :]


class RelativeAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.Er = nn.Parameter(torch.randn(SEQ, D // HEADS) * 0.02)
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)))

    def forward(self, x):
        b, t, _ = x.shape
        dh = D // HEADS
        q, k, v = self.qkv(x).split(D, dim=2)
        q = q.view(b, t, HEADS, dh).transpose(1, 2)
        k = k.view(b, t, HEADS, dh).transpose(1, 2)
        v = v.view(b, t, HEADS, dh).transpose(1, 2)
        er = self.Er[SEQ - t:]
        srel = skew(q @ er.transpose(0, 1))
        logits = (q @ k.transpose(-2, -1) + srel) / math.sqrt(dh)
        logits = logits.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(logits, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, D))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = RelativeAttention()
        self.ln1 = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))
        self.ln2 = nn.LayerNorm(D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.ff(x)))


class MusicTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.emb(idx) * math.sqrt(D)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make(seed=0):
    torch.manual_seed(seed)
    model = MusicTransformer()
    # synthetic "performance events": repeated arpeggio-like patterns with noise
    base = torch.randint(0, VOCAB, (64, 8))
    songs = base.repeat(1, SEQ // 8 + 1)[:, :SEQ + 1]
    noise = torch.rand(songs.shape) < 0.1
    songs = torch.where(noise, torch.randint(0, VOCAB, songs.shape), songs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    state = {"model": model, "opt": opt, "songs": songs, "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    state["i"] = i + 1
    lr = D ** -0.5 * min((i + 1) ** -0.5, (i + 1) * 400 ** -1.5)
    for group in state["opt"].param_groups:
        group["lr"] = lr
    n = state["songs"].shape[0] // BATCH
    batch = state["songs"][(i % n) * BATCH:(i % n + 1) * BATCH]
    logits = state["model"](batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (state["songs"][:BATCH, :-1],)}
