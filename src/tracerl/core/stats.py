"""Statistics for method comparisons: curves read at equal cost, paired differences with confidence intervals.

A comparison trains every method on the same seeds and evaluates each run on the same held-out questions, so
the natural unit of evidence is the paired difference: for seed s and question q, the method's success on q
minus the baseline's success on q, both read at the same cost. Cost is cumulative sampled tokens or budget
units; methods are evaluated at their own cost points, so a curve is read at another cost by linear
interpolation between its evaluations (`interpolate_at`), never by extrapolation past its last one.

The confidence interval treats seeds as the independent draws (a run's training noise is the larger part of
the spread): with S >= 2 seeds it is the Student-t interval over the S per-seed mean differences; with one seed
it falls back to the normal interval over the question-level differences, which ignores training noise and is
labelled so (`PairedDifference.over`).

Per-seed readings with a bootstrap (`seed_bootstrap`): the cost a method needs to reach the baseline's final
success, and its share of the baseline's cost, are read on each seed's own curves and only then pooled; a share read
off the seed-mean curve depends on where its few evaluation points fall. The interval resamples seeds, the top level
of the design: each seed's value already carries its own evaluation noise, so its spread over seeds holds the
training and the evaluation noise once each (with one seed it resamples that seed's questions instead), read at
expanded percentiles so that few seeds do not make it too narrow. Tokens-to-threshold reads a nondecreasing fit of
the curve (`isotonic`), so one noisy evaluation above the threshold does not count as reaching it.

Secondary comparisons are corrected with Holm's step-down procedure (`holm`) within a table, on the two-sided p-values
of the paired t-test over seeds (`paired_t_pvalue`).

Deliberately not here: anything that reads files.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

# two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom, as printed in the usual tables; above 30
# they are computed (`_t_quantile`), never replaced by the normal quantile (1.96 is 2.7% narrow at 40 dof)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_Z975 = 1.959964


def t_quantile_975(dof: int) -> float:
    """Two-sided 95% critical value of Student's t with `dof` degrees of freedom, at every dof."""
    if dof < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else _t_quantile(0.975, dof)


@functools.lru_cache(maxsize=256)
def _t_quantile(p: float, dof: int) -> float:
    """The t with P(T <= t) = p (p > 1/2): bisection on `t_cdf` to 1e-7, from [0, 2] widened until it brackets."""
    lo, hi = 0.0, 2.0
    while t_cdf(hi, dof) < p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-7:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return (lo + hi) / 2


def t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with `dof` degrees of freedom.

    The density f(x) = Gamma((v+1)/2) / (sqrt(v pi) Gamma(v/2)) (1 + x^2/v)^(-(v+1)/2) integrated from 0 to |t| by
    Simpson's rule on 4,000 intervals (error below 1e-9 for |t| < 50), mirrored about 0."""
    if dof < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {dof}")
    if not math.isfinite(t):
        return 1.0 if t > 0 else 0.0
    v, a = float(dof), min(abs(t), 1e4)
    log_c = math.lgamma((v + 1) / 2) - math.lgamma(v / 2) - 0.5 * math.log(v * math.pi)
    x = np.linspace(0.0, a, 4001)
    f = np.exp(log_c - (v + 1) / 2 * np.log1p(x * x / v))
    half = (a / 4000 / 3) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return float(0.5 + half if t >= 0 else 0.5 - half)


