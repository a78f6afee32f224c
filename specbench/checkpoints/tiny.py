"""Tiny random-initialised Llama targets, built in-process (tests, the no-download demo)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama_config(vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 2, max_context: int = 1024) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        # a wider init than the default 0.02 spreads the logits, so fp32 argmax ties between a
        # one-token and a k-token forward (rounding ~1e-6) are practically impossible
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, **config_overrides) -> LlamaForCausalLM:
    """A seeded random Llama; the same seed gives the same weights."""
    config = tiny_llama_config(**config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


BUILTIN_TARGETS = {
    # name -> factory(dtype) ; tokenizer-less, random weights: for demos and engine tests only
    "specbench-tiny/random-llama": lambda dtype: tiny_llama(seed=0, dtype=dtype),
}
