"""Fixtures for the neural predictors: tiny local encoder / causal-LM directories built from configs (no download).

The registry names the neural predictors by "module:attr"; nothing is registered on import, so nothing is undone here.
"""

from __future__ import annotations

import pytest
from helpers import BUILD_SEED

torch = pytest.importorskip("torch", reason="the neural predictors need torch: pip install -e '.[neural]'")
pytest.importorskip("transformers", reason="the neural predictors need transformers: pip install -e '.[neural]'")

TEXTS = [f"task family {i % 5} level plus{i % 7} item {i}\nthink call tool {i % 4}\nresult ok" for i in range(40)]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from tracerl.io.rollout.tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(TEXTS + ["good bad outcome"] * 3, vocab_size=400).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory, tokenizer_dir):
    """A random 2-layer Qwen3 (hidden 32) saved with save_pretrained, and the tokenizer beside it."""
    from transformers import AutoTokenizer

    from tracerl.engines.tiny import tiny_qwen3

    path = tmp_path_factory.mktemp("tiny-lm")
    tiny_qwen3(vocab_size=512, hidden_size=32, num_heads=2, num_kv_heads=1, seed=BUILD_SEED).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory, tokenizer_dir):
    """A random 1-layer BERT (hidden 32) with the trained BPE tokenizer: the layout all-MiniLM-L6-v2 ships in."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-encoder")
    config = BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path
