"""Small CIFAR-style ResNet (3 stages, 16/32/64 channels, one basic block each, BatchNorm) on
16x16 RGB images, batch 32, SGD with Nesterov momentum and weight decay, batches cycled by a
Python counter."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "resnet"
DESCRIPTION = "ResNet-8 (16/32/64 ch), 16x16 RGB, batch 32, SGD Nesterov"
BATCH = 32


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        s = x if self.short is None else self.short(x)
        return F.relu(out + s)


class ResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make(seed=0):
    torch.manual_seed(seed)
    model = ResNet()
    x = torch.randn(256, 3, 16, 16)
    y = torch.randint(0, 10, (256,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    state = {"model": model, "opt": opt, "x": x, "y": y, "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    n = state["x"].shape[0] // BATCH
    xb = state["x"][(i % n) * BATCH:(i % n + 1) * BATCH]
    yb = state["y"][(i % n) * BATCH:(i % n + 1) * BATCH]
    state["i"] = i + 1
    loss = F.cross_entropy(state["model"](xb), yb)
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
