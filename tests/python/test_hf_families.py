"""Hugging Face transformers model families beyond the benchmarks' GPT-2, Llama and BERT, each
trained for a few steps with AdamW under `terra.run` and compared bitwise with eager: an
encoder-decoder with relative position buckets (T5), another with learned positions (BART), a
vision transformer (ViT, patches by convolution), DistilBERT with an attention mask, Mistral
(grouped-query attention, sliding window), GPT-NeoX (rotary, parallel residual) and Wav2Vec2
(a convolutional feature encoder on raw audio). Built from small configs with random weights:
nothing is downloaded. All ran as in eager when written (session 52); the test keeps them so.
"""
import pytest
import torch

import terra

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
T = transformers


def make(kind):
    torch.manual_seed(0)
    if kind == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=200, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            decoder_start_token_id=0, dropout_rate=0.1)), "seq2seq"
    if kind == "bart":
        return T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=200, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)), "seq2seq"
    if kind == "vit":
        return T.ViTForImageClassification(T.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_labels=5)), "image"
    if kind == "distilbert":
        return T.DistilBertForSequenceClassification(T.DistilBertConfig(
            vocab_size=200, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64)), "classify"
    if kind == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(
            vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, sliding_window=8)), "lm"
    if kind == "gpt_neox":
        return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
            vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)), "lm"
    if kind == "wav2vec2":
        return T.Wav2Vec2ForSequenceClassification(T.Wav2Vec2Config(
            vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, mask_time_prob=0.0)), "audio"
    raise ValueError(kind)


def train(kind, steps=8):
    model, task = make(kind)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        if task == "lm":
            ids = torch.randint(0, 200, (2, 12), generator=g)
            loss = model(input_ids=ids, labels=ids).loss
        elif task == "seq2seq":
            ids = torch.randint(1, 200, (2, 10), generator=g)
            loss = model(input_ids=ids, labels=torch.randint(1, 200, (2, 6), generator=g)).loss
        elif task == "classify":
            ids = torch.randint(0, 200, (2, 12), generator=g)
            loss = model(input_ids=ids, attention_mask=(ids > 20).long(), labels=torch.tensor([0, 1])).loss
        elif task == "image":
            loss = model(pixel_values=torch.randn(2, 3, 16, 16, generator=g), labels=torch.tensor([1, 3])).loss
        else:
            loss = model(input_values=torch.randn(2, 400, generator=g), labels=torch.tensor([0, 1])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out + [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["t5", "bart", "vit", "distilbert", "mistral", "gpt_neox", "wav2vec2"])
def test_a_model_family_trains_as_in_eager(kind, fresh_graphs):
    eager = train(kind)
    coexecuted = terra.run(train, kind)
    assert len(eager) == len(coexecuted)
    bad = [i for i, (a, b) in enumerate(zip(eager, coexecuted)) if not torch.equal(a, b)]
    assert not bad, bad[:10]
    stats = terra.stats("train")
    assert stats["iterations_coexecuted"] >= 3 and stats["iterations_replayed"] >= 1, stats
