"""WGAN with weight clipping: the critic trains every step, the generator every 5th step; RMSprop.

After every critic update, each critic parameter is clipped in place through `.data`:
`p.data.clamp_(-c, c)` (the original WGAN recipe).

Terra features / hard spots: in-place parameter edits through `.data` (views of parameters mutated
outside autograd); two optimizers with different update frequencies (n_critic = 5: a path that
repeats every 5 iterations); RMSprop; `requires_grad_(False)` toggling on the critic while the
generator trains; Wasserstein losses (means of raw scores).
"""
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    z_dim, clip, n_critic = 4, 0.05, 5
    gen = nn.Sequential(nn.Linear(z_dim, 32), nn.ReLU(), nn.Linear(32, 2))
    critic = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt_g = torch.optim.RMSprop(gen.parameters(), lr=5e-4)
    opt_c = torch.optim.RMSprop(critic.parameters(), lr=5e-4)
    batch_size = 32
    real_mean = torch.tensor([1.0, -1.0])
    for step in range(60):
        real = real_mean + 0.3 * torch.randn(batch_size, 2)
        fake = gen(torch.randn(batch_size, z_dim)).detach()
        c_loss = critic(fake).mean() - critic(real).mean()
        opt_c.zero_grad()
        c_loss.backward()
        opt_c.step()
        for p in critic.parameters():
            p.data.clamp_(-clip, clip)

        if step % n_critic == n_critic - 1:
            for p in critic.parameters():
                p.requires_grad_(False)
            g_loss = -critic(gen(torch.randn(batch_size, z_dim))).mean()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
            for p in critic.parameters():
                p.requires_grad_(True)
            if step % 10 == 9:
                print(f"step {step} critic {c_loss.item():.6f} gen {g_loss.item():.6f}")

    with torch.no_grad():
        fake_mean = gen(torch.randn(256, z_dim)).mean(dim=0)
    print("fake mean", [round(v, 4) for v in fake_mean.tolist()])

    state = {f"gen.{k}": v for k, v in gen.state_dict(keep_vars=True).items()}
    state.update({f"critic.{k}": v for k, v in critic.state_dict(keep_vars=True).items()})
    for prefix, opt in (("opt_g", opt_g), ("opt_c", opt_c)):
        for pid, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                if v is not None:
                    state[f"{prefix}.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return state


if __name__ == "__main__":
    main()
