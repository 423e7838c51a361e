"""2-D GAN with two Adam optimizers; the discriminator and the generator update on alternate steps.

The real data is a ring of 8 Gaussians. Even steps update the discriminator (fake samples
detached), odd steps update the generator through the discriminator (whose grads are then set to
None by its own `zero_grad` before its next update).

Terra features / hard spots: a GAN with two models and two optimizers; alternating updates chosen by
`step % 2` (two paths that alternate every iteration); `.detach()`; gradients flowing through a
model that is not being stepped; BCEWithLogitsLoss; `torch.randn` noise and `torch.randint` every
step (RNG order); printing losses every 10 steps.
"""
import math

import torch
import torch.nn as nn


def sample_real(n):
    angles = torch.randint(0, 8, (n,)).float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * 2.0
    return centers + 0.05 * torch.randn(n, 2)


def main():
    torch.manual_seed(0)
    z_dim = 4
    gen = nn.Sequential(nn.Linear(z_dim, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2),
                         nn.Linear(32, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    batch_size = 32
    ones = torch.ones(batch_size, 1)
    zeros = torch.zeros(batch_size, 1)
    d_loss_val, g_loss_val = float("nan"), float("nan")
    for step in range(60):
        z = torch.randn(batch_size, z_dim)
        if step % 2 == 0:
            real = sample_real(batch_size)
            fake = gen(z).detach()
            d_loss = bce(disc(real), ones) + bce(disc(fake), zeros)
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            d_loss_val = d_loss.item()
        else:
            g_loss = bce(disc(gen(z)), ones)
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
            g_loss_val = g_loss.item()
        if step % 10 == 9:
            print(f"step {step} d_loss {d_loss_val:.5f} g_loss {g_loss_val:.5f}")

    with torch.no_grad():
        samples = gen(torch.randn(256, z_dim))
    print(f"generated radius mean {samples.norm(dim=1).mean().item():.4f}")

    state = {f"gen.{k}": v for k, v in gen.state_dict(keep_vars=True).items()}
    state.update({f"disc.{k}": v for k, v in disc.state_dict(keep_vars=True).items()})
    for prefix, opt in (("opt_g", opt_g), ("opt_d", opt_d)):
        for pid, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                if v is not None:
                    state[f"{prefix}.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    for name, p in disc.named_parameters():
        if p.grad is not None:
            state[f"disc_grad.{name}"] = p.grad
    state["samples"] = samples
    return state


if __name__ == "__main__":
    main()
