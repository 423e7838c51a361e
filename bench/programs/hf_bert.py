"""Hugging Face BERT (transformers' BertForSequenceClassification from a config, random weights:
2 layers, hidden 64, 4 heads, vocab 512), classifying padded sequences of random lengths with an
attention mask (a new mask every step), AdamW, loss from labels=, .item() every 10 steps."""
import torch

from bench.programs import _common, _hf

NAME = "hf_bert"
DESCRIPTION = "transformers BERT 2x64d from config, padded batches + attention mask, AdamW"
VOCAB, CTX, BATCH, LABELS = 512, 32, 8, 2


def make(seed=0):
    transformers = _hf.quiet(_hf.ensure_installed())
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=256,
                                     max_position_embeddings=CTX, num_labels=LABELS)
    model = transformers.BertForSequenceClassification(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    state = {"model": model, "opt": opt, "i": 0, "log": []}
    return _common.register(state, {"model": model}, {"opt": opt})


def batch():
    """Token ids padded with 0 after each sequence's length, the attention mask and a label that
    depends on the tokens (whether the first token is in the vocabulary's upper half)."""
    lengths = torch.randint(CTX // 4, CTX + 1, (BATCH,))
    mask = (torch.arange(CTX)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (BATCH, CTX)) * mask
    labels = (ids[:, 0] >= VOCAB // 2).long()
    return ids, mask, labels


def step(state):
    ids, mask, labels = batch()
    return _hf.update(state, state["model"](input_ids=ids, attention_mask=mask, labels=labels).loss)


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    ids, mask, _ = batch()
    return {"model": (ids, mask)}
