"""DCGAN on 16x16 single-channel images: transposed-conv generator, conv discriminator, BatchNorm,
alternating discriminator / generator Adam steps, noise drawn every step (torch RNG)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "dcgan"
DESCRIPTION = "DCGAN, 16x16 images, batch 32, alternating D/G Adam steps"
NZ = 32
BATCH = 32


class Generator(nn.Module):
    def __init__(self, nz=NZ, ch=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(nz, ch * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ch * 2), nn.ReLU(),
            nn.ConvTranspose2d(ch * 2, ch, 4, 2, 1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(),
            nn.ConvTranspose2d(ch, 1, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, ch, 4, 2, 1, bias=False), nn.LeakyReLU(0.2),
            nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 2), nn.LeakyReLU(0.2),
            nn.Conv2d(ch * 2, 1, 4, 1, 0, bias=False))

    def forward(self, x):
        return self.net(x).view(-1)


def make(seed=0):
    torch.manual_seed(seed)
    g, d = Generator(), Discriminator()
    # "real" data: smooth random blobs in [-1, 1]
    base = torch.randn(256, 1, 4, 4)
    data = torch.tanh(F.interpolate(base, size=(16, 16), mode="bilinear", align_corners=False) * 2)
    state = {
        "G": g, "D": d, "data": data, "i": 0,
        "opt_g": torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999)),
        "opt_d": torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999)),
        "ones": torch.ones(BATCH), "zeros": torch.zeros(BATCH),
    }
    return _common.register(state, {"G": g, "D": d}, {"opt_g": state["opt_g"], "opt_d": state["opt_d"]})


def step(state):
    G, D = state["G"], state["D"]
    i = state["i"]
    n = state["data"].shape[0] // BATCH
    real = state["data"][(i % n) * BATCH:(i % n + 1) * BATCH]
    state["i"] = i + 1
    z = torch.randn(BATCH, NZ, 1, 1)
    fake = G(z)
    # discriminator
    loss_d = (F.binary_cross_entropy_with_logits(D(real), state["ones"])
              + F.binary_cross_entropy_with_logits(D(fake.detach()), state["zeros"]))
    state["opt_d"].zero_grad()
    loss_d.backward()
    state["opt_d"].step()
    # generator
    loss_g = F.binary_cross_entropy_with_logits(D(fake), state["ones"])
    state["opt_g"].zero_grad()
    loss_g.backward()
    state["opt_g"].step()
    return loss_g


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"G": (torch.randn(BATCH, NZ, 1, 1),), "D": (torch.randn(BATCH, 1, 16, 16),)}
