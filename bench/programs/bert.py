"""BERT-style classifier: token + position embeddings, 2 nn.TransformerEncoderLayer blocks (d=64,
4 heads, dropout 0.1), padding masks from per-example lengths, [CLS] pooling, AdamW with linear
warm-up set from Python every step."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.programs import _common

NAME = "bert"
DESCRIPTION = "BERT classifier 2x64d seq32, padding masks, dropout, AdamW + warm-up"
VOCAB, SEQ, D, BATCH = 512, 32, 64, 16


class BertClassifier(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(SEQ, D)
        self.ln = nn.LayerNorm(D)
        layer = nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.1, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.cls = nn.Linear(D, num_classes)

    def forward(self, ids, pad_mask):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.ln(self.tok(ids) + self.pos(pos))
        x = self.encoder(x, src_key_padding_mask=pad_mask)
        return self.cls(x[:, 0])


def make(seed=0):
    torch.manual_seed(seed)
    model = BertClassifier()
    n = 512
    ids = torch.randint(2, VOCAB, (n, SEQ))
    ids[:, 0] = 1  # [CLS]
    lengths = torch.randint(8, SEQ + 1, (n,))
    pad = torch.arange(SEQ)[None, :] >= lengths[:, None]
    ids = ids.masked_fill(pad, 0)
    labels = ((ids[:, 1:5] % 2).sum(1) >= 2).long()  # learnable from the first tokens
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    state = {"model": model, "opt": opt, "ids": ids, "pad": pad, "labels": labels, "i": 0}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    state["i"] = i + 1
    for group in state["opt"].param_groups:
        group["lr"] = 1e-3 * min(1.0, (i + 1) / 100)
    n = state["ids"].shape[0] // BATCH
    sl = slice((i % n) * BATCH, (i % n + 1) * BATCH)
    logits = state["model"](state["ids"][sl], state["pad"][sl])
    loss = F.cross_entropy(logits, state["labels"][sl])
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (state["ids"][:BATCH], state["pad"][:BATCH])}
