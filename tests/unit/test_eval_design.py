"""studies/eval_design.py: questions per evaluation against seeds, from a pilot's spread and costs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from helpers import load_study_script


@pytest.fixture(scope="module")
def eval_design():
    return load_study_script("eval_design")


def _write_run(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_copied_evaluation_counts_once(eval_design, tmp_path):
    start = {"step": 0, "kind": "eval", "eval/seconds": 70.0, "eval/success": 0.3}
    _write_run(tmp_path / "grpo-seed0", [start, {"step": 1, "kind": "step", "sys/step_seconds": 10.0},
                                         {"step": 1, "kind": "eval", "eval/seconds": 60.0, "eval/success": 0.35}])
    _write_run(tmp_path / "trace-seed0", [start, {"step": 1, "kind": "step", "sys/step_seconds": 12.0},
                                          {"step": 1, "kind": "eval", "eval/seconds": 65.0, "eval/success": 0.36}])
    (cost,) = eval_design.seed_costs(tmp_path, ["grpo", "trace"], [0])
    assert cost.train_seconds == pytest.approx(22.0)
    assert cost.eval_seconds == pytest.approx(70.0 + 60.0 + 65.0)  # the shared start once, each final evaluation


def test_a_missing_run_names_the_folder(eval_design, tmp_path):
    with pytest.raises(SystemExit, match="grpo-seed3"):
        eval_design.seed_costs(tmp_path, ["grpo"], [3])


def test_chi2_bounds_match_the_tables(eval_design):
    lo, hi = eval_design.chi2_bounds(6)  # 5 degrees of freedom: chi2 quantiles 1.610 (10%) and 9.236 (90%)
    assert lo == pytest.approx(5 / 9.236, rel=0.01)
    assert hi == pytest.approx(5 / 1.610, rel=0.01)


def test_fewer_questions_win_when_training_dominates_the_spread(eval_design):
    cost = eval_design.SeedCost(train_seconds=400.0, eval_seconds=400.0)
    rows = {r.questions: r for r in eval_design.design(var_train=9.0, sd_q=18.0, cost=cost, n0=1024,
                                                        questions=[128, 256, 1024], effect=1.0, target=0.8,
                                                        alpha=0.05, planned_seeds=60)}
    assert rows[256].sd_seed == pytest.approx(math.sqrt(9.0 + 18.0 ** 2 / 256))
    assert rows[256].cost_per_seed == pytest.approx(400.0 + 100.0)
    assert rows[256].budget_seeds == int(60 * 800 // 500)
    assert rows[256].total_cost < rows[1024].total_cost  # cheaper in all for the same power
    assert rows[256].budget_power > rows[1024].budget_power  # more power for the same compute


def test_more_questions_win_when_the_evaluation_dominates(eval_design):
    cost = eval_design.SeedCost(train_seconds=400.0, eval_seconds=40.0)
    rows = {r.questions: r for r in eval_design.design(var_train=0.1, sd_q=18.0, cost=cost, n0=1024,
                                                        questions=[64, 1024], effect=1.0, target=0.8,
                                                        alpha=0.05, planned_seeds=20)}
    assert rows[1024].total_cost < rows[64].total_cost


def test_seeds_sharing_their_questions_are_refused(eval_design, tmp_path, monkeypatch):
    """Per-seed differences spread less than question sampling alone would make them: the model does not apply."""
    per_seed = [0.010, 0.012, 0.008, 0.011]  # sd 0.17 points, against 18 points per question over 256 questions
    summary = {"baseline": "grpo", "seeds": [0, 1, 2, 3],
               "methods": {"grpo": {}, "trace": {"diff_at_equal_tokens": {"per_seed": per_seed}}},
               "resolution": {"num_questions": 256, "sd_paired_per_question": 0.18}}
    (tmp_path / "compare.json").write_text(json.dumps(summary))
    monkeypatch.setattr(sys, "argv", ["eval_design.py", str(tmp_path)])
    with pytest.raises(SystemExit, match="share most of their held-out questions"):
        eval_design.main()


def test_runs_stopping_at_different_steps_pair_their_last_evaluations(eval_design, tmp_path):
    """Runs trained to one token budget stop at different steps, so no evaluation pairs by step: the spread per
    question comes from each seed's last evaluations (not the shared start). Seed 0's last differences are
    (+1, -1, +1, -1) (variance 4/3), seed 1's (0, 0, 0, 0): sqrt(mean(4/3, 0)) = 0.816, in points 81.6."""
    start = {"step": 0, "kind": "eval", "eval/per_prompt": [0.5, 0.5, 0.5, 0.5]}
    for seed, trace_last in ((0, [1.0, 0.0, 1.0, 0.0]), (1, [0.25, 0.5, 0.75, 1.0])):
        grpo_last = [0.0, 1.0, 0.0, 1.0] if seed == 0 else [0.25, 0.5, 0.75, 1.0]
        _write_run(tmp_path / f"grpo-seed{seed}", [start, {"step": 28, "kind": "eval", "eval/per_prompt": grpo_last}])
        _write_run(tmp_path / f"trace-seed{seed}", [start, {"step": 39, "kind": "eval", "eval/per_prompt": trace_last},
                                                     {"step": 39, "kind": "step", "sys/step_seconds": 1.0}])
    assert eval_design.paired_spread_at_stop(tmp_path, "trace", "grpo", [0, 1]) == pytest.approx(
        100 * math.sqrt(2 / 3))
