"""Comparison statistics and the informative-sample measure: hand-worked values and the properties they must keep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.ledger import BudgetLedger
from tracerl.core.metrics import ratios, step_counts
from tracerl.core.stats import (
    Curve,
    Success,
    cost_to_reach,
    diff_at_baseline_cost,
    holm,
    interpolate_at,
    isotonic,
    num_eval_questions,
    paired_difference,
    paired_t_pvalue,
    bootstrap_over_seeds,
    seed_bootstrap,
    share_to_reach,
    t_cdf,
    t_half_width,
    t_quantile_975,
)
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
    assert t_quantile_975(30) == pytest.approx(2.042)
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=1e-4)  # not the normal 1.96 above 30 dof
    assert t_quantile_975(120) == pytest.approx(1.9799, abs=1e-4)
    assert t_quantile_975(100000) == pytest.approx(1.96, abs=1e-3)
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
    counts = step_counts(trees, adv, units_spent=9.0, tokens_spent=45, prices=BudgetLedger(9.0))
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
    counts = step_counts(trees, whitened, units_spent=8.0, tokens_spent=42, prices=BudgetLedger(8.0),
                         raw_advantages=raw)
    assert counts["num_informative_rollouts"] == 4
    assert counts["num_informative_tokens"] == 4 * 5 + 3 * 2
    assert counts["num_nonzero_adv_tokens"] == counts["num_informative_tokens"] + 4 * 5  # whitened: all of them


def test_a_continuation_is_priced_at_its_cost_and_its_own_tokens():
    """A tree: one fresh rollout that failed (2 + 5 policy tokens), then 2 continuations from its first turn, one
    success and one failure (6 tokens each). All 3 rollouts are informative; counted, that is 3 per 2 units spent;
    priced, the continuations are half a unit each and sampled only their own tokens."""
    tree = Tree.new("branched", "prompt")
    inner = tree.add_child(0, Segment.text_only("call", "obs", 2, 3))
    tree.add_child(inner, Segment.text_only("answer", "", 5, 0), reward=0)
    for r in (1, 0):
        tree.add_child(inner, Segment.text_only("answer", "", 6, 0), reward=r, origin="continuation", anchor_id=inner)
    adv = compute_advantages("trace", [tree])
    counts = step_counts([tree], adv, units_spent=2.0, tokens_spent=19, prices=BudgetLedger(2.0))
    assert counts["num_informative_rollouts"] == 3
    assert counts["informative_units"] == pytest.approx(1 + 0.5 + 0.5)
    assert counts["num_informative_sampled_tokens"] == 7 + 6 + 6
    measures = ratios(counts)
    assert measures["informative_rollouts_per_budget"] == pytest.approx(1.5)  # more than one per unit: unpriced
    assert measures["informative_units_per_unit"] == pytest.approx(1.0)
    assert measures["informative_sampled_tokens_per_token"] == pytest.approx(1.0)
    dearer = step_counts([tree], adv, 2.5, 19, prices=BudgetLedger(2.5, continuation_cost=0.75))
    assert ratios(dearer)["informative_units_per_unit"] == pytest.approx(2.5 / 2.5)
    assert dearer["informative_units"] == pytest.approx(2.5)


def test_priced_measures_of_uninformative_rollouts_are_zero():
    trees = [_star([1, 0], "mixed", tokens=4), _star([1, 1], "all-success", tokens=10)]
    counts = step_counts(trees, compute_advantages("grpo", trees), units_spent=4.0, tokens_spent=28,
                         prices=BudgetLedger(4.0))
    measures = ratios(counts)
    assert measures["informative_units_per_unit"] == pytest.approx(2 / 4)
    assert measures["informative_sampled_tokens_per_token"] == pytest.approx(8 / 28)


# ------------------------------------------------------------------------------ tests and corrections
def test_t_cdf_matches_the_table_of_quantiles():
    for dof in (1, 2, 4, 9, 30):
        assert t_cdf(t_quantile_975(dof), dof) == pytest.approx(0.975, abs=2e-4), dof
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(-1.5, 6) == pytest.approx(1 - t_cdf(1.5, 6))


def test_paired_t_pvalue_is_005_at_the_edge_of_the_95_interval():
    d = np.array([-1.0, 0.0, 1.0, 2.0, 3.0])
    half = t_quantile_975(4) * d.std(ddof=1) / math.sqrt(5)
    assert paired_t_pvalue(d - d.mean() + half) == pytest.approx(0.05, abs=1e-3)
    assert paired_t_pvalue([0.1, -0.1]) == pytest.approx(1.0)
    assert math.isnan(paired_t_pvalue([0.3]))


def test_holm_multiplies_the_smallest_p_by_the_number_of_tests_and_stays_monotone():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    adjusted = holm([0.2, float("nan"), 0.01])  # a missing test does not count
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    assert holm([0.9, 0.3]) == pytest.approx([0.9, 0.6])  # never below a smaller p's adjustment
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # never above 1


def test_isotonic_pools_adjacent_violators():
    assert isotonic([0.1, 0.3, 0.2, 0.4]) == pytest.approx([0.1, 0.25, 0.25, 0.4])
    assert isotonic([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert isotonic([1.0, 3.0, 2.0], weights=[1, 1, 3]) == pytest.approx([1.0, 2.25, 2.25])


def test_num_eval_questions_follows_the_variance():
    assert num_eval_questions(0.4, 0.02) == 416  # (0.4 / 0.02)^2 = 400, up to a multiple of 32
    assert num_eval_questions(0.4, 0.04) == 128  # half the SE, a quarter of the questions (100 -> 128)
    with pytest.raises(ValueError):
        num_eval_questions(0.4, 0.0)


# ------------------------------------------------------------------------------ per-seed readings, bootstrap
def _curve(cost, success, num_q=8):
    return Curve(np.asarray(cost, dtype=float), np.repeat(np.asarray(success, dtype=float)[:, None], num_q, axis=1))


def test_share_to_reach_is_read_per_seed_on_the_fitted_curve():
    base = _curve([0, 100, 200, 300, 400], [0.50, 0.52, 0.54, 0.56, 0.55])  # fitted final 0.555
    fast = _curve([0, 100, 200, 300], [0.50, 0.53, 0.60, 0.50])
    # the fitted fast curve: 0.50, 0.53, 0.55, 0.55 pools the last two; it first reaches 0.555 never -> inf
    assert share_to_reach(fast.mean(), base.mean()) == math.inf
    faster = _curve([0, 100, 200], [0.50, 0.5275, 0.58])
    want = (100 + 100 * (0.555 - 0.5275) / (0.58 - 0.5275)) / 400
    assert share_to_reach(faster.mean(), base.mean()) == pytest.approx(want)
    # read at its end: never extrapolated
    assert diff_at_baseline_cost(faster.mean(), base.mean()) == pytest.approx(0.58 - 0.55)


def test_a_noisy_spike_above_the_target_is_not_a_crossing():
    """Read off the raw points, one lucky evaluation at 100 tokens would make the share 25%."""
    base = _curve([0, 400], [0.50, 0.56])
    spiky = _curve([0, 100, 200, 300, 400], [0.50, 0.57, 0.51, 0.52, 0.60])
    assert share_to_reach(spiky.mean(), base.mean()) > 0.5


def test_seed_bootstrap_pools_per_seed_values_and_covers_them():
    rng = np.random.default_rng(1)
    pairs = []
    for s, gain in enumerate([0.01, 0.02, 0.03, 0.04]):
        base = Curve(np.array([0.0, 100.0]), rng.random((2, 16)))
        pairs.append((Curve(base.cost, base.per_question + gain), base))
    est = seed_bootstrap(diff_at_baseline_cost, pairs, num_resamples=400)
    assert est.per_seed == pytest.approx((0.01, 0.02, 0.03, 0.04))
    assert est.mean == pytest.approx(0.025)
    assert 0.01 <= est.lo < est.mean < est.hi <= 0.04  # a constant shift per seed: questions add no spread
    shares = seed_bootstrap(share_to_reach, [(_curve([0, 50], [0.5, 0.6]), _curve([0, 100], [0.5, 0.6]))] * 3,
                            num_resamples=50)
    assert shares.mean == pytest.approx(0.5) and shares.lo == shares.hi == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same questions"):
        seed_bootstrap(diff_at_baseline_cost, [(_curve([0], [0.5], 4), _curve([0], [0.5], 5))])


def test_the_statistics_read_many_resampled_curves_at_once_as_they_read_one():
    rng = np.random.default_rng(3)
    method = Curve(np.array([0.0, 100.0, 200.0]), rng.random((3, 6)))
    base = Curve(np.array([0.0, 150.0]), rng.random((2, 6)))
    weights = rng.dirichlet(np.ones(6), size=4).T  # (Q, R)
    for statistic in (diff_at_baseline_cost, share_to_reach):
        together = statistic(method.mean(weights), base.mean(weights))
        alone = [statistic(Success(method.cost, method.per_question @ w), Success(base.cost, base.per_question @ w))
                 for w in weights.T]
        assert np.allclose(together, alone), statistic.__name__


def _noisy_table(rng, num_seeds, num_questions, gain):
    """Seeds whose per-seed difference is evaluation noise only: each seed draws its own questions' outcomes."""
    pairs = []
    for _ in range(num_seeds):
        base = Curve(np.array([0.0, 100.0]), (rng.random((2, num_questions)) < 0.5).astype(float))
        pairs.append((Curve(base.cost, (rng.random((2, num_questions)) < 0.5 + gain).astype(float)), base))
    return pairs


