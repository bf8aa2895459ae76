"""studies/batch_shape.py: what it reads of a run's batches, held to hand-computed steps (the kept tables are not
read here)."""

from __future__ import annotations

import json
import math

import pytest

from helpers import load_study_script

from tracerl.core.tally import Rollout, batch_shape

shape = load_study_script("batch_shape")

ROW = {"kind": "train", "alloc/num_prompts": 3, "alloc/mixed_trees_per_budget": 0.125, "alloc/success_rate": 0.5,
       "rollout/tokens": 900}


def columns(groups: list[tuple[int, float | None]], continuations: int = 0) -> dict[str, list]:
    """A step's rollouts file columns: each (grant, p) a prompt with `grant` fresh rollouts at the root's p, then
    `continuations` stage-2 rows (grant 1, p 0.9) that the batch measures must skip."""
    grant, p, cont = [], [], []
    for g, q in groups:
        grant += [g] * g
        p += [q] * g
        cont += [0] * g
    grant += [1] * continuations
    p += [0.9] * continuations
    cont += [1] * continuations
    rows = len(cont)
    return {"continuation": cont, "grant": grant, "p_anchor": p, "anchor_depth": cont, "units": [1.0] * rows,
            "sampled_tokens": [10] * rows, "informative": [0] * rows, "anchor_outcome": [None] * rows,
            "flipped": [None] * rows}


def test_a_step_counts_prompts_by_their_fresh_rollouts_only():
    # prompts: 4 rollouts at p 0.5, 2 at p 0.9, 8 at p 0.3; n = 8: 8 of 14 fresh rollouts in a group of n
    got = shape.step_measures(ROW, columns([(4, 0.5), (2, 0.9), (8, 0.3)], continuations=5), n=8)
    assert got["per_prompt"] == pytest.approx(14 / 3)
    assert got["share_n"] == pytest.approx(8 / 14)
    assert got["distance"] == pytest.approx((0.0 + 0.4 + 0.2) / 3)  # one count a prompt, not a rollout
    assert (got["prompts"], got["mixed"], got["success"], got["tokens"]) == (3.0, 0.125, 0.5, 900.0)


def test_a_prompt_without_a_prediction_is_left_out_of_the_distance_only():
    got = shape.step_measures(ROW, columns([(4, None), (4, 0.7)]), n=4)
    assert got["distance"] == pytest.approx(0.2)
    assert got["share_n"] == 1.0 and got["per_prompt"] == 4.0
    assert math.isnan(shape.step_measures(ROW, columns([(4, None)]), n=4)["distance"])


def test_a_run_is_the_mean_of_its_training_steps(tmp_path):
    run = tmp_path / "pcl-seed0"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"allocation": {"rollouts_per_prompt": 4}}))
    steps = [dict(ROW, step=1, **{"alloc/num_prompts": 2}), dict(ROW, step=2, **{"alloc/num_prompts": 4}),
             {"kind": "eval", "step": 2, "eval/success": 0.4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    for step, groups in ((1, [(4, 0.5), (4, 0.6)]), (2, [(2, 0.5), (4, 0.9)])):
        (run / "rollouts" / f"step-{step:06d}.json").write_text(json.dumps(
            {"step": step, "rollouts": columns(groups)}))
    got = shape.run_measures(run)
    assert got["prompts"] == 3.0
    assert got["per_prompt"] == pytest.approx((4.0 + 3.0) / 2)
    assert got["share_n"] == pytest.approx((1.0 + 4 / 6) / 2)
    assert got["distance"] == pytest.approx((0.05 + 0.2) / 2)


def test_a_run_with_no_training_step_is_an_error_naming_it(tmp_path):
    run = tmp_path / "pcl-seed0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"allocation": {"rollouts_per_prompt": 4}}))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 0}) + "\n")
    with pytest.raises(ValueError, match="pcl-seed0: no training step"):
        shape.run_measures(run)


def test_pearson_and_its_fisher_interval_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    r, lo, hi = shape.pearson(x, y)
    assert r == pytest.approx(0.8)  # sum dx dy = 8, sum dx^2 = sum dy^2 = 10
    half = 1.959963984540054 / math.sqrt(2)
    assert (lo, hi) == pytest.approx((math.tanh(math.atanh(0.8) - half), math.tanh(math.atanh(0.8) + half)))
    assert lo < 0 < r < hi < 1
    assert all(math.isnan(v) for v in shape.pearson([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])[1:])


def test_the_committed_table_is_what_the_kept_archives_give(tmp_path):
    """batch.md, which the study's README reads, comes back byte for byte from the three tables' kept archives and
    reports (72 builds, about ten seconds)."""
    out = tmp_path / "batch.md"
    assert shape.main(["--out", str(out)]) == 0
    assert out.read_text() == (shape.STUDIES / "batch-shape" / "batch.md").read_text()


def fresh(grant: int, p: float | None) -> list[Rollout]:
    return [Rollout(False, 0, p, 1.0, 10, True, grant=grant)] * grant


def test_batch_shape_counts_a_prompt_once_whatever_its_group_size():
    # groups of 3 (p 0.8), 3 (p 0.5) and 8 (no prediction), and two continuations below them that are not stage 1's
    items = [*fresh(3, 0.8), *fresh(3, 0.5), *fresh(8, None), *[Rollout(True, 1, 0.1, 0.5, 4, True, 0, True)] * 2]
    shape = batch_shape(items)
    assert shape["prompts"] == pytest.approx(3.0) and shape["fresh"] == 14
    assert shape["prompts_by_grant"] == pytest.approx({3: 2.0, 8: 1.0})
    assert shape["distance"] == pytest.approx((0.3 + 0.0) / 2)


def test_batch_shape_of_records_without_grants_is_unknown_not_wrong():
    shape = batch_shape([Rollout(False, 0, 0.4, 1.0, 10, False)] * 4)  # grant 0: written before grants were
    assert math.isnan(shape["prompts"]) and math.isnan(shape["distance"]) and shape["prompts_by_grant"] == {}
    assert math.isnan(batch_shape([])["distance"]) and batch_shape([])["prompts"] == 0
