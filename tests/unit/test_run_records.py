"""studies/run_records.py: a comparison's finished seeds kept as small records, put back, and what is left."""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from helpers import load_study_script

LABELS = ["grpo", "pcl", "trace"]


@pytest.fixture(scope="module")
def module():
    return load_study_script("run_records")


def make_run(folder: Path, label: str, seed: int, steps: int = 4, done: int = 4, weights: str = "ab" * 32,
             source: Path | None = None) -> Path:
    run = folder / f"{label}-seed{seed}"
    (run / "trees").mkdir(parents=True)
    (run / "checkpoints" / "step-000004").mkdir(parents=True)
    (run / "checkpoints" / "step-000004" / "model.pt").write_bytes(b"\0" * 64)
    (run / "config.json").write_text(json.dumps({"run": {"num_steps": steps}, "method": label}))
    (run / "provenance.json").write_text(json.dumps({"weights_sha256": weights, "source": str(source or "Qwen/x")}))
    for step in (1, 2):
        (run / "trees" / f"step-00000{step}.json.gz").write_bytes(gzip.compress(f'{{"step": {step}}}'.encode()))
    rows = [{"kind": "eval", "step": 0}]
    for step in range(1, done + 1):
        rows.append({"kind": "train", "step": step, "seed": seed, "rollout/cum_tokens": 1000 * step})
        if step % 2 == 0:
            rows.append({"kind": "eval", "step": step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_finished_seed_is_kept_without_checkpoints_or_later_trees(module, tmp_path):
    runs, records = tmp_path / "runs", tmp_path / "records"
    for label in LABELS:
        make_run(runs, label, 3)
    assert module.save(runs, records, LABELS) == [3]
    kept = records / "trace-seed3"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == [
        "config.json", "metrics.jsonl", "provenance.json", "saved_on.json", "trees/step-000001.json.gz"]
    assert json.loads((kept / "saved_on.json").read_text())["cpu_flags_sha256"]
    assert (kept / "metrics.jsonl").read_bytes() == (runs / "trace-seed3" / "metrics.jsonl").read_bytes()
    assert module.save(runs, records, LABELS) == []  # kept once
    shutil.rmtree(records / "pcl-seed3")
    with pytest.raises(FileExistsError, match="part of seed 3"):  # a seed is never kept half
        module.save(runs, records, LABELS)


def test_every_steps_rollout_records_are_kept_with_the_run(module, tmp_path):
    runs, records = tmp_path / "runs", tmp_path / "records"
    for label in LABELS:
        run = make_run(runs, label, 5)
        (run / "rollouts").mkdir()
        for step in range(1, 5):
            (run / "rollouts" / f"step-00000{step}.json").write_text(json.dumps({"step": step, "rollouts": {}}))
    assert module.save(runs, records, LABELS) == [5]
    kept = records / "trace-seed5"
    assert sorted(p.name for p in (kept / "rollouts").iterdir()) == [f"step-00000{s}.json" for s in range(1, 5)]
    assert not (kept / "trees" / "step-000002.json.gz").exists()
    restored = tmp_path / "back"
    module.restore(records, restored)
    assert (restored / "trace-seed5" / "rollouts" / "step-000004.json").read_text() == \
        (runs / "trace-seed5" / "rollouts" / "step-000004.json").read_text()


def test_a_seed_is_kept_whole_or_not_at_all(module, tmp_path):
    runs, records = tmp_path / "runs", tmp_path / "records"
    for label in LABELS:
        make_run(runs, label, 0)
    make_run(runs, "grpo", 1)
    make_run(runs, "pcl", 1)
    make_run(runs, "trace", 1, done=3)  # stopped part-way
    make_run(runs, "grpo", 2)  # the others not started
    assert module.save(runs, records, LABELS) == [0]
    assert not (records / "grpo-seed1").exists() and not (records / "grpo-seed2").exists()
    assert module.pending(records, list(range(4)), LABELS) == [1, 2, 3]


def test_a_run_short_of_its_configured_steps_is_not_finished(module, tmp_path):
    assert module.finished(make_run(tmp_path, "grpo", 0, steps=4, done=4))
    assert not module.finished(make_run(tmp_path, "pcl", 0, steps=6, done=4))
    assert not module.finished(tmp_path / "missing-seed0")
    broken = make_run(tmp_path, "trace", 0)
    (broken / "metrics.jsonl").write_text('{"kind": "train", "step": 4}\n{not json')
    assert not module.finished(broken)  # its last step was not evaluated


def test_a_run_under_a_token_budget_is_finished_when_it_spent_it(module, tmp_path):
    run = make_run(tmp_path, "grpo", 0, steps=80, done=4)  # 4,000 tokens by step 4
    config = json.loads((run / "config.json").read_text())
    config["run"]["total_token_budget"] = 4000
    (run / "config.json").write_text(json.dumps(config))
    assert module.finished(run)
    config["run"]["total_token_budget"] = 4001
    (run / "config.json").write_text(json.dumps(config))
    assert not module.finished(run)


def test_restore_puts_runs_back_and_refuses_to_overwrite_other_metrics(module, tmp_path):
    runs, records, again = tmp_path / "runs", tmp_path / "records", tmp_path / "again"
    for label in LABELS:
        make_run(runs, label, 5)
    build = tmp_path / "cache" / "0123abcd"
    (build / "model").mkdir(parents=True)
    (build / "model" / "model.safetensors").write_bytes(b"weights")
    module.save(runs, records, LABELS, policy=build)
    cache = tmp_path / "new-cache"
    assert module.restore(records, again, cache) == [f"{label}-seed5" for label in LABELS]
    assert (cache / "0123abcd" / "model" / "model.safetensors").read_bytes() == b"weights"
    assert (again / "pcl-seed5" / "metrics.jsonl").read_bytes() == (runs / "pcl-seed5" / "metrics.jsonl").read_bytes()
    assert module.restore(records, again, cache) == []  # the same runs are already there
    (again / "pcl-seed5" / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n')
    with pytest.raises(FileExistsError, match="other metrics"):
        module.restore(records, again)


def test_seed_lists_read_and_print_as_tracerl_compare_takes_them(module):
    assert module.parse_seeds("0-3,7,9-10") == [0, 1, 2, 3, 7, 9, 10]
    assert module.parse_seeds("40") == [40]  # a seed, not a count
    assert module.format_seeds([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert module.format_seeds([]) == ""
    assert module.format_seeds([40]) == "40-40"  # "40" would be read as a count, seeds 0-39


def test_the_command_line_names_a_wrong_build_folder(module, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(SystemExit):
        module.main(["save", str(runs), str(tmp_path / "records"), "--policy", str(tmp_path)])
    assert "not a build folder" in capsys.readouterr().err
    assert module.main(["pending", str(tmp_path / "records"), "--seeds", "0-2"]) == 0
    assert capsys.readouterr().out.strip() == "0-2"


def test_the_build_named_by_the_runs_provenance_is_kept_once(module, tmp_path):
    runs, records = tmp_path / "runs", tmp_path / "records"
    build = tmp_path / "cache" / "feedbeef"
    (build / "model").mkdir(parents=True)
    (build / "model" / "model.safetensors").write_bytes(b"weights")
    for seed in (0, 1):
        for label in LABELS:
            make_run(runs, label, seed, source=build)
    module.save(runs, records, LABELS)
    assert (records / "policy" / "feedbeef" / "model" / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in (records / "policy").iterdir()] == ["feedbeef"]


def test_no_build_keeps_the_runs_and_no_build(module, tmp_path, capsys):
    """A design whose unit is the build keeps one records per build, without the 2 MB build in each."""
    runs, records = tmp_path / "runs", tmp_path / "build5.tar.xz"
    build = tmp_path / "cache" / "feedbeef"
    (build / "model").mkdir(parents=True)
    for label in LABELS:
        make_run(runs, label, 0, source=build)
    assert module.main(["save", str(runs), str(records), "--no-build", "--methods", ",".join(LABELS)]) == 0
    assert "kept seeds 0" in capsys.readouterr().out
    with tarfile.open(records) as tar:
        names = tar.getnames()
    assert names and not any("/policy/" in n for n in names) and any("pcl-seed0/metrics.jsonl" in n for n in names)


def test_a_seed_from_other_weights_is_refused(module, tmp_path):
    runs, records = tmp_path / "runs", tmp_path / "records"
    for label in LABELS:
        make_run(runs, label, 0)
        make_run(runs, label, 1, weights="cd" * 32)  # trained on a machine that built its own weights
    with pytest.raises(ValueError, match="seed 1's runs start from weights.*kept build"):
        module.save(runs, records, LABELS)
    assert module.pending(records, [0, 1], LABELS) == [1]  # seed 0 was kept before the refusal


@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_saves_that_run_at_once_each_keep_every_seed_once(module, tmp_path, kind):
    """Lanes finish seeds at about the same moment and each calls `save`: the saves take turns, none fails, and each
    seed is kept whole, once (into an archive too: each save unpacks, adds and packs under the lock)."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    records = tmp_path / "records" if kind == "folder" else tmp_path / "table" / "runs.tar.xz"
    for seed in range(12):
        for label in LABELS:
            make_run(runs, label, seed)
    script = Path(__file__).resolve().parents[2] / "studies" / "run_records.py"
    saves = [subprocess.Popen([sys.executable, str(script), "save", str(runs), str(records)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outcomes = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in saves]
    assert all(code == 0 for code, _, _ in outcomes), outcomes
    kept = [line.split("kept seeds ")[1].split(" in ")[0] for _, out, _ in outcomes for line in out.splitlines()]
    assert sorted(s for s in kept if s != "none") == ["0-11"], kept  # one save kept them all, the others none
    if kind == "archive":
        module.unpack(records, tmp_path / "unpacked")
        records = tmp_path / "unpacked"
    assert sorted(p.name for p in records.iterdir() if not p.name.startswith(".")) == sorted(
        f"{label}-seed{seed}" for seed in range(12) for label in LABELS)
    for seed in range(12):
        assert (records / f"trace-seed{seed}" / "metrics.jsonl").read_bytes() == \
            (runs / f"trace-seed{seed}" / "metrics.jsonl").read_bytes()


def test_an_archive_packs_the_same_records_to_the_same_bytes(module, tmp_path):
    """Whatever order the files were written in and whatever their times, owners or the gzip headers of their trees,
    the same records give the same archive; unpacked, every file reads as it did (trees gzipped again)."""
    import os

    first, second = tmp_path / "first", tmp_path / "second"
    for seed in (0, 1):
        for label in LABELS:
            make_run(first, label, seed)
    for seed in (1, 0):  # the other order, other times
        for label in reversed(LABELS):
            run = make_run(second, label, seed)
            os.utime(run / "metrics.jsonl", (1e9, 1e9))
    for folder in (first, second):  # the same trees, gzipped with other headers
        for i, path in enumerate(sorted(folder.rglob("step-*.json.gz"))):
            path.write_bytes(gzip.compress(b'{"step": 1, "trees": []}', mtime=i if folder == first else 7 * i))
    (first / ".grpo-seed9.tmp").mkdir()  # a copy `save` left when it stopped: not records
    a, b = tmp_path / "a" / "runs.tar.xz", tmp_path / "b" / "runs.tar.xz"
    for folder, archive in ((first, a), (second, b)):
        archive.parent.mkdir()
        module.pack(folder, archive)
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert "runs/grpo-seed0/trees/step-000001.json" in [m.name for m in members]  # stored as JSON
    back = tmp_path / "back"
    module.unpack(a, back)
    tree = back / "grpo-seed0" / "trees" / "step-000001.json.gz"
    assert gzip.decompress(tree.read_bytes()) == b'{"step": 1, "trees": []}'
    assert (back / "pcl-seed1" / "metrics.jsonl").read_bytes() == (first / "pcl-seed1" / "metrics.jsonl").read_bytes()
    again = tmp_path / "again" / "runs.tar.xz"
    again.parent.mkdir()
    module.pack(back, again)
    assert again.read_bytes() == a.read_bytes()  # unpacked and packed again: the same bytes


def test_save_restore_and_pending_work_on_an_archive(module, tmp_path):
    runs, archive, again = tmp_path / "runs", tmp_path / "table" / "runs.tar.xz", tmp_path / "again"
    for label in LABELS:
        make_run(runs, label, 0)
        make_run(runs, label, 1, done=3 if label == "trace" else 4)  # seed 1 not finished
    assert module.save(runs, archive, LABELS) == [0]
    packed = archive.read_bytes()
    assert module.save(runs, archive, LABELS) == [] and archive.read_bytes() == packed  # nothing new: untouched
    assert module.pending(archive, [0, 1, 2], LABELS) == [1, 2]
    assert module.restore(archive, again) == [f"{label}-seed0" for label in LABELS]
    tree = again / "grpo-seed0" / "trees" / "step-000001.json.gz"
    assert gzip.decompress(tree.read_bytes()) == b'{"step": 1}'  # the first step's trees, gzipped again
    assert not (again / "grpo-seed0" / "checkpoints").exists() and not tree.with_name("step-000002.json.gz").exists()
    assert module.main(["pending", str(tmp_path / "missing" / "runs.tar.xz"), "--seeds", "0-1"]) == 0  # none kept
    bad = tmp_path / "bad" / "runs.tar.xz"  # a member that would land outside the folder is refused
    bad.parent.mkdir()
    with tarfile.open(bad, "w:xz") as tar:
        tar.add(runs / "grpo-seed0" / "config.json", arcname="runs/../../config.json")
    with pytest.raises(ValueError, match="not a records file"):
        module.unpack(bad, tmp_path / "out")
    assert not (tmp_path / "config.json").exists()


def test_cost_times_kept_seeds_by_their_logged_seconds(module, tmp_path):
    records = tmp_path / "records"
    for seed, step_seconds in ((0, 60.0), (1, 120.0), (2, 600.0)):
        for label in LABELS:
            run = make_run(records, label, seed)
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for row in rows:  # four steps of step_seconds and three evaluations of 20 s: per run 4x + 60 seconds
                row["sys/step_seconds" if row["kind"] == "train" else "eval/seconds"] = (
                    step_seconds if row["kind"] == "train" else 20.0)
                if row["kind"] == "eval" and row["step"] > 0:
                    row["eval/success"] = len(label) / 10  # differs by method; step 0's row is the same in all
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    make_run(records, "grpo", 3)  # a seed kept in part is not timed
    # per seed: 3 runs x (4 steps + 2 own evaluations of 20 s) + the shared step-0 evaluation once
    assert module.seed_minutes(records, LABELS) == [(3 * (4 * x + 40) + 20) / 60 for x in (60, 120, 600)]
    line = module.describe_cost(records, list(range(10)), LABELS, lanes=2)
    assert "3 seeds kept took 14-122 minutes" in line and "median 26" in line
    assert "the 7 pending, 4 round(s) of 2 lane(s), about 1.8 hours" in line  # 4 x 26.3 / 60
    assert "no seed kept yet" in module.describe_cost(tmp_path / "none", [0, 1], LABELS, lanes=1)
