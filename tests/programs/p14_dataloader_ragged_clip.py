"""MLP with LayerNorm trained from a shuffling DataLoader whose last batch is ragged; gradient clipping.

103 samples with batch size 16: every epoch ends with a batch of 7. `DataLoader(shuffle=True)` draws
its permutation seed from the global torch RNG at the start of every epoch. Gradients are clipped by
value (`clip_grad_value_`) and then by norm (`clip_grad_norm_`), whose returned total norm is kept in
a Python list via `.item()`.

Terra features / hard spots: a ragged last batch (a shape change at the end of every epoch, then
back); `torch.utils.data.DataLoader` / `TensorDataset` iteration in Python (the sampler consumes the
torch RNG); gradient clipping in both forms; Adam; LayerNorm; `zero_grad(set_to_none=True)`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    n, d = 103, 8
    x = torch.randn(n, d)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(d, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    norms = []
    for epoch in range(4):
        seen = 0
        for step, (xb, yb) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.8)
            norms.append(total.item())
            optimizer.step()
            seen += xb.shape[0]
            if xb.shape[0] != 16:
                print(f"epoch {epoch} step {step}: ragged batch of {xb.shape[0]}, loss {loss.item():.5f}")
        print(f"epoch {epoch} saw {seen} samples, max grad norm {max(norms[-7:]):.5f}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["norms"] = torch.tensor(norms, dtype=torch.float64)
    return state


if __name__ == "__main__":
    main()
