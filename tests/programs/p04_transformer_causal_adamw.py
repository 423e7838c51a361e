"""Tiny causal language model with nn.TransformerEncoderLayer, trained with AdamW, then greedy decoding.

The corpus is a repeating token pattern; the model learns next-token prediction over windows of 12
tokens. After training, a greedy decoding loop under `model.eval()` + `torch.no_grad()` grows the
sequence one token at a time (argmax -> `.item()` -> Python list -> `torch.tensor(list)`).

Terra features / hard spots: a small transformer (multi-head attention, LayerNorm, GELU FFN,
dropout inside the layer) with a causal mask; AdamW (decoupled weight decay); Embedding backward;
random window starts from `torch.randint` (RNG order); `train()`/`eval()` switching (eval may take
PyTorch's fused fast path); a decode loop whose sequence length grows every iteration (new shapes
every step); `torch.tensor(python_list)` built every decode step.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 10
CTX = 12


class TinyLM(nn.Module):
    def __init__(self, d_model=32):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(CTX, d_model))
        self.block = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.1,
                                                activation="gelu", batch_first=True)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, VOCAB)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos[:t]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.block(h, src_mask=mask, is_causal=True)
        return self.out(self.norm(h))


def main():
    torch.manual_seed(0)
    pattern = [1, 2, 3, 4, 5, 1, 2, 6, 7, 8, 9, 0, 3, 5, 7]
    stream = torch.tensor(pattern * 20)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    batch_size = 8

    for epoch in range(3):
        model.train()
        for step in range(10):
            starts = torch.randint(0, stream.numel() - CTX - 1, (batch_size,))
            xb = torch.stack([stream[s:s + CTX] for s in starts.tolist()])
            yb = torch.stack([stream[s + 1:s + CTX + 1] for s in starts.tolist()])
            logits = model(xb)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), yb.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.5f}")

    model.eval()
    generated = [1, 2]
    with torch.no_grad():
        while len(generated) < CTX:
            idx = torch.tensor([generated])
            nxt = model(idx)[0, -1].argmax().item()
            generated.append(nxt)
    print("generated", generated)

    state = {f"model.{k}": v for k, v in model.state_dict(keep_vars=True).items()}
    for pid, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            if v is not None:
                state[f"opt.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    state["generated"] = torch.tensor(generated)
    return state


if __name__ == "__main__":
    main()
