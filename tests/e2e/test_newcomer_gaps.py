"""Gaps a new user hit, each checked where it shows: `tracerl eval --out RUN --checkpoint` evaluates with the run's
saved config (and refuses a folder without one); the warm start's check names the split it reads; `tracerl config`
marks the fields that apply to the multi-hop world only; `report.md` says why a prompt-selecting method's training
success is not the policy's; the saved trees hold what docs/training.md says they hold."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import TINY_POLICY
from tracerl.cli import main
from tracerl.core.tree import Node, Segment
from tracerl.policy.embedded_config import EmbeddedConfig

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    """`tracerl argv...` in this process: (exit status, stdout, stderr)."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as stop:
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def only_the_tiny_policy(monkeypatch):
    """Any build or load of another embedded policy than the tests' tiny one fails at once: the defaults would
    build the 5-minute multi-hop policy, which is the bug a command reading the wrong config shows."""
    import tracerl.policy.embedded as embedded

    build, tiny = embedded.build_embedded, EmbeddedConfig.from_dict(TINY_POLICY)

    def guarded(config=EmbeddedConfig(), *args, **kwargs):
        assert config == tiny, f"built the embedded policy of another config than the run's ({config.key()})"
        return build(config, *args, **kwargs)

    monkeypatch.setattr(embedded, "build_embedded", guarded)


@pytest.fixture(scope="module")
def trained(tiny_overrides, tmp_path_factory):
    """One grpo step on the tiny policy with `--out`: a run folder holding its config.json, a checkpoint, trees."""
    out = tmp_path_factory.mktemp("newcomer") / "mine"
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    status = main(["train", "--config", str(ROOT / "configs" / "grpo.toml"), "--set", "run.num_steps=1",
                   "--out", str(out), *sets])
    assert status == 0
    return out


@pytest.mark.slow
def test_eval_with_out_reads_the_runs_saved_config(trained, capsys, only_the_tiny_policy):
    # README: tracerl eval --out runs/mine --checkpoint (no --config, no --set)
    status, text, err = run(capsys, "eval", "--out", trained, "--checkpoint")
    assert status == 0, err
    assert "held-out success at step 1" in text and "(6 questions x 2 samples)" in text, text
    # --set still applies on top of the saved config
    status, text, err = run(capsys, "eval", "--out", trained, "--checkpoint", "--set", "run.eval_samples=1")
    assert status == 0 and "(6 questions x 1 samples)" in text, (text, err)


@pytest.mark.slow
def test_eval_of_a_checkpoint_without_saved_config_names_the_fix(trained, tmp_path, capsys, only_the_tiny_policy):
    moved = tmp_path / "copied"
    shutil.copytree(trained, moved)
    (moved / "config.json").unlink()
    status, text, err = run(capsys, "eval", "--out", moved, "--checkpoint")
    assert status == 2 and text == "", (status, text, err)
    assert len(err.strip().splitlines()) == 1, f"one line, not a traceback: {err}"
    assert "holds no config.json" in err and f"to {moved / 'config.json'}" in err, err
    # the fix it names works
    step = next((moved / "checkpoints").glob("step-*"))
    shutil.copyfile(step / "config.json", moved / "config.json")
    status, text, err = run(capsys, "eval", "--out", moved, "--checkpoint")
    assert status == 0 and "held-out success at step 1" in text, err
    # a folder that is no run at all is told so, not sent to look for a checkpoint
    status, _, err = run(capsys, "eval", "--out", tmp_path / "typo", "--checkpoint")
    assert status == 2 and "neither a config.json nor checkpoints" in err, err


def test_warmstart_names_the_split_of_its_check(tiny_overrides, tmp_path, capsys):
    """A small build into an empty cache: the progress lines name the warm start's split and the check's, and the
    summary names the check's."""
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    small = ["--set", f"policy.cache_dir={tmp_path}", "--set", "policy.embedded.sft_steps=5",
             "--set", "policy.embedded.num_train_rows=10", "--set", "policy.embedded.num_eval_prompts=2",
             "--set", "policy.embedded.eval_samples_per_prompt=1"]
    status, text, err = run(capsys, "warmstart", *sets, *small)
    assert status == 0, err
    assert "10 expert traces on questions of the warmup split" in err, err
    assert re.search(r"held-out success on the test split \d+\.\d% \+- \d+\.\d% \(2 questions x 1 samples", err), err
    assert re.search(r"held-out success on the test split \d+\.\d% ± \d+\.\d% \(2 questions x 1\)", text), text


