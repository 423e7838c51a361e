"""Logistic regression / 2-layer net written with raw tensors and a hand-written SGD update under
`torch.no_grad()` (the classic "from scratch" tutorial loop), no nn.Module and no torch.optim.

Parameters are plain tensors with `requires_grad=True`; the update is
`with torch.no_grad(): p -= lr * p.grad; p.grad.zero_()`, plus a hand-written momentum buffer
updated with `mul_`/`add_`; the lr is a Python float decayed every 10 steps.

Terra features / hard spots: in-place updates of leaf tensors that require grad under
`torch.no_grad()`; `p.grad` read and zeroed in place from Python; a momentum buffer kept in a Python
list; a Python float lr that changes; `torch.sigmoid` / `binary_cross_entropy` written out by hand.
"""
import torch


def main():
    torch.manual_seed(0)
    n, d, hidden = 200, 5, 16
    x = torch.randn(n, d)
    y = ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).float().unsqueeze(1)
    w1 = (torch.randn(d, hidden) * 0.5).requires_grad_()
    b1 = torch.zeros(hidden, requires_grad=True)
    w2 = (torch.randn(hidden, 1) * 0.5).requires_grad_()
    b2 = torch.zeros(1, requires_grad=True)
    params = [w1, b1, w2, b2]
    velocity = [torch.zeros_like(p) for p in params]
    lr, beta = 0.5, 0.9
    batch_size = 40
    for epoch in range(10):
        for start in range(0, n, batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            h = torch.tanh(xb @ w1 + b1)
            prob = torch.sigmoid(h @ w2 + b2)
            loss = -(yb * torch.log(prob + 1e-7) + (1 - yb) * torch.log(1 - prob + 1e-7)).mean()
            loss.backward()
            with torch.no_grad():
                for p, v in zip(params, velocity):
                    v.mul_(beta).add_(p.grad)
                    p -= lr * v
                    p.grad.zero_()
        if epoch % 3 == 2:
            lr *= 0.5
        with torch.no_grad():
            acc = ((torch.sigmoid(torch.tanh(x @ w1 + b1) @ w2 + b2) > 0.5).float() == y).float().mean()
        print(f"epoch {epoch} lr {lr:.4f} loss {loss.item():.5f} acc {acc.item():.4f}")

    state = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    state.update({f"velocity.{i}": v for i, v in enumerate(velocity)})
    state.update({f"grad.{name}": p.grad for name, p in zip(["w1", "b1", "w2", "b2"], params)})
    return state


if __name__ == "__main__":
    main()
