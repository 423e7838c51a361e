"""Hugging Face GPT-2 (transformers' GPT2LMHeadModel from a config, random weights: 2 layers,
d=64, 4 heads, context 32, vocab 512, dropout 0.1 as configured), trained as a language model
with AdamW on a token stream; the loss comes from the model (labels=), logged with .item() every
10 steps. Third-party model code: nothing in it was written for Terra."""
import torch

from bench.programs import _common, _hf

NAME = "hf_gpt2"
DESCRIPTION = "transformers GPT-2 2x64d ctx32 from config, AdamW, loss from labels=, .item() every 10"
VOCAB, CTX, BATCH = 512, 32, 8


def make(seed=0):
    transformers = _hf.quiet(_hf.ensure_installed())
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=64, n_layer=2,
                                     n_head=4)
    model = transformers.GPT2LMHeadModel(config)
    return _hf.lm_state(model, VOCAB)


def step(state):
    return _hf.lm_step(state, CTX, BATCH, clip=False)


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return _hf.lm_jit_targets(VOCAB, BATCH, CTX)
