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
    model.train()
    stream = torch.cumsum(torch.randint(-3, 4, (8192,)), 0) % VOCAB
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    state = {"model": model, "opt": opt, "stream": stream, "i": 0, "log": []}
    return _common.register(state, {"model": model}, {"opt": opt})


def step(state):
    i = state["i"]
    state["i"] = i + 1
    starts = torch.randint(0, state["stream"].shape[0] - CTX, (BATCH,))
    x = state["stream"][starts[:, None] + torch.arange(CTX)[None, :]]
    loss = state["model"](input_ids=x, labels=x).loss
    state["opt"].zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(state["model"].parameters(), 1.0)
    state["opt"].step()
    if i % 10 == 0:
        state["log"].append(loss.item())
    return loss


def train(state, steps):
    for _ in range(steps):
        step(state)


final_state = _common.final_state


def jit_targets(state):
    return {"model": (torch.randint(0, VOCAB, (BATCH, CTX)),)}
