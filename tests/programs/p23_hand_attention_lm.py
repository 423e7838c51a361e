"""Hand-written causal self-attention language model (GPT-style block) with tied embeddings, Adam.

Multi-head attention is written out by hand: q/k/v from one Linear, `view` + `transpose` into heads,
scaled dot products, `masked_fill` with a lower-triangular causal mask buffer, softmax, weighted
sum, `transpose(...).contiguous().view(...)` back. The output projection reuses the token embedding
matrix (weight tying: one parameter used twice). Training data are random windows of a fixed
sequence; a short sampling loop uses `torch.multinomial` at the end.

Terra features / hard spots: a small transformer with hand-written attention and a causal mask;
views and non-contiguous tensors (transpose, view, contiguous); a registered buffer sliced every
forward; a parameter used at two places (tied weights); Adam; `torch.multinomial` sampling (RNG).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, D, HEADS = 16, 10, 32, 4


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.register_buffer("mask", torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q = q.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, d // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // HEADS)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class MiniGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        self.ln1 = nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.ln_f = nn.LayerNorm(D)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.ln_f(x) @ self.tok.weight.T


def main():
    torch.manual_seed(0)
    text = torch.tensor(([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9] * 12))
    model = MiniGPT()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch_size = 8
    for step in range(40):
        starts = torch.randint(0, text.numel() - CTX - 1, (batch_size,))
        xb = torch.stack([text[s:s + CTX] for s in starts])
        yb = torch.stack([text[s + 1:s + CTX + 1] for s in starts])
        logits = model(xb)
        loss = F.cross_entropy(logits.view(-1, VOCAB), yb.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 8 == 0:
            print(f"step {step} loss {loss.item():.5f}")

    idx = torch.tensor([[3, 1, 4]])
    with torch.no_grad():
        for _ in range(6):
            probs = F.softmax(model(idx[:, -CTX:])[:, -1], dim=-1)
            nxt = torch.multinomial(probs, num_samples=1)
            idx = torch.cat([idx, nxt], dim=1)
    print("sampled", idx[0].tolist())

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["sampled"] = idx
    return state


if __name__ == "__main__":
    main()
