"""Brier, ECE, AUC and reliability: hand-computed values, brute-force agreement, soft-target expansion."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.calibration import auc, brier, calibration_metrics, ece, expand_soft_targets, reliability


def auc_brute_force(p, y, w):
    """Weighted share of (positive, negative) pairs ordered right, ties 1/2: the definition, O(n^2)."""
    num = den = 0.0
    for i, j in itertools.product(range(len(p)), repeat=2):
        if y[i] == 1 and y[j] == 0:
            pair = w[i] * w[j]
            num += pair * (1.0 if p[i] > p[j] else 0.5 if p[i] == p[j] else 0.0)
            den += pair
    return num / den


def test_brier_by_hand():
    p, y = [0.1, 0.8, 0.6], [0, 1, 0]
    assert brier(p, y) == pytest.approx((0.01 + 0.04 + 0.36) / 3)
    assert brier(p, y, w=[1, 2, 1]) == pytest.approx((0.01 + 2 * 0.04 + 0.36) / 4)


def test_ece_by_hand():
    # bin 0: p .05 y 0 -> gap .05; bin 1: p .15,.12 y 1,0 -> |.135 - .5| * 2 samples; bin 9: p .95 y 1 -> .05
    p, y = [0.05, 0.15, 0.12, 0.95], [0, 1, 0, 1]
    assert ece(p, y) == pytest.approx((0.05 + 2 * 0.365 + 0.05) / 4)
    # weights scale a sample's share of its bin and of the total
    assert ece(p, y, w=[2, 1, 1, 0]) == pytest.approx((2 * 0.05 + abs(0.15 + 0.12 - 1)) / 4)
    # with 2 bins all four land in [0, .5) or [.5, 1]: |(.05+.15+.12)/3 - 1/3| * 3/4 + |.95 - 1| * 1/4
    assert ece(p, y, num_bins=2) == pytest.approx(abs(0.32 / 3 - 1 / 3) * 0.75 + 0.05 * 0.25)


def test_ece_puts_p_equal_one_in_the_last_bin():
    assert ece([1.0, 0.0], [1, 0]) == 0.0
    _, mean_p, _, mass = reliability([1.0, 0.95], [1, 1])
    assert mass[-1] == 1.0 and mean_p[-1] == pytest.approx(0.975)


def test_auc_by_hand_and_ties():
    # positives .35 and .8 against negatives .1 and .4: .35 beats .1 only, .8 beats both -> 3/4
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert auc([0.2, 0.9], [1, 0]) == 0.0
    # weights: the (pos .35, neg .4) pair that is ordered wrong now counts 3 times
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], w=[1, 3, 1, 1]) == pytest.approx((1 + 0 + 1 + 3) / (2 * 4))


def test_auc_matches_brute_force_on_random_data_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 30))
        p = rng.integers(0, 6, n) / 5  # few distinct values -> many ties
        y = (rng.random(n) < 0.5).astype(float)
        w = rng.random(n) * 3
        if y.min() == y.max():
            continue
        assert auc(p, y, w) == pytest.approx(auc_brute_force(p, y, w), rel=1e-12)


def test_auc_is_nan_when_a_class_is_absent_and_metrics_are_nan_when_empty():
    assert np.isnan(auc([0.2, 0.7], [1, 1]))
    assert np.isnan(auc([0.2, 0.7], [1, 0], w=[1, 0]))  # the only negative has zero weight
    assert np.isnan(brier([], [])) and np.isnan(ece([], [])) and np.isnan(auc([], []))


def test_perfect_predictor():
    y = np.array([0, 1, 1, 0, 1], dtype=float)
    assert brier(y, y) == 0.0 and ece(y, y) == 0.0 and auc(y, y) == 1.0
    # a perfectly calibrated soft predictor: p equals each node's success rate
    t = np.array([0.0, 0.25, 0.5, 1.0])
    w = np.array([4, 4, 2, 1])
    metrics = calibration_metrics(t, t, weights=w)
    assert metrics["ece"] == pytest.approx(0.0, abs=1e-12)
    # what is left of the Brier score is the leaves' own variance t (1 - t)
    assert metrics["brier"] == pytest.approx(np.sum(w * t * (1 - t)) / w.sum())


def test_soft_targets_equal_explicit_per_leaf_expansion():
    """Scoring (p_node, Vhat, n) equals scoring p_node against each of the node's n binary leaves."""
    rng = np.random.default_rng(1)
    p_nodes, vhat, num_leaves, p_leaf, y_leaf = [], [], [], [], []
    for _ in range(40):
        n = int(rng.integers(1, 9))
        rewards = (rng.random(n) < rng.random()).astype(float)
        p = float(rng.random())
        p_nodes.append(p), vhat.append(rewards.mean()), num_leaves.append(n)
        p_leaf.extend([p] * n), y_leaf.extend(rewards)
    soft = calibration_metrics(p_nodes, vhat, weights=num_leaves)
    assert soft["brier"] == pytest.approx(brier(p_leaf, y_leaf), rel=1e-12)
    assert soft["ece"] == pytest.approx(ece(p_leaf, y_leaf), rel=1e-12)
    assert soft["auc"] == pytest.approx(auc(p_leaf, y_leaf), rel=1e-12)
    assert soft["auc"] == pytest.approx(auc_brute_force(p_leaf, y_leaf, np.ones(len(p_leaf))), rel=1e-12)


