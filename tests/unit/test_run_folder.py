"""A run folder is the run's own: its metrics, lock and trees are never read or written through a symlink that
leads elsewhere (another run's file, a file of the user's), so a planted link cannot make one run truncate,
append to or report another's records. The checkpoints' side of this is in tests/torch/test_checkpoint_integrity.py."""

import json
import os

import pytest

from tracerl.io.files.runlog import LOCK_FILE, METRICS_FILE, TREES_DIR, RunLog, finished_run, read_metrics, read_trees
from tracerl.io.files.runlog import run_lock, write_trees

OTHER_ROWS = [{"step": 0, "kind": "eval"}, {"step": 1, "kind": "train", "rollout/cum_tokens": 10},
              {"step": 1, "kind": "eval"}, {"step": 2, "kind": "train", "rollout/cum_tokens": 20},
              {"step": 2, "kind": "eval"}]


def _other_run(tmp_path):
    """A finished run of 2 steps beside the one under attack; returns its folder."""
    other = tmp_path / "other"
    other.mkdir()
    (other / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in OTHER_ROWS))
    (other / "config.json").write_text(json.dumps({"run": {"num_steps": 2, "total_token_budget": 0}}))
    (other / LOCK_FILE).write_text("not a pid: another run's file")
    (other / TREES_DIR).mkdir()
    return other


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else "/" for p in sorted(folder.rglob("*"))}


def _run_linking(tmp_path, name, target):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / name).symlink_to(target)
    return run


def _never_through(tmp_path, name, act, words=()):
    """Run `act(run)` in a run folder whose `name` is a symlink into another run: it may refuse (a ValueError naming
    `name` and `words`), but the other run must be left as it was."""
    other = _other_run(tmp_path)
    before = _snapshot(other)
    run = _run_linking(tmp_path, name, other / name)
    try:
        act(run)
    except ValueError as refused:
        assert name in str(refused) and all(w in str(refused) for w in words)
    return _snapshot(other) == before


def _append(run):
    log = RunLog(run)
    log.write("train", 3, {"rollout/cum_tokens": 30})
    log.close()


def _truncate(run):
    log = RunLog(run)
    log.truncate_after(0)
    log.close()


def _lock(run):
    with run_lock(run):
        pass


def test_metrics_are_never_appended_through_a_symlink(tmp_path):
    assert _never_through(tmp_path, METRICS_FILE, _append, ["symlink"]), \
        "a run appended its metrics to another run's file"


def test_a_resume_never_truncates_metrics_through_a_symlink(tmp_path):
    assert _never_through(tmp_path, METRICS_FILE, _truncate), "a resume truncated another run's metrics"


def test_the_lock_never_truncates_a_file_a_symlink_leads_to(tmp_path):
    assert _never_through(tmp_path, LOCK_FILE, _lock), "taking the lock overwrote the file its symlink leads to"


def test_trees_are_never_written_into_a_folder_a_symlink_leads_to(tmp_path):
    assert _never_through(tmp_path, TREES_DIR, lambda run: write_trees(run, 1, {"step": 1, "method": "grpo",
                                                                                 "pool": [], "trees": []})), \
        "a run wrote its trees into another run's folder"


def test_a_metrics_file_that_is_a_symlink_is_not_read_as_the_runs(tmp_path):
    other = _other_run(tmp_path)
    run = _run_linking(tmp_path, METRICS_FILE, other / METRICS_FILE)
    (run / "config.json").write_text(json.dumps({"run": {"num_steps": 2, "total_token_budget": 0}}))
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}.*symlink"):
        read_metrics(run)
    assert not finished_run(run), "another run's metrics made this run look finished"


def test_a_config_that_is_a_symlink_does_not_make_a_run_finished(tmp_path):
    other = _other_run(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in OTHER_ROWS))
    (run / "config.json").symlink_to(other / "config.json")
    assert not finished_run(run), "another run's config made this run look finished"


def test_a_trees_record_that_is_a_symlink_is_not_read_as_the_runs(tmp_path):
    other = _other_run(tmp_path)
    write_trees(other, 1, {"step": 1, "method": "grpo", "pool": [], "trees": []})
    run = tmp_path / "run"
    (run / TREES_DIR).mkdir(parents=True)
    for path in (other / TREES_DIR).iterdir():
        os.symlink(path, run / TREES_DIR / path.name)
    with pytest.raises(ValueError, match="symlink"):
        read_trees(run, 1)


def test_a_run_folder_reached_through_a_symlink_is_still_the_run(tmp_path):
    """The run folder itself may be a link (a comparison's runs gathered under one name): only what it holds must not
    lead out of it."""
    other = _other_run(tmp_path)
    (tmp_path / "alias").symlink_to(other, target_is_directory=True)
    assert read_metrics(tmp_path / "alias") == OTHER_ROWS
    assert finished_run(tmp_path / "alias") is True


def test_a_metrics_file_that_is_not_utf8_names_the_byte(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    head = "".join(json.dumps(r) + "\n" for r in OTHER_ROWS[:3]).encode()
    (run / METRICS_FILE).write_bytes(head + b'{"step": 2, "kind": "tr\xe9in"}\n' + b'{"step": 2, "kind": "eval"}\n')
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}.*byte {len(head) + 23}.*save it as UTF-8"):
        read_metrics(run)


# ---------------------------------------------------------------- written after reading the code: planted temporaries
# Writers used to write `<name>.tmp` by name and rename it into place: a symlink planted under that name was written
# through. Every atomic write now makes a fresh temporary exclusively (tracerl.io.files.run_folder.replacing).

@pytest.mark.parametrize("planted", ["metrics.tmp", "config.tmp", f".{METRICS_FILE}.tmp"])
def test_a_planted_temporary_symlink_is_never_written_through(tmp_path, planted):
    other = _other_run(tmp_path)
    before = _snapshot(other)
    run = tmp_path / "run"
    run.mkdir()
    (run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in OTHER_ROWS))
    (run / planted).symlink_to(other / METRICS_FILE)
    log = RunLog(run)
    log.truncate_after(1)
    log.close()
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 1]
    assert _snapshot(other) == before, "a truncation wrote through a planted temporary"


def test_trees_never_write_through_a_planted_temporary(tmp_path):
    other = _other_run(tmp_path)
    before = _snapshot(other)
    run = tmp_path / "run"
    (run / TREES_DIR).mkdir(parents=True)
    (run / TREES_DIR / "step-000001.json.tmp").symlink_to(other / METRICS_FILE)
    write_trees(run, 1, {"step": 1, "method": "grpo", "pool": [], "trees": []})
    assert read_trees(run, 1)["method"] == "grpo"
    assert _snapshot(other) == before


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", "x\x00"])
def test_run_path_takes_plain_names_only(tmp_path, name):
    from tracerl.io.files.run_folder import OutsideRun, run_path

    with pytest.raises(OutsideRun):
        run_path(tmp_path, name)


def test_a_run_folder_holding_a_symlinked_provenance_or_report_is_refused(tmp_path):
    from tracerl.io.files.run_folder import OutsideRun

    other = _other_run(tmp_path)
    before = _snapshot(other)
    run = _run_linking(tmp_path, "provenance.json", other / METRICS_FILE)
    from tracerl.report.provenance import read_provenance

    with pytest.raises(OutsideRun, match="provenance.json"):
        read_provenance(run)
    assert _snapshot(other) == before
