"""Denoising autoencoder whose batches are generated with NumPy every step and fed via
`torch.from_numpy` / `torch.as_tensor`, with a NumPy-side metric history.

Each step: NumPy draws low-rank data plus noise (float64), converts it to float32, and the program
turns it into tensors (`torch.from_numpy(...)` for the input, `torch.as_tensor(...)` for the clean
target). Reconstruction errors per sample come back with `.numpy()`, and the running median kept
in NumPy decides (Python `if`) whether to log.

Terra features / hard spots: tensors created from NumPy every step (feeds whose values change every
step, a float64 -> float32 cast in NumPy); `.numpy()` fetches; SGD with nesterov momentum;
an encoder/decoder pair with a bottleneck; `torch.no_grad()` metric computation.
"""
import numpy as np
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    np.random.seed(0)
    d, rank = 20, 3
    basis = np.random.randn(rank, d)
    encoder = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 4))
    decoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, d))
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    errors = []
    for step in range(60):
        clean = (np.random.randn(24, rank) @ basis).astype(np.float32)
        noisy = clean + 0.3 * np.random.randn(24, d).astype(np.float32)
        x = torch.from_numpy(noisy)
        target = torch.as_tensor(clean)
        recon = decoder(encoder(x))
        loss = ((recon - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            per_sample = ((recon - target) ** 2).mean(dim=1).numpy()
        errors.extend(per_sample.tolist())
        median = float(np.median(errors[-96:]))
        if step % 10 == 0 or per_sample.max() > 8 * median:
            print(f"step {step} loss {loss.item():.5f} median {median:.5f} worst {per_sample.max():.5f}")

    state = {f"encoder.{k}": v for k, v in encoder.state_dict(keep_vars=True).items()}
    state.update({f"decoder.{k}": v for k, v in decoder.state_dict(keep_vars=True).items()})
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["errors"] = torch.tensor(errors)
    return state


if __name__ == "__main__":
    main()
