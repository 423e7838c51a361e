"""A small MLP on tabular data, the way a notebook trains one: standardized numeric features,
mini-batches sliced from shuffled tensors, dropout, AdamW, a learning-rate schedule, and the
loss read back with .item() every 25 steps for a progress log. Small layers, so each step is a
few hundred microseconds of framework overhead (Python, dispatcher, autograd) rather than
arithmetic: the kind of program the GPU or more cores do not speed up."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "tabular_mlp"
DESCRIPTION = "MLP 24-128-64-3 on tabular features, batch 64, dropout, AdamW + StepLR, .item() log"
FEATURES, CLASSES, BATCH, ROWS = 24, 3, 64, 4096


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 128)
        self.fc2 = nn.Linear(128, 64)
        self.out = nn.Linear(64, CLASSES)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = F.relu(self.fc2(x))
        return self.out(x)


def make(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(ROWS, FEATURES)
    w = torch.randn(FEATURES, CLASSES)
    y = (x @ w + 0.5 * torch.randn(ROWS, CLASSES)).argmax(dim=1)
    x = (x - x.mean(dim=0)) / x.std(dim=0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=200, gamma=0.7)
    state = {"model": model, "opt": opt, "sched": sched, "x": x, "y": y,
             "order": torch.randperm(ROWS), "pos": 0, "i": 0, "log": []}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    if state["pos"] + BATCH > ROWS:  # a new epoch: reshuffle
        state["order"] = torch.randperm(ROWS)
        state["pos"] = 0
    idx = state["order"][state["pos"]:state["pos"] + BATCH]
    state["pos"] += BATCH
    xb, yb = state["x"][idx], state["y"][idx]
    loss = F.cross_entropy(state["model"](xb), yb)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["sched"].step()
    state["i"] += 1
    if state["i"] % 25 == 0:
        state["log"].append(loss.item())
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


def final_state(state):
    out = _common.final_state(state)
    out["extra.log"] = torch.tensor(state["log"], dtype=torch.float64)  # the losses it printed
    return out


def jit_targets(state):
    return {"model": (state["x"][:BATCH],)}