def t_half_width(per_seed: Sequence[float]) -> float:
    """Half the width of the Student-t 95% interval of the mean over seeds (nan below 2 seeds)."""
    v = np.asarray(per_seed, dtype=float)
    return float(t_quantile_975(len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) >= 2 else float("nan")


def paired_t_pvalue(per_seed: Sequence[float]) -> float:
    """Two-sided p-value of the one-sample t-test that the mean per-seed difference is 0 (nan below 2 seeds)."""
    d = np.asarray(per_seed, dtype=float)
    if len(d) < 2:
        return float("nan")
    sd = d.std(ddof=1)
    if sd == 0:
        return 1.0 if d.mean() == 0 else 0.0
    t = d.mean() / (sd / math.sqrt(len(d)))
    return float(min(1.0, 2 * (1 - t_cdf(abs(t), len(d) - 1))))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), which control the family-wise error rate.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); reject
    hypothesis i at level alpha when its adjusted p <= alpha. A nan (no test) stays nan and does not count in m."""
    p = np.asarray(p_values, dtype=float)
    tested = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(len(p), np.nan)
    order = tested[np.argsort(p[tested], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def num_eval_questions(sd_per_question: float, target_se: float, multiple: int = 32) -> int:
    """Held-out questions per evaluation for a standard error of `target_se`: ceil((sd / target_se)^2), rounded up
    to a multiple of `multiple`. `sd_per_question` is the spread over questions of one question's avg@k success
    (it holds both the spread of question difficulty and the sampling noise of k samples)."""
    if sd_per_question < 0 or target_se <= 0:
        raise ValueError(f"need sd_per_question >= 0 and target_se > 0, got {sd_per_question}, {target_se}")
    n = max(1, math.ceil((sd_per_question / target_se) ** 2))
    return multiple * math.ceil(n / multiple)


def interpolate_at(x: Sequence[float], y: np.ndarray, at: float) -> tuple[np.ndarray, bool]:
    """A curve `y` (evaluations along axis 0, any trailing shape) with increasing cost `x`, read at cost `at`.

    Linear between the two evaluations around `at`; returns (value, reached). When `at` lies beyond the last
    evaluation the run never spent that much: the value is the last evaluation's and reached is False (no
    extrapolation). Before the first evaluation the first one's value is returned (reached is True)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"interpolate_at needs one cost per evaluation, got {x.shape} costs for {y.shape[:1]} rows")
    if np.any(np.diff(x) < 0):
        raise ValueError(f"costs must not decrease along the curve, got {x.tolist()}")
    if at >= x[-1]:
        return y[-1].copy(), bool(np.isclose(at, x[-1], rtol=1e-9, atol=1e-9))
    j = int(np.searchsorted(x, at, side="right"))
    if j == 0:
        return y[0].copy(), True
    lo, hi = x[j - 1], x[j]
    w = 0.0 if hi == lo else (at - lo) / (hi - lo)
    return (1.0 - w) * y[j - 1] + w * y[j], True


def cost_to_reach(x: Sequence[float], y: Sequence[float], target: float) -> float | None:
    """The cost at which the curve (x, y) first reaches `target`, linear between evaluations; None if never."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    hits = np.flatnonzero(y >= target)
    if len(hits) == 0:
        return None
    j = int(hits[0])
    if j == 0:
        return float(x[0])
    w = (target - y[j - 1]) / (y[j] - y[j - 1])
    return float(x[j - 1] + w * (x[j] - x[j - 1]))


def isotonic(y: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """The nondecreasing sequence closest to `y` in weighted least squares (pool-adjacent-violators)."""
    values = np.asarray(y, dtype=float).tolist()  # plain floats: this runs once per curve per bootstrap resample
    w = [1.0] * len(values) if weights is None else np.asarray(weights, dtype=float).tolist()
    means: list[float] = []
    totals: list[float] = []
    lengths: list[int] = []
    for value, weight in zip(values, w):
        means.append(value)
        totals.append(weight)
        lengths.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m1, w1, n1 = means.pop(), totals.pop(), lengths.pop()
            means[-1] = (means[-1] * totals[-1] + m1 * w1) / (totals[-1] + w1)
            totals[-1] += w1
            lengths[-1] += n1
    return np.repeat(means, lengths)


@dataclass(frozen=True)
class Success:
    """Success along a run's evaluations: increasing cost (E,) and success (E,), or (E, R) for R resamples at once."""

    cost: np.ndarray
    success: np.ndarray


@dataclass(frozen=True)
class Curve:
    """One run's held-out evaluations: increasing cost (tokens or units) and (E, Q) per-question success."""

    cost: np.ndarray  # (E,)
    per_question: np.ndarray  # (E, Q)

    def mean(self, weights: np.ndarray | None = None) -> Success:
        """Success over the questions: their mean, or with (Q, R) `weights` (columns summing to 1) R weighted means."""
        y = self.per_question.mean(axis=1) if weights is None else self.per_question @ weights
        return Success(self.cost, y)


def diff_at_baseline_cost(method: Success, baseline: Success) -> np.ndarray:
    """method minus baseline success, both read at the baseline's final cost (method interpolated, not extrapolated);
    one value per column."""
    value, _ = interpolate_at(method.cost, method.success, float(baseline.cost[-1]))
    return value - baseline.success[-1]