def test_expand_soft_targets_shapes_and_weights():
    p, y, w = expand_soft_targets([0.3, 0.6], [0.25, 1.0], [4, 2])
    np.testing.assert_array_equal(p, [0.3, 0.6, 0.3, 0.6])
    np.testing.assert_array_equal(y, [1, 1, 0, 0])
    np.testing.assert_array_equal(w, [1, 2, 3, 0])


def test_reliability_bins():
    p, y = [0.05, 0.15, 0.12, 0.95], [0, 1, 0, 1]
    bin_mid, mean_p, mean_y, mass = reliability(p, y, num_bins=10)
    np.testing.assert_allclose(bin_mid, np.arange(10) / 10 + 0.05)
    np.testing.assert_allclose(mass, [0.25, 0.5] + [0] * 7 + [0.25])
    assert mean_p[1] == pytest.approx(0.135) and mean_y[1] == pytest.approx(0.5)
    assert np.isnan(mean_p[2:9]).all() and np.isnan(mean_y[2:9]).all()
    used = mass > 0
    assert np.sum(mass[used] * np.abs(mean_p[used] - mean_y[used])) == pytest.approx(ece(p, y))


@pytest.mark.parametrize("call, match", [
    (lambda: brier([0.1, 0.2], [1]), "same length"),
    (lambda: ece([[0.1, 0.2]], [[1, 0]]), "1-D"),
    (lambda: auc([0.1, 1.2], [1, 0]), r"\[0, 1\]"),
    (lambda: brier([0.1, np.nan], [1, 0]), "NaN"),
    (lambda: brier([0.1, 0.2], [1, 0.5]), "calibration_metrics"),
    (lambda: ece([0.1, 0.2], [1, 0], w=[1, -1]), ">= 0"),
    (lambda: ece([0.1, 0.2], [1, 0], w=[1]), "one weight per prediction"),
    (lambda: ece([0.1, 0.2], [1, 0], num_bins=0), "num_bins"),
    (lambda: calibration_metrics([0.1, 0.2], [0.5, 1.5]), r"targets must lie in \[0, 1\]"),
])
def test_bad_input_raises_a_helpful_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


probs = st.lists(st.integers(0, 20).map(lambda k: k / 20), min_size=2, max_size=30)  # a grid: ties happen


@settings(max_examples=60, deadline=None)
@given(probs, st.data())
def test_metric_invariants(p, data):
    y = data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=len(p), max_size=len(p)))
    p, y = np.array(p), np.array(y)
    assert 0.0 <= brier(p, y) <= 1.0
    assert 0.0 <= ece(p, y) <= 1.0 + 1e-12
    assert ece(p, y) <= np.mean(np.abs(p - y)) + 1e-12  # binning can only cancel errors
    if 0 < y.sum() < len(y):
        a = auc(p, y)
        assert 0.0 <= a <= 1.0
        assert auc(1 - p, y) == pytest.approx(1 - a, abs=1e-9)  # reversing the ranking mirrors the AUC
        assert auc(p, 1 - y) == pytest.approx(1 - a, abs=1e-9)


def test_platt_fit_recovers_a_known_scaling():
    from tracerl.core.calibration import platt_fit

    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 2.0, 20000)
    t = (rng.random(z.size) < 1 / (1 + np.exp(-(0.5 * z - 1.0)))).astype(float)
    a, b = platt_fit(z, t)
    assert abs(a - 0.5) < 0.05 and abs(b + 1.0) < 0.05
    # soft targets and weights: one sample of weight 3 with target 1/3 is the same evidence as three samples
    a1, b1 = platt_fit(np.array([0.0, 1.0]), np.array([1 / 3, 1.0]), np.array([3.0, 1.0]))
    a2, b2 = platt_fit(np.array([0.0, 0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0, 1.0]))
    assert abs(a1 - a2) < 1e-6 and abs(b1 - b2) < 1e-6


def test_platt_fit_edge_cases():
    from tracerl.core.calibration import platt_fit

    assert platt_fit(np.zeros(0), np.zeros(0)) == (1.0, 0.0)
    a, b = platt_fit(np.zeros(400), np.r_[np.ones(100), np.zeros(300)])  # no signal in z: b -> logit(0.25)
    assert abs(a - 1.0) < 1e-6 and abs(b - np.log(0.25 / 0.75)) < 0.02
    a, b = platt_fit(np.array([1e6, -1e6, 3.0]), np.array([0.0, 1.0, 1.0]))  # extreme logits stay finite
    assert np.isfinite(a) and np.isfinite(b) and a < 0
    with pytest.raises(ValueError, match="ridge"):
        platt_fit(np.zeros(3), np.zeros(3), ridge=0.0)
    with pytest.raises(ValueError, match="1-d arrays"):
        platt_fit(np.zeros(3), np.zeros(2))
