"""Regression with RMSprop, plateau-driven learning-rate halving and early stopping, all from `.item()`.

Each epoch ends with a validation pass under `torch.no_grad()`. The validation loss (a Python float
from `.item()`) drives a hand-written reduce-on-plateau: when it has not improved for `patience`
epochs, every `param_group['lr']` is halved; training stops early when the learning rate falls under
a floor, and an epoch is cut short when the loss of a step goes under a target (a `break` out of the
inner loop).

Terra features / hard spots: RMSprop (square_avg in place); `.item()`-driven early stopping
(data-dependent loop count: the epoch loop ends on a fetched value); learning-rate changes by
assigning `param_group['lr']` (a Python float feed that changes mid-run); Python floats kept as
best-so-far; `torch.no_grad()` evaluation between epochs.
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    x = torch.rand(192, 4) * 4 - 2
    y = torch.sin(x[:, :1]) * x[:, 1:2] + 0.5 * x[:, 2:3] ** 2 - x[:, 3:4] + 0.05 * torch.randn(192, 1)
    x_train, y_train, x_val, y_val = x[:160], y[:160], x[160:], y[160:]
    model = nn.Sequential(nn.Linear(4, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 1))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9)
    loss_fn = nn.MSELoss()
    batch_size = 32

    best_val = float("inf")
    bad_epochs = 0
    patience = 1
    target = 0.03
    for epoch in range(40):
        model.train()
        for step in range(0, x_train.shape[0], batch_size):
            xb, yb = x_train[step:step + batch_size], y_train[step:step + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            if loss.item() < target:
                print(f"epoch {epoch} step {step // batch_size}: train loss {loss.item():.6f} under target, "
                      "skipping the rest of the epoch")
                break
        model.eval()
        with torch.no_grad():
            val = loss_fn(model(x_val), y_val).item()
        if val < best_val - 1e-4:
            best_val = val
            bad_epochs = 0
        else:
            bad_epochs += 1
            if bad_epochs > patience:
                for group in optimizer.param_groups:
                    group["lr"] = group["lr"] * 0.5
                bad_epochs = 0
                print(f"epoch {epoch}: plateau, lr -> {optimizer.param_groups[0]['lr']:.6f}")
        print(f"epoch {epoch} val {val:.6f} best {best_val:.6f}")
        if optimizer.param_groups[0]["lr"] < 2e-3:
            print(f"early stop after epoch {epoch}")
            break

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["best_val"] = torch.tensor(best_val, dtype=torch.float64)
    state["final_lr"] = torch.tensor(optimizer.param_groups[0]["lr"], dtype=torch.float64)
    return state


if __name__ == "__main__":
    main()
