"""MLP trained with AdamW under a LambdaLR schedule (linear warmup then cosine decay), stepped
every iteration, plus a MultiStepLR-style manual drop of weight decay.

Terra features / hard spots: a learning-rate scheduler (LambdaLR with a Python function of the
step count; the lr is a new Python float every step: a feed, never a baked constant); AdamW with
`amsgrad=True`; changing another hyperparameter (`param_group['weight_decay']`) mid-run; printing
the lr every 8 steps.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    x = torch.randn(160, 10)
    y = (x[:, :5].sum(dim=1) > x[:, 5:].sum(dim=1)).long()
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=True)
    total_steps, warmup = 40, 8

    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / (total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    batch_size = 32
    step = 0
    for epoch in range(8):
        if epoch == 4:
            for group in optimizer.param_groups:
                group["weight_decay"] = 0.01
            print("weight decay lowered to 0.01")
        for b in range(160 // batch_size):
            xb, yb = x[b * batch_size:(b + 1) * batch_size], y[b * batch_size:(b + 1) * batch_size]
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 8 == 0:
                print(f"step {step} lr {scheduler.get_last_lr()[0]:.6f} loss {loss.item():.5f}")
            step += 1

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
