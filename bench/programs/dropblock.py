"""DropBlock (Ghiasi et al. 2018) in a small CNN: contiguous 3x3 regions of the feature maps are
dropped with a probability that grows linearly over training (a Python float computed from the
step counter, fed into the graph each step); masks from torch.rand + max-pooling, renormalized by
the kept fraction."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "dropblock"
DESCRIPTION = "CNN with DropBlock (3x3 blocks), drop prob scheduled from Python, Adam"
BATCH = 32


def drop_block(x, drop_prob, block_size, training):
    if not training or drop_prob == 0.0:
        return x
    h = x.shape[-1]
    gamma = drop_prob / (block_size ** 2) * (h ** 2) / ((h - block_size + 1) ** 2)
    seed_mask = (torch.rand(x.shape[0], x.shape[1], h, h) < gamma).float()
    block_mask = 1.0 - F.max_pool2d(seed_mask, block_size, stride=1, padding=block_size // 2)
    return x * block_mask * (block_mask.numel() / block_mask.sum().clamp(min=1.0))


class DropBlockNet(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.c1 = nn.Conv2d(3, ch, 3, padding=1)
        self.b1 = nn.BatchNorm2d(ch)
        self.c2 = nn.Conv2d(ch, 2 * ch, 3, padding=1)
        self.b2 = nn.BatchNorm2d(2 * ch)
        self.c3 = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1)
        self.b3 = nn.BatchNorm2d(2 * ch)
        self.fc = nn.Linear(2 * ch, 10)
        self.drop_prob = 0.0

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = drop_block(F.relu(self.b2(self.c2(x))), self.drop_prob, 3, self.training)
        x = drop_block(F.relu(self.b3(self.c3(x))), self.drop_prob, 3, self.training)
        return self.fc(x.mean(dim=(2, 3)))


def make(seed=0):
    torch.manual_seed(seed)
    model = DropBlockNet()
    x = torch.randn(256, 3, 16, 16)
    y = torch.randint(0, 10, (256,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = {"model": model, "opt": opt, "x": x, "y": y, "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    n = state["x"].shape[0] // BATCH
    sl = slice((i % n) * BATCH, (i % n + 1) * BATCH)
    state["i"] = i + 1
    state["_modules"]["model"].drop_prob = min(0.15, 0.15 * (i + 1) / 500)  # linear schedule
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
