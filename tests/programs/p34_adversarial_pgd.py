"""Adversarial training with projected gradient descent (PGD, Madry et al.): each step attacks the
batch with a few signed-gradient steps on a perturbation, then trains the classifier on the
attacked batch, as the adversarial-robustness tutorials write it.

Terra features / hard spots: a fresh leaf every step made by a factory's `requires_grad=True`
(`torch.zeros_like(x, requires_grad=True)`, set on the op's result outside the dispatcher); an
inner loop of backward calls into that leaf, reading `delta.grad` and zeroing it in place;
`delta.data` updated under `no_grad` with `clamp_` (the projection); `model.requires_grad_(False)`
during the attack and back; a uniform random start made a leaf with `requires_grad_()` on odd
epochs; a `torch.randn(..., requires_grad=True)` noise leaf in the training loss, its gradient read; SGD with Nesterov momentum; clean accuracy fetched with `.item()`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS, ALPHA, ATTACK_STEPS = 0.3, 0.1, 3


def pgd(model, x, y, random_start):
    if random_start:
        delta = torch.empty_like(x).uniform_(-EPS, EPS).requires_grad_(True)
    else:
        delta = torch.zeros_like(x, requires_grad=True)
    for _ in range(ATTACK_STEPS):
        loss = F.cross_entropy(model(x + delta), y)
        loss.backward()
        with torch.no_grad():
            delta.add_(ALPHA * delta.grad.sign())
            delta.clamp_(-EPS, EPS)
        delta.grad.zero_()
    return delta.detach()


def main():
    torch.manual_seed(0)
    n, d = 192, 10
    x = torch.randn(n, d)
    labels = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).long()
    model = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    batch_size = 32
    for epoch in range(4):
        for start in range(0, n, batch_size):
            xb, yb = x[start:start + batch_size], labels[start:start + batch_size]
            model.requires_grad_(False)
            delta = pgd(model, xb, yb, random_start=epoch % 2 == 1)
            model.requires_grad_(True)
            noise = torch.randn(xb.shape, requires_grad=True)  # a leaf of the step's loss
            loss = F.cross_entropy(model(xb + delta + 0.01 * noise), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            clean = (model(x).argmax(1) == labels).float().mean()
        print(f"epoch {epoch} loss {loss.item():.5f} clean acc {clean.item():.4f} "
              f"noise grad {noise.grad.abs().sum().item():.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["last_delta"] = delta
    state["last_noise_grad"] = noise.grad
    return state


if __name__ == "__main__":
    main()
