"""Checkpoints verify their manifest on load, fall back to the previous intact one, keep the newest."""

from __future__ import annotations

import re

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


# ---------------------------------------------------------------- hostile checkpoint folders
# What a checkpoint folder on disk can hold that a save never writes: manifests that leave files out, list names
# that are not files of the folder (absolute paths, `..`, devices, FIFOs, symlinks), repeat a key or are huge; a
# `latest` pointer or step folder that leads outside the run; a run whose config.json is gone. Each must be refused
# quickly with a CheckpointError, never loaded and never hang.

import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

EMPTY_SHA = hashlib.sha256(b"").hexdigest()


class Blocked(BaseException):
    """Raised by `_within`; a BaseException so that no `except OSError` or `except Exception` can take it for a
    refusal."""


@contextlib.contextmanager
def _within(seconds: int):
    """Fail (instead of hanging the suite) when the body blocks for longer than `seconds`."""
    def expire(signum, frame):
        raise Blocked(f"blocked for more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _manifest(folder):
    return json.loads((folder / checkpoint.MANIFEST_FILE).read_text())


def _write_manifest(folder, manifest):
    (folder / checkpoint.MANIFEST_FILE).write_text(json.dumps(manifest))


def _plant(folder, name, text):
    """Write `name` into the checkpoint `folder` and list it in the manifest with its true hash and size."""
    (folder / name).write_text(text)
    manifest = _manifest(folder)
    manifest["files"][name] = _entry(folder / name)
    _write_manifest(folder, manifest)


def _entry(path):
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _refused(run_dir, match=None):
    """load raises CheckpointError (matching `match`) within 10 s and leaves the fresh model as it was."""
    model, optimizer = _model_and_optimizer(3)
    before = model.weight.detach().clone()
    with _within(10), pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(run_dir, model, optimizer, None)
    assert torch.equal(model.weight, before), "a refused checkpoint was loaded anyway"


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_file_the_manifest_leaves_out_is_still_verified(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    manifest = _manifest(folder)
    del manifest["files"]["model.pt"]
    _write_manifest(folder, manifest)
    _flip(folder / "model.pt")
    _refused(tmp_path, "model.pt")


def test_an_empty_manifest_verifies_nothing_and_is_refused(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    _write_manifest(folder, {"files": {}})
    _refused(tmp_path, "model.pt")


@pytest.mark.parametrize("name", ["/dev/zero", "../../../../../../dev/zero", "sub/model.pt", "..", "", ".",
                                  "manifest.json"])
def test_a_manifest_entry_that_is_not_a_file_of_the_folder_is_refused_without_opening_it(tmp_path, name):
    folder, _ = _save(tmp_path, 1, seed=1)
    manifest = _manifest(folder)
    manifest["files"][name] = {"sha256": EMPTY_SHA, "bytes": 0}
    _write_manifest(folder, manifest)
    _refused(tmp_path)


def test_a_file_listed_that_loading_never_reads_is_refused(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    _plant(folder, "notes.txt", "hello")
    _refused(tmp_path, "notes.txt")


def test_a_symlink_in_place_of_a_listed_file_is_refused_even_when_its_bytes_match(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    elsewhere = tmp_path / "elsewhere.pt"
    elsewhere.write_bytes((folder / "model.pt").read_bytes())
    (folder / "model.pt").unlink()
    (folder / "model.pt").symlink_to(elsewhere)
    _refused(tmp_path, "model.pt")


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_listed_file_that_is_a_fifo_device_or_folder_is_refused_without_blocking(tmp_path, kind):
    folder, _ = _save(tmp_path, 1, seed=1)
    target = folder / "model.pt"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    manifest = _manifest(folder)
    manifest["files"]["model.pt"] = {"sha256": EMPTY_SHA, "bytes": 0}  # what stat says of a FIFO or a device
    _write_manifest(folder, manifest)
    _refused(tmp_path, "model.pt")


def test_a_manifest_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    (folder / checkpoint.MANIFEST_FILE).unlink()
    os.mkfifo(folder / checkpoint.MANIFEST_FILE)
    _refused(tmp_path, "manifest.json")


def test_a_manifest_with_a_repeated_key_is_refused(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    text = (folder / checkpoint.MANIFEST_FILE).read_text()
    # two entries for model.pt: a reader taking the first and one taking the last would verify different claims
    text = text.replace('"model.pt":', '"model.pt": {"sha256": "%s", "bytes": 0}, "model.pt":' % EMPTY_SHA, 1)
    (folder / checkpoint.MANIFEST_FILE).write_text(text)
    _refused(tmp_path, "model.pt")


def test_a_huge_manifest_is_refused_before_it_is_parsed(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    text = (folder / checkpoint.MANIFEST_FILE).read_text()
    (folder / checkpoint.MANIFEST_FILE).write_text(text[:-1] + " " * (8 << 20) + "}")
    _refused(tmp_path, "manifest.json")


def test_a_truncated_file_is_refused(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    data = (folder / "model.pt").read_bytes()
    (folder / "model.pt").write_bytes(data[: len(data) // 2])
    _refused(tmp_path, "model.pt")


def test_an_unlisted_extra_file_is_never_opened(tmp_path):
    folder, saved = _save(tmp_path, 1, seed=1)
    os.mkfifo(folder / "stray")  # opening it would block
    model, optimizer = _model_and_optimizer(3)
    with _within(10):
        assert checkpoint.load(tmp_path, model, optimizer, None)["step"] == 1
    assert torch.equal(model.weight, saved.weight)


def _foreign_checkpoint(tmp_path):
    """A complete, self-consistent checkpoint of another run (seed 9)."""
    folder, model = _save(tmp_path / "other", 1, seed=9)
    return folder, model


def test_a_latest_pointer_leading_outside_the_run_is_not_followed(tmp_path):
    run = tmp_path / "run"
    _, own = _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    for pointer in (str(foreign), f"../../other/checkpoints/{foreign.name}"):
        (run / "checkpoints" / "latest").write_text(pointer + "\n")
        model, optimizer = _model_and_optimizer(3)
        with pytest.warns(RuntimeWarning, match="latest"):
            assert checkpoint.load(run, model, optimizer, None)["step"] == 1
        assert torch.equal(model.weight, own.weight), f"latest={pointer!r} loaded a checkpoint of another run"


def test_a_step_folder_that_is_a_symlink_is_skipped(tmp_path):
    run = tmp_path / "run"
    _, own = _save(run, 1, seed=1)
    foreign, _ = _foreign_checkpoint(tmp_path)
    (run / "checkpoints" / "step-000002").symlink_to(foreign, target_is_directory=True)
    (run / "checkpoints" / "latest").write_text("step-000002\n")
    model, optimizer = _model_and_optimizer(3)
    with pytest.warns(RuntimeWarning, match="step-000002"):
        assert checkpoint.load(run, model, optimizer, None)["step"] == 1
    assert torch.equal(model.weight, own.weight)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_latest_pointer_that_is_not_a_regular_file_is_skipped_not_taken_for_a_fresh_run(tmp_path, kind):
    _, own = _save(tmp_path, 1, seed=1)
    pointer = tmp_path / "checkpoints" / "latest"
    pointer.unlink()
    if kind == "fifo":
        os.mkfifo(pointer)
    elif kind == "device":
        pointer.symlink_to("/dev/zero")
    else:
        pointer.mkdir()
    model, optimizer = _model_and_optimizer(3)
    with _within(10), pytest.warns(RuntimeWarning, match="latest"):
        state = checkpoint.load(tmp_path, model, optimizer, None)
    assert state is not None and state["step"] == 1, "a run with a checkpoint was taken for a fresh one"
    assert torch.equal(model.weight, own.weight)


def test_a_resume_whose_run_config_is_gone_is_refused(tmp_path):
    """The checkpoint holds the config it was saved with; without the run's config.json nothing says the resume
    runs with that config (another method or learning rate would load silently)."""
    checkpoint.save_config(tmp_path, {"method": "trace", "optim": {"lr": 0.1}})
    _save(tmp_path, 1, seed=1)
    (tmp_path / checkpoint.CONFIG_FILE).unlink()
    _refused(tmp_path, "config.json")


# ---------------------------------------------------------------- the config is part of every checkpoint

SAVED = {"method": "trace", "run": {"num_steps": 12, "seed": 0}, "optim": {"lr": 0.1},
         "predictor": {"options": {"l2": 0.1}}}
RULES = {"may_change": ("run.num_steps",), "defaults": {"run": {"added_since": 1}}}


def _with(config, **changes):
    out = json.loads(json.dumps(config))
    for dotted, value in changes.items():
        node = out
        *path, last = dotted.split("__")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def _load_with(run_dir, config):
    model, optimizer = _model_and_optimizer(3)
    return checkpoint.load(run_dir, model, optimizer, None, config=config, **RULES)


def test_a_resume_with_another_config_is_refused_naming_the_keys(tmp_path):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    assert json.loads((tmp_path / "checkpoints" / "step-000001" / "config.json").read_text()) == SAVED
    with pytest.raises(checkpoint.CheckpointError, match=r"\['method', 'optim.lr'\].*only run.num_steps may change"):
        _load_with(tmp_path, _with(SAVED, method="grpo", optim__lr=0.2))
    with pytest.raises(checkpoint.CheckpointError, match=r"\['predictor.options.l2'\]"):
        _load_with(tmp_path, _with(SAVED, predictor__options__l2=0.5))
    assert _load_with(tmp_path, _with(SAVED, run__num_steps=40))["step"] == 1, "num_steps may change on a resume"
    # a key added since the save: the saved run had the default, so only the default resumes
    assert _load_with(tmp_path, _with(SAVED, run__added_since=1))["step"] == 1
    with pytest.raises(checkpoint.CheckpointError, match=r"\['run.added_since'\]"):
        _load_with(tmp_path, _with(SAVED, run__added_since=2))


def test_without_a_config_argument_the_runs_config_json_is_compared(tmp_path):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    checkpoint.save_config(tmp_path, _with(SAVED, optim__lr=0.3))
    with pytest.raises(checkpoint.CheckpointError, match=r"\['optim.lr'\]"):
        checkpoint.load(tmp_path, *_model_and_optimizer(3), None, **RULES)
    checkpoint.save_config(tmp_path, SAVED)
    assert checkpoint.load(tmp_path, *_model_and_optimizer(3), None, **RULES)["step"] == 1


@pytest.mark.parametrize("kind", ["fifo", "device", "repeated key", "nested"])
def test_a_hostile_run_config_json_is_refused_without_blocking(tmp_path, kind):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    run_config = tmp_path / checkpoint.CONFIG_FILE
    run_config.unlink()
    if kind == "fifo":
        os.mkfifo(run_config)
    elif kind == "device":
        run_config.symlink_to("/dev/zero")
    elif kind == "repeated key":
        run_config.write_text('{"method": "trace", "method": "grpo"}')
    else:
        run_config.write_text("[" * 100_000 + "]" * 100_000)
    _refused(tmp_path, "config.json")


def test_a_checkpoint_without_its_config_is_refused(tmp_path):
    checkpoint.save_config(tmp_path, SAVED)
    folder, _ = _save(tmp_path, 1, seed=1)
    (folder / "config.json").unlink()
    manifest = _manifest(folder)
    del manifest["files"]["config.json"]
    _write_manifest(folder, manifest)
    _refused(tmp_path, r"does not list \['config.json'\]")


@pytest.mark.parametrize("entry", [{"sha256": EMPTY_SHA.upper(), "bytes": 0}, {"sha256": EMPTY_SHA, "bytes": True},
                                   {"sha256": EMPTY_SHA, "bytes": -1}, {"sha256": EMPTY_SHA, "bytes": 1.5},
                                   {"sha256": EMPTY_SHA}, {"sha256": EMPTY_SHA, "bytes": 0, "mode": "x"}, None, []])
def test_a_malformed_manifest_entry_is_refused(tmp_path, entry):
    folder, _ = _save(tmp_path, 1, seed=1)
    manifest = _manifest(folder)
    manifest["files"]["model.pt"] = entry
    _write_manifest(folder, manifest)
    _refused(tmp_path, "model.pt")


@pytest.mark.parametrize("text", ["[]", "null", '{"files": []}', '{"files": {}, "extra": 1}', '{"files": {"a": NaN}}',
                                  "\xff"])
def test_a_malformed_manifest_is_refused(tmp_path, text):
    folder, _ = _save(tmp_path, 1, seed=1)
    (folder / checkpoint.MANIFEST_FILE).write_text(text, encoding="latin-1")
    _refused(tmp_path, "manifest.json")


def test_a_checkpoint_saved_without_a_predictor_is_refused_by_a_run_with_one(tmp_path):
    from tracerl.core.predictor import make_predictor

    _save(tmp_path, 1, seed=1)
    model, optimizer = _model_and_optimizer(3)
    with pytest.raises(checkpoint.CheckpointError, match="saved without a predictor"):
        checkpoint.load(tmp_path, model, optimizer, make_predictor("hashed_logistic"))


def test_config_changes_compares_leaves_by_value():
    nan = {"a": {"x": float("nan")}, "b": [1, 2]}
    assert checkpoint.config_changes(nan, json.loads(json.dumps(nan))) == []
    assert checkpoint.config_changes({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}) == ["a.y"]
    assert checkpoint.config_changes({"a": {"x": 1}}, {"a": 1}) == ["a", "a.x"]
    assert checkpoint.config_changes({"run": {"dir": "a"}}, {"run": {"dir": "b"}}, may_change=("run",)) == []
    assert checkpoint.config_changes({"run2": 1}, {"run2": 2}, may_change=("run",)) == ["run2"]


# ---------------------------------------------------------------- kinds, not only names and shapes

@pytest.mark.parametrize("saved_dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_checkpoint_of_another_dtype_is_refused_naming_the_key_and_the_fix(tmp_path, saved_dtype):
    model, optimizer = _model_and_optimizer(1)
    model.to(saved_dtype)
    checkpoint.save(tmp_path, 1, model, optimizer, None, {"step": 1})
    _refused(tmp_path, rf"'weight'.*{str(saved_dtype)}.*torch.float32.*(precision|dtype)")


def test_a_checkpoint_of_the_models_dtype_still_loads(tmp_path):
    model, optimizer = _model_and_optimizer(1)
    model.to(torch.float64)
    checkpoint.save(tmp_path, 1, model, optimizer, None, {"step": 1})
    fresh, fresh_optimizer = _model_and_optimizer(3)
    fresh.to(torch.float64)
    assert checkpoint.load(tmp_path, fresh, fresh_optimizer, None)["step"] == 1
    assert torch.equal(fresh.weight, model.weight)


def test_a_manifest_listing_many_unread_files_gets_a_short_message(tmp_path):
    folder, _ = _save(tmp_path, 1, seed=1)
    manifest = _manifest(folder)
    manifest["files"].update({f"x{i:05d}.pt": {"sha256": EMPTY_SHA, "bytes": 0} for i in range(5000)})
    _write_manifest(folder, manifest)
    model, optimizer = _model_and_optimizer(3)
    with _within(10), pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load(tmp_path, model, optimizer, None)
    assert len(str(caught.value)) < 1000 and "more" in str(caught.value), str(caught.value)[:300]


# ---------------------------------------------------------------- a resume needs the run's config

@pytest.mark.parametrize("text", ["{}", "[]", "null", '"trace"', "1"])
def test_a_run_config_json_that_is_not_a_config_is_refused(tmp_path, text):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    (tmp_path / checkpoint.CONFIG_FILE).write_text(text)
    _refused(tmp_path, "config.json")


def test_many_differing_keys_are_named_a_few_then_counted(tmp_path):
    many = {"method": "trace", "run": {"seed": 0}, **{f"section{i}": {"x": i} for i in range(40)}}
    checkpoint.save_config(tmp_path, many)
    _save(tmp_path, 1, seed=1)
    changed = _with(many, method="grpo", **{f"section{i}__x": -1 for i in range(40)})
    with pytest.raises(checkpoint.CheckpointError) as caught:
        _load_with(tmp_path, changed)
    message = str(caught.value)
    named = sum(f"section{i}.x" in message for i in range(40))
    assert "method" in message and named <= 10 and re.search(r"\b3[0-9] more", message), message
    assert len(message) < 1000, message


def test_a_checkpoint_whose_own_config_is_not_a_table_is_refused(tmp_path):
    checkpoint.save_config(tmp_path, SAVED)
    folder, _ = _save(tmp_path, 1, seed=1)
    _plant(folder, "config.json", "[]")
    _refused(tmp_path, "config.json")


@pytest.mark.parametrize("where", ["run", "checkpoint"])
def test_a_config_json_nested_deep_is_refused_without_a_recursion_error(tmp_path, where):
    checkpoint.save_config(tmp_path, SAVED)
    folder, _ = _save(tmp_path, 1, seed=1)
    text = ('{"method": "trace", "run": {"num_steps": 12, "seed": 0}, "optim": {"lr": 0.1}, "predictor": {"options": '
            + '{"a": ' * 3000 + "{}" + "}" * 3000 + "}}")
    if where == "checkpoint":
        _plant(folder, "config.json", text)
    else:
        (tmp_path / checkpoint.CONFIG_FILE).write_text(text)
    _refused(tmp_path, "config.json")


def test_a_run_config_json_that_is_not_utf8_names_the_byte(tmp_path):
    checkpoint.save_config(tmp_path, SAVED)
    _save(tmp_path, 1, seed=1)
    data = json.dumps(SAVED).encode()
    offset = data.index(b"trace")
    (tmp_path / checkpoint.CONFIG_FILE).write_bytes(data[:offset] + b"\xff" + data[offset:])
    _refused(tmp_path, rf"config.json.*byte {offset}.*save it as UTF-8")