def test_seed_bootstrap_counts_evaluation_noise_once():
    """A seed's value already holds its evaluation noise: resampling seeds covers the truth about 95% of the time.
    Resampling each drawn seed's questions as well would widen the interval by about sqrt(2) (coverage near 99.5%)."""
    rng = np.random.default_rng(2)
    covered, ratios = 0, []
    for _ in range(200):
        est = seed_bootstrap(diff_at_baseline_cost, _noisy_table(rng, 12, 64, 0.05), num_resamples=400,
                             seed=int(rng.integers(1 << 30)))
        covered += est.lo <= 0.05 <= est.hi
        ratios.append((est.hi - est.lo) / (2 * 1.959964 * np.std(est.per_seed, ddof=1) / math.sqrt(12)))
    assert not est.resample_questions
    assert 0.88 <= covered / 200 <= 0.98
    assert 0.85 <= float(np.median(ratios)) <= 1.1


def test_the_bootstrap_over_few_seeds_is_about_as_wide_as_students_t():
    """The plain percentile interval over 5 seeds is about 0.65 of the t interval's width; the expanded one is not."""
    rng = np.random.default_rng(5)
    ratios = []
    for i in range(300):
        values = rng.normal(0.0, 1.0, 5)
        est = bootstrap_over_seeds(values, num_resamples=1000, seed=i)
        ratios.append((est.hi - est.lo) / (2 * t_half_width(values)))
    assert 0.8 <= float(np.median(ratios)) <= 1.15
    with pytest.raises(ValueError, match="at least 2 seeds"):
        bootstrap_over_seeds([0.1])


