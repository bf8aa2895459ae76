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

Deliberately not here: multiple-comparison corrections, bootstrap intervals, anything that reads files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

# two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (above 30 the normal quantile is within 4%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_Z975 = 1.959964


def t_quantile_975(dof: int) -> float:
    """Two-sided 95% critical value of Student's t with `dof` degrees of freedom (the normal one for dof > 30)."""
    if dof < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else _Z975


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
        half, over = t_quantile_975(len(per_seed) - 1) * se, "seeds"
    else:
        se = float(diffs[0].std(ddof=1) / math.sqrt(num_q)) if num_q > 1 else float("nan")
        half, over = _Z975 * se, "questions"
    mean = float(per_seed.mean())
    return PairedDifference(mean, mean - half, mean + half, se, len(diffs), num_q, over,
                            tuple(float(v) for v in per_seed))
