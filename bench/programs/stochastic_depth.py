"""Stochastic depth (Huang et al. 2016): a 6-block residual CNN whose blocks are skipped during
training with linearly growing probability (up to 0.5), decided per step by Python's
`random.Random` held in the model -- the set of executed blocks changes every step."""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "stochastic_depth"
DESCRIPTION = "6-block residual CNN, blocks dropped by Python random each step, SGD momentum"
BATCH = 32


class Block(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        return self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))


class StochasticDepthNet(nn.Module):
    def __init__(self, seed, ch=24, n_blocks=6, p_last=0.5):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, padding=1)
        self.blocks = nn.ModuleList([Block(ch) for _ in range(n_blocks)])
        self.drop = [p_last * (i + 1) / n_blocks for i in range(n_blocks)]
        self.fc = nn.Linear(ch, 10)
        self.rng = random.Random(seed)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.max_pool2d(x, 2)
        for p, block in zip(self.drop, self.blocks):
            if self.training:
                if self.rng.random() < p:
                    continue
                x = F.relu(x + block(x))
            else:
                x = F.relu(x + (1 - p) * block(x))
        return self.fc(x.mean(dim=(2, 3)))


def make(seed=0):
    torch.manual_seed(seed)
    model = StochasticDepthNet(seed)
    x = torch.randn(256, 3, 16, 16)
    y = torch.randint(0, 10, (256,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = {"model": model, "opt": opt, "x": x, "y": y, "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    n = state["x"].shape[0] // BATCH
    sl = slice((i % n) * BATCH, (i % n + 1) * BATCH)
    state["i"] = i + 1
    loss = F.cross_entropy(state["model"](state["x"][sl]), state["y"][sl])
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (torch.randn(BATCH, 3, 16, 16),)}
