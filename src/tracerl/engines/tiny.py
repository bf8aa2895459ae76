"""Tiny random-init Qwen3 policies built from a config (no download), for tests, benchmarks and the embedded default.

Does not train or tokenize anything: the weights are random, so outputs are noise until a trainer warm-starts them.
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3(vocab_size: int = 512, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
               num_kv_heads: int = 2, seed: int = 0, *, intermediate_size: int | None = None,
               max_position_embeddings: int = 4096) -> Qwen3ForCausalLM:
    """A random-init `Qwen3ForCausalLM` (tied embeddings, full attention, float32, eval mode).

    The same arguments and seed give the same weights; the global torch RNG is left untouched.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}, and num_heads by "
                         f"num_kv_heads={num_kv_heads}; pick e.g. hidden_size=64, num_heads=4, num_kv_heads=2")
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.float().eval()
