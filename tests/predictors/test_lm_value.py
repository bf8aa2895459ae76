"""lm_value on a tiny random Qwen3: last-token pooling, the trainable base, and tokenizer checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracerl.core.history import History
from tracerl.core.predictor import make_predictor
from tracerl.io.files.state import load_state, save_state
from tracerl.predictors.lm_value import last_token_state


def test_last_token_state_picks_the_last_real_token_on_either_padding_side():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # (B, T, H)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    assert torch.equal(last_token_state(hidden, right), torch.stack([hidden[0, 1], hidden[1, 3]]))
    assert torch.equal(last_token_state(hidden, left), torch.stack([hidden[0, 3], hidden[1, 3]]))


def test_embedding_does_not_depend_on_batch_mates(tiny_lm_dir):
    predictor = make_predictor("lm_value", model_path=str(tiny_lm_dir), cache_size=0)
    short, long = "result ok", "task family 1 item 3\nthink call tool 2\nresult error\nthink call tool 1\nresult ok"
    alone = predictor._embed([short], grad=False)
    padded = predictor._embed([long, short], grad=False)
    torch.testing.assert_close(padded[1], alone[0], atol=1e-5, rtol=1e-5)


def test_frozen_base_is_not_changed_by_updates(tiny_lm_dir):
    predictor = make_predictor("lm_value", model_path=str(tiny_lm_dir))
    before = {k: v.clone() for k, v in predictor.base.state_dict().items()}
    histories = [History(text=f"item {i} result {'ok' if i % 2 else 'error'}", depth=1) for i in range(16)]
    predictor.update(histories, np.arange(16) % 2)
    assert all(torch.equal(before[k], v) for k, v in predictor.base.state_dict().items())


def test_train_base_updates_the_base_and_round_trips(tiny_lm_dir, tmp_path):
    predictor = make_predictor("lm_value", model_path=str(tiny_lm_dir), train_base=True, base_lr=1e-3, seed=2)
    before = {k: v.clone() for k, v in predictor.base.state_dict().items()}
    histories = [History(text=f"item {i} result {'ok' if i % 2 else 'error'}", depth=1) for i in range(16)]
    predictor.update(histories, np.arange(16) % 2)
    changed = [k for k, v in predictor.base.state_dict().items() if not torch.equal(before[k], v)]
    assert changed, "train_base=True must move the base's weights"
    save_state(tmp_path / "s.npz", predictor.state_dict())
    restored = make_predictor("lm_value", **predictor.config())
    restored.load_state_dict(load_state(tmp_path / "s.npz"))
    np.testing.assert_array_equal(restored.predict(histories), predictor.predict(histories))
    frozen = make_predictor("lm_value", model_path=str(tiny_lm_dir))
    with pytest.raises(ValueError, match="train_base"):
        frozen.load_state_dict(load_state(tmp_path / "s.npz"))


def test_tokenizer_larger_than_the_embedding_table_is_refused(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    from tracerl.engines.tiny import tiny_qwen3

    tiny_qwen3(vocab_size=64, hidden_size=32, num_heads=2, num_kv_heads=1).save_pretrained(tmp_path)
    assert len(AutoTokenizer.from_pretrained(tokenizer_dir)) > 64
    with pytest.raises(ValueError, match="tokenizer_path"):
        make_predictor("lm_value", model_path=str(tmp_path), tokenizer_path=str(tokenizer_dir))
