"""Benchmark programs after the Terra paper's evaluation (see _common.py for the interface)."""
PROGRAMS = [
    "dcgan",
    "resnet",
    "gpt",
    "bert",
    "stochastic_depth",
    "stochastic_downsampling",
    "dropblock",
    "music_transformer",
    "detector_numpy_nms",
    "rnn_lengths",
    "rl_cartpole",
    "tabular_mlp",
    # third-party model code (Hugging Face transformers from configs; installed on first use)
    "hf_gpt2",
    "hf_llama",
    "hf_bert",
]