def test_seed_bootstrap_of_one_seed_resamples_its_questions():
    """One seed: the only draw left is the questions; the interval is then about the normal one over questions."""
    pairs = _noisy_table(np.random.default_rng(4), 1, 400, 0.05)
    est = seed_bootstrap(diff_at_baseline_cost, pairs, num_resamples=2000)
    d = pairs[0][0].per_question[-1] - pairs[0][1].per_question[-1]
    assert est.resample_questions and est.per_seed == (pytest.approx(d.mean()),)
    assert (est.hi - est.lo) / (2 * 1.959964 * d.std(ddof=1) / math.sqrt(len(d))) == pytest.approx(1.0, abs=0.1)


def test_the_median_over_seeds_stays_finite_where_one_seed_never_reaches():
    reach = (_curve([0, 50], [0.5, 0.6]), _curve([0, 100], [0.5, 0.6]))  # share 0.5
    never = (_curve([0, 50], [0.5, 0.55]), _curve([0, 100], [0.5, 0.6]))  # never reaches 0.6
    est = seed_bootstrap(share_to_reach, [reach] * 8 + [never], num_resamples=400)
    assert est.mean == float("inf") and est.hi == float("inf")  # the mean: infinite with a single such seed
    assert est.median == pytest.approx(0.5) and est.median_lo == pytest.approx(0.5)
    assert est.median_hi == pytest.approx(0.5)  # a resample's median is infinite only if half its seeds are
    half = seed_bootstrap(share_to_reach, [reach] * 4 + [never] * 5, num_resamples=400)
    assert half.median == float("inf")
