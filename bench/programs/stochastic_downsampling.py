"""Stochastic downsampling (Kuen et al. 2018): a residual CNN where, each training step, Python's
`random` picks a block after which the feature map is downsampled and a ratio (0.5 or 0.75, via
adaptive average pooling); the spatial shapes of every later layer change with the choice."""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "stochastic_downsampling"
DESCRIPTION = "residual CNN, Python-chosen downsampling point and ratio per step (shapes vary)"
BATCH = 16


class Block(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class SDNet(nn.Module):
    def __init__(self, seed, ch=16, n_blocks=4):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, padding=1)
        self.blocks = nn.ModuleList([Block(ch) for _ in range(n_blocks)])
        self.fc = nn.Linear(ch, 10)
        self.rng = random.Random(seed)

    def forward(self, x):
        x = F.relu(self.stem(x))
        where, ratio = -1, 1.0
        if self.training and self.rng.random() < 0.75:
            where = self.rng.randrange(len(self.blocks))
            ratio = self.rng.choice([0.5, 0.75])
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == where:
                size = int(x.shape[-1] * ratio)
                x = F.adaptive_avg_pool2d(x, size)
        return self.fc(x.mean(dim=(2, 3)))


def make(seed=0):
    torch.manual_seed(seed)
    model = SDNet(seed)
    x = torch.randn(256, 3, 16, 16)
    y = torch.randint(0, 10, (256,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
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
