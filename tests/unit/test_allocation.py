"""Stage 1 (root knapsack), stage 2 (prefix greedy) and split_budget: optimality against brute force,
budget and bound invariants, tie-breaking, and the errors users see."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.allocation import (
    ROOT_VALUES,
    RootPlan,
    allocate_prefixes,
    allocate_roots,
    prefix_value,
    root_value,
    solve_roots,
    split_budget,
)

PROPS = settings(max_examples=80, deadline=None)


# ---------- reference implementations: enumerate everything ----------

def brute_roots(p, budget, m_min, m_max, cost, value) -> float:
    """Best sum_i V(p_i, m_i) over every assignment that fits the budget (all of them, enumerated
    prompt by prompt; partial assignments that already overspend are dropped as they can only grow)."""
    spent, total = np.zeros(1), np.zeros(1)
    for i in range(len(p)):
        top = math.floor(budget / cost[i] + 1e-12)
        top = top if m_max is None else min(top, m_max)
        m = np.array([0] + list(range(m_min, top + 1)))
        v = np.array([float(root_value(p[i], k, value)) for k in m])
        spent, total = (spent[:, None] + m * cost[i]).ravel(), (total[:, None] + v).ravel()
        fits = spent <= budget
        spent, total = spent[fits], total[fits]
    return float(total.max())


def brute_prefixes(p, outcome, budget, cost, k_max) -> float:
    q = np.where(np.asarray(outcome) == 1, p, 1 - p)
    best = 0.0
    tops = [math.floor(budget / c + 1e-12) for c in cost]
    tops = tops if k_max is None else [min(k_max, t) for t in tops]
    for combo in itertools.product(*[range(t + 1) for t in tops]):
        k = np.array(combo)
        if np.sum(k * cost) <= budget:
            best = max(best, float(np.sum(1 - q ** k)))
    return best


def random_instance(rng, n_max=5):
    n = int(rng.integers(1, n_max + 1))
    p = rng.uniform(size=n)
    if rng.random() < 0.3:
        p = np.round(p, 1)  # exact ties and p in {0, 1}
    m_min = int(rng.integers(2, 5))  # the solver shares the config's rule: m_min >= 2
    m_max = None if rng.random() < 0.3 else int(rng.integers(m_min, 7))
    cost = rng.integers(1, 4, size=n).astype(float) if rng.random() < 0.6 else np.ones(n)
    return p, int(rng.integers(0, 18)), m_min, m_max, cost


def check_counts(counts, m_min, m_max, n):
    assert counts.dtype == np.int64 and counts.shape == (n,)
    inside = counts[counts > 0]
    assert np.all(counts >= 0) and np.all(inside >= m_min), counts
    if m_max is not None:
        assert np.all(inside <= m_max), counts


# ---------- values ----------

def test_v_root_closed_forms():
    assert root_value(0.5, 2) == pytest.approx(0.5)
    assert root_value(0.5, 3) == pytest.approx(0.75)
    v = np.linspace(0, 1, 11)
    assert np.all(root_value(v, 0) == 0) and np.all(root_value(v, 1) == 0)
    m = np.arange(2, 30)
    np.testing.assert_allclose(root_value(v[:, None], m[None, :]), root_value(1 - v[:, None], m[None, :]), atol=1e-12)
    np.testing.assert_allclose(root_value(0.3, m), 1 - 0.3 ** m - 0.7 ** m, rtol=1e-12)


def test_registry_values_match_their_formulas():
    p, m = np.array([0.0, 0.2, 0.5, 0.9]), np.array([0, 1, 2, 5, 9])
    base = 1 - p[:, None] ** m - (1 - p[:, None]) ** m
    base[:, m <= 1] = 0
    np.testing.assert_allclose(ROOT_VALUES["v_root"](p, m), base, atol=1e-14)
    np.testing.assert_allclose(ROOT_VALUES["knapsack_rl"](p, m), base * (p * (1 - p) ** 2)[:, None], atol=1e-14)
    np.testing.assert_allclose(ROOT_VALUES["nonzero_adv"](p, m), base * m, atol=1e-13)
    # a non-consecutive m list takes the pow path and must agree with the running product
    np.testing.assert_allclose(ROOT_VALUES["v_root"](p, np.arange(2, 40))[:, [0, 7, 30]],
                               ROOT_VALUES["v_root"](p, np.array([2, 9, 32])), rtol=1e-12, atol=1e-15)


def test_prefix_value_formula():
    assert prefix_value(0.8, 1, 2) == pytest.approx(1 - 0.8 ** 2)  # success so far: need a failure
    assert prefix_value(0.8, 0, 2) == pytest.approx(1 - 0.2 ** 2)  # failure so far: need a success
    assert prefix_value(1.0, 1, 5) == 0.0


# ---------- stage 1: optimality ----------

def test_exact_matches_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(100):
        p, budget, m_min, m_max, cost = random_instance(rng)
        value = list(ROOT_VALUES)[trial % 3]
        plan = solve_roots(p, budget, m_min=m_min, m_max=m_max, cost=cost, value=value, solver="exact")
        best = brute_roots(p, budget, m_min, m_max, cost, value)
        assert plan.solver == "exact"
        assert plan.value == pytest.approx(best, abs=1e-9), (p, budget, m_min, m_max, cost, value, plan)
        assert plan.value == pytest.approx(float(root_value(p, plan.counts, value).sum()), abs=1e-12)
        assert plan.cost <= budget and plan.upper_bound == plan.value


def test_lagrangian_is_sandwiched_by_the_optimum():
    rng = np.random.default_rng(1)
    for trial in range(100):
        p, budget, m_min, m_max, cost = random_instance(rng)
        if trial % 2:  # float costs and budgets: only brute force can judge these
            cost, budget = rng.uniform(0.3, 3.0, size=p.size), float(rng.uniform(0, 15))
        value = list(ROOT_VALUES)[trial % 3]
        plan = solve_roots(p, budget, m_min=m_min, m_max=m_max, cost=cost, value=value, solver="lagrangian")
        best = brute_roots(p, budget, m_min, m_max, cost, value)
        assert plan.value <= best + 1e-9 and best <= plan.upper_bound + 1e-9, (p, budget, m_min, m_max, cost, value)
        assert plan.value == pytest.approx(float(root_value(p, plan.counts, value).sum()), abs=1e-9)
        check_counts(plan.counts, m_min, m_max, p.size)


def test_a_registered_value_with_two_bumps(monkeypatch):
    """A pluggable value whose increments rise again after the first hull vertex takes the general-hull
    path: still sandwiched by the brute-force optimum, and the DP still exact."""
    def two_steps(p, m):  # worth p from 3 rollouts on, plus 1 - p from 8 on
        m = np.asarray(m)
        return p[:, None] * (m >= 3) + (1 - p[:, None]) * (m >= 8)

    monkeypatch.setitem(ROOT_VALUES, "two_steps", two_steps)
    rng = np.random.default_rng(12)
    for trial in range(60):
        n = int(rng.integers(1, 5))
        p, budget = rng.uniform(0.4, 1.0, size=n), int(rng.integers(0, 30))
        cost = rng.integers(1, 3, size=n).astype(float)
        m_max = [None, 9, 12][trial % 3]
        best = brute_roots(p, budget, 2, m_max, cost, "two_steps")
        exact = solve_roots(p, budget, m_max=m_max, cost=cost, value="two_steps", solver="exact")
        lag = solve_roots(p, budget, m_max=m_max, cost=cost, value="two_steps", solver="lagrangian")
        assert exact.value == pytest.approx(best, abs=1e-12)
        assert lag.value <= best + 1e-12 and best <= lag.upper_bound + 1e-12
    big = solve_roots(rng.uniform(0.4, 1.0, size=2000), 12000, m_max=12, value="two_steps", solver="lagrangian")
    assert big.cost <= 12000 and big.value <= big.upper_bound


def test_lagrangian_is_exact_when_the_budget_is_a_lagrangian_cost():
    """If the budget equals what the per-prompt argmax_m V(m) - lam*m choices cost, the relaxation has
    no gap: the lagrangian plan is optimal and its bound is tight. (Elsewhere it can miss by a boundary
    effect: e.g. a leftover of 1 unit cannot buy an m_min=2 block.)"""
    rng = np.random.default_rng(2)
    for _ in range(100):
        n, m_min = int(rng.integers(1, 9)), int(rng.integers(2, 5))
        m_max = int(rng.integers(m_min, 9))
        p, lam = rng.uniform(size=n), float(rng.uniform(0, 0.3))
        ms = np.concatenate([[0], np.arange(m_min, m_max + 1)])
        choice = ms[np.argmax(root_value(p[:, None], ms[None, :]) - lam * ms, axis=1)]  # independent argmax
        budget = int(choice.sum())
        exact = solve_roots(p, budget, m_min=m_min, m_max=m_max, solver="exact")
        lag = solve_roots(p, budget, m_min=m_min, m_max=m_max, solver="lagrangian")
        assert lag.value == pytest.approx(exact.value, abs=1e-9)
        assert lag.upper_bound - lag.value <= 1e-9


def test_lagrangian_gap_is_at_most_one_prompt_on_moderate_instances():
    rng = np.random.default_rng(3)
    for trial in range(12):
        n = int(rng.integers(200, 1500))
        p, budget = rng.uniform(size=n), int(rng.integers(2, 20)) * n
        m_max = [None, 8, 32][trial % 3]
        plan = solve_roots(p, budget, m_max=m_max, solver="lagrangian")
        assert plan.value <= plan.upper_bound
        assert plan.upper_bound - plan.value <= 1.0  # V_root <= 1: the boundary costs at most one prompt
        assert plan.cost <= budget
        if trial < 3:  # cross-check the bound with the DP where it is affordable
            small = solve_roots(p[:60], 180, m_max=m_max or 12, solver="exact")
            lag = solve_roots(p[:60], 180, m_max=m_max or 12, solver="lagrangian")
            assert lag.value <= small.value + 1e-9 <= lag.upper_bound + 2e-9


def test_lagrangian_is_exact_at_scale_when_the_budget_is_a_lagrangian_cost():
    rng = np.random.default_rng(10)
    for value, m_max in [("v_root", 16), ("knapsack_rl", 24), ("nonzero_adv", 12)]:
        p, lam = rng.uniform(size=3000), float(rng.uniform(0.001, 0.05))
        ms = np.concatenate([[0], np.arange(2, m_max + 1)])
        gain = root_value(p[:, None], ms[None, :], value) - lam * ms
        choice = ms[np.argmax(gain, axis=1)]
        plan = solve_roots(p, int(choice.sum()), m_max=m_max, value=value, solver="lagrangian")
        best = float(root_value(p, choice, value).sum())
        assert plan.value == pytest.approx(best, rel=1e-12) and plan.upper_bound == pytest.approx(best, rel=1e-12)


def test_threshold_quickselect_matches_a_full_sort():
    """The weighted quickselect behind the lagrangian finds the same multiplier as sorting every slope."""
    from tracerl.core.knapsack import _threshold

    def by_sorting(parts, budget):
        s = np.concatenate([x.ravel() for x, _ in parts])
        w = np.concatenate([np.broadcast_to(c, x.shape).ravel() for x, c in parts])
        s, w = s[s > 0], w[s > 0]
        order = np.argsort(-s, kind="stable")
        spent = np.cumsum(w[order])
        return 0.0 if w.sum() <= budget else float(s[order][np.searchsorted(spent, budget, side="right")])

    rng = np.random.default_rng(11)
    for trial in range(40):
        n, k = int(rng.choice([5, 800, 20000])), int(rng.integers(1, 10))
        slopes = [rng.normal(size=(k, n)), rng.integers(-2, 5, size=(k, n)).astype(float),  # heavy ties
                  np.full((k, n), 0.25), np.where(rng.random((k, n)) < 0.3, -np.inf, rng.exponential(size=(k, n)))]
        cost = rng.uniform(0.5, 2.0, size=n) if trial % 2 else 1.0
        parts = [(rng.exponential(size=n), rng.integers(1, 4, size=n) * 1.0), (slopes[trial % 4], cost)]
        total = sum(float(np.broadcast_to(c, x.shape)[x > 0].sum()) for x, c in parts)
        budget = float(np.floor(rng.uniform(0, 1.2) * total))
        assert _threshold(parts, budget) == by_sorting(parts, budget)


def test_values_disagree_as_designed():
    """v_root spreads the budget over many prompts, nonzero_adv concentrates it."""
    p = np.random.default_rng(4).uniform(size=400)
    spread = solve_roots(p, 3200, m_max=64, value="v_root").counts
    focused = solve_roots(p, 3200, m_max=64, value="nonzero_adv").counts
    assert (spread > 0).sum() > 2 * (focused > 0).sum()


def test_prompts_that_can_never_be_mixed_get_nothing():
    p = np.array([0.0, 0.5, 1.0, 0.5])
    for solver in ("exact", "lagrangian"):
        counts = allocate_roots(p, 40, solver=solver)
        assert counts[0] == 0 and counts[2] == 0 and counts[1] > 0 and counts[3] > 0


def test_tiny_budgets():
    for solver in ("exact", "lagrangian"):
        assert np.all(allocate_roots([0.5, 0.5], 0, solver=solver) == 0)
        assert np.all(allocate_roots([0.5, 0.5], 1.9, solver=solver) == 0)  # below one m_min block
        assert list(allocate_roots([0.5, 0.5], 2.5, solver=solver)) == [2, 0]


# ---------- stage 1: ties, determinism, solver choice ----------

@pytest.mark.parametrize("solver", ["exact", "lagrangian"])
def test_equal_prompts_give_the_budget_to_lower_indices_first(solver):
    counts = allocate_roots(np.full(10, 0.5), 6, m_max=2, solver=solver)
    assert list(counts) == [2, 2, 2, 0, 0, 0, 0, 0, 0, 0]
    counts = allocate_roots(np.full(6, 0.3), 10, m_max=4, solver=solver)
    assert counts.sum() <= 10 and np.all(np.diff(counts) <= 0), counts  # never more to a later twin


def test_same_input_same_plan():
    p = np.random.default_rng(5).uniform(size=3000)
    a, b = solve_roots(p, 30000), solve_roots(p.copy(), 30000)
    assert np.array_equal(a.counts, b.counts) and a.value == b.value and a.upper_bound == b.upper_bound


def test_auto_picks_the_dp_only_where_it_is_cheap():
    p = np.random.default_rng(6).uniform(size=50)
    assert solve_roots(p, 100, m_max=8).solver == "exact"
    assert solve_roots(p, 100, m_max=8, cost=np.full(50, 0.5)).solver == "lagrangian"  # float costs
    assert solve_roots(np.tile(p, 100), 50000, m_max=32).solver == "lagrangian"  # too large for the DP
    assert isinstance(solve_roots(p, 100), RootPlan)


def test_exact_solver_floors_a_float_budget():
    p = np.random.default_rng(7).uniform(size=6)
    assert np.array_equal(allocate_roots(p, 16.0, solver="exact"), allocate_roots(p, 16, solver="exact"))
    assert np.array_equal(allocate_roots(p, 16.7, solver="exact"), allocate_roots(p, 16, solver="exact"))


# ---------- stage 1: invariants (hypothesis) ----------

probs = st.lists(st.floats(0, 1), min_size=1, max_size=12)


@PROPS
@given(p=probs, budget=st.floats(0, 80), m_min=st.integers(2, 5), extra=st.one_of(st.none(), st.integers(0, 6)),
       value=st.sampled_from(sorted(ROOT_VALUES)), data=st.data())
def test_stage1_never_overspends_and_respects_bounds(p, budget, m_min, extra, value, data):
    m_max = None if extra is None else m_min + extra
    n = len(p)
    int_cost = np.array(data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)), dtype=float)
    float_cost = np.array(data.draw(st.lists(st.floats(0.05, 5), min_size=n, max_size=n)))
    runs = [("exact", int_cost), ("lagrangian", int_cost), ("lagrangian", float_cost), ("auto", float_cost)]
    for solver, cost in runs:
        plan = solve_roots(p, budget, m_min=m_min, m_max=m_max, cost=cost, value=value, solver=solver)
        check_counts(plan.counts, m_min, m_max, n)
        assert np.sum(plan.counts * cost) <= budget and plan.cost <= budget


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), per_prompt=st.floats(0, 40), m_max=st.one_of(st.none(), st.integers(2, 40)),
       seed=st.integers(0, 2 ** 16))
def test_stage1_invariants_at_scale(n, per_prompt, m_max, seed):
    rng = np.random.default_rng(seed)
    p, cost = rng.beta(0.5, 0.5, size=n), rng.uniform(0.5, 2.0, size=n)
    budget = per_prompt * n
    for c in (None, cost):
        plan = solve_roots(p, budget, m_max=m_max, cost=c, solver="lagrangian")
        check_counts(plan.counts, 2, m_max, n)
        assert plan.cost <= budget and np.sum(plan.counts * (1.0 if c is None else c)) <= budget


# ---------- stage 2 ----------

def test_prefix_greedy_matches_brute_force_with_equal_costs():
    rng = np.random.default_rng(8)
    for trial in range(120):
        y = int(rng.integers(1, 5))
        p, outcome = rng.uniform(size=y), rng.integers(0, 2, size=y)
        if trial % 3 == 0:
            p = np.round(p, 1)
        c = [0.5, 1.0, 0.3][trial % 3]
        budget, k_max = float(rng.uniform(0, 3)), [None, 2][trial % 2]
        k = allocate_prefixes(p, outcome, budget, cost=np.full(y, c), k_max=k_max)
        got = float(np.sum(prefix_value(p, outcome, k)))
        assert got == pytest.approx(brute_prefixes(p, outcome, budget, np.full(y, c), k_max), abs=1e-12)
        assert np.sum(k * c) <= budget + 1e-12


def test_prefix_bulk_phase_agrees_with_the_plain_greedy(monkeypatch):
    """Large budgets hand out increments in bulk before the heap; it must not change the answer."""
    from tracerl.core import allocation
    rng = np.random.default_rng(9)
    for trial in range(20):
        y = int(rng.integers(1, 40))
        p, outcome = rng.uniform(size=y), rng.integers(0, 2, size=y)
        cost = np.full(y, 0.5) if trial % 2 else rng.uniform(0.2, 2.0, size=y)
        k_max = None if trial % 3 else rng.integers(0, 400, size=y)
        budget = float(rng.uniform(2500, 4000))
        bulk = allocate_prefixes(p, outcome, budget, cost=cost, k_max=k_max)
        monkeypatch.setattr(allocation, "_BULK_GRANTS", 10 ** 12)
        plain = allocate_prefixes(p, outcome, budget, cost=cost, k_max=k_max)
        monkeypatch.setattr(allocation, "_BULK_GRANTS", 4096)
        assert np.array_equal(bulk, plain), np.flatnonzero(bulk != plain)


def test_prefix_greedy_ties_and_zero_gain():
    assert list(allocate_prefixes([0.5] * 4, [1] * 4, 2)) == [1, 1, 0, 0]  # equal gains: lower index first
    assert list(allocate_prefixes([1.0, 0.0, 0.7], [1, 0, 1], 10)) == [0, 0, 10]  # q == 1 gains nothing
    assert list(allocate_prefixes([0.0], [1], 5)) == [1]  # q == 0: one continuation is certain, more add nothing
    assert allocate_prefixes([], [], 5.0).shape == (0,)


def test_prefix_greedy_skips_what_no_longer_fits():
    # candidate 0 has the best ratio but costs 3; after it only 1 unit is left, which candidate 2 can use
    k = allocate_prefixes([0.5, 0.5, 0.9], [1, 1, 1], 4, cost=[3.0, 3.0, 1.0], k_max=1)
    assert list(k) == [1, 0, 1]


@PROPS
@given(data=st.data(), y=st.integers(0, 15), budget=st.floats(0, 30))
def test_stage2_never_overspends_and_respects_k_max(data, y, budget):
    p = np.array(data.draw(st.lists(st.floats(0, 1), min_size=y, max_size=y)))
    outcome = np.array(data.draw(st.lists(st.integers(0, 1), min_size=y, max_size=y)), dtype=int)
    cost = np.array(data.draw(st.lists(st.floats(0.05, 3), min_size=y, max_size=y)))
    k_max = data.draw(st.one_of(st.none(), st.integers(0, 5), st.lists(st.integers(0, 5), min_size=y, max_size=y)))
    k = allocate_prefixes(p, outcome, budget, cost=cost, k_max=k_max)
    assert k.dtype == np.int64 and k.shape == (y,) and np.all(k >= 0)
    assert np.sum(k * cost) <= budget + 1e-9
    if k_max is not None:
        assert np.all(k <= np.asarray(k_max))


# ---------- split_budget ----------

@PROPS
@given(total=st.floats(0, 1e6), weights=st.lists(st.floats(0, 1e4), min_size=1, max_size=50))
def test_split_budget_sums_to_total_and_never_exceeds_it(total, weights):
    parts = split_budget(total, weights)
    w = np.asarray(weights)
    assert np.all(parts >= 0) and np.all(parts[w == 0] == 0)
    assert parts.sum() <= total and math.fsum(parts) <= total
    if w.sum() > 0:
        assert parts.sum() == pytest.approx(total, rel=1e-9, abs=1e-9)


def test_split_budget_is_proportional():
    np.testing.assert_allclose(split_budget(12.0, [1, 0, 2, 3]), [2.0, 0.0, 4.0, 6.0])
    assert np.all(split_budget(5.0, [0, 0]) == 0)


# ---------- user errors ----------

@pytest.mark.parametrize("kwargs, names", [
    (dict(budget=-1), "budget"),
    (dict(budget=float("nan")), "budget"),
    (dict(p_success=[0.2, 1.5]), "p_success"),
    (dict(p_success=[0.2, float("nan")]), "p_success"),
    (dict(p_success=[]), "empty candidate pool"),
    (dict(m_min=0), "m_min"),
    (dict(m_min=4, m_max=3), "m_max"),
    (dict(cost=[1.0, 0.0, 1.0]), "cost"),
    (dict(cost=[1.0, float("nan"), 1.0]), "cost"),
    (dict(cost=[1.0, 1.0]), "cost"),
    (dict(value="mixedness"), "value='mixedness'"),
    (dict(solver="greedy"), "solver"),
    (dict(cost=[1.0, 0.5, 1.0], solver="exact"), "cost"),
])
def test_stage1_bad_input_names_the_parameter(kwargs, names):
    args = dict(p_success=[0.2, 0.5, 0.7], budget=10.0) | kwargs
    with pytest.raises(ValueError, match=names):
        solve_roots(**args)


def test_unbounded_nonzero_adv_asks_for_m_max(monkeypatch):
    """m * V_root keeps climbing, so without m_max the relaxation widens until it hits the size limit."""
    from tracerl.core import knapsack
    monkeypatch.setattr(knapsack, "MAX_MATRIX_ENTRIES", 200_000)
    plan = solve_roots(np.full(4, 0.5), 10 ** 4, value="nonzero_adv", solver="lagrangian")  # fits: no error
    assert plan.cost == 10 ** 4 and plan.value == pytest.approx(10 ** 4)  # V <= m: nothing beats 1 per rollout
    with pytest.raises(ValueError, match="set m_max"):
        solve_roots(np.full(4, 0.5), 10 ** 6, value="nonzero_adv", solver="lagrangian")


@pytest.mark.parametrize("kwargs, names", [
    (dict(outcome=[1, 2, 0]), "outcome"),
    (dict(outcome=[1, 0]), "outcome"),
    (dict(p_success=[0.1, -0.2, 0.3]), "p_success"),
    (dict(budget=-0.5), "budget"),
    (dict(cost=[0.5, -0.5, 0.5]), "cost"),
    (dict(k_max=-1), "k_max"),
    (dict(k_max=[1, 2]), "k_max"),
])
def test_stage2_bad_input_names_the_parameter(kwargs, names):
    args = dict(p_success=[0.1, 0.5, 0.9], outcome=[1, 0, 1], budget=3.0) | kwargs
    with pytest.raises(ValueError, match=names):
        allocate_prefixes(**args)


def test_split_budget_bad_input():
    with pytest.raises(ValueError, match="total"):
        split_budget(-1.0, [1, 2])
    with pytest.raises(ValueError, match="weights"):
        split_budget(1.0, [1, -2])