def share_to_reach(method: Success, baseline: Success) -> np.ndarray:
    """Cost the method needs to reach the baseline's final success, over the baseline's final cost; inf if never;
    one value per column.

    Both curves are read through their `isotonic` fits: the target is the baseline's fitted final success (its last
    evaluations pooled where they do not rise), and the method's cost is where its fitted curve first reaches it."""
    mine = method.success.reshape(len(method.cost), -1)  # (E, R)
    theirs = baseline.success.reshape(len(baseline.cost), -1)
    out = np.empty(mine.shape[1])
    for r in range(mine.shape[1]):
        target = isotonic(theirs[:, r])[-1]
        cost = cost_to_reach(method.cost, isotonic(mine[:, r]), target - 1e-12)
        out[r] = math.inf if cost is None else cost / float(baseline.cost[-1])
    return out if method.success.ndim > 1 else out[0]


@dataclass(frozen=True)
class BootstrapEstimate:
    """A per-seed statistic pooled as the mean over seeds, with a percentile bootstrap interval; beside it the median
    over seeds with its interval from the same resamples (robust where some seeds are infinite)."""

    mean: float
    lo: float
    hi: float
    per_seed: tuple[float, ...]
    num_resamples: int
    resample_questions: bool
    median: float = float("nan")
    median_lo: float = float("nan")
    median_hi: float = float("nan")

    def to_dict(self) -> dict:
        return {**asdict(self), "per_seed": list(self.per_seed)}


