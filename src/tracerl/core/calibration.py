"""Calibration and ranking of success predictions: Brier score, ECE, AUC, reliability bins.

Used for the `predictor/brier`, `predictor/ece`, `predictor/auc` measures (docs/design.md, section 3):
a step's fresh nodes are scored *before* the predictor is updated on them. A node's target is soft,
its backed-up success rate Vhat in [0, 1] over its n leaves; `calibration_metrics` turns it into a
positive sample of weight n * Vhat and a negative one of weight n * (1 - Vhat), which is exactly the
score of the node's prediction against each of its leaves' binary outcomes.

The primitives (`brier`, `ece`, `auc`, `reliability`) take binary labels y in {0, 1} and optional
non-negative sample weights w. With no samples (or zero total weight) they return NaN, so an empty
step logs NaN instead of crashing the run.

`platt_fit` fits Platt scaling p' = sigmoid(a z + b) on logits z, the online recalibration step of the
numpy predictor (`HashedLogisticPredictor(recalibrate=True)`).

Deliberately not here: isotonic recalibration, confidence intervals, plotting.
"""

from __future__ import annotations

import numpy as np


def _check(p, y, w, *, binary: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate and convert (p, y, w) to float arrays of one shape (n,); w defaults to ones."""
    p = np.asarray(p, dtype=float)
    y = np.asarray(y, dtype=float)
    if p.ndim != 1 or y.shape != p.shape:
        raise ValueError(f"p and y must be 1-D arrays of the same length, got shapes {p.shape} and {y.shape}; "
                         "flatten them or pass one prediction per label")
    w = np.ones_like(p) if w is None else np.asarray(w, dtype=float)
    if w.shape != p.shape:
        raise ValueError(f"weights have shape {w.shape} but p has {p.shape}; pass one weight per prediction")
    for name, a in (("p", p), ("y", y), ("weights", w)):
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or inf at index {int(np.flatnonzero(~np.isfinite(a))[0])}; "
                             "drop those samples (e.g. nodes with no leaves) before scoring")
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p must lie in [0, 1], got min {p.min():.4g}, max {p.max():.4g}; "
                         "pass probabilities, not logits")
    if binary and np.any((y != 0) & (y != 1)):
        raise ValueError("y must be binary (0 or 1); for soft targets (a node's success rate) use "
                         "calibration_metrics(p, targets, weights)")
    if not binary and np.any((y < 0) | (y > 1)):
        raise ValueError(f"targets must lie in [0, 1], got min {y.min():.4g}, max {y.max():.4g}")
    if np.any(w < 0):
        raise ValueError("weights must be >= 0 (a node's weight is its number of leaves)")
    return p, y, w


def brier(p, y, w=None) -> float:
    """Weighted Brier score: sum_i w_i (p_i - y_i)^2 / sum_i w_i (lower is better, 0 is perfect)."""
    p, y, w = _check(p, y, w)
    total = w.sum()
    return float(np.sum(w * (p - y) ** 2) / total) if total > 0 else float("nan")


def _bin_index(p: np.ndarray, num_bins: int) -> np.ndarray:
    """Equal-width bins on [0, 1]: bin b holds [b/num_bins, (b+1)/num_bins), the last one includes 1."""
    if not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins={num_bins!r}; use a positive int (default 10)")
    return np.minimum((p * num_bins).astype(np.int64), num_bins - 1)


def ece(p, y, w=None, num_bins: int = 10) -> float:
    """Expected calibration error over equal-width bins.

    ECE = sum_b (W_b / W) |mean_w(p in b) - mean_w(y in b)| = sum_b |sum_{i in b} w_i (p_i - y_i)| / W,
    with W_b the weight in bin b and W the total weight.
    """
    p, y, w = _check(p, y, w)
    total = w.sum()
    if total <= 0:
        return float("nan")
    gap = np.bincount(_bin_index(p, num_bins), weights=w * (p - y), minlength=num_bins)
    return float(np.abs(gap).sum() / total)


def auc(p, y, w=None) -> float:
    """Weighted ROC AUC (Mann-Whitney): the weighted share of (positive, negative) pairs ranked right.

    AUC = sum_{i: y=1} sum_{j: y=0} w_i w_j ([p_i > p_j] + 0.5 [p_i == p_j]) / (W_pos W_neg).
    NaN when either class has zero total weight. O(n log n) by grouping equal scores.
    """
    p, y, w = _check(p, y, w)
    w_pos, w_neg = w * y, w * (1 - y)
    total_pos, total_neg = w_pos.sum(), w_neg.sum()
    if total_pos <= 0 or total_neg <= 0:
        return float("nan")
    _, group = np.unique(p, return_inverse=True)  # groups in increasing score order
    pos = np.bincount(group, weights=w_pos)
    neg = np.bincount(group, weights=w_neg)
    neg_below = np.cumsum(neg) - neg
    return float(np.sum(pos * (neg_below + 0.5 * neg)) / (total_pos * total_neg))


def reliability(p, y, w=None, num_bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin data for a reliability diagram, each (num_bins,): bin_mid, mean_p, mean_y, mass.

    mean_p, mean_y: weighted means in the bin (NaN for an empty bin); mass: W_b / W (sums to 1).
    """
    p, y, w = _check(p, y, w)
    index = _bin_index(p, num_bins)
    bin_mass = np.bincount(index, weights=w, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(index, weights=w * p, minlength=num_bins) / bin_mass
        mean_y = np.bincount(index, weights=w * y, minlength=num_bins) / bin_mass
        mass = bin_mass / bin_mass.sum()
    empty = bin_mass <= 0
    mean_p[empty] = np.nan
    mean_y[empty] = np.nan
    bin_mid = (np.arange(num_bins) + 0.5) / num_bins
    return bin_mid, mean_p, mean_y, mass


def expand_soft_targets(p, targets, weights=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Soft targets -> binary samples: (p, t, w) becomes (p, 1, w t) and (p, 0, w (1 - t)).

    Scoring the expansion equals scoring each node's prediction against every one of its leaves
    when w = n (number of leaves) and t = Vhat (their mean reward). Returns (p, y, w), each (2n,).
    """
    p, t, w = _check(p, targets, weights, binary=False)
    return (np.concatenate([p, p]), np.concatenate([np.ones_like(t), np.zeros_like(t)]),
            np.concatenate([w * t, w * (1 - t)]))


def calibration_metrics(p, targets, weights=None, num_bins: int = 10) -> dict[str, float]:
    """{"brier", "ece", "auc"} of predictions p against soft targets in [0, 1] with weights (leaf counts).

    Binary targets with unit weights give the plain per-sample metrics. Keys are bare; a caller logs
    them as `predictor/brier` etc.
    """
    p, y, w = expand_soft_targets(p, targets, weights)
    return {"brier": brier(p, y, w), "ece": ece(p, y, w, num_bins), "auc": auc(p, y, w)}


def platt_fit(z, targets, weights=None, ridge: float = 1.0, max_iter: int = 50) -> tuple[float, float]:
    """(a, b) minimising sum_i w_i BCE(sigmoid(a z_i + b), t_i) + ridge/2 ((a - 1)^2 + b^2), by Newton's method
    with step halving (the objective never increases, so extreme or constant z cannot make it diverge).

    z: logits; targets: soft labels in [0, 1]; weights: >= 0 (default 1; a node's leaf count, so a weight-3 sample
    with target 1/3 is the same evidence as three 0/1 samples). The ridge, counted in units of weight, pulls
    towards the identity (a, b) = (1, 0): with no data it stays there, with z all equal a stays near 1 and b moves
    to the weighted mean target's logit. Empty input returns (1.0, 0.0)."""
    z = np.asarray(z, dtype=float)
    t = np.asarray(targets, dtype=float)
    w = np.ones_like(z) if weights is None else np.asarray(weights, dtype=float)
    if z.shape != t.shape or z.shape != w.shape or z.ndim != 1:
        raise ValueError(f"z {z.shape}, targets {t.shape}, weights {w.shape}: pass three 1-d arrays of one length")
    if ridge <= 0:
        raise ValueError(f"ridge={ridge}; use ridge > 0 (it keeps the fit defined when z carries no signal)")
    if len(z) == 0 or w.sum() <= 0:
        return 1.0, 0.0

    def objective(a: float, b: float) -> float:
        u = a * z + b
        return float(np.sum(w * (np.logaddexp(0.0, u) - t * u)) + 0.5 * ridge * ((a - 1.0) ** 2 + b ** 2))

    a, b = 1.0, 0.0
    f = objective(a, b)
    for _ in range(max_iter):
        s = 1.0 / (1.0 + np.exp(-np.clip(a * z + b, -40.0, 40.0)))
        r, h = w * (s - t), w * s * (1.0 - s)
        grad = np.array([np.sum(r * z) + ridge * (a - 1.0), np.sum(r) + ridge * b])
        hess = np.array([[np.sum(h * z * z) + ridge, np.sum(h * z)], [np.sum(h * z), np.sum(h) + ridge]])
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-6:
            na, nb = a - scale * step[0], b - scale * step[1]
            nf = objective(na, nb)
            if nf <= f:
                break
            scale /= 2
        else:
            break
        a, b, f = na, nb, nf
        if np.max(np.abs(scale * step)) < 1e-8:
            break
    return float(a), float(b)
