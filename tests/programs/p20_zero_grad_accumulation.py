"""Gradient accumulation over micro-batches with `zero_grad(set_to_none=True)` and `=False`, and a
layer frozen for the first epoch.

Each optimizer step accumulates the gradients of 4 micro-batches (`loss / 4` then `backward()`
four times). Even epochs clear grads with `optimizer.zero_grad(set_to_none=True)` (grads become
None, then are freshly allocated by the next backward), odd epochs with
`model.zero_grad(set_to_none=False)` (grads zeroed in place, then accumulated into). The first layer
has `requires_grad_(False)` during epoch 0 and is unfrozen afterwards.

Terra features / hard spots: zero_grad with set_to_none both True and False (grad tensors that are
None vs. existing tensors accumulated in place); gradient accumulation across several backward
calls per step; `requires_grad` flipping mid-program (different autograd graph, different
optimizer behaviour for params with no grad); Adam with `foreach=True` (the `torch._foreach_*` ops).
The final grads are part of the compared state (None-ness included, as missing keys).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = torch.sin(x[:, :2].sum(dim=1, keepdim=True)) + 0.1 * x[:, 2:3]
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, foreach=True)
    micro, accum = 8, 4
    for epoch in range(4):
        model[0].requires_grad_(epoch > 0)
        set_to_none = epoch % 2 == 0
        n_updates = 0
        for start in range(0, 128, micro * accum):
            if set_to_none:
                optimizer.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=False)
            total = 0.0
            for k in range(accum):
                lo = start + k * micro
                loss = F.mse_loss(model(x[lo:lo + micro]), y[lo:lo + micro]) / accum
                loss.backward()
                total += loss.item()
            optimizer.step()
            n_updates += 1
            print(f"epoch {epoch} update {n_updates} set_to_none={set_to_none} loss {total:.6f} "
                  f"first layer grad is None: {model[0].weight.grad is None}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    for name, p in model.named_parameters():
        if p.grad is not None:
            state[f"grad.{name}"] = p.grad
    return state


if __name__ == "__main__":
    main()
