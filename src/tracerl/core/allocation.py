"""Budget allocation: stage 1 (which prompts, how many fresh rollouts), stage 2 (which prefixes to
continue, how often). What sampling costs (units, tokens, the ledger) is `tracerl.core.ledger`'s.

Stage 1 (docs/design.md, section 2). A prompt with predicted success v given m fresh rollouts is worth
V(v, m), by default V_root(v, m) = 1 - v^m - (1 - v)^m, the chance that its rollouts are mixed. Choose
m_i in {0} ∪ [m_min, m_max] maximising sum_i V(v_i, m_i) s.t. sum_i m_i cost_i <= budget; m_i = 0 filters
the prompt out. With unit costs the marginal gain g(m) = v^m (1 - v) + (1 - v)^m v decreases for
m >= 1, so a greedy over marginal gains (a prompt's first grant being its m_min block) is optimal except
at the budget boundary. Hence two solvers (`tracerl.core.knapsack`): "exact" (DP, small instances) and
"lagrangian" (for scale; the gap to the optimum is bounded by `RootPlan.upper_bound`).

Stage 2. A candidate prefix y whose leaves all have outcome r, with predicted success p, is worth
V_pref(y, k) = 1 - q^k, q = r p + (1 - r)(1 - p), after k continuations. 1 - q^k is concave in k, so a greedy
over marginal gains q^k (1 - q) per unit cost is optimal when costs are equal.

Everything here takes arrays of probabilities and costs, never a predictor, and returns integer counts.
It does not sample, and does not decide the B_root / B_prefix split (the method presets do).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracerl.core.knapsack import solve_exact, solve_lagrangian

AUTO_EXACT_CELLS = 2_000_000  # solver="auto" uses the DP when N * (B + 1) * #m is at most this
AUTO_EXACT_PROMPTS = 4096  # ... and N is at most this (the DP loops over prompts in Python)
_BULK_GRANTS = 4096  # stage 2 hands out increments in bulk before its heap when more could fit


def _consecutive(m: np.ndarray) -> bool:
    return bool(m.size > 1 and m[0] >= 0 and np.all(np.diff(m) == 1))


def _powers(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(M, N) x_i ** m_j, m-major; a running product when m is a run of consecutive integers (fast, exact
    to a few ulps)."""
    if _consecutive(m):
        out = np.empty((m.size, x.size))
        out[0] = x ** m[0]
        if x.size < 256:  # few rows: one cumprod beats a Python loop over many columns
            out[1:] = x
            return np.cumprod(out, axis=0, out=out)
        for j in range(1, m.size):
            np.multiply(out[j - 1], x, out=out[j])
        return out
    return np.power(x[None, :], m[:, None].astype(float))


