"""Training with data-dependent branching on tensor values: `if loss.item() > thr`, `if x.sum() > 0`,
and a `while` loop whose trip count depends on a tensor.

- A mixture of two expert heads: each batch is routed by `if xb.sum() > 0:` (Tensor.__bool__ on a
  0-d comparison) to expert A or expert B, which are different op sequences.
- `if loss.item() > threshold:` adds an extra L2 activity penalty (different ops on the path).
- After each step, a refinement loop `while residual > tol and it < 6:` iterates a few fixed-point
  updates of a buffer tensor (a data-dependent loop count, capped).

Terra features / hard spots: data-dependent branching on a tensor value choosing different ops
(path decisions that depend on a fetch), a data-dependent loop count with a cap; SGD plain (no
momentum) so the trajectory is sensitive to every path decision.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoExperts(nn.Module):
    def __init__(self, d=6, hidden=32):
        super().__init__()
        self.shared = nn.Linear(d, hidden)
        self.expert_a = nn.Linear(hidden, 1)
        self.expert_b = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        h = F.relu(self.shared(x))
        if x.sum() > 0:
            return self.expert_a(h), h, "a"
        return self.expert_b(h), h, "b"


def main():
    torch.manual_seed(0)
    model = TwoExperts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    w = torch.randn(6, 1)
    anchor = torch.zeros(1, 32)
    threshold = 2.5
    routes = {"a": 0, "b": 0}
    penalized = 0
    refine_iters = []
    for step in range(50):
        xb = torch.randn(16, 6) + (0.3 if step % 3 == 0 else -0.1)
        yb = torch.where(xb.sum(dim=1, keepdim=True) > 0, xb @ w, -(xb @ w))
        pred, h, route = model(xb)
        routes[route] += 1
        loss = F.mse_loss(pred, yb)
        if loss.item() > threshold:
            loss = loss + 1e-3 * h.pow(2).mean()
            penalized += 1
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        target = h.detach().mean(dim=0, keepdim=True)
        it = 0
        residual = (anchor - target).abs().max()
        while residual > 0.05 and it < 6:
            anchor = 0.5 * anchor + 0.5 * target
            residual = (anchor - target).abs().max()
            it += 1
        refine_iters.append(it)
        if step % 10 == 0:
            print(f"step {step} route {route} loss {loss.item():.5f} refine iters {it}")
    print(f"routes {routes} penalized {penalized} refine histogram "
          f"{[refine_iters.count(k) for k in range(7)]}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    state["anchor"] = anchor
    state["refine_iters"] = torch.tensor(refine_iters)
    return state


if __name__ == "__main__":
    main()
