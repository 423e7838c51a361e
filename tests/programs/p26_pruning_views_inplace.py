"""Magnitude pruning and max-norm constraints applied in place to views of parameters between steps.

After every optimizer step: a pruning mask (recomputed every 10 steps from weight magnitudes with
`kthvalue`, sparsity growing) is applied with `p.data.mul_(mask)`; the rows of the first layer are
renormalized in place to a maximum L2 norm (`w.data.div_(...)`); under `torch.no_grad()` a slice of
a bias is clamped in place (`bias[:8].clamp_`), and on odd steps one column of the last weight (a
non-contiguous view) is zeroed with `weight[:, 0].zero_()`.

Terra features / hard spots: views and in-place ops on views of parameters (`p.data.mul_`,
`.data[...]` slicing, non-contiguous column views, `torch.no_grad()` in-place writes into
parameters); masks kept in a Python dict; Adam (its moments keep pushing pruned weights, which the
mask zeroes again).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def magnitude_mask(weight, sparsity):
    k = max(1, int(weight.numel() * sparsity))
    threshold = weight.abs().flatten().kthvalue(k).values
    return (weight.abs() > threshold).float()


def main():
    torch.manual_seed(0)
    x = torch.randn(192, 12)
    y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 0.5).long()
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    prunable = {"0": model[0], "2": model[2]}
    masks = {}
    sparsity = 0.0
    batch_size = 32
    step = 0
    for epoch in range(6):
        for start in range(0, x.shape[0], batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            if step % 10 == 0:
                sparsity = min(0.6, sparsity + 0.15)
                masks = {name: magnitude_mask(layer.weight.data, sparsity) for name, layer in prunable.items()}
            for name, layer in prunable.items():
                layer.weight.data.mul_(masks[name])
            w = model[0].weight
            row_norms = w.data.norm(dim=1, keepdim=True)
            w.data.div_(row_norms.clamp(min=1.5) / 1.5)
            with torch.no_grad():
                model[2].bias[:8].clamp_(-0.1, 0.1)
                if step % 2 == 1:
                    model[4].weight[:, 0].zero_()
            if step % 6 == 0:
                zeros = sum(int((layer.weight == 0).sum()) for layer in prunable.values())
                print(f"epoch {epoch} step {step} loss {loss.item():.5f} sparsity {sparsity:.2f} zeros {zeros}")
            step += 1

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state.update({f"mask.{name}": m for name, m in masks.items()})
    return state


if __name__ == "__main__":
    main()
