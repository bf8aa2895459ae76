"""`tracerl compare` on the tiny policy: every method runs at equal budget, the report and plots are written."""

import json

import pytest

from tracerl.io.files.runlog import read_metrics
from tracerl.io.files.runlog import RunLog, run_lock
from tracerl.train.compare import _train_one, compare_status, format_seeds, parse_seeds, run_compare
from tracerl.train.config import load_config


def test_compare_writes_table_plots_and_shares_the_initial_evaluation(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "run.num_steps=2", "run.eval_every=1", "run.eval_prompts=3", "run.eval_samples=1",
                 "run.tensorboard=false"]
    report = run_compare(["grpo", "trace"], [0], tmp_path, overrides=overrides, say=lambda m: None)
    lines = [line for line in report.splitlines() if line.startswith("| grpo") or line.startswith("| trace")]
    assert len(lines) == 4 and "tracerl compare --methods grpo,trace --seeds 0-0 " in report  # trace: 3 tables
    summary = json.loads((tmp_path / "compare.json").read_text())
    budget = 4 * 4  # allocation.num_prompts x rollouts_per_prompt in tiny_overrides
    for method in ("grpo", "trace"):
        assert summary["methods"][method]["units"] <= 2 * budget
        evals = [r for r in read_metrics(tmp_path / f"{method}-seed0") if r["kind"] == "eval"]
        assert [r["step"] for r in evals] == [0, 1, 2]
    first = [[r for r in read_metrics(tmp_path / f"{m}-seed0") if r["kind"] == "eval"][0] for m in ("grpo", "trace")]
    assert first[0]["eval/per_prompt"] == first[1]["eval/per_prompt"]
    assert summary["methods"]["grpo"]["share_of_baseline_tokens"] <= 1 + 1e-9  # grpo reaches its own final success
    assert summary["methods"]["trace"]["informative_rollouts_per_budget"] is not None  # logged by every step
    signal = summary["methods"]["trace"]["signal_vs_baseline"]  # one seed: a reading, no interval
    assert signal["informative_sampled_tokens_per_token"]["mean"] is not None
    assert signal["tokens_per_unit_ratio"]["lo"] is None
    assert summary["regime"] and summary["regime"][0]["num_prompts"] == 4
    for name in ("compare.md", "accuracy_vs_tokens.png", "accuracy_vs_units.png", "informative_per_unit.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "accuracy_vs_tokens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = [json.loads((tmp_path / f"{m}-seed0" / "provenance.json").read_text()) for m in ("grpo", "trace")]
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"] and records[0]["torch"]
    assert f"every run started from sha256 {records[0]['weights_sha256'][:16]}" in report
    assert summary["methods"]["trace"]["informative_units_per_unit"] is not None  # the priced measure, every step


WALL_CLOCK = ("seconds", "overhead_frac")  # metrics that time the machine, not the run


def test_parallel_compare_trains_the_same_runs_as_the_sequential_one(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "run.num_steps=2", "run.eval_every=1", "run.eval_prompts=3", "run.eval_samples=1",
                 "run.tensorboard=false"]
    run_compare(["grpo", "trace"], [0], tmp_path / "one", overrides=overrides, say=lambda m: None)
    said = []
    run_compare(["grpo", "trace"], [0], tmp_path / "two", overrides=overrides, say=said.append, jobs=2)
    assert "compare: 2 runs, 2 at a time" in said
    for method in ("grpo", "trace"):
        rows = [[{k: v for k, v in r.items() if not k.endswith(WALL_CLOCK)}
                 for r in read_metrics(tmp_path / folder / f"{method}-seed0") if r["kind"] in ("eval", "train")]
                for folder in ("one", "two")]
        assert rows[0] == rows[1], method  # same evaluations, losses, grad norms, budgets
        assert any("train/pg_loss" in r for r in rows[0]) and any("eval/per_prompt" in r for r in rows[0])
    with pytest.raises(ValueError, match="--jobs 0"):
        run_compare(["grpo"], [0], tmp_path / "three", overrides=overrides, jobs=0)


@pytest.mark.parametrize("seeds", [[0], [3], [0, 3], [2, 3, 4], [0, 1, 2, 3, 4]])
def test_the_reports_seed_list_reads_back_as_the_same_seeds(seeds):
    """The report's command must rerun the same seeds: a lone "0" would be a count of none, a lone "3" seeds 0-2."""
    assert parse_seeds(format_seeds(seeds)) == seeds


def test_provenance_is_recorded_before_the_first_step_only(tiny_overrides, tmp_path):
    """A run with metrics but no record started before records were kept: hashing it now would name whatever
    weights it holds, not the ones it started from, so it stays without one."""
    from pathlib import Path

    from tracerl.train.config import load_config
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import record_provenance

    policy = load_policy(load_config(None, tiny_overrides))
    record_provenance(tmp_path / "fresh", policy.model, policy.source)
    record = json.loads((tmp_path / "fresh" / "provenance.json").read_text())
    build = json.loads((Path(record["source"]) / "metrics.json").read_text())
    assert record["weights_sha256"] == build["build/weights_sha256"], "the run names other weights than its build"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.jsonl").write_text("")
    record_provenance(tmp_path / "old", policy.model, policy.source)
    assert not (tmp_path / "old" / "provenance.json").exists()


def test_status_counts_complete_running_and_waiting_runs_and_estimates_the_rest(tmp_path):
    """Run folders written by hand (nothing trains): grpo seeds 0-1 complete at 100 s of steps and 500 s of
    evaluations each, seed 2 half done, seeds 3 and 5 not begun; trace seed 0 complete, the rest not begun."""
    def write(label, seed, steps, num_steps=4):
        log = RunLog(tmp_path / f"{label}-seed{seed}")
        log.write("eval", 0, {"eval/seconds": 100.0})
        for step in range(1, steps + 1):
            log.write("train", step, {"sys/step_seconds": 25.0})
            if step % 2 == 0:
                log.write("eval", step, {"eval/seconds": 200.0})

    for seed in (0, 1):
        write("grpo", seed, 4)
    write("grpo", 2, 2)
    write("trace", 0, 4)
    text = compare_status("grpo,trace", [0, 1, 2, 3, 5], tmp_path, overrides=["run.num_steps=4"], jobs=2)
    assert "| grpo | 2 of 5 | 2 (step 2) | 3, 5 |" in text
    assert "| trace | 1 of 5 | - | 1-3, 5 |" in text
    # left: half of grpo seed 2, grpo 3 and 5, trace 1, 2, 3 and 5 = 6.5 runs of 600 s, 2 at a time
    assert text.startswith("3 of 10 runs complete; about 0.5 h left at 2 run(s) at a time (median complete run "
                           "10.0 min")
    assert compare_status("grpo", [3, 5], tmp_path, overrides=["run.num_steps=4"]).startswith(
        "0 of 2 runs complete; no complete run yet to estimate the time left from.")


def test_status_under_a_token_budget_counts_a_run_done_at_the_budget_whatever_its_steps(tmp_path):
    def write(label, steps, tokens_per_step):
        log = RunLog(tmp_path / f"{label}-seed0")
        log.write("eval", 0, {"eval/seconds": 10.0})
        for step in range(1, steps + 1):
            log.write("train", step, {"sys/step_seconds": 5.0, "rollout/cum_tokens": tokens_per_step * step})

    write("grpo", 3, 1000)  # 3,000 tokens: done
    write("trace", 4, 500)  # 2,000 of 3,000 tokens after 4 of 100 steps: two thirds done
    text = compare_status("grpo,trace", [0], tmp_path, overrides=["run.num_steps=100", "run.total_token_budget=3000"])
    assert "| grpo | 1 of 1 |" in text and "| trace | 0 of 1 | 0 (step 4) |" in text
    assert "about 0.0 h left" in text  # a third of a 25 s run


def test_a_run_another_process_trains_is_skipped_and_a_second_train_is_refused(tiny_overrides, tmp_path, capsys):
    """The lock is held here as another invocation would hold it: compare trains the other entry and leaves the
    locked run untouched; `tracerl train --resume` on it exits with the holder named."""
    from tracerl.cli import main

    overrides = [*tiny_overrides, "run.num_steps=1", "run.eval_prompts=3", "run.eval_samples=1",
                 "run.tensorboard=false"]
    messages = []
    with run_lock(tmp_path / "grpo-seed0"):
        report = run_compare(["grpo", "trace"], [0], tmp_path, overrides=overrides, say=messages.append)
        assert report.startswith("no report yet: grpo-seed0 is being trained by another process")
        assert any(m.startswith("  skipped:") and "grpo-seed0 is being trained by another process" in m
                   for m in messages)
        assert not (tmp_path / "grpo-seed0" / "metrics.jsonl").exists()
        assert [r["step"] for r in read_metrics(tmp_path / "trace-seed0") if r["kind"] == "train"] == [1]
        args = (["train", "--out", str(tmp_path / "grpo-seed0"), "--resume"]
                + [a for o in overrides for a in ("--set", o)])
        assert main(args) == 2
        assert "is being trained by another process" in capsys.readouterr().err
        # a worker of --jobs N says why it skipped instead of failing the comparison
        config = load_config(None, [*overrides, "method=grpo", f"run.out_dir={tmp_path / 'grpo-seed0'}"])
        assert "grpo-seed0 is being trained by another process" in _train_one(config)