def test_config_marks_exactly_the_fields_the_multihop_world_reads(capsys):
    status, out, _ = run(capsys, "config")
    assert status == 0
    docs = dict(re.findall(r"^(policy\.embedded\.\w+)  .*\n    (.*)$", out, flags=re.M))
    marked = {key.rsplit(".", 1)[1] for key, doc in docs.items() if doc.startswith("(multihop only)")}

    read = set()

    class Spy:  # an EmbeddedConfig that records which fields the multi-hop world is built from, through any method
        def __getattr__(self, name):
            method = getattr(EmbeddedConfig, name, None)
            if callable(method):
                return method.__get__(self)
            read.add(name)
            return getattr(EmbeddedConfig(), name)

    EmbeddedConfig.make_domain(Spy())
    assert marked == read, f"marked but unread: {sorted(marked - read)}; read but unmarked: {sorted(read - marked)}"
    assert not any("(multihop only)" in line for line in out.splitlines() if not line.startswith("    ")), \
        "the mark is the doc's, printed under the key"


def test_config_with_a_config_shows_its_values_and_checks_them_without_training(tmp_path, capsys):
    """`tracerl config --config FILE` is the documented way to check a config: its values in place of the defaults,
    a bad value refused at load with the fix, and nothing trained or built."""
    preset = tmp_path / "mine.toml"
    preset.write_text("method = 'grpo'\n[policy.embedded]\nsft_steps = 1234\n[optim]\nlr = 5e-4\n")
    status, out, _ = run(capsys, "config", "--config", preset, "--set", "run.num_steps=7")
    assert status == 0
    for line in ("method  str = 'grpo'", "policy.embedded.sft_steps  int = 1234", "optim.lr  float = 0.0005",
                 "run.num_steps  int = 7"):
        assert f"\n{line}" in "\n" + out, f"{line!r} missing"
    status, _, err = run(capsys, "config", "--config", preset, "--set", "optim.lr=-1")
    assert status not in (0, None) and "optim.lr=-1.0 must be > 0" in str(status) + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"], "checking a config wrote something"


def _run_folder(path: Path, method: str) -> Path:
    """A run folder with training success falling and held-out success rising, as the new user saw."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"method": method, "data": {"domain": "multihop"}}))
    rows = [{"step": 0, "kind": "eval", "eval/success": 0.40, "eval/success_se": 0.03}]
    rows += [{"step": s, "kind": "train", "rollout/success_rate": r, "alloc/effective_ratio": 0.5}
             for s, r in ((1, 0.62), (2, 0.55), (3, 0.51))]
    rows += [{"step": 3, "kind": "eval", "eval/success": 0.46, "eval/success_se": 0.03}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("method, selects", [("pcl", True), ("trace", True), ("speed", True), ("grpo", False),
                                             ("treepo", False), ("trace-prefix-only", False)])
def test_report_says_why_a_selecting_methods_training_success_is_not_the_policys(tmp_path, method, selects):
    from tracerl.report.run_report import write_run_report

    report = write_run_report(_run_folder(tmp_path / method, method)).read_text()
    success = report.split("## Success", 1)[1].split("\n## ", 1)[0]
    assert "62.0% at step 1 -> 51.0% at step 3" in success
    said = "not over the training set" in success and "p = 0.5" in success
    assert said == selects, success
    if selects:
        assert f"`{method}`'s stage 1" in success


@pytest.mark.slow
def test_saved_trees_hold_the_fields_docs_training_md_lists(trained):
    from tracerl.io.files.runlog import read_trees

    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("## Saved trees", 1)[1].split("\n## ", 1)[0]
    tables = [re.findall(r"^\| (`[^|]+`) \|", t, flags=re.M) for t in section.split("| field | what |")]
    record_keys = {k.strip("`") for k in tables[0]}
    node_fields = {name.strip("` ") for cell in tables[1] for name in cell.split(",")}
    record = read_trees(trained)
    assert set(record) == record_keys
    assert node_fields == {f.name for f in dataclasses.fields(Node)}
    node = record["trees"][0]["nodes"][0]
    assert set(node) == node_fields and set(node["segment"]) == {f.name for f in dataclasses.fields(Segment)}
    assert all(f"`{f.name}`" in section for f in dataclasses.fields(Segment)), "every segment field is named"
    assert set(record["pool"][0]) == {"prompt_id", "p", "granted"}
    assert "read_trees" in section
