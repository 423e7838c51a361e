"""Hugging Face Llama (transformers' LlamaForCausalLM from a config, random weights: 2 layers,
hidden 64, 4 heads with 2 key/value heads (grouped-query attention), rotary embeddings, RMSNorm,
SiLU MLP, vocab 512, context 32), trained as a language model with AdamW and gradient clipping;
the loss comes from the model (labels=), logged with .item() every 10 steps."""
import torch

from bench.programs import _common, _hf

NAME = "hf_llama"
DESCRIPTION = "transformers Llama 2x64d GQA ctx32 from config, AdamW, clip, .item() every 10"
VOCAB, CTX, BATCH = 512, 32, 8


def make(seed=0):
    transformers = _hf.quiet(_hf.ensure_installed())
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=172,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=CTX)
    model = transformers.LlamaForCausalLM(config)
    return _hf.lm_state(model, VOCAB)


def step(state):
    return _hf.lm_step(state, CTX, BATCH, clip=True)


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return _hf.lm_jit_targets(VOCAB, BATCH, CTX)
