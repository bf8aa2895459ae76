"""studies/continue_preregistered.sh: the seeds not yet kept, taken by lanes (of one invocation or of several)
so that no run is trained twice, each seed kept in the design's archive as soon as it finishes; a deadline after
which no seed starts; a testbed already read is never trained again. The frozen tree is a commit from before the
studies left benchmarks/, so its stand-in keeps its trainer there."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import load_study_script
from test_run_records import LABELS, make_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "studies/continue_preregistered.sh"

# stands in for the frozen tree's preregistered.sh: for SEEDS "s-s", writes three finished runs of seed s and logs it
FAKE_TRAINER = """#!/usr/bin/env bash
set -euo pipefail
seed=${2%-*}
echo "$seed" >> runs/preregistered/$1/trained.txt
sleep "${SLEEP:-0}"
[ "${FAIL_SEED:-}" = "$seed" ] && { echo "seed $seed crashed" >&2; exit 1; }
python3 - "$1" "$seed" <<'PY'
import json, sys
from pathlib import Path
testbed, seed = sys.argv[1], int(sys.argv[2])
for label in ("grpo", "pcl", "trace"):
    run = Path("runs/preregistered") / testbed / f"{label}-seed{seed}"
    (run / "trees").mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps({"run": {"num_steps": 2}}))
    (run / "provenance.json").write_text(json.dumps({"weights_sha256": "ab" * 32, "source": "x"}))
    rows = [{"kind": "eval", "step": 0}, {"kind": "train", "step": 1, "rollout/cum_tokens": 10},
            {"kind": "train", "step": 2, "rollout/cum_tokens": 20}, {"kind": "eval", "step": 2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
PY
"""


def git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def trees(tmp_path):
    """A copy of this tree's two scripts (HERE) and a stand-in frozen tree (FROZEN, a git repository whose commit
    the copied script expects in place of the multihop testbeds' caeaa86)."""
    here, frozen = tmp_path / "here", tmp_path / "frozen"
    (here / "studies").mkdir(parents=True)
    (frozen / "benchmarks").mkdir(parents=True)
    (frozen / "benchmarks" / "preregistered.sh").write_text(FAKE_TRAINER)
    (frozen / "benchmarks" / "preregistered.sh").chmod(0o755)
    git(frozen, "init", "-q")
    git(frozen, "add", "-A")
    git(frozen, "commit", "-qm", "frozen")
    head = git(frozen, "rev-parse", "HEAD")
    shutil.copy2(ROOT / "studies" / "run_records.py", here / "studies" / "run_records.py")
    script = (ROOT / SCRIPT).read_text()
    assert script.count("commit=caeaa86") == 1
    (here / SCRIPT).write_text(script.replace("commit=caeaa86", f"commit={head[:7]}"))
    return here, frozen


def run(here: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TRACERL_CACHE": str(here.parent / "cache"), **extra_env}
    return subprocess.run(["bash", str(here / SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def keep_seeds(here: Path, table: str, seeds) -> Path:
    """The archive of `table` holding finished runs of `seeds`, as if kept already; returns the archive."""
    folder = here.parent / f"{table}-records"
    for seed in seeds:
        for label in LABELS:
            make_run(folder, label, seed)
    archive = here / "studies" / table / "runs.tar.xz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    records_module().pack(folder, archive)
    return archive


def unpacked(archive: Path) -> Path:
    """The kept runs of `archive`, unpacked beside it into a fresh folder."""
    folder = archive.parent.parent / f"{archive.parent.name}-unpacked"
    shutil.rmtree(folder, ignore_errors=True)
    records_module().unpack(archive, folder)
    return folder


def records_module():
    return load_study_script("run_records")


def test_a_dry_run_lists_the_pending_seeds(trees):
    here, frozen = trees
    keep_seeds(here, "preregistered-headroom", (0, 2, 3))
    done = run(here, "headroom", str(frozen), "3", "--dry-run")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("holds: ")[1].split(" (logs")[0].split()
    assert listed == ["1"] + [str(s) for s in range(4, 41)]
    assert "training now: none" in done.stdout
    assert not (frozen / "runs").exists()  # a dry run trains and restores nothing


def test_a_dry_run_names_the_seeds_a_lane_holds(trees):
    here, frozen = trees
    runs = frozen / "runs/preregistered/headroom"
    runs.mkdir(parents=True)
    (runs / ".seed-6.lock").touch()  # a lock file left by a lane that has finished: not held
    with open(runs / ".seed-5.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run(here, "headroom", str(frozen), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "training now: 5\n" in done.stdout


def keep_default_seeds(here: Path, count: int) -> Path:
    """The default design's archive with seeds 0..count-1, as if kept already; returns the archive."""
    return keep_seeds(here, "preregistered-default", range(count))


def test_every_pending_seed_is_trained_once_and_kept(trees):
    here, frozen = trees
    records = keep_default_seeds(here, 27)
    stopped = make_run(frozen / "runs/preregistered/default", "grpo", 28, done=1)  # a lane stopped part-way
    done = run(here, "default", str(frozen), "2")
    assert done.returncode == 0, done.stderr
    trained = (frozen / "runs/preregistered/default/trained.txt").read_text().split()
    assert sorted(trained, key=int) == ["27", "28", "29"]
    assert (frozen / "runs/preregistered/default/grpo-seed5/metrics.jsonl").exists()  # restored
    assert json.loads((unpacked(records) / "trace-seed29" / "config.json").read_text())["run"]["num_steps"] == 2
    assert [p.name.split(".")[0] for p in (frozen / "runs/preregistered/default/.stopped").iterdir()] == [
        "grpo-seed28"]  # set aside, not resumed
    assert not stopped.exists() or records_module().finished(stopped)
    again = run(here, "default", str(frozen), "2")
    assert again.returncode == 0 and "every planned seed" in again.stdout


def test_a_testbed_already_read_is_not_trained_again(trees):
    here, frozen = trees
    (here / "studies/preregistered-default").mkdir(parents=True)
    (here / "studies/preregistered-default/primary.md").write_text("read\n")
    done = run(here, "default", str(frozen))
    assert done.returncode == 1 and "has been read" in done.stderr
    assert "unknown design" in run(here, "other", str(frozen)).stderr
    assert "positive number" in run(here, "headroom", str(frozen), "0").stderr


def test_a_frozen_tree_at_another_commit_is_refused(trees):
    here, frozen = trees
    done = run(here, "funcall", str(frozen), "--dry-run")  # funcall trains from 9e8af0d
    assert done.returncode == 2 and "not 9e8af0d" in done.stderr, done.stderr
    (frozen / "later.txt").write_text("x")
    git(frozen, "add", "-A")
    git(frozen, "commit", "-qm", "later")
    assert "git worktree add" in run(here, "headroom", str(frozen), "--dry-run").stderr


def test_a_seed_that_fails_to_train_is_reported_and_its_lane_goes_on(trees):
    here, frozen = trees
    records = keep_default_seeds(here, 26)
    done = run(here, "default", str(frozen), "1", FAIL_SEED="27")
    assert done.returncode == 1
    assert "seed 27 failed to train" in done.stderr and "still pending: 27-27" in done.stdout
    assert (frozen / "runs/preregistered/default/trained.txt").read_text().split() == ["26", "27", "28", "29"]
    assert "seed 27 crashed" in (frozen / "runs/preregistered/default/logs/seed-27.log").read_text()
    assert {p.name for p in unpacked(records).iterdir() if p.name.endswith(("seed28", "seed29"))} == {
        f"{label}-seed{seed}" for seed in (28, 29) for label in LABELS}


def test_invocations_side_by_side_train_each_seed_once(trees):
    """Two invocations of two lanes each, started together (as when a second is started when cores free up): every
    pending seed trains exactly once, and every one is kept."""
    here, frozen = trees
    records = keep_default_seeds(here, 22)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TRACERL_CACHE": str(here.parent / "cache"), "SLEEP": "0.5"}
    both = [subprocess.Popen(["bash", str(here / SCRIPT), "default", str(frozen), "2"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in both:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    trained = (frozen / "runs/preregistered/default/trained.txt").read_text().split()
    assert sorted(trained, key=int) == [str(s) for s in range(22, 30)]
    assert records_module().pending(records, list(range(30)), list(LABELS)) == []


def test_no_seed_starts_after_the_deadline(trees):
    here, frozen = trees
    keep_default_seeds(here, 26)
    done = run(here, "default", str(frozen), "2", "--until", "1 minute ago")
    assert done.returncode == 0, done.stderr
    assert "starts no more seeds" in done.stdout and "still pending: 26-29" in done.stdout
    assert not (frozen / "runs/preregistered/default/trained.txt").exists()
    bad = run(here, "default", str(frozen), "--until", "teatime-ish")
    assert bad.returncode == 2 and "not a time" in bad.stderr
