"""The registry by name resolves the neural predictors, the core's unknown-name message, and `tracerl bench
predictors` end to end (small)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracerl.core.predictor import PREDICTORS, make_predictor, predictor_class


def test_the_registry_names_resolve_to_the_neural_classes_without_importing_the_package_first():
    assert predictor_class("minilm_head").__name__ == "EncoderHeadPredictor"
    assert predictor_class("lm_value").__name__ == "LMValuePredictor"
    assert PREDICTORS["lm_value"] == "tracerl.predictors.lm_value:LMValuePredictor"


def test_unknown_name_lists_every_predictor():
    with pytest.raises(ValueError, match="known predictors: constant, hashed_logistic, lm_value, minilm_head, oracle"):
        make_predictor("no_such_predictor")


def test_bench_on_the_simulator(tmp_path):
    from tracerl.bench.predictors import PredictorBenchConfig, run, to_markdown

    cfg = PredictorBenchConfig(predictors=("constant", "hashed_logistic", "lm_value"), num_steps=3, warmup_steps=1)
    result = run(cfg)
    assert list(result["predictors"]) == ["constant", "hashed_logistic", "lm_value"]
    for name, row in result["predictors"].items():
        assert 0 <= row["brier"] <= 1 and 0 <= row["ece"] <= 1 and 0 <= row["auc"] <= 1, (name, row)
        assert row["num_prefixes"] == 3 * result["nodes_per_step"]
        assert row["predict_s_per_1k"] >= 0 and math.isfinite(row["update_s_per_1k"])
    # a running mean ranks nothing; the numpy model learns from the text
    assert result["predictors"]["hashed_logistic"]["auc"] > result["predictors"]["constant"]["auc"] + 0.1
    table = to_markdown(result)
    assert "| lm_value |" in table and "not a quality claim" in table


def test_bench_replays_a_runs_saved_trees(tmp_path):
    from tracerl.bench.predictors import PredictorBenchConfig, record_run, record_simulator
    from tracerl.core.ledger import make_prices
    from tracerl.core.growth import grow_trees
    from tracerl.core.methods import get_method
    from tracerl.core.simulator import Simulator
    from tracerl.io.files.runlog import write_trees

    cfg = PredictorBenchConfig(num_steps=2)
    sim, alloc = Simulator(cfg.sim, seed=0), cfg.allocation
    expected = []
    for step in range(2):
        pool = sim.set_pool(np.arange(step * alloc.pool_size, (step + 1) * alloc.pool_size))
        grown = grow_trees(get_method("grpo"), alloc, pool, None, sim,
                           make_prices(alloc).ledger(), np.random.default_rng(step), make_prices(alloc))
        write_trees(tmp_path, step, {"trees": [t.to_dict() for t in grown.trees]})
        expected.append(grown.trees)
    steps = record_run(tmp_path)
    assert len(steps) == 2
    from tracerl.core.metrics import predictor_targets

    for (histories, targets, weights), trees in zip(steps, expected):
        h2, t2, w2 = predictor_targets(trees)
        assert [h.text for h in histories] == [h.text for h in h2]
        np.testing.assert_array_equal(targets, t2)
        np.testing.assert_array_equal(weights, w2)
    assert len(record_simulator(cfg)) == 2
    with pytest.raises(ValueError, match="save_trees"):
        record_run(tmp_path / "empty")


def test_mid_band_root_auc_ranks_only_the_uncertain_roots():
    """A predictor that tells easy from impossible prompts but orders the uncertain ones backwards ranks roots well
    overall and badly inside the band stage 1 chooses from: the mid-band AUC must show the second."""
    from tracerl.bench.predictors import evaluate
    from tracerl.core.history import History

    # (prediction, outcome): two sure successes, two sure failures, four mid-band roots ranked backwards
    pairs = [(0.95, 1.0), (0.9, 1.0), (0.05, 0.0), (0.1, 0.0), (0.7, 0.0), (0.6, 0.0), (0.4, 1.0), (0.3, 1.0)]
    histories = [History(text=f"q{i}") for i in range(len(pairs))]

    class Scripted:
        def predict(self, hs):
            return np.array([pairs[int(h.text[1:])][0] for h in hs])

        def update(self, hs, targets, weights):
            pass

    targets, weights = np.array([t for _, t in pairs]), np.ones(len(pairs))
    row = evaluate(Scripted(), [(histories, targets, weights)], warmup_steps=0)
    assert row["auc_root"] == pytest.approx(0.75)  # 12 of the 16 success/failure pairs ordered right
    assert row["auc_root_mid"] == pytest.approx(0.0)
    assert row["root_mid_share"] == pytest.approx(0.5)
