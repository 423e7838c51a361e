"""Training loop stopped by a KeyboardInterrupt (raised by a time-budget check, as if Ctrl-C were
pressed mid-step), caught by the user's handler that "saves a checkpoint", then resumed.

The interrupt is raised inside the step after the forward and backward passes but before
`optimizer.step()`, so the interrupted step leaves gradients but no update. The handler clones the
parameters and optimizer state into a checkpoint dict; training then resumes from a second loop
with a fresh `zero_grad()`, and at the end the model is compared against the checkpoint.

Terra features / hard spots: KeyboardInterrupt in the middle of an iteration (must reach the user's
handler with exactly the eager state, and the GraphRunner must stop cleanly); exceptions leaving
half-finished iterations; `copy.deepcopy` of an optimizer state_dict; Adam.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class Budget:
    def __init__(self, max_steps):
        self.max_steps = max_steps
        self.used = 0

    def tick(self):
        self.used += 1
        if self.used == self.max_steps:
            raise KeyboardInterrupt


def train(model, optimizer, x, y, epochs, budget, tag):
    for epoch in range(epochs):
        for start in range(0, x.shape[0], 16):
            xb, yb = x[start:start + 16], y[start:start + 16]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            budget.tick()
            optimizer.step()
        print(f"[{tag}] epoch {epoch} loss {loss.item():.5f}")


def main():
    torch.manual_seed(0)
    x = torch.randn(96, 6)
    y = (x[:, 0] > x[:, 1]).long()
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    checkpoint = None
    try:
        train(model, optimizer, x, y, epochs=5, budget=Budget(15), tag="run1")
    except KeyboardInterrupt:
        checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                      "optimizer": copy.deepcopy(optimizer.state_dict())}
        grad_norm = sum(float(p.grad.norm()) for p in model.parameters())
        print(f"interrupted; checkpoint saved, pending grad norm {grad_norm:.5f}")
    train(model, optimizer, x, y, epochs=2, budget=Budget(10 ** 9), tag="resume")
    drift = sum(float((v - checkpoint["model"][k]).abs().sum()) for k, v in model.state_dict().items())
    print(f"drift since checkpoint {drift:.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state.update({f"ckpt.model.{k}": v for k, v in checkpoint["model"].items()})
    for pid, st in checkpoint["optimizer"]["state"].items():
        for k, v in st.items():
            state[f"ckpt.opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
