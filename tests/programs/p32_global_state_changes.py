"""Process-wide and thread-local settings changed between iterations of one program.

Terra features / hard spots: `torch.set_default_dtype(torch.float64)` mid-run (factory ops made
with no dtype switch to float64: a new path, and ops issued before the change must still make
float32); an evaluation loop under `torch.inference_mode()`; a parallel reduction under the
float64 default; deterministic algorithms switched on for the last phase. (The intra-op thread
count, which the harness controls, is covered by tests/python/test_engine.py.) Every phase's ops must run under the setting the program had
when it issued them.
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen, evals, bigs = [], [], []
    # phases: (steps, default dtype, deterministic, evaluate under inference_mode afterwards)
    phases = [(12, torch.float32, False, True), (8, torch.float64, False, False),
              (8, torch.float32, True, False), (6, torch.float32, False, False)]
    try:
        for steps, default, deterministic, evaluate in phases:
            torch.set_default_dtype(default)
            torch.use_deterministic_algorithms(deterministic)
            for _ in range(steps):
                noise = torch.randn(64, 8)  # default dtype: follows set_default_dtype
                x = (noise * 0.5).float()
                opt.zero_grad()
                loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
                loss.backward()
                opt.step()
                seen.append(noise.dtype)
                bigs.append(torch.zeros(300_000).add_(torch.randn(300_000)).sum())  # parallel
            if evaluate:
                with torch.inference_mode():
                    for _ in range(6):
                        evals.append(model(torch.randn(64, 8)).sum().item())
    finally:
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(False)
    print("dtypes", [str(d).split(".")[1] for d in seen[::4]], "evals", [f"{e:.4f}" for e in evals[:3]],
          f"big {sum(b.item() for b in bigs):.6f}")
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["bigs"] = torch.stack([b.double() for b in bigs])
    return state
