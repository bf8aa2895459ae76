"""The Predictor contract for both neural predictors, on tiny random encoders built from configs (no download)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tracerl.core.history import History
from tracerl.core.predictor import P_MAX, P_MIN, HashedLogisticPredictor, make_predictor, weighted_bce
from tracerl.io.files.state import load_predictor, load_state, save_predictor, save_state

NAMES = ("minilm_head", "lm_value")


@pytest.fixture
def build(tiny_encoder_dir, tiny_lm_dir):
    def build(name, **options):
        if name == "minilm_head":
            return make_predictor(name, encoder_path=str(tiny_encoder_dir), **options)
        return make_predictor(name, model_path=str(tiny_lm_dir), **options)
    return build


def toy_task(num: int = 64, seed: int = 0):
    """Success is written in the text (last word good/bad), so any encoder + head can learn it."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, num)
    histories = [History(text=f"task family {i % 5} item {i}\nthink call tool {i % 3}\nresult "
                              + ("good" if y else "bad"), depth=int(i % 3), num_tokens=int(10 * (i % 3)))
                 for i, y in enumerate(labels)]
    return histories, labels.astype(float)


@pytest.mark.parametrize("name", NAMES)
def test_predict_shapes_range_and_prior(build, name):
    predictor = build(name, prior=0.3)
    histories, _ = toy_task(10)
    p = predictor.predict(histories)
    assert p.shape == (10,) and p.dtype == np.float64
    np.testing.assert_allclose(p, 0.3, atol=1e-6, err_msg="before any update the head must predict its prior")
    assert predictor.predict([]).shape == (0,)
    predictor.update(*toy_task(32))
    p = predictor.predict(histories)
    assert p.shape == (10,) and np.all((p >= P_MIN) & (p <= P_MAX))


@pytest.mark.parametrize("name", NAMES)
def test_update_lowers_loss_on_learnable_task(build, name):
    predictor = build(name, lr=3e-2, num_epochs=4, batch_size=32, seed=1)
    histories, targets = toy_task(64)
    weights = np.ones(len(targets))
    before = weighted_bce(predictor.predict(histories), targets, weights)
    for _ in range(5):
        metrics = predictor.update(histories, targets, weights)
    after = weighted_bce(predictor.predict(histories), targets, weights)
    assert set(metrics) >= {"loss", "loss_new", "replay_size", "num_samples"}
    assert after < 0.7 * before, f"{name}: BCE {before:.4f} -> {after:.4f} after 5 updates on a separable task"
    held_out, held_targets = toy_task(32, seed=7)
    p = predictor.predict(held_out)
    assert p[held_targets == 1].mean() > p[held_targets == 0].mean() + 0.1, "did not generalise to new item numbers"


@pytest.mark.parametrize("name", NAMES)
def test_replay_window_is_bounded(build, name):
    predictor = build(name, replay_size=20)
    histories, targets = toy_task(16)
    predictor.update(histories, targets)
    metrics = predictor.update(histories, targets)
    assert metrics["replay_size"] == 20 and len(predictor.replay_texts) == 20


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_gives_identical_predictions(build, name, tmp_path):
    predictor = build(name, seed=3)
    histories, targets = toy_task(48)
    predictor.update(histories[:24], targets[:24])
    predictor.update(histories[24:], targets[24:])
    save_state(tmp_path / "state.npz", predictor.state_dict())
    config = json.loads(json.dumps(predictor.config()))  # what a checkpoint stores must be JSON
    restored = make_predictor(name, **config)
    restored.load_state_dict(load_state(tmp_path / "state.npz"))
    fresh, fresh_targets = toy_task(16, seed=5)
    np.testing.assert_array_equal(restored.predict(fresh), predictor.predict(fresh))
    # the replay window, Adam moments and shuffling RNG came back too: the next update matches as well
    predictor.update(fresh, fresh_targets)
    restored.update(fresh, fresh_targets)
    np.testing.assert_array_equal(restored.predict(histories), predictor.predict(histories))
    # the untrained predictor differs, so the comparison above could fail
    assert not np.array_equal(make_predictor(name, **config).predict(histories), predictor.predict(histories))


@pytest.mark.parametrize("name", NAMES)
def test_save_predictor_round_trip(build, name, tmp_path):
    predictor = build(name)
    predictor.update(*toy_task(24))
    save_predictor(tmp_path / "pred.npz", predictor)
    loaded = load_predictor(tmp_path / "pred.npz")
    assert type(loaded) is type(predictor)
    histories, _ = toy_task(8, seed=9)
    np.testing.assert_array_equal(loaded.predict(histories), predictor.predict(histories))


BAD_UPDATES = [
    ("wrong target count", lambda hs: (hs, np.zeros(len(hs) - 1), None)),
    ("wrong weight count", lambda hs: (hs, np.zeros(len(hs)), np.ones(len(hs) + 1))),
    ("nan target", lambda hs: (hs, np.full(len(hs), np.nan), None)),
    ("target above 1", lambda hs: (hs, np.full(len(hs), 1.5), None)),
    ("negative weight", lambda hs: (hs, np.zeros(len(hs)), -np.ones(len(hs)))),
    ("not a History", lambda hs: (["a transcript"] * len(hs), np.zeros(len(hs)), None)),
    ("negative depth", lambda hs: ([History(text="x", depth=-1)] * len(hs), np.zeros(len(hs)), None)),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", BAD_UPDATES, ids=[c[0] for c in BAD_UPDATES])
def test_bad_inputs_raise_like_the_numpy_predictor(build, name, case):
    histories, _ = toy_task(4)
    args = case[1](histories)
    with pytest.raises(ValueError) as expected:
        HashedLogisticPredictor().update(*args)
    with pytest.raises(ValueError) as got:
        build(name).update(*args)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("name", NAMES)
def test_predict_rejects_non_histories_like_the_numpy_predictor(build, name):
    with pytest.raises(ValueError) as expected:
        HashedLogisticPredictor().predict(["text"])
    with pytest.raises(ValueError) as got:
        build(name).predict(["text"])
    assert str(got.value) == str(expected.value)


def test_embeddings_are_cached_by_text(build):
    predictor = build("minilm_head")
    calls = []
    embed = predictor._embed
    predictor._embed = lambda texts, grad: calls.append(list(texts)) or embed(texts, grad)
    histories, targets = toy_task(12)
    predictor.predict(histories + histories[:3])
    predictor.update(histories, targets)
    predictor.update(histories, targets)  # the refit reads the replay window's stored embeddings
    assert calls == [[h.text for h in histories]], "each distinct text must be encoded exactly once"


def test_bad_options_raise(tmp_path, tiny_encoder_dir):
    with pytest.raises(ValueError, match="config.json"):
        make_predictor("minilm_head", encoder_path=str(tmp_path))
    with pytest.raises(ValueError, match="prior"):
        make_predictor("minilm_head", encoder_path=str(tiny_encoder_dir), prior=1.0)
    with pytest.raises(ValueError, match="config.json"):
        make_predictor("lm_value", model_path=str(tmp_path))
