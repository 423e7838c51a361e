"""Online hard-example mining: NumPy picks the hardest samples of one step to replay in the next.

Each step computes per-sample losses (`reduction="none"`), moves them to NumPy with
`.detach().numpy()`, takes the `np.argsort` top-k, and the next step's batch is the union of fresh
random indices (drawn with `np.random.choice`) and those hard indices, used to index the dataset
tensors. The per-class argmax of the logits also goes through NumPy (`np.bincount`) for logging.

Terra features / hard spots: NumPy post-processing whose result indexes tensors in the next step
(`.numpy()` fetch, then index tensors with NumPy int arrays / `torch.from_numpy`); NumPy random
(feeds); SGD with momentum and dampening; `zero_grad(set_to_none=True)`.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    np.random.seed(0)
    n, d, n_classes = 300, 10, 3
    centers = torch.randn(n_classes, d) * 1.5
    labels = torch.randint(0, n_classes, (n,))
    x = centers[labels] + torch.randn(n, d)
    model = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, n_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.8, dampening=0.1)
    fresh, hard_k = 24, 8
    hard_idx = np.random.choice(n, hard_k, replace=False)
    for step in range(40):
        fresh_idx = np.random.choice(n, fresh, replace=False)
        idx = np.concatenate([fresh_idx, hard_idx])
        xb = x[torch.from_numpy(idx)]
        yb = labels[idx]
        logits = model(xb)
        per_sample = F.cross_entropy(logits, yb, reduction="none")
        loss = per_sample.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        losses_np = per_sample.detach().numpy()
        hard_idx = idx[np.argsort(-losses_np, kind="stable")[:hard_k]]
        pred_np = logits.argmax(dim=1).numpy()
        if step % 5 == 0:
            counts = np.bincount(pred_np, minlength=n_classes)
            print(f"step {step} loss {loss.item():.5f} hardest {losses_np.max():.4f} "
                  f"pred counts {counts.tolist()} hard idx {sorted(hard_idx.tolist())[:4]}")

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["hard_idx"] = torch.from_numpy(hard_idx.copy())
    return state


if __name__ == "__main__":
    main()