def v_root(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """V_root(v, m) = 1 - v^m - (1 - v)^m, and 0 for m <= 1: P(m rollouts are mixed) (TRACE, stage 1).

    Returns (N, M) as the transpose of an m-major buffer, the layout the stage-1 solvers read fastest.
    Many rows and consecutive m: one column at a time, the same running products and subtractions as
    `_powers` (so the same floats) without two (M, N) temporaries (4x faster at 100k x 33).
    """
    m = np.asarray(m)
    if p.size >= 256 and _consecutive(m):
        out = np.empty((m.size, p.size))  # (M, N)
        q = 1.0 - p
        p_m, q_m = p ** m[0], q ** m[0]  # (N,) running v^m and (1 - v)^m
        for j in range(m.size):
            if j:
                np.multiply(p_m, p, out=p_m)
                np.multiply(q_m, q, out=q_m)
            np.subtract(1.0, p_m, out=out[j])
            np.subtract(out[j], q_m, out=out[j])
    else:
        out = _powers(p, m)  # (M, N)
        np.subtract(1.0, out, out=out)
        out -= _powers(1.0 - p, m)
    out[m <= 1] = 0.0
    return out.T


def knapsack_rl(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """V_root(v, m) * v (1 - v)^2, the value of KnapsackRL (arXiv 2509.25849)."""
    return v_root(p, m) * (p * (1.0 - p) ** 2)[:, None]


def nonzero_adv(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """m * V_root(v, m): expected number of samples with a non-zero advantage. Concentrates budget."""
    return v_root(p, m) * np.asarray(m, dtype=float)[None, :]


ROOT_VALUES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "v_root": v_root,
    "knapsack_rl": knapsack_rl,
    "nonzero_adv": nonzero_adv,
}


def root_value(p, m, value: str = "v_root") -> np.ndarray:
    """V(p, m) elementwise with numpy broadcasting, e.g. root_value(0.5, 2) == 0.5."""
    fn = _value_fn(value)
    p_arr, m_arr = np.broadcast_arrays(_probabilities(p, "p", ndim=None), _whole(m, "m"))
    uniq, inv = np.unique(m_arr.ravel(), return_inverse=True)
    table = fn(p_arr.ravel().astype(float), uniq)  # (n, #distinct m)
    return table[np.arange(p_arr.size), inv.ravel()].reshape(p_arr.shape)


@dataclass(frozen=True)
class RootPlan:
    """Stage-1 decision and how good it is."""

    counts: np.ndarray  # (N,) int64 fresh rollouts per prompt; 0 = filtered out, else in [m_min, m_max]
    value: float  # sum_i V(p_i, counts_i)
    upper_bound: float  # proven bound on the optimum (== value for "exact"); upper_bound - value bounds the gap
    cost: float  # sum_i counts_i * cost_i, never above the budget
    solver: str  # "exact" or "lagrangian"


def solve_roots(p_success, budget: float, *, m_min: int = 2, m_max: int | None = None, cost=None,
                value: str = "v_root", solver: str = "auto") -> RootPlan:
    """Stage 1: maximise sum_i V(p_i, m_i) s.t. sum_i m_i cost_i <= budget, m_i in {0} ∪ [m_min, m_max].

    With unit costs the marginal gain of V_root decreases for m >= 1, so a greedy over marginal gains
    (a prompt's first grant being its m_min block) is optimal except at the budget boundary (docs/design.md,
    section 2); hence two solvers, and a bound on what the boundary costs:

    - "exact": DP over the budget; integer costs, the budget is floored. upper_bound == value.
    - "lagrangian": bisection on the multiplier of the budget (over per-prompt hulls, see
      `tracerl.core.knapsack`), the feasible side, then a greedy repair of the leftover. upper_bound is the
      dual value at the final multiplier, so the plan is within upper_bound - value of the optimum (0 when
      the multiplier's plan spends the budget exactly; at most about one prompt's value otherwise).
      About 50 ms of CPU time for 100k prompts and a budget of 16 rollouts each (2-core CPU, `tracerl bench
      alloc`; the wall clock depends on what else runs).
    - "auto": exact when costs are integers, N * (B + 1) * #m <= 2e6 and N <= 4096, else lagrangian.

    m_max=None lets the budget alone cap a prompt. Ties go to the lower prompt index. Never overspends.
    """
    p = _probabilities(p_success, "p_success")
    if p.size == 0:
        raise ValueError("empty candidate pool: p_success has no entries; pass at least one prompt")
    budget = _budget(budget)
    m_min = _whole(m_min, "m_min", low=2)  # one rollout is never mixed: the same rule as allocation.m_min
    if m_max is not None:
        m_max = _whole(m_max, "m_max", low=2)
        if m_max < m_min:
            raise ValueError(f"m_min={m_min} > m_max={m_max}; lower m_min or raise m_max")
    c = _costs(cost, p.size)
    fn = _value_fn(value)
    if solver not in ("auto", "exact", "lagrangian"):
        raise ValueError(f"solver={solver!r} is unknown; use 'auto', 'exact' or 'lagrangian'")
    integral = bool(np.all(c == np.round(c)))
    if solver == "auto":
        b = math.floor(budget)
        top = b // int(c.min()) if integral else 0
        top = top if m_max is None else min(top, m_max)
        cells = p.size * (b + 1) * (max(top - m_min + 1, 0) + 1)
        solver = "exact" if integral and cells <= AUTO_EXACT_CELLS and p.size <= AUTO_EXACT_PROMPTS else "lagrangian"
    if solver == "exact":
        if not integral:
            bad = int(np.flatnonzero(c != np.round(c))[0])
            raise ValueError(f"solver='exact' needs integer costs but cost[{bad}]={c[bad]}; "
                             "scale the costs to integers or use solver='lagrangian'")
        counts, val = solve_exact(p, math.floor(budget), m_min, m_max, c.astype(np.int64), fn)
        upper = val
    else:
        counts, val, upper = solve_lagrangian(p, budget, m_min, m_max, c, fn)
    spent = float(np.sum(counts * c))
    assert spent <= budget, f"stage 1 overspent: {spent} > {budget}"  # a solver bug, never user input
    return RootPlan(counts, val, upper, spent, solver)


def allocate_roots(p_success, budget: float, *, m_min: int = 2, m_max: int | None = None, cost=None,
                   value: str = "v_root", solver: str = "auto") -> np.ndarray:
    """Stage-1 counts only: `solve_roots(...).counts`."""
    return solve_roots(p_success, budget, m_min=m_min, m_max=m_max, cost=cost, value=value, solver=solver).counts


def prefix_value(p_success, outcome, k) -> np.ndarray:
    """V_pref = 1 - q^k, q = r p + (1 - r)(1 - p): P(k continuations reach the outcome opposite to r)."""
    p = _probabilities(p_success, "p_success", ndim=None)
    r = _outcomes(outcome, ndim=None)
    k = _whole(k, "k")
    q = np.where(r == 1, p, 1.0 - p)
    return 1.0 - np.power(q, k)


def allocate_prefixes(p_success, outcome, budget: float, *, cost=None, k_max=None) -> np.ndarray:
    """Stage 2: K_y >= 0 maximising sum_y 1 - q_y^K_y s.t. sum_y K_y cost_y <= budget (and K_y <= k_max).

    Greedy over marginal gains q^k (1 - q) per unit cost, ties to the lower index; an increment that no
    longer fits is skipped and the greedy goes on. Optimal for equal costs. Zero-gain increments (q == 1,
    or k >= 2 with q == 0) never get budget. `cost` defaults to ones: pass continuation_cost explicitly.
    """
    p = _probabilities(p_success, "p_success")
    r = _outcomes(outcome, ndim=1)
    if r.shape != p.shape:
        raise ValueError(f"outcome has shape {r.shape} but p_success has {p.shape}; give one outcome per candidate")
    budget = _budget(budget)
    c = _costs(cost, p.size)
    if k_max is None:
        cap = np.full(p.size, np.iinfo(np.int64).max // 4, dtype=np.int64)
    else:
        if np.ndim(k_max) and np.shape(k_max) != p.shape:
            raise ValueError(f"k_max has shape {np.shape(k_max)} but p_success has {p.shape}; give one per candidate")
        cap = np.broadcast_to(_whole(k_max, "k_max"), p.shape).astype(np.int64)
    grants = np.zeros(p.size, dtype=np.int64)
    q = np.where(r == 1, p, 1.0 - p)
    live = (q < 1.0) & (cap > 0) & (c <= budget)
    if not live.any():
        return grants
    if budget / c[live].min() > _BULK_GRANTS:
        grants = _bulk_prefix_grants(q, c, np.where(live, cap, 0), budget)
    todo = np.flatnonzero(live & (grants < cap))
    first = np.power(q[todo], grants[todo]) * (1.0 - q[todo]) / c[todo]
    heap = list(zip((-first).tolist(), todo.tolist()))
    heapq.heapify(heap)
    qs, cs, caps, ks = q.tolist(), c.tolist(), cap.tolist(), grants.tolist()  # Python scalars: a fast loop
    spent = float(np.sum(grants * c))
    while heap:
        neg_ratio, y = heapq.heappop(heap)
        if neg_ratio >= 0.0 or spent + cs[y] > budget:
            continue  # no gain, or it no longer fits (nor will it: what is left only shrinks)
        ks[y] += 1
        spent += cs[y]
        if ks[y] < caps[y]:
            heapq.heappush(heap, (-(qs[y] ** ks[y]) * (1.0 - qs[y]) / cs[y], y))
    return np.array(ks, dtype=np.int64)


def _bulk_prefix_grants(q: np.ndarray, c: np.ndarray, cap: np.ndarray, budget: float) -> np.ndarray:
    """All increments with gain per cost above a multiplier lam whose total cost fits: a prefix of the
    greedy's order that fits whole, so the greedy takes exactly these first. lam by bisection (log scale)."""
    first = (1.0 - q) / c  # (Y,) gain per cost of the first continuation
    with np.errstate(divide="ignore"):
        log_first, log_q = np.log(first), np.log(q)

    def above(log_lam: float) -> np.ndarray:  # increments with q^(k-1) (1 - q) / c > lam, i.e. k - 1 < x
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.minimum((log_lam - log_first) / np.where(q > 0.0, log_q, -np.inf), 4e18)
        n = np.where(log_first > log_lam, np.maximum(np.ceil(x), 1.0), 0.0)  # q == 0: one increment
        return np.minimum(n, cap_f)  # float counts: exact below 2^53, and a fast dot with c

    cap_f = cap.astype(float)
    lo, hi = float(log_first.max()) - 700.0, float(log_first.max())
    if float(np.sum(above(lo) * c)) <= budget:
        hi = lo
    for _ in range(64 if hi > lo else 0):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if float(np.sum(above(mid) * c)) <= budget else (mid, hi)
    return above(hi).astype(np.int64)


def split_budget(total: float, weights) -> np.ndarray:
    """total * w_i / sum(w): e.g. B_prefix across prompts in proportion to their stage-1 grants.

    Zero weights get zero; all-zero weights give all zeros. The parts never sum above `total`.
    """
    total = _budget(total, "total")
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be a 1-d array of finite numbers >= 0 (e.g. the stage-1 counts)")
    if w.sum() <= 0:
        return np.zeros(w.size)
    out = total * (w / w.sum())
    for _ in range(8):  # rounding can push the sum a few ulps past total: take it off the largest part
        excess = max(math.fsum(out), float(out.sum())) - total
        if excess <= 0:
            break
        j = int(np.argmax(out))
        out[j] = max(0.0, out[j] - max(excess, math.ulp(out[j])))
    return out


# ---- input checks: user errors become ValueErrors that say what to change ----

def _value_fn(value: str):
    if value not in ROOT_VALUES:
        raise ValueError(f"value={value!r} is unknown; use one of {sorted(ROOT_VALUES)}")
    return ROOT_VALUES[value]


def _probabilities(x, name: str, ndim: int | None = 1) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be a 1-d array of probabilities, got shape {a.shape}")
    bad = ~((a >= 0.0) & (a <= 1.0))  # NaN fails both
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), a.shape)
        raise ValueError(f"{name}{list(i) if i else ''}={a[i]} is not a probability in [0, 1]; "
                         "clip or fix the predictor output")
    return a


def _outcomes(x, ndim: int | None) -> np.ndarray:
    a = np.asarray(x)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"outcome must be a 1-d array of 0/1 rewards, got shape {a.shape}")
    bad = ~np.isin(a, (0, 1))
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), a.shape)
        raise ValueError(f"outcome{list(i) if i else ''}={a[i]} must be 0 or 1 "
                         "(the shared reward of the candidate's leaves)")
    return a.astype(np.int64)


def _budget(x, name: str = "budget") -> float:
    try:
        value = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={x!r} must be a finite number >= 0") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={x} must be a finite number >= 0")
    return value


def _costs(cost, n: int) -> np.ndarray:
    if cost is None:
        return np.ones(n)
    c = np.asarray(cost, dtype=float)
    if c.ndim == 0:
        c = np.full(n, float(c))
    if c.shape != (n,):
        raise ValueError(f"cost has shape {c.shape} but there are {n} candidates; give one cost per candidate")
    bad = ~(np.isfinite(c) & (c > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"cost[{i}]={c[i]} must be a finite number > 0")
    return c


def _whole(x, name: str, low: int = 0):
    """A non-negative integer (or array of them) >= low; floats such as 4.0 are accepted."""
    a = np.asarray(x)
    whole_floats = np.issubdtype(a.dtype, np.floating) and np.all(np.isfinite(a)) and np.all(a == np.round(a))
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or whole_floats):
        raise ValueError(f"{name}={x!r} must be an integer >= {low}")
    if np.any(a < low):
        raise ValueError(f"{name}={x!r} must be an integer >= {low}")
    return int(a) if a.ndim == 0 else a.astype(np.int64)