def seed_bootstrap(statistic: Callable[[Success, Success], np.ndarray], pairs: Sequence[tuple[Curve, Curve]], *,
                   num_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> BootstrapEstimate:
    """statistic(method, baseline) on each seed's (method, baseline) curves, pooled as the mean over seeds.

    Interval: percentile bootstrap at the top level of the design. With two or more seeds each resample draws the
    seeds with replacement and nothing else: a seed's value already carries its own evaluation noise (its questions
    and samples were drawn once, for that seed), so the spread of the per-seed values holds both the training and the
    evaluation noise, and resampling the questions inside each drawn seed as well would count the evaluation noise a
    second time (a nested design's bootstrap resamples its top level only: Davison and Hinkley 1997, section 3.8).
    With one seed there is no spread over seeds; each resample then draws that seed's questions with replacement (one
    draw shared by both curves, which are evaluated on the same questions), an interval that leaves training noise
    out (`resample_questions` says which was done). An infinite per-seed value (a method that never reached) makes a
    mean infinite; the percentiles are read without interpolation, so a bound is infinite only when that share of
    resamples is.

    The median over seeds is pooled from the same resamples (no further random draw, so the mean's interval does
    not move): it is infinite only where at least half the seeds are, so unlike the mean it does not become infinite
    with certainty as seeds are added while a few of them never reach."""
    if not pairs:
        raise ValueError("seed_bootstrap needs at least one seed")
    for s, (a, b) in enumerate(pairs):
        if a.per_question.shape[1] != b.per_question.shape[1]:
            raise ValueError(f"seed {s}: {a.per_question.shape[1]} and {b.per_question.shape[1]} questions; the "
                             "curves of one seed must be evaluated on the same questions")
    per_seed = np.array([float(statistic(a.mean(), b.mean())) for a, b in pairs])
    if len(pairs) == 1:
        rng = np.random.default_rng(seed)
        a, b = pairs[0]
        num_q = a.per_question.shape[1]
        drawn = rng.integers(num_q, size=(num_resamples, num_q)) + num_q * np.arange(num_resamples)[:, None]
        counts = np.bincount(drawn.ravel(), minlength=num_resamples * num_q).reshape(num_resamples, num_q)
        weights = counts.T / num_q  # (Q, R): the share of each resample's draws that fell on each question
        resampled = np.asarray(statistic(a.mean(weights), b.mean(weights)), dtype=float)[:, None]  # (R, 1)
        return _percentiles(per_seed, resampled, level, True)
    return bootstrap_over_seeds(per_seed, num_resamples=num_resamples, level=level, seed=seed)


def bootstrap_over_seeds(per_seed: Sequence[float], *, num_resamples: int = 2000, level: float = 0.95,
                         seed: int = 0) -> BootstrapEstimate:
    """The percentile bootstrap of the mean (and median) of per-seed values, resampling the seeds: what
    `seed_bootstrap` gives for two or more seeds, from the per-seed values alone (a report's `per_seed` restates its
    interval with no run at hand)."""
    values = np.asarray(per_seed, dtype=float)
    if len(values) < 2:
        raise ValueError(f"a bootstrap over seeds needs at least 2 seeds, got {len(values)}")
    rng = np.random.default_rng(seed)
    return _percentiles(values, values[rng.integers(len(values), size=(num_resamples, len(values)))], level, False)


def _percentiles(per_seed: np.ndarray, resampled: np.ndarray, level: float, questions: bool) -> BootstrapEstimate:
    """The estimate from (R, S) resampled per-seed values: percentile intervals of their mean and their median.

    Over S seeds the percentiles are the expanded ones (Hesterberg 2015, "What teachers should know about the
    bootstrap"): read at the tail Phi(-sqrt(S / (S - 1)) t_{S-1}) instead of (1 - level) / 2, which undoes the plain
    percentile interval's narrowness with few seeds (its spread is the plug-in one, over S not S - 1, and its
    quantiles are the normal ones, not Student's); at 41 seeds it reads the 2.0% tails, at 8 seeds 0.6%, at 5 0.1%."""
    tail = (1 - level) / 2
    if not questions:
        dof = resampled.shape[1] - 1
        z = math.sqrt(resampled.shape[1] / dof) * _t_quantile(1 - tail, dof)
        tail = 0.5 * math.erfc(z / math.sqrt(2))
    lo, hi = np.quantile(resampled.mean(axis=1), [tail, 1 - tail], method="inverted_cdf")
    median_lo, median_hi = np.quantile(np.median(resampled, axis=1), [tail, 1 - tail], method="inverted_cdf")
    return BootstrapEstimate(float(per_seed.mean()), float(lo), float(hi), tuple(float(v) for v in per_seed),
                             len(resampled), questions, float(np.median(per_seed)), float(median_lo),
                             float(median_hi))


@dataclass(frozen=True)
class PairedDifference:
    """method minus baseline, paired by seed and question; `lo`, `hi` bound the 95% confidence interval."""

    mean: float
    lo: float
    hi: float
    se: float
    num_seeds: int
    num_questions: int
    over: str  # "seeds" (t interval over per-seed means) or "questions" (one seed: normal over questions)
    per_seed: tuple[float, ...]

    def to_dict(self) -> dict:
        return {**asdict(self), "per_seed": list(self.per_seed)}


def paired_difference(method: Sequence[np.ndarray], baseline: Sequence[np.ndarray]) -> PairedDifference:
    """Paired difference of per-question success, one array per seed (same questions, same order, in both).

    Seeds are the independent draws: mean and t interval over the per-seed mean differences. With one seed the
    interval is the normal one over questions (training noise not included; `over == "questions"`)."""
    if len(method) != len(baseline) or not method:
        raise ValueError(f"paired_difference needs the same seeds for both sides, got {len(method)} and "
                         f"{len(baseline)} per-seed arrays")
    diffs = []
    for s, (a, b) in enumerate(zip(method, baseline)):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a.shape != b.shape or a.ndim != 1 or a.size == 0:
            raise ValueError(f"seed {s}: the method has {a.shape} and the baseline {b.shape} per-question values; "
                             "a paired difference needs the same held-out questions for both")
        diffs.append(a - b)
    per_seed = np.array([d.mean() for d in diffs])
    num_q = int(diffs[0].size)
    if len(diffs) >= 2:
        se = float(per_seed.std(ddof=1) / math.sqrt(len(per_seed)))
        half, over = t_half_width(per_seed), "seeds"
    else:
        se = float(diffs[0].std(ddof=1) / math.sqrt(num_q)) if num_q > 1 else float("nan")
        half, over = _Z975 * se, "questions"
    mean = float(per_seed.mean())
    return PairedDifference(mean, mean - half, mean + half, se, len(diffs), num_q, over,
                            tuple(float(v) for v in per_seed))


@dataclass(frozen=True)
class SeedMean:
    """The mean over seeds of a per-seed value, with a 95% t interval (nan bounds below 2 seeds)."""

    mean: float
    lo: float
    hi: float
    per_seed: tuple[float, ...]
    p_value: float = float("nan")  # paired t-test of mean 0 (differences only)


def seed_mean(values: Sequence[float], test: bool = False) -> SeedMean:
    """Mean of the finite per-seed `values` and its Student-t 95% interval over seeds; with `test`, the two-sided
    p-value that the mean is 0."""
    v = np.array([x for x in values if math.isfinite(x)], dtype=float)
    if not len(v):
        return SeedMean(float("nan"), float("nan"), float("nan"), ())
    half = t_half_width(v)
    mean = float(v.mean())
    return SeedMean(mean, mean - half, mean + half, tuple(float(x) for x in v),
                    paired_t_pvalue(v) if test else float("nan"))
