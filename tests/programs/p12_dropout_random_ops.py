"""MLP with dropout trained on randomly augmented data: rand, randn_like, bernoulli, randperm, mixup.

Every step draws: a random feature mask with `torch.bernoulli`, Gaussian noise with `randn_like`,
a mixup coefficient from `torch.rand(1)` (turned into a Python float), a mixup partner permutation
with `torch.randperm`, and in-place `uniform_` jitter; the model applies `nn.Dropout` and
`F.dropout` with `training=self.training`. The evaluation pass (dropout off) draws no randomness.

Terra features / hard spots: dropout and other random ops, whose results depend on the exact order
in which the global RNG is consumed (forward and backward, and the Python-side `.item()` of a
random value); Adam with L2 weight_decay; a Python float from a random tensor used as a scalar in
later ops (a feed that changes every step).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DropMLP(nn.Module):
    def __init__(self, d_in, hidden=64, n_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_out)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = F.dropout(F.relu(self.fc2(x)), p=0.1, training=self.training)
        return self.fc3(x)


def main():
    torch.manual_seed(0)
    n, d = 160, 12
    w = torch.randn(d, 4)
    x = torch.randn(n, d)
    labels = (x @ w).argmax(dim=1)
    model = DropMLP(d)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, weight_decay=1e-4)
    batch_size = 32
    for epoch in range(4):
        model.train()
        order = torch.randperm(n)
        for step in range(n // batch_size):
            idx = order[step * batch_size:(step + 1) * batch_size]
            xb = x[idx]
            keep = torch.bernoulli(torch.full_like(xb, 0.9))
            xb = xb * keep + 0.05 * torch.randn_like(xb)
            jitter = torch.empty(xb.shape[0], 1).uniform_(0.9, 1.1)
            xb = xb * jitter
            lam = torch.rand(1).item() * 0.3
            partner = torch.randperm(xb.shape[0])
            x_mix = (1 - lam) * xb + lam * xb[partner]
            logits = model(x_mix)
            yb = labels[idx]
            loss = (1 - lam) * F.cross_entropy(logits, yb) + lam * F.cross_entropy(logits, yb[partner])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} lam {lam:.4f} loss {loss.item():.5f}")
        model.eval()
        with torch.no_grad():
            acc = (model(x).argmax(dim=1) == labels).float().mean().item()
        print(f"epoch {epoch} acc {acc:.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["rng_probe"] = torch.rand(4)
    return state


if __name__ == "__main__":
    main()
