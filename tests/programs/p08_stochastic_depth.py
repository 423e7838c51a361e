"""CNN with stochastic depth and stochastic downsampling chosen per step with Python's `random`.

Each training step, every residual block is skipped with probability 0.3 (`random.random()`), and
the downsampling is chosen by `random.choice` among max-pooling, average-pooling and strided
slicing; the chosen downsampling changes the spatial shape seen by later layers (a global average
pool makes the head shape-independent). At eval time all blocks run with max-pooling.

Terra features / hard spots: a per-step architecture choice from Python `random` (path decisions
that Terra cannot see as tensor ops: many paths, each recurring); stochastic depth; shapes that
depend on the path; SGD with momentum; `train()`/`eval()` switching and `torch.no_grad()` evaluation.
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(x)))


class StochasticNet(nn.Module):
    def __init__(self, ch=8, n_blocks=3, drop_prob=0.3):
        super().__init__()
        self.stem = nn.Conv2d(1, ch, 3, padding=1)
        self.blocks = nn.ModuleList([ResBlock(ch) for _ in range(n_blocks)])
        self.head = nn.Linear(ch, 2)
        self.drop_prob = drop_prob

    def forward(self, x):
        x = F.relu(self.stem(x))
        mode = random.choice(["max", "avg", "stride"]) if self.training else "max"
        if mode == "max":
            x = F.max_pool2d(x, 2)
        elif mode == "avg":
            x = F.avg_pool2d(x, 2)
        else:
            x = x[:, :, ::2, ::2]
        for block in self.blocks:
            if self.training and random.random() < self.drop_prob:
                continue
            x = F.relu(block(x))
        return self.head(x.mean(dim=(2, 3)))


def main():
    torch.manual_seed(0)
    random.seed(0)
    n = 96
    labels = torch.randint(0, 2, (n,))
    x = torch.randn(n, 1, 8, 8) * 0.5
    x[:, :, :, :4] += labels.view(-1, 1, 1, 1).float()  # class 1: bright left half
    model = StochasticNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batch_size = 16
    for epoch in range(4):
        model.train()
        for step in range(n // batch_size):
            xb = x[step * batch_size:(step + 1) * batch_size]
            yb = labels[step * batch_size:(step + 1) * batch_size]
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.5f}")
        model.eval()
        with torch.no_grad():
            acc = (model(x).argmax(1) == labels).float().mean()
        print(f"epoch {epoch} train acc {acc.item():.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
