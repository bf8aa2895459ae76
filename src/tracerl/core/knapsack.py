"""Stage-1 solvers: choose m_i in {0} ∪ [m_min, m_max] maximising sum_i V_i(m_i) s.t. sum_i c_i m_i <= B.

Two solvers, both deterministic (ties give the budget to the lower prompt index first):

- `solve_exact`: dynamic programming over the integer budget, O(N * B * #m). Among optimal plans it
  returns the cheapest one, and among those the one that gives each prompt in index order the most.
- `solve_lagrangian`: for scale. Relaxing the budget with a multiplier lambda splits the problem into
  one tiny problem per prompt, argmax_m V_i(m) - lambda c_i m (ties -> smallest m), whose answer always
  lies on the upper concave hull of the points (0, 0), (m, V_i(m)). So instead of re-evaluating an (N, M)
  matrix at every bisection step, each prompt's hull is built once (segments of slope "value per budget
  unit") and the bisection runs on the flat list of segment slopes: a weighted quickselect that drops
  settled segments as the bracket shrinks, and returns exactly the lambda* a bisection converges to. The
  plan takes every segment steeper than lambda* (the feasible side); a greedy repair spends the rest; the
  dual value at lambda* is the upper bound. With m_max=None the columns start at about twice the mean
  grant and double for prompts whose hull still climbs at the cap, so the bound is proven whenever V's
  increments are eventually non-increasing (all registered values); with m_max set it always is.

Arrays are m-major, (K, n), so each step along m is one contiguous vector operation. With many prompts
(n >= 256) a pass over a (K, n) array goes row by row through (n,) buffers: at 100,000 prompts such an array
is 26 MB and memory traffic sets the time, so each pass reads it once and makes no (K, n) temporary; the float
operations are those of the whole-array forms, so the plans are float for float those of the solver before
(tests/unit/test_knapsack.py). The values come from a registered function (see `allocation.ROOT_VALUES`); this
module never knows which, and it does not validate user input: `allocation.solve_roots` does that before
calling in. Numpy alone: no threads, no compiled code.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ValueFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

MAX_MATRIX_ENTRIES = 50_000_000  # lagrangian: V matrix entries over all prompts and columns
MAX_DP_CELLS = 200_000_000  # exact: option x budget cells the DP may visit
MAX_DP_TABLE = 20_000_000  # exact: (N + 1) x (B + 1) floats kept for the backtrack
BY_COLUMN_FROM = 256  # prompts from which a pass over a (K, n) array goes row by row (the same floats)
BATCH_MOVES = 32  # repair: vectorised rounds while a round moves at least this many prompts, then a heap


def solve_exact(p: np.ndarray, budget: int, m_min: int, m_max: int | None, cost: np.ndarray,
                fn: ValueFn) -> tuple[np.ndarray, float]:
    """Optimal counts by DP over the integer budget (integer costs). Returns (counts, value)."""
    n = p.size
    cap = budget // cost if m_max is None else np.minimum(budget // cost, m_max)  # (N,) largest feasible m
    counts = np.zeros(n, dtype=np.int64)
    top = int(cap.max())
    if top < m_min:
        return counts, 0.0
    num_opts = np.maximum(cap - m_min + 1, 0)  # (N,) non-zero options per prompt
    cells = int(num_opts.sum()) * (budget + 1)
    if cells > MAX_DP_CELLS or (n + 1) * (budget + 1) > MAX_DP_TABLE:
        raise ValueError(f"solver='exact' needs {cells:.2e} DP cells for {n} prompts and budget {budget}; "
                         "use solver='lagrangian' (or 'auto'), set m_max, or lower the budget")
    ms = np.arange(m_min, top + 1)
    values = fn(p, ms)  # (N, K)
    b_idx = np.arange(budget + 1)
    best = np.zeros((n + 1, budget + 1))  # best[i, b]: optimum of prompts i.. with at most b units
    for i in range(n - 1, -1, -1):
        nxt = best[i + 1]
        best[i] = nxt
        k = num_opts[i]
        if k:
            src = b_idx[None, :] - (ms[:k] * cost[i])[:, None]  # (k, B+1) budget left for prompts i+1..
            cand = np.where(src >= 0, nxt[np.maximum(src, 0)] + values[i, :k, None], -np.inf)
            np.maximum(best[i], cand.max(axis=0), out=best[i])
    opt = best[0, budget]
    tol = 1e-10 * (1.0 + abs(opt))
    b = int(np.argmax(best[0] >= opt - tol))  # cheapest budget that reaches the optimum
    for i in range(n):
        k = num_opts[i]
        if not k:
            continue
        shifts = ms[:k] * cost[i]
        ok = shifts <= b
        ok[ok] = values[i, :k][ok] + best[i + 1][b - shifts[ok]] >= best[i, b] - tol
        if ok.any():  # the largest count that stays optimal: lower index gets the budget first
            j = int(np.flatnonzero(ok)[-1])
            counts[i] = ms[j]
            b -= int(shifts[j])
    chosen = counts > 0
    value = float(values[chosen, counts[chosen] - m_min].sum())
    return counts, value


class _Block:
    """Per-prompt hulls of some prompts over the columns m = m_min..m_cap, as segments (slope, cost).

    Most value functions (all registered ones except nonzero_adv at extreme p) have non-increasing
    increments after the first hull vertex, so a prompt's hull is a *chain*: one entry segment 0 -> m_k
    then one segment per column. Prompts whose increments rise again get a general hull instead.
    Arrays are stored m-major, (K, n), so that every step along m is one contiguous vector operation.
    """

    def __init__(self, rows: np.ndarray, p: np.ndarray, cost: np.ndarray, m_min: int, m_cap: int, fn: ValueFn):
        self.rows, self.m_cap = rows, m_cap
        self.ms = ms = np.arange(m_min, m_cap + 1)
        self.c = cost[rows]
        self.unit_cost = bool(np.all(self.c == self.c[0]))
        u = np.ascontiguousarray(np.asarray(fn(p[rows], ms), dtype=float).T)  # (K, n)
        if not (self.unit_cost and self.c[0] == 1.0):
            u = u / (self.c[0] if self.unit_cost else self.c)  # value per budget unit
        self.u = u
        k, n = u.shape
        self.live = np.ones(n, dtype=bool)  # False once the prompt moved to a wider block
        chains = _chains_by_column if n >= BY_COLUMN_FROM else _chains_whole  # the same floats either way
        entry, first, inc, rising = chains(u, ms, m_cap)
        self.hull_loc = np.flatnonzero(rising)
        entry[self.hull_loc] = -np.inf
        inc[:, self.hull_loc] = -np.inf
        self.entry, self.first, self.inc = entry, first, inc
        self.hull_s, self.hull_m = _upper_hull(u[:, self.hull_loc].T, ms)

    def segments(self) -> list[tuple[np.ndarray, np.ndarray | float]]:
        """(slopes, costs) of every segment; costs broadcast against slopes (one float, or one per prompt)."""
        c = self.c
        segs = [(self.entry, self.ms[self.first] * c), (self.inc, float(c[0]) if self.unit_cost else c)]
        if self.hull_loc.size:
            prev = np.concatenate([np.zeros((self.hull_m.shape[0], 1)), self.hull_m[:, :-1]], axis=1)
            segs.append((self.hull_s.ravel(), ((self.hull_m - prev) * c[self.hull_loc, None]).ravel()))
        return segs

    def choose(self, lam: float) -> np.ndarray:
        """Each prompt's argmax_m V(m) - lam c m (ties -> smallest m): the end of its segments steeper than lam."""
        m = np.where(self.entry > lam, self.ms[self.first] + _count_above(self.inc, lam), 0)
        if self.hull_loc.size:
            taken = (self.hull_s > lam).sum(axis=1)
            ends = self.hull_m[np.arange(taken.size), np.maximum(taken - 1, 0)]
            m[self.hull_loc] = np.where(taken > 0, ends, 0)
        return m

    def last_slope(self) -> np.ndarray:
        """Slope of each prompt's hull segment that ends at the cap (-inf once retired)."""
        out = np.where(self.first == self.ms.size - 1, self.entry, self.inc[-1])
        if self.hull_loc.size:
            out[self.hull_loc] = self.hull_s[np.arange(self.hull_loc.size), (self.hull_m > 0).sum(axis=1) - 1]
        return out

    def dual_terms(self, lam: float) -> float:
        """sum over live prompts of max(0, max_m V(m) - lam c m)."""
        if self.c.size >= BY_COLUMN_FROM:
            best, buf = np.zeros(self.c.size), np.empty(self.c.size)
            for j, m in enumerate(self.ms):
                np.subtract(self.u[j], lam * m, out=buf)
                np.maximum(best, buf, out=best)
        else:
            best = np.maximum((self.u - lam * self.ms[:, None]).max(axis=0), 0.0)
        return float((best * self.c)[self.live].sum())

    def value(self, loc: np.ndarray, m: np.ndarray) -> np.ndarray:
        """V(m) of local prompts `loc` (0 where m == 0)."""
        col = np.maximum(m - self.ms[0], 0)
        return np.where(m > 0, self.u[col, loc] * self.c[loc], 0.0)

    def next_vertex(self, loc: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Smallest hull vertex above m: the farthest a greedy move from m needs to look."""
        entry = self.ms[self.first[loc]]
        out = np.where(m < entry, entry, m + 1)
        hull = np.flatnonzero(np.isin(loc, self.hull_loc))
        if hull.size:
            ends = self.hull_m[np.searchsorted(self.hull_loc, loc[hull])]  # (h, H) ascending, 0-padded
            out[hull] = np.where(ends > m[hull, None], ends, np.iinfo(np.int64).max).min(axis=1)
        return out

    def retire(self, loc: np.ndarray) -> None:
        """Hand prompts over to a wider block: their segments leave this one."""
        self.live[loc] = False
        self.entry[loc] = -np.inf
        self.inc[:, loc] = -np.inf
        if self.hull_loc.size:
            self.hull_s[np.isin(self.hull_loc, loc)] = -np.inf


def _chains_whole(u: np.ndarray, ms: np.ndarray, m_cap: int):
    """Each prompt's chain (see _Block), whole-array ops for few prompts: (entry slope, its column, inc[j] the
    slope of ms[j-1] -> ms[j] or -inf, whether increments rise again beyond float noise: a general hull)."""
    k, n = u.shape
    ratio = u / ms[:, None]
    first = np.argmax(ratio, axis=0)  # the steepest segment from the origin, first on ties
    entry = ratio[first, np.arange(n)]
    inc = np.empty_like(u)  # +inf while inside the entry segment
    inc[0] = np.inf
    np.subtract(u[1:], u[:-1], out=inc[1:])
    inside = [(j, first >= j) for j in range(1, int(first.max()) + 1)]
    for j, mask in inside:
        inc[j, mask] = np.inf
    after = np.flatnonzero(first + 1 < k)
    flat, at = inc.reshape(-1), (first[after] + 1) * n + after  # first chain step is no steeper than the entry
    flat[at] = np.minimum(flat[at], entry[after])
    tol = 1e-12 * (1.0 + np.abs(entry) * m_cap + np.abs(u[-1]))
    flat_inc = np.minimum.accumulate(inc, axis=0)  # a chain must not rise; float noise below tol is flattened
    rising = (inc[2:] > flat_inc[1:-1] + tol).any(axis=0)
    inc = flat_inc
    inc[0] = -np.inf
    for j, mask in inside:
        inc[j, mask] = -np.inf
    return entry, first, inc, rising


def _chains_by_column(u: np.ndarray, ms: np.ndarray, m_cap: int):
    """`_chains_whole` for many prompts: the same floats, one column at a time through (n,) buffers."""
    k, n = u.shape
    entry, first = u[0] / ms[0], np.zeros(n, dtype=np.int64)
    buf, hit = np.empty(n), np.empty(n, dtype=bool)
    for j in range(1, k):  # the steepest segment from the origin, first on ties
        np.divide(u[j], ms[j], out=buf)  # ratio V(ms[j]) / ms[j]
        np.greater(buf, entry, out=hit)
        if hit.any():  # np.maximum(entry, buf) for finite values, skipped when it would change nothing
            first[hit] = j
            np.copyto(entry, buf, where=hit)
    tol = 1e-12 * (1.0 + np.abs(entry) * m_cap + np.abs(u[-1]))
    top = int(first.max())
    inc = np.empty_like(u)
    inc[0] = -np.inf
    rising = np.zeros(n, dtype=bool)
    for j in range(1, k):
        row = inc[j]
        np.subtract(u[j], u[j - 1], out=row)
        if j <= top:
            row[first >= j] = np.inf  # inside the entry segment: +inf while flattening, -inf at the end
        if j <= top + 1:  # the first chain step is no steeper than the entry
            np.minimum(row, entry, out=row, where=first == j - 1)
        if j >= 2:  # a chain must not rise; float noise below tol is flattened
            prev = inc[j - 1]
            np.greater(row, prev, out=hit)  # row > prev + tol needs row > prev (tol > 0): test only those
            if hit.any():
                at = np.flatnonzero(hit)
                rising[at] |= row[at] > prev[at] + tol[at]
            np.minimum(row, prev, out=row)
    for j in range(1, top + 1):
        inc[j, first >= j] = -np.inf
    return entry, first, inc, rising


def solve_lagrangian(p: np.ndarray, budget: float, m_min: int, m_max: int | None, cost: np.ndarray,
                     fn: ValueFn) -> tuple[np.ndarray, float, float]:
    """Lagrangian counts plus greedy repair. Returns (counts, value, upper_bound)."""
    n = p.size
    integral = bool(np.all(cost == np.round(cost)))
    fit = float(np.floor(budget)) if integral else budget * (1.0 - 1e-12)  # float sums must not round past B
    hard = np.floor(budget / cost).astype(np.int64)  # (N,) most rollouts a prompt could afford alone
    cap = hard if m_max is None else np.minimum(hard, m_max)
    rows = np.flatnonzero(cap >= m_min)
    counts = np.zeros(n, dtype=np.int64)
    if rows.size == 0:
        return counts, 0.0, 0.0
    if m_max is None:  # start narrow; prompts whose hull still climbs at the cap get a block twice as wide
        m_cap = min(int(cap.max()), m_min + min(64, 2 * int(np.ceil(budget / cost.sum()))))
    else:
        m_cap = int(cap.max())
    _check_size(rows.size * (m_cap - m_min + 1), m_max)
    blocks = [_Block(rows, p, cost, m_min, m_cap, fn)]
    owner = np.full(n, -1)  # block index of each prompt
    owner[rows] = 0
    loc = np.zeros(n, dtype=np.int64)  # row of each prompt inside its block
    loc[rows] = np.arange(rows.size)
    while True:
        lam = _threshold([s for b in blocks for s in b.segments()], fit)
        if m_max is not None:
            break
        grown = False
        for blk in list(blocks):  # a prompt whose hull still climbs at the cap might want more than the cap
            last = blk.last_slope()
            climbs = (last > lam) | ((last == lam) & (lam > 0))
            at_cap = np.flatnonzero(blk.live & climbs & (hard[blk.rows] > blk.m_cap))
            if at_cap.size:
                ext = blk.rows[at_cap]
                wider = min(2 * blk.m_cap, int(hard[ext].max()))
                _check_size(sum(b.u.size for b in blocks) + ext.size * (wider - m_min + 1), m_max)
                blk.retire(at_cap)
                blocks.append(_Block(ext, p, cost, m_min, wider, fn))
                owner[ext], loc[ext] = len(blocks) - 1, np.arange(ext.size)
                grown = True
        if not grown:
            break
    for blk in blocks:  # the plan at the final lambda (every prompt is live in one block, so all are set)
        counts[blk.rows[blk.live]] = blk.choose(lam)[blk.live]
    upper = sum(b.dual_terms(lam) for b in blocks) + lam * (fit if integral else budget)  # dual value at lam
    m_top = np.zeros(n, dtype=np.int64)
    for blk in blocks:
        m_top[blk.rows[blk.live]] = blk.m_cap
    solver = _Solver(blocks, owner, loc, counts, cost, m_min, np.minimum(m_top, cap))
    solver.repair(fit - float(np.sum(counts * cost)))
    value = float(solver.per_block("value", np.arange(n), counts).sum())
    return counts, value, max(upper, value)


def _check_size(entries: int, m_max: int | None) -> None:
    if entries > MAX_MATRIX_ENTRIES:
        hint = "set m_max" if m_max is None else "lower m_max"
        raise ValueError(f"stage-1 relaxation needs {entries:.2e} value entries (> {MAX_MATRIX_ENTRIES:.0e}); "
                         f"{hint} to cap the rollouts one prompt may get")


@dataclass
class _Solver:
    """The Lagrangian solver's state over all prompts (N of them), shared by the repair's helpers."""

    blocks: list[_Block]  # the prompts' hull blocks (a prompt whose hull climbed at the cap moves to a wider one)
    owner: np.ndarray  # (N,) block index of each prompt, -1 when it can afford no m_min block
    loc: np.ndarray  # (N,) row of each prompt inside its block
    counts: np.ndarray  # (N,) current grants, changed in place by the repair
    cost: np.ndarray  # (N,) cost of one rollout of each prompt
    m_min: int
    m_top: np.ndarray  # (N,) most rollouts each prompt may get (its block's cap, the budget, m_max)

    def per_block(self, method: str, idx: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Call a _Block method for prompts `idx` (global ids), each in the block that owns it."""
        out = np.zeros(idx.size, dtype=float if method == "value" else np.int64)
        whose = self.owner[idx]
        for bi in np.flatnonzero(np.bincount(whose[whose >= 0], minlength=len(self.blocks))).tolist():
            sel = np.flatnonzero(whose == bi)
            out[sel] = getattr(self.blocks[bi], method)(self.loc[idx[sel]], m[sel])
        return out

    def repair(self, left: float) -> None:
        """Spend `left` greedily by gain per cost (ties: lower index). A prompt's move is its best affordable
        m -> m' up to its next hull vertex (entering at m' >= m_min): for a chain that is m -> m + 1, or the
        entry block for a prompt not yet in. Vectorised rounds (every prompt proposes one move, the best are
        taken while they fit) while many prompts move at once, then one move at a time from a heap."""
        counts, cost, m_min = self.counts, self.cost, self.m_min
        while True:
            idx = np.flatnonzero((np.where(counts == 0, m_min, counts + 1) <= self.m_top) & (cost <= left))
            ratio, target = self.best_moves(idx, left)
            pos = ratio > 0
            if not pos.any():
                return
            idx, ratio, target = idx[pos], ratio[pos], target[pos]
            order = np.lexsort((idx, -ratio))
            spent = np.cumsum(((target - counts[idx]) * cost[idx])[order])
            take = order[: int(np.searchsorted(spent, left, side="right"))]
            counts[idx[take]] = target[take]
            left -= float(spent[take.size - 1])
            if take.size < BATCH_MOVES:
                break
        heap = [(-r, i, t) for r, i, t in zip(ratio.tolist(), idx.tolist(), target.tolist())]  # one proposal per prompt
        heapq.heapify(heap)
        cheapest = float(cost.min())
        while heap and left >= cheapest:
            _, i, m1 = heapq.heappop(heap)
            if m1 <= counts[i]:
                pass  # taken in the last round: propose its next move
            elif (m1 - counts[i]) * cost[i] <= left:
                left -= (m1 - counts[i]) * cost[i]
                counts[i] = m1
                left -= self.run(heap, i, left)
            elif (m_min if counts[i] == 0 else 1) * cost[i] > left:
                continue  # nothing this prompt could do fits any more: what is left only shrinks
            ratio, target = self.best_moves(np.array([i]), left)
            if ratio[0] > 0:
                heapq.heappush(heap, (-float(ratio[0]), i, int(target[0])))

    def run(self, heap, i: int, left: float) -> float:
        """Let prompt i keep taking single steps m -> m + 1 while each beats the best other proposal and
        fits (what the one-at-a-time greedy would do, without a heap round trip per step). Returns the cost."""
        m, c = int(self.counts[i]), float(self.cost[i])
        width = min(int(self.m_top[i]) - m, int(left // c), 4096)
        one = np.array([i])
        if width <= 0 or self.per_block("next_vertex", one, self.counts[one])[0] != m + 1:
            return 0.0
        vals = self.per_block("value", np.full(width + 1, i), np.arange(m, m + width + 1))
        ratio = np.diff(vals) / c
        beats = ratio > 0
        if heap:
            top_ratio, top_i, _ = heap[0]
            beats &= (ratio > -top_ratio) | ((ratio == -top_ratio) & (i < top_i))
        steps = int(np.argmin(beats)) if not beats.all() else width
        self.counts[i] = m + steps
        return steps * c

    def best_moves(self, idx: np.ndarray, left: float) -> tuple[np.ndarray, np.ndarray]:
        """Best affordable move of each prompt in idx: (gain per cost, target count); -inf when none."""
        m0, c = self.counts[idx], self.cost[idx]
        lo = np.where(m0 == 0, self.m_min, m0 + 1)
        reach = np.minimum(np.minimum(self.m_top[idx], m0 + np.floor(left / c + 1e-9).astype(np.int64)),
                           self.per_block("next_vertex", idx, m0))
        reach = np.where((reach - m0) * c <= left, reach, reach - 1)  # the floor above may round up by one
        best, target = np.full(idx.size, -np.inf), m0.copy()
        ok = np.flatnonzero(reach >= lo)
        ok = ok[np.argsort(reach[ok] - lo[ok], kind="stable")]  # narrow scans first, in chunks of similar width
        widths = reach[ok] - lo[ok] + 1
        while ok.size:  # at most 2^22 candidate targets per chunk
            k = max(1, int(np.searchsorted((np.arange(ok.size) + 1) * widths, 1 << 22, side="right")))
            now, width, ok, widths = ok[:k], int(widths[k - 1]), ok[k:], widths[k:]
            m1 = np.minimum(lo[now, None] + np.arange(width), reach[now, None])  # (k, width) candidate targets
            gain = self.per_block("value", np.repeat(idx[now], width), m1.ravel()).reshape(m1.shape) \
                - self.per_block("value", idx[now], m0[now])[:, None]
            ratio = gain / ((m1 - m0[now, None]) * c[now, None])
            j = np.argmax(ratio, axis=1)  # first max: the smallest target wins ties
            best[now], target[now] = ratio[np.arange(now.size), j], m1[np.arange(now.size), j]
        return best, target


def _threshold(segments: list[tuple[np.ndarray, np.ndarray | float]], budget: float) -> float:
    """lambda*: the largest slope t with cost(slopes >= t) > budget, or 0 when all positive slopes fit.

    Taking every segment with slope > lambda* is the feasible side of the bisection. A weighted quickselect
    over the parts as given (the big ones are never copied whole; a part's costs broadcast against its
    slopes): each round brackets the crossing that a random sample predicts with two pivots, and keeps
    only the undecided slopes.
    """
    parts = [(s, w) for s, w in segments if s.size]
    base = 0.0  # cost of the slopes known to be > lambda*
    rng = np.random.default_rng(0)  # pivots only; the answer does not depend on them
    tiny = np.nextafter(0.0, 1.0)  # slopes <= 0 are never taken
    while (total := sum(s.size for s, _ in parts)) > 4096:
        picks = [rng.integers(0, s.size, max(1, 16384 * s.size // total)) for s, _ in parts]
        sample = np.concatenate([s.ravel()[i] for (s, _), i in zip(parts, picks)])
        sample_w = np.concatenate([np.broadcast_to(w, s.shape).flat[i] for (s, w), i in zip(parts, picks)])
        order = np.argsort(-sample)
        est = base + np.cumsum(sample_w[order]) * (total / sample.size)
        at = int(np.searchsorted(est, budget, side="right"))
        hi = max(float(sample[order[max(at - 256, 0)]]), tiny)
        lo = max(float(sample[order[min(at + 256, sample.size - 1)]]), tiny)
        w_hi, w_lo, between = _split(parts, lo, hi)
        if base + w_hi > budget:  # lambda* >= hi
            parts = _compress(parts, [s >= hi for s, _ in parts])
        elif base + w_lo > budget:  # lo <= lambda* < hi (the usual case)
            base, parts = base + w_hi, between
        else:  # lambda* < lo
            base, parts = base + w_lo, _compress(parts, [np.greater(s > 0, s >= lo) for s, _ in parts])
        if sum(s.size for s, _ in parts) == total:  # nothing decided: hi is the smallest slope left
            w_strict, gt = _weight_at_least(parts, np.nextafter(hi, math.inf))
            if base + w_strict <= budget:
                return hi
            parts = _compress(parts, gt)
    parts = _compress(parts, [s > 0 for s, _ in parts])
    s = np.concatenate([s for s, _ in parts] + [np.zeros(0)])
    w = np.concatenate([np.broadcast_to(w, s_.shape) for s_, w in parts] + [np.zeros(0)])
    order = np.argsort(-s, kind="stable")
    spent = base + np.cumsum(w[order])
    if s.size == 0 or spent[-1] <= budget:
        return 0.0
    return float(s[order][int(np.searchsorted(spent, budget, side="right"))])


def _split(parts, lo: float, hi: float) -> tuple[float, float, list[tuple[np.ndarray, np.ndarray | float]]]:
    """(cost of the slopes >= hi, cost of those >= lo, the slopes in [lo, hi) with their costs), lo <= hi: the
    floats of `_weight_at_least` at hi and at lo and of `_compress` to the slopes between, but a big (K, n) part
    is read once, row by row, not twice as whole-array masks (2.5x faster at 33 x 100,000 on a busy machine)."""
    w_hi = w_lo = 0.0
    between = []
    for s, w in parts:
        if not (s.ndim == 2 and s.shape[1] >= BY_COLUMN_FROM and np.shape(w) in ((), (s.shape[1],))):
            (c_hi, (ge_hi,)), (c_lo, (ge_lo,)) = _weight_at_least([(s, w)], hi), _weight_at_least([(s, w)], lo)
            w_hi, w_lo = w_hi + c_hi, w_lo + c_lo
            between += _compress([(s, w)], [np.greater(ge_lo, ge_hi, out=ge_lo)])  # at least lo, not hi
            continue
        per_column = np.ndim(w) == 1  # one cost per column: count per column (uint8 cannot wrap for K < 256)
        n_hi, n_lo = np.zeros((2, s.shape[1]), dtype=np.uint8 if s.shape[0] < 256 else np.int64) if per_column \
            else (0, 0)
        ge_hi, ge_lo = np.empty((2, s.shape[1]), dtype=bool)
        kept_s, kept_w = [], []
        for row in s:
            np.greater_equal(row, hi, out=ge_hi)
            np.greater_equal(row, lo, out=ge_lo)
            if per_column:
                np.add(n_hi, ge_hi, out=n_hi)
                np.add(n_lo, ge_lo, out=n_lo)
            else:
                n_hi, n_lo = n_hi + np.count_nonzero(ge_hi), n_lo + np.count_nonzero(ge_lo)
            at = np.flatnonzero(np.greater(ge_lo, ge_hi, out=ge_lo))
            kept_s.append(row[at])
            kept_w.append(w[at] if per_column else None)
        w_hi += float(np.sum(n_hi * w)) if per_column else float(n_hi) * float(w)
        w_lo += float(np.sum(n_lo * w)) if per_column else float(n_lo) * float(w)
        if sum(k.size for k in kept_s):
            between.append((np.concatenate(kept_s), np.concatenate(kept_w) if per_column else w))
    return w_hi, w_lo, between


def _weight_at_least(parts, t: float) -> tuple[float, list[np.ndarray]]:
    """Total cost of the segments with slope >= t, and the masks."""
    masks = [s >= t for s, _ in parts]
    total = 0.0
    for (s, w), m in zip(parts, masks):
        if np.ndim(w) == 0:
            total += float(np.count_nonzero(m)) * float(w)
        elif np.shape(w) == s.shape:
            total += float(np.sum(w, where=m))
        else:  # one cost per column of a (K, n) part
            total += float(np.sum(np.count_nonzero(m, axis=0) * w))
    return total, masks


def _compress(parts, masks) -> list[tuple[np.ndarray, np.ndarray | float]]:
    """Keep the masked slopes of each part (flattened), with their costs."""
    out = []
    for (s, w), m in zip(parts, masks):
        if m.any():
            out.append((s[m], w if np.ndim(w) == 0 else np.broadcast_to(w, s.shape)[m]))
    return out


def _count_above(a: np.ndarray, t: float) -> np.ndarray:
    """(n,) number of entries > t in each column of a (K, n) array: np.count_nonzero(a > t, axis=0), but for
    large n row by row into uint8 counts (no wrap for K < 256) with no (K, n) mask, several times faster."""
    k, n = a.shape
    if n < BY_COLUMN_FROM or k >= 256:
        return np.count_nonzero(a > t, axis=0)
    counts, hit = np.zeros(n, dtype=np.uint8), np.empty(n, dtype=bool)
    for row in a:
        np.add(counts, np.greater(row, t, out=hit), out=counts)
    return counts


def _upper_hull(u: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper concave hull of (0, 0), (ms[j], u[i, j]) per row, found for all rows in lockstep (monotone chain).

    Returns slopes (g, H), non-increasing along each row and -inf-padded, and the m at each segment's end.
    """
    g, k = u.shape
    if g == 0:
        return np.zeros((0, 1)), np.zeros((0, 1), dtype=np.int64)
    x = np.concatenate([[0], ms]).astype(float)
    y = np.concatenate([np.zeros((g, 1)), u], axis=1)  # (g, K+1), point 0 is the origin
    stack = np.zeros((g, k + 1), dtype=np.int64)
    top = np.zeros(g, dtype=np.int64)
    r = np.arange(g)
    for j in range(1, k + 1):
        while True:
            live = np.flatnonzero(top >= 1)
            a, b = stack[live, top[live] - 1], stack[live, top[live]]
            ya, yb = y[live, a], y[live, b]
            drop = (yb - ya) * (x[j] - x[b]) <= (y[live, j] - yb) * (x[b] - x[a])  # b is not above chord a-j
            if not drop.any():
                break
            top[live[drop]] -= 1
        top += 1
        stack[r, top] = j
    h = int(top.max())
    ends, starts = stack[:, 1:h + 1], stack[:, :h]
    valid = np.arange(h) < top[:, None]
    rise = y[r[:, None], ends] - y[r[:, None], starts]
    slopes = np.divide(rise, x[ends] - x[starts], out=np.full(rise.shape, -np.inf), where=valid)  # past a hull: none
    slopes = np.minimum.accumulate(slopes, axis=1)
    return slopes, np.where(valid, x[ends], 0).astype(np.int64)
