"""`tracerl compare` on the tiny policy: every method runs at equal budget, the report and plots are written."""

import json

import pytest

from tracerl.io.runlog import read_metrics
from tracerl.train.compare import run_compare


def test_compare_writes_table_plots_and_shares_the_initial_evaluation(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "run.num_steps=2", "run.eval_every=1", "run.eval_prompts=3", "run.eval_samples=1",
                 "run.tensorboard=false"]
    report = run_compare(["grpo", "trace"], [0], tmp_path, overrides=overrides, say=lambda m: None)
    lines = [line for line in report.splitlines() if line.startswith("| grpo") or line.startswith("| trace")]
    assert len(lines) == 3 and "tracerl compare --methods grpo,trace --seeds 0" in report  # trace: 2 tables
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
    assert summary["regime"] and summary["regime"][0]["num_prompts"] == 4
    for name in ("compare.md", "accuracy_vs_tokens.png", "accuracy_vs_units.png", "informative_per_unit.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "accuracy_vs_tokens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
