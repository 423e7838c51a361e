"""Regression loop that prints tensors directly, in every common way, every N steps.

Prints: `print(loss)` (repr with grad_fn), `print(f"{loss:.4f}")` (Tensor.__format__),
`print(loss.detach())`, a small slice of predictions, a parameter (`Parameter containing:`), an
integer tensor, a boolean tensor, `.tolist()`, and `str()` of a scalar from a reduction.

Terra features / hard spots: printing tensors every step or every N steps (a fetch per step that
serializes the two runners; the printed text, grad_fn names and dtype suffixes included, must be
identical); Adam; SmoothL1Loss.
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = torch.stack([x[:, 0] * 2 - x[:, 1], x[:, 2] * x[:, 3]], dim=1)
    model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    loss_fn = nn.SmoothL1Loss()
    for epoch in range(3):
        for step in range(8):
            xb, yb = x[step * 8:(step + 1) * 8], y[step * 8:(step + 1) * 8]
            pred = model(xb)
            loss = loss_fn(pred, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"{loss:.4f}")
            if step % 4 == 0:
                print(loss)
                print("detached:", loss.detach())
                print(pred[:2])
                print("argmax", pred.argmax(dim=1))
                print("positive", (pred[:3] > 0))
        print(model[2].bias)
        print("epoch", epoch, "weights norm", str(model[0].weight.norm()), model[0].weight[0, :3].tolist())

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
