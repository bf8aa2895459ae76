"""Checkpoints verify their manifest on load, fall back to the previous intact one, keep the newest."""

from __future__ import annotations

import pytest
import torch

from tracerl.train import checkpoint


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _save(tmp_path, step: int, seed: int, keep: int = 2):
    model, optimizer = _model_and_optimizer(seed)
    return checkpoint.save(tmp_path, step, model, optimizer, None, {"step": step}, keep=keep), model


def test_flipped_byte_falls_back_to_previous_checkpoint_with_a_warning(tmp_path):
    _, old_model = _save(tmp_path, 1, seed=1)
    newest, _ = _save(tmp_path, 2, seed=2)
    data = bytearray((newest / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (newest / "model.pt").write_bytes(bytes(data))
    model, optimizer = _model_and_optimizer(3)
    with pytest.warns(RuntimeWarning, match="model.pt"):
        state = checkpoint.load(tmp_path, model, optimizer, None)
    assert state["step"] == 1, "the corrupted step-2 checkpoint must be skipped for step 1"
    assert torch.equal(model.weight, old_model.weight)


def test_no_intact_checkpoint_names_the_file_and_the_fix(tmp_path):
    newest, _ = _save(tmp_path, 1, seed=1)
    (newest / "optimizer.pt").write_bytes(b"garbage")
    model, optimizer = _model_and_optimizer(3)
    with pytest.raises(checkpoint.CheckpointError, match="optimizer.pt.*delete .*latest"):
        checkpoint.load(tmp_path, model, optimizer, None)


def test_manifest_missing_means_incomplete(tmp_path):
    newest, _ = _save(tmp_path, 1, seed=1)
    (newest / checkpoint.MANIFEST_FILE).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="manifest.json is missing"):
        checkpoint.load(tmp_path, *_model_and_optimizer(3), None)


def test_retention_keeps_the_checkpoint_just_written_and_removes_stale_temporaries(tmp_path):
    _save(tmp_path, 5, seed=1)
    _save(tmp_path, 6, seed=1)
    stale = tmp_path / "checkpoints" / ".step-000007-abc"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"half")
    written, _ = _save(tmp_path, 3, seed=1, keep=1)  # a step re-run after a resume sorts before older names
    assert written.is_dir(), "retention deleted the checkpoint it had just written"
    assert not stale.exists(), "a killed save's temporary folder was left behind"
    assert checkpoint.latest(tmp_path) == written


def test_round_trip_still_exact(tmp_path):
    _, saved = _save(tmp_path, 4, seed=7)
    model, optimizer = _model_and_optimizer(8)
    assert checkpoint.load(tmp_path, model, optimizer, None)["step"] == 4
    assert torch.equal(model.weight, saved.weight) and torch.equal(model.bias, saved.bias)
