"""Three-class spiral classifier trained with SGD + Nesterov momentum, StepLR and gradient clipping.

Terra features / hard spots: SGD with nesterov=True and weight_decay; `torch.nn.utils.clip_grad_norm_`
(a norm computed over all grads, then an in-place rescale of every grad) whose returned total norm
is printed with an f-string; a StepLR scheduler stepped once per epoch (the learning rate is a
Python float that changes: must be a feed, not a baked constant); `scheduler.get_last_lr()` printed.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_spirals(n_per_class, n_classes=3):
    xs, ys = [], []
    for c in range(n_classes):
        r = torch.linspace(0.05, 1.0, n_per_class)
        t = torch.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + 0.2 * torch.randn(n_per_class)
        xs.append(torch.stack([r * torch.sin(t), r * torch.cos(t)], dim=1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    return torch.cat(xs), torch.cat(ys)


def main():
    torch.manual_seed(0)
    x, y = make_spirals(64)
    perm = torch.randperm(x.shape[0])
    x, y = x[perm], y[perm]
    model = nn.Sequential(nn.Linear(2, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True,
                                weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    batch_size = 32
    n_batches = math.ceil(x.shape[0] / batch_size)

    for epoch in range(6):
        for step in range(n_batches):
            xb = x[step * batch_size:(step + 1) * batch_size]
            yb = y[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            if step % 3 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.5f} grad norm {norm:.5f}")
        scheduler.step()
        print(f"epoch {epoch} lr now {scheduler.get_last_lr()[0]:.4f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
