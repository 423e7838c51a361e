"""Mixed precision: the forward under `torch.autocast("cpu", dtype=torch.bfloat16)`.

Terra features / hard spots: autocast is thread-local state of the program thread that changes
what an op computes (linear runs in bfloat16, its output is bfloat16), so the GraphRunner must run
each op under the autocast state it was issued with, and a change of that state between
iterations (an epoch with the weight cast cache off, a last epoch in full precision) must be a new
path, never a wrong result. The loss is
computed outside the autocast region in float32; `.item()` every 10 steps.
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    y = torch.randn(256, 1)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 0
    for epoch in range(4):
        # epochs 0-1: autocast; 2: autocast without the weight cast cache; 3: full precision
        use_amp, cache = epoch < 3, epoch != 2
        for i in range(0, 256, 32):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp, cache_enabled=cache):
                out = model(x[i:i + 32])
            loss = nn.functional.mse_loss(out.float(), y[i:i + 32])
            loss.backward()
            opt.step()
            steps += 1
            if steps % 10 == 0:
                print(f"epoch {epoch} step {steps} loss {loss.item():.5f} out dtype {out.dtype}")
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state.update({f"momentum.{i}": opt.state[p]["momentum_buffer"] for i, p in enumerate(model.parameters())})
    return state
