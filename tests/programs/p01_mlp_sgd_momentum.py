"""Static MLP regression trained with SGD + momentum.

The baseline steady-state loop: one path, fixed shapes, mini-batches sliced from tensors made once
before the loop.

Terra features / hard spots: static MLP training; SGD with momentum (momentum buffers created on
the first step, then mutated in place); `optimizer.zero_grad(set_to_none=False)` (grads zeroed in
place, never None); a `.item()` fetch formatted with an f-string every 8 steps; a Python list of
floats (per-epoch mean loss).
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    n, d_in = 256, 16
    x = torch.randn(n, d_in)
    w_true = torch.randn(d_in, 1)
    y = x @ w_true + 0.1 * torch.randn(n, 1)
    batch_size = 32
    batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n, batch_size)]

    model = nn.Sequential(
        nn.Linear(d_in, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.Tanh(),
        nn.Linear(64, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.MSELoss()

    epoch_losses = []
    global_step = 0
    for epoch in range(6):
        running = 0.0
        for step, (xb, yb) in enumerate(batches):
            optimizer.zero_grad(set_to_none=False)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            running += loss.item()
            if global_step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            global_step += 1
        epoch_losses.append(running / len(batches))
        print(f"epoch {epoch} mean loss {epoch_losses[-1]:.6f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["epoch_losses"] = torch.tensor(epoch_losses, dtype=torch.float64)
    return state


if __name__ == "__main__":
    main()
