"""studies/stage2_calibration.py: an out-of-sample recalibration of stage 2's flip probability."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import load_study_script


@pytest.fixture(scope="module")
def module():
    return load_study_script("stage2_calibration")


def synthetic_runs(seed: int, num_runs: int = 6, size: int = 4000) -> list[dict[str, np.ndarray]]:
    """Priced flips q; the true flip rate is q / 2 at failed anchors and q / 4 at succeeded ones (overpriced)."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(num_runs):
        r = rng.integers(0, 2, size)
        q = rng.uniform(0.05, 0.95, size)
        y = (rng.random(size) < np.where(r == 1, q / 4, q / 2)).astype(float)
        runs.append({"q": q, "r": r, "depth": rng.integers(1, 6, size), "y": y})
    return runs


def test_recalibration_out_of_sample_fixes_the_level_and_keeps_the_ranking(module):
    runs = synthetic_runs(0)
    y, r, q = (np.concatenate([run[k] for run in runs]) for k in ("y", "r", "q"))
    priced, fitted = module.scores(q, y, r), module.scores(module.cross_fitted(runs, False), y, r)
    assert fitted["log_loss"] < priced["log_loss"] and fitted["brier"] < priced["brier"]
    for side in ("failed", "succeeded"):
        assert priced[f"{side}_predicted"] > 1.5 * priced[f"{side}_realized"]  # the synthetic overpricing
        assert fitted[f"{side}_predicted"] == pytest.approx(fitted[f"{side}_realized"], abs=0.01)
        assert fitted[f"{side}_auc"] == pytest.approx(priced[f"{side}_auc"], abs=0.01)  # monotone within a side


def test_fit_logistic_recovers_known_weights(module):
    rng = np.random.default_rng(1)
    x = np.column_stack([np.ones(20000), rng.normal(size=20000)])
    y = (rng.random(20000) < 1 / (1 + np.exp(-(x @ np.array([-1.0, 2.0]))))).astype(float)
    assert module.fit_logistic(x, y) == pytest.approx([-1.0, 2.0], abs=0.1)
