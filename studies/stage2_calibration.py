"""How well stage 2's flip probability predicts a continuation's flip, and what recalibrating it would change.

    python studies/stage2_calibration.py RUN_DIR [RUN_DIR ...] [--out FILE.md]

Stage 2 buys continuations at an anchor whose leaves all had outcome r because one of them flips it with probability
q = p (r = 0) or 1 - p (r = 1), p the predictor's success probability at the anchor (`allocation.prefix_value`). From
`trace` runs' saved trees (`tracerl.report.stage2.read_run`), every continuation gives (q, r, depth, flipped). The
runs are split in two halves by seed order; a recalibration is fitted on one half and scored on the other, then the
other way round, so every score is out of sample:

- `as priced`: q itself;
- `by side`: a logistic regression of the flip on logit(q) and r (one intercept and slope per side);
- `by side and depth`: the same plus the anchor's depth (1, 2, 3, 4 and deeper as indicators).

Scores: mean log loss and Brier score of the flip, the mean predicted flip against the realized rate per side, and
the AUC of the prediction for the flip within each side: where stage 2 ranks candidates of one side against each
other (a prompt whose rollouts all succeeded offers only succeeded anchors), the within-side AUC is what decides its
choice; the level decides how much budget a side draws when sides compete (the global mode).

Deliberately not here: any change to training; this reads what the runs bought, so it scores q only where stage 2
chose to spend (the candidates it passed over have no outcome).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from tracerl.core.calibration import auc
from tracerl.report.stage2 import read_run

DEPTHS = (2, 3, 4)  # indicator columns: depth == 2, == 3, >= 4 (depth 1 is the reference)


def features(q: np.ndarray, r: np.ndarray, depth: np.ndarray, with_depth: bool) -> np.ndarray:
    """Design matrix: per side an intercept and a slope on logit(q); optionally depth indicators."""
    z = np.log(np.clip(q, 1e-4, 1 - 1e-4) / np.clip(1 - q, 1e-4, 1 - 1e-4))
    cols = [1 - r, r, (1 - r) * z, r * z]
    if with_depth:
        cols += [(depth == d) if d < DEPTHS[-1] else (depth >= d) for d in DEPTHS]
    return np.column_stack(cols).astype(float)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iterations: int = 50) -> np.ndarray:
    """Weights of a logistic regression by Newton's method with a small ridge (keeps separable columns finite)."""
    w = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-x @ w))
        gradient = x.T @ (p - y) + l2 * w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(x.shape[1])
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w


def scores(pred: np.ndarray, y: np.ndarray, r: np.ndarray) -> dict[str, float]:
    p = np.clip(pred, 1e-6, 1 - 1e-6)
    out = {"log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
           "brier": float(np.mean((p - y) ** 2))}
    for side, name in ((0, "failed"), (1, "succeeded")):
        sel = r == side
        out[f"{name}_predicted"] = float(pred[sel].mean()) if sel.any() else math.nan
        out[f"{name}_realized"] = float(y[sel].mean()) if sel.any() else math.nan
        out[f"{name}_auc"] = auc(pred[sel], y[sel]) if sel.any() else math.nan
    return out


def collect(run_dirs: list[Path]) -> list[dict[str, np.ndarray]]:
    """Per run: the continuations' q, r, depth and flip (those with a recorded p and anchor outcome)."""
    runs = []
    for run_dir in run_dirs:
        items = [x for x in read_run(run_dir)["rollouts"] if x.continuation and x.p_flip is not None]
        runs.append({"q": np.array([x.p_flip for x in items]), "r": np.array([x.anchor_outcome for x in items]),
                     "depth": np.array([x.anchor_depth for x in items]),
                     "y": np.array([float(x.flipped) for x in items])})
    return runs


def cross_fitted(runs: list[dict[str, np.ndarray]], with_depth: bool) -> np.ndarray:
    """Out-of-sample predictions: each half of the runs scored by the fit on the other half."""
    half = len(runs) // 2
    halves = (runs[:half], runs[half:])
    preds = []
    for test, train in ((halves[0], halves[1]), (halves[1], halves[0])):
        cat = {k: np.concatenate([run[k] for run in train]) for k in train[0]}
        w = fit_logistic(features(cat["q"], cat["r"], cat["depth"], with_depth), cat["y"])
        for run in test:
            preds.append(1 / (1 + np.exp(-features(run["q"], run["r"], run["depth"], with_depth) @ w)))
    return np.concatenate(preds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if len(args.run_dirs) < 2:
        raise SystemExit("give at least two runs (seeds): the recalibration is fitted on one half, scored on the other")
    runs = collect(args.run_dirs)
    y, r, q = (np.concatenate([run[k] for run in runs]) for k in ("y", "r", "q"))
    rows = {"as priced": q, "by side": cross_fitted(runs, False), "by side and depth": cross_fitted(runs, True)}
    lines = [f"{len(runs)} runs, {len(y):,} continuations ({int((r == 1).sum()):,} from succeeded anchors); "
             "scores out of sample (two halves of the runs, each scored by the other's fit).", "",
             "| prediction | log loss | Brier | failed anchors: predicted / realized flip | AUC within | "
             "succeeded anchors: predicted / realized flip | AUC within |", "|---|---|---|---|---|---|---|"]
    for name, pred in rows.items():
        s = scores(pred, y, r)
        lines.append(f"| {name} | {s['log_loss']:.4f} | {s['brier']:.4f} | {s['failed_predicted']:.3f} / "
                     f"{s['failed_realized']:.3f} | {s['failed_auc']:.3f} | {s['succeeded_predicted']:.3f} / "
                     f"{s['succeeded_realized']:.3f} | {s['succeeded_auc']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
