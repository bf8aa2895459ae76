"""The stage-1 Lagrangian solver's row-by-row passes (n >= knapsack.BY_COLUMN_FROM prompts) give the plans of its
whole-array forms, float for float: the same counts, value, cost and bound as the solver with every pass whole-array
(BY_COLUMN_FROM raised past n, the arithmetic of the solver before the row-by-row passes), on seeded and
hypothesis-drawn instances (N on both sides of the by-column switch at 256; every registered value, one that rises twice
and a linear one whose ratios all tie; m_max unbounded or set; unit, integer, float and constant non-unit costs; exact
ties from constant or rounded p). Also the pieces one by one: both chain builders, the column counts, the
column-at-a-time v_root. Speed is measured by `tracerl bench alloc`, never here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core import knapsack
from tracerl.core.allocation import ROOT_VALUES, _powers, solve_roots, v_root


def whole_array_lagrangian(*args):
    """solve_lagrangian with every (K, n) pass whole-array, whatever n."""
    saved = knapsack.BY_COLUMN_FROM
    knapsack.BY_COLUMN_FROM = 2 ** 62
    try:
        return knapsack.solve_lagrangian(*args)
    finally:
        knapsack.BY_COLUMN_FROM = saved


def two_steps(p, m):
    """A value whose increments rise again (p^2 steps at m = 4 and m = 9): prompts need the general hull."""
    m = np.asarray(m, dtype=float)
    return (np.minimum(m, 3) * 0.1 + (m >= 4) * p[:, None] ** 2 + (m >= 9) * 0.5 * p[:, None]) * np.ones((p.size, 1))


def linear(p, m):
    """V = p m: every ratio V(m) / m ties with the next up to float rounding, which decides each prompt's entry
    column and whether its first chain step must be capped at the entry slope."""
    return p[:, None] * np.asarray(m, dtype=float)[None, :]


TEST_VALUES = {"two_steps": two_steps, "linear": linear}


def assert_same_plan(p, budget, m_min, m_max, cost, value):
    """solve_lagrangian and its whole-array form agree exactly; returns the plan's counts."""
    fn = TEST_VALUES.get(value) or ROOT_VALUES[value]
    new = knapsack.solve_lagrangian(p, budget, m_min, m_max, cost, fn)
    old = whole_array_lagrangian(p, budget, m_min, m_max, cost, fn)
    where = f"N={p.size} budget={budget} m_min={m_min} m_max={m_max} value={value} costs={np.unique(cost)[:4]}"
    assert np.array_equal(new[0], old[0]), f"counts differ ({int(np.sum(new[0] != old[0]))} prompts): {where}"
    assert new[1] == old[1], f"value {new[1]!r} != whole-array {old[1]!r}: {where}"
    assert new[2] == old[2], f"upper bound {new[2]!r} != whole-array {old[2]!r}: {where}"
    assert float(np.sum(new[0] * cost)) == float(np.sum(old[0] * cost))
    return new[0]


def random_case(rng, n):
    kind = rng.integers(5)
    p = [rng.uniform(size=n), np.round(rng.uniform(size=n), 1), np.full(n, rng.uniform()),
         rng.beta(0.3, 0.3, size=n), np.concatenate([[0.0, 1.0, 0.5], rng.uniform(size=n)])[:n]][kind]
    m_min = int(rng.integers(2, 5))
    m_max = None if rng.random() < 0.5 else int(rng.integers(m_min, 48))
    cost = [np.ones(n), rng.integers(1, 4, size=n).astype(float), rng.uniform(0.5, 2.0, size=n),
            np.full(n, 0.5)][rng.integers(4)]
    budget = float(rng.uniform(0, 40) * n * float(cost.mean()))
    if rng.random() < 0.3:
        budget = float(np.floor(budget))
    value = ["v_root", "knapsack_rl", "nonzero_adv", "two_steps", "linear"][rng.integers(5)]
    if value in ("nonzero_adv", "linear") and m_max is None:
        m_max = int(rng.integers(m_min, 48))  # their hulls climb forever: unbounded, they ask for m_max at scale
    return p, budget, m_min, m_max, cost, value


def test_the_plan_is_the_whole_array_plan_on_random_instances():
    rng = np.random.default_rng(0)
    grew = 0
    for trial in range(60):
        n = int(rng.choice([1, 7, 255, 256, 700, 3000, 20000]))
        p, budget, m_min, m_max, cost, value = random_case(rng, n)
        counts = assert_same_plan(p, budget, m_min, m_max, cost, value)
        grew += m_max is None and counts.max(initial=0) > m_min + min(64, 2 * np.ceil(budget / cost.sum()))
    assert grew >= 3, "too few instances took the path that widens a block; the test lost its reach"


def test_the_benchmark_instance_gives_the_whole_array_plan():
    """`tracerl bench alloc`'s stage-1 row: 100,000 prompts, p ~ U(0, 1), budget 1,600,000, unit costs."""
    p = np.random.default_rng(0).random(100_000)
    counts = assert_same_plan(p, 1_600_000.0, 2, None, np.ones(p.size), "v_root")
    assert counts.max() > 34  # some prompts outgrew the first block (m_cap 34): the second threshold ran
    plan = solve_roots(p, 1_600_000.0)
    assert plan.solver == "lagrangian" and np.array_equal(plan.counts, counts)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.one_of(st.integers(1, 12), st.integers(250, 600)))
