"""Comparison statistics and the informative-sample measure: hand-worked values and the properties they must keep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.metrics import ratios, step_counts
from tracerl.core.stats import cost_to_reach, interpolate_at, paired_difference, t_quantile_975
from tracerl.core.tree import Segment, Tree


# ------------------------------------------------------------------------------ reading curves at a cost
def test_interpolate_is_linear_between_evaluations_and_never_extrapolates():
    x = [0.0, 100.0, 300.0]
    y = np.array([[0.0, 1.0], [0.5, 1.0], [1.0, 0.0]])  # two questions
    value, reached = interpolate_at(x, y, 200.0)
    assert reached and np.allclose(value, [0.75, 0.5])
    value, reached = interpolate_at(x, y, 300.0)
    assert reached and np.allclose(value, [1.0, 0.0])
    value, reached = interpolate_at(x, y, 301.0)  # the run never spent that much: its last value, flagged
    assert not reached and np.allclose(value, [1.0, 0.0])
    with pytest.raises(ValueError, match="must not decrease"):
        interpolate_at([0, 2, 1], y, 1.0)


def test_cost_to_reach_interpolates_the_first_crossing():
    assert cost_to_reach([0, 100, 200], [0.2, 0.4, 0.6], 0.5) == pytest.approx(150.0)
    assert cost_to_reach([0, 100, 200], [0.2, 0.4, 0.6], 0.2) == 0.0
    assert cost_to_reach([0, 100, 200], [0.2, 0.4, 0.45], 0.5) is None


# ------------------------------------------------------------------------------ paired differences
def test_paired_difference_over_seeds_is_a_t_interval_on_per_seed_means():
    base = [np.array([0.0, 1.0, 0.5, 0.5]), np.array([0.25, 0.25, 0.5, 0.0]), np.array([1.0, 0.0, 0.0, 0.0])]
    shift = [0.1, 0.2, 0.3]
    method = [b + s for b, s in zip(base, shift)]
    diff = paired_difference(method, base)
    assert diff.over == "seeds" and diff.num_seeds == 3 and diff.num_questions == 4
    assert diff.mean == pytest.approx(0.2)
    se = np.std(shift, ddof=1) / math.sqrt(3)
    assert diff.se == pytest.approx(se)
    assert (diff.lo, diff.hi) == pytest.approx((0.2 - 4.303 * se, 0.2 + 4.303 * se))
    assert diff.per_seed == pytest.approx(tuple(shift))


def test_paired_difference_of_one_seed_uses_questions_and_says_so():
    a, b = np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
    diff = paired_difference([a], [b])
    d = a - b
    assert diff.over == "questions" and diff.mean == pytest.approx(0.5)
    assert diff.se == pytest.approx(d.std(ddof=1) / 2)
    assert diff.hi - diff.lo == pytest.approx(2 * 1.959964 * diff.se)


def test_paired_difference_pairs_question_by_question():
    """A method that is better on every question by the same amount has a zero-width interval, whatever the
    spread of the questions themselves (an unpaired comparison could not see this)."""
    rng = np.random.default_rng(0)
    base = [rng.random(64) for _ in range(5)]
    diff = paired_difference([b + 0.03 for b in base], base)
    assert diff.lo == pytest.approx(0.03) and diff.hi == pytest.approx(0.03)


def test_paired_difference_rejects_different_questions():
    with pytest.raises(ValueError, match="same held-out questions"):
        paired_difference([np.zeros(4)], [np.zeros(5)])
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference([np.zeros(4)], [np.zeros(4), np.zeros(4)])


def test_t_quantiles():
    assert t_quantile_975(1) == pytest.approx(12.706)
    assert t_quantile_975(4) == pytest.approx(2.776)
    assert t_quantile_975(1000) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile_975(0)


# ------------------------------------------------------------------------------ informative samples
def _star(rewards, prompt_id, tokens=5):
    tree = Tree.new(prompt_id, "prompt")
    for r in rewards:
        tree.add_child(0, Segment.text_only("answer", "", tokens, 0), reward=r)
    return tree


def test_informative_rollouts_are_those_of_mixed_groups():
    trees = [_star([1, 0, 0], "mixed"), _star([1, 1, 1, 1], "all-success"), _star([0, 0], "all-fail")]
    adv = compute_advantages("grpo", trees)
    counts = step_counts(trees, adv, units_spent=9.0, tokens_spent=45)
    assert counts["num_informative_rollouts"] == 3
    assert counts["num_informative_tokens"] == 15
    measures = ratios(counts)
    assert measures["informative_rollouts_per_budget"] == pytest.approx(3 / 9)
    assert measures["informative_rollouts_per_ktoken"] == pytest.approx(1000 * 3 / 45)
    assert measures["informative_tokens_per_token"] == pytest.approx(15 / 45)
    assert measures["informative_rollout_frac"] == pytest.approx(3 / 9)


def test_informative_counts_read_the_advantages_before_batch_whitening():
    """TreePO whitens over the batch, which gives the all-success tree non-zero advantages: they carry no contrast,
    and the measure must not count them when given the unwhitened ones."""
    branched = Tree.new("branched", "prompt")
    inner = branched.add_child(0, Segment.text_only("call", "obs", 2, 3))
    for r in (1, 0, 0):
        branched.add_child(inner, Segment.text_only("answer", "", 5, 0), reward=r)
    branched.add_child(0, Segment.text_only("answer", "", 5, 0), reward=1)
    trees = [branched, _star([1, 1, 1, 1], "all-success")]
    whitened = compute_advantages("treepo", trees, AdvantageConfig())
    assert all(np.all(np.abs(row) > 1e-6) for row in whitened[1].values)  # the batch mean is not 0 here
    raw = [compute_advantages("treepo", [tree])[0] for tree in trees]  # alone, a tree is whitened by itself only
    assert not any(np.any(row) for row in raw[1].values)
    counts = step_counts(trees, whitened, units_spent=8.0, tokens_spent=42, raw_advantages=raw)
    assert counts["num_informative_rollouts"] == 4
    assert counts["num_informative_tokens"] == 4 * 5 + 3 * 2
    assert counts["num_nonzero_adv_tokens"] == counts["num_informative_tokens"] + 4 * 5  # whitened: all of them
