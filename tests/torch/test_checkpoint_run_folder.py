"""A checkpoint's run folder is the run's own (the other half of test_checkpoint_integrity.py): nothing it holds leads
outside it, and a save never writes or deletes through a symlink or a planted temporary."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from test_checkpoint_integrity import SAVED, _foreign_checkpoint, _model_and_optimizer, _refused, _save, _with, _within

from tracerl.train import checkpoint


# ---------------------------------------------------------------- the run folder is the run's own
# Nothing a run folder holds leads outside it: a step folder, `checkpoints/`, `latest`, `config.json` or a stale
# temporary that is a symlink (to another run, or within this one) is neither read nor written through, and a save
# that meets one never deletes what it points to.



def _snapshot(folder):
    """Every file under `folder` with its bytes (symlinks inside are listed, not followed)."""
    return {str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "/")
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_saving_a_step_whose_folder_is_a_symlink_replaces_the_link_and_leaves_its_target_alone(tmp_path, relative):
    run = tmp_path / "run"
    _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    before = _snapshot(tmp_path / "other")
    link = run / "checkpoints" / "step-000002"
    link.symlink_to(f"../../other/checkpoints/{foreign.name}" if relative else foreign, target_is_directory=True)
    written, saved = _save(run, 2, seed=2)  # a resumed run saving a step again
    assert _snapshot(tmp_path / "other") == before, "a save deleted or changed another run's checkpoint"
    assert not written.is_symlink() and written.is_dir() and written.parent == run / "checkpoints"
    model, optimizer = _model_and_optimizer(3)
    assert checkpoint.load(run, model, optimizer, None)["step"] == 2
    assert torch.equal(model.weight, saved.weight)


def test_retention_never_deletes_through_a_symlinked_step_folder(tmp_path):
    run = tmp_path / "run"
    foreign, _ = _foreign_checkpoint(tmp_path)
    before = _snapshot(tmp_path / "other")
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-000000").symlink_to(foreign, target_is_directory=True)  # the oldest: retention's pick
    for step in (1, 2, 3):
        _save(run, step, seed=step, keep=2)
    assert _snapshot(tmp_path / "other") == before, "retention deleted another run's checkpoint through a symlink"


def test_a_stale_temporary_that_is_a_symlink_is_cleared_without_touching_its_target(tmp_path):
    run = tmp_path / "run"
    foreign, _ = _foreign_checkpoint(tmp_path)
    before = _snapshot(tmp_path / "other")
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / ".step-000007-abc").symlink_to(foreign, target_is_directory=True)
    _save(run, 1, seed=1)
    assert _snapshot(tmp_path / "other") == before, "clearing a temporary deleted another run's checkpoint"


def test_a_checkpoints_folder_that_is_a_symlink_is_refused_on_load_and_on_save(tmp_path):
    run = tmp_path / "run"
    _foreign_checkpoint(tmp_path)
    before = _snapshot(tmp_path / "other")
    run.mkdir()
    (run / "checkpoints").symlink_to(tmp_path / "other" / "checkpoints", target_is_directory=True)
    _refused(run, "checkpoints")
    model, optimizer = _model_and_optimizer(3)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoints"):
        checkpoint.save(run, 2, model, optimizer, None, {"step": 2})
    assert _snapshot(tmp_path / "other") == before, "a save wrote into another run's checkpoints"


@pytest.mark.parametrize("pointer, place", [
    ("step-000001/../../../other/checkpoints/step-000001", None),  # starts with a step name, then leaves
    (".step-000002-abc", ".step-000002-abc"),  # a killed save's temporary: not a step folder
    ("step-2", "step-2"),  # not the step-name pattern
    ("sub/step-000002", "sub/step-000002"),  # below the checkpoints folder
    ("step-000002/", None),  # a trailing slash
    ("step-000002\x00", None),  # a NUL byte
    ("~/step-000002", None),
])
def test_latest_names_only_a_step_folder_of_the_run(tmp_path, pointer, place):
    run = tmp_path / "run"
    _, own = _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    if place is not None:  # a complete checkpoint of another run where the pointer leads
        target = run / "checkpoints" / place
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(foreign, target)
    (run / "checkpoints" / "latest").write_text(pointer + "\n")
    model, optimizer = _model_and_optimizer(3)
    with _within(10), pytest.warns(RuntimeWarning, match="latest"):
        state = checkpoint.load(run, model, optimizer, None)
    assert state["step"] == 1 and torch.equal(model.weight, own.weight), f"latest={pointer!r} was followed"


def test_a_latest_pointer_that_is_a_symlink_is_not_followed(tmp_path):
    run = tmp_path / "run"
    _save(run, 1, seed=1)
    _, newest = _save(run, 2, seed=2)
    elsewhere = tmp_path / "pointer"
    elsewhere.write_text("step-000001\n")  # followed, it would resume the older step
    pointer = run / "checkpoints" / "latest"
    pointer.unlink()
    pointer.symlink_to(elsewhere)
    model, optimizer = _model_and_optimizer(3)
    with pytest.warns(RuntimeWarning, match="latest"):
        assert checkpoint.load(run, model, optimizer, None)["step"] == 2
    assert torch.equal(model.weight, newest.weight)


@pytest.mark.parametrize("target", ["relative-foreign", "own-step"])
def test_a_step_folder_symlinked_anywhere_is_skipped(tmp_path, target):
    run = tmp_path / "run"
    _, own = _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    (run / "checkpoints" / "step-000002").symlink_to(
        f"../../other/checkpoints/{foreign.name}" if target == "relative-foreign" else "step-000001",
        target_is_directory=True)
    (run / "checkpoints" / "latest").write_text("step-000002\n")
    model, optimizer = _model_and_optimizer(3)
    with pytest.warns(RuntimeWarning, match="step-000002"):
        assert checkpoint.load(run, model, optimizer, None)["step"] == 1
    assert torch.equal(model.weight, own.weight)


def test_a_run_config_json_that_is_a_symlink_to_another_runs_is_refused(tmp_path):
    run = tmp_path / "run"
    checkpoint.save_config(run, SAVED)
    _save(run, 1, seed=1)
    other = tmp_path / "other"
    checkpoint.save_config(other, SAVED)  # the same bytes: only where it lies is wrong
    (run / checkpoint.CONFIG_FILE).unlink()
    (run / checkpoint.CONFIG_FILE).symlink_to(other / checkpoint.CONFIG_FILE)
    _refused(run, "config.json")


def test_saving_the_config_never_writes_through_a_symlink(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    checkpoint.save_config(other, SAVED)
    before = (other / checkpoint.CONFIG_FILE).read_bytes()
    run.mkdir()
    (run / checkpoint.CONFIG_FILE).symlink_to(other / checkpoint.CONFIG_FILE)
    try:
        checkpoint.save_config(run, _with(SAVED, method="grpo"))
    except checkpoint.CheckpointError as refused:
        assert "config.json" in str(refused)
    assert (other / checkpoint.CONFIG_FILE).read_bytes() == before, "save_config wrote into another run's config"


def test_saving_never_writes_through_a_latest_pointer_that_is_a_symlink(tmp_path):
    run = tmp_path / "run"
    _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    before = _snapshot(tmp_path / "other")
    pointer = run / "checkpoints" / "latest"
    pointer.unlink()
    pointer.symlink_to(tmp_path / "other" / "checkpoints" / "latest")
    written, _ = _save(run, 2, seed=2)
    assert _snapshot(tmp_path / "other") == before, "a save rewrote another run's latest pointer"
    assert checkpoint.latest(run) == written


# ---------------------------------------------------------------- written after reading the code
# Saves wrote `latest.tmp` and `config.tmp` by name, then renamed them: a symlink planted there was written through.
# A config.json the parser reads (under a thousand levels) but a walk cannot was compared recursively.

@pytest.mark.parametrize("planted", ["checkpoints/latest.tmp", "config.tmp"])
def test_a_save_never_writes_through_a_planted_temporary(tmp_path, planted):
    run, other = tmp_path / "run", tmp_path / "other"
    checkpoint.save_config(other, SAVED)
    before = (other / checkpoint.CONFIG_FILE).read_bytes()
    checkpoint.save_config(run, SAVED)
    _save(run, 1, seed=1)
    (run / planted).symlink_to(other / checkpoint.CONFIG_FILE)
    checkpoint.save_config(run, SAVED)
    written, _ = _save(run, 2, seed=2)
    assert (other / checkpoint.CONFIG_FILE).read_bytes() == before, f"a save wrote through {planted}"
    assert checkpoint.latest(run) == written


@pytest.mark.parametrize("depth", [40, 900])
def test_a_config_json_the_parser_reads_but_nests_deep_is_refused_naming_the_limit(tmp_path, depth):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    (tmp_path / checkpoint.CONFIG_FILE).write_text(
        '{"method": "trace", "predictor": {"options": ' + '{"a": ' * depth + "{}" + "}" * depth + "}}")
    _refused(tmp_path, r"config.json.*deeper than the 32 levels")