def test_the_plan_is_the_whole_array_plan_hypothesis(seed, n):
    assert_same_plan(*random_case(np.random.default_rng(seed), n))


@settings(max_examples=40, deadline=None)
@given(p=st.lists(st.floats(0, 1), min_size=1, max_size=12), budget=st.floats(0, 80), m_min=st.integers(2, 5),
       extra=st.one_of(st.none(), st.integers(0, 6)), value=st.sampled_from(sorted(ROOT_VALUES)))
def test_the_plan_is_the_whole_array_plan_on_drawn_probabilities(p, budget, m_min, extra, value):
    """Probabilities hypothesis picks (0, 1, subnormals, 0.5 exactly), few prompts: the whole-array paths."""
    p = np.array(p)
    assert_same_plan(p, budget, m_min, None if extra is None else m_min + extra, np.ones(p.size), value)


def test_column_and_whole_array_chains_agree():
    """The by-column chain builder (N >= 256) gives the floats of the whole-array one: rising increments (two_steps)
    and entry slopes tied with the next ratio (linear) included."""
    rng = np.random.default_rng(1)
    for trial in range(20):
        n, k, m_min = 300, int(rng.integers(1 if trial % 3 < 2 else 12, 40)), int(rng.integers(2, 5))
        ms = np.arange(m_min, m_min + k)
        value = [ROOT_VALUES["v_root"], linear, two_steps][trial % 3]
        p = rng.beta(0.3, 0.3, size=n) if trial % 2 else np.round(rng.uniform(size=n), 1)
        u = np.ascontiguousarray(value(p, ms).T)  # (K, n)
        whole = knapsack._chains_whole(u, ms, int(ms[-1]))
        column = knapsack._chains_by_column(u, ms, int(ms[-1]))
        for name, a, b in zip(("entry", "first", "inc", "rising"), whole, column):
            assert np.array_equal(a, b), f"{name} differs at trial {trial} (K={k})"
        if trial % 3 == 2:  # K >= 12 reaches two_steps' second step at m = 9
            assert whole[3].any(), "two_steps should make some prompts rise again"


@pytest.mark.parametrize("k,n", [(5, 10), (33, 1000), (255, 300), (300, 300)])
def test_count_above_equals_count_nonzero(k, n):
    a = np.random.default_rng(k).random((k, n))
    a[0, :7] = [np.inf, -np.inf, 0.03, 0.03, 0.0, np.nan, 1.0]
    for t in (0.03, 0.0, 0.5):  # at t = 0.03 near-full columns: uint8 counts must not wrap at K = 255
        assert np.array_equal(knapsack._count_above(a, t), np.count_nonzero(a > t, axis=0)), f"t={t}"


@pytest.mark.parametrize("k,n", [(3, 40), (33, 1000), (255, 300), (300, 300)])
def test_split_equals_two_weights_and_a_compress(k, n):
    """One row-by-row pass gives the floats of the whole-array masks: scalar, per-column and per-slope costs."""
    rng = np.random.default_rng(k)
    s = np.where(rng.random((k, n)) < 0.1, -np.inf, rng.uniform(0.0, 1.0, size=(k, n)))
    s[:, :5] = 0.5  # ties at a pivot
    parts = [(s, 1.0), (s, rng.uniform(0.5, 2.0, size=n)), (rng.uniform(size=n), rng.uniform(0.5, 2.0, size=n)),
             (s[:, :0], 1.0)]
    for lo, hi in [(0.5, 0.5), (0.3, 0.5), (0.0, 0.9), (2.0, 3.0)]:
        w_hi, w_lo, between = knapsack._split(parts, lo, hi)
        (old_hi, ge_hi), (old_lo, ge_lo) = knapsack._weight_at_least(parts, hi), knapsack._weight_at_least(parts, lo)
        assert (w_hi, w_lo) == (old_hi, old_lo), f"lo={lo} hi={hi}"
        expected = knapsack._compress(parts, [a & ~b for a, b in zip(ge_lo, ge_hi)])
        assert len(between) == len(expected)
        for (s1, w1), (s2, w2) in zip(between, expected):
            assert np.array_equal(s1, s2) and np.array_equal(w1, w2)


def test_v_root_by_column_equals_the_running_products():
    rng = np.random.default_rng(2)
    for p in (rng.uniform(size=1000), np.round(rng.uniform(size=300), 1), rng.beta(0.1, 0.1, size=500)):
        for m in (np.arange(2, 70), np.arange(0, 5), np.arange(7, 9)):
            expected = 1.0 - _powers(p, m) - _powers(1.0 - p, m)
            expected[m <= 1] = 0.0
            assert np.array_equal(v_root(p, m), expected.T), f"m={m[0]}..{m[-1]}"
