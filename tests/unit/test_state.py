"""Atomic state files: exact round trips, no torn or leftover files, predictors saved and rebuilt."""

import math
import os

import numpy as np
import pytest

from tracerl.core.history import History
from tracerl.core.predictor import ConstantPredictor, HashedLogisticPredictor, OraclePredictor
from tracerl.io.files.state import load_predictor, load_state, save_predictor, save_state


def assert_same(a, b, where="state"):
    """Equal structure; arrays with the same dtype, shape and bytes; floats equal (NaN == NaN)."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, where


def test_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    state = {
        "weights": rng.normal(size=1000),
        "f32": np.array([np.nan, -0.0, np.inf, 1e-45], dtype=np.float32),
        "ints": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3), dtype=np.int32),
        "scalar_array": np.array(3.5),
        "words": np.array(["alpha", "beta"]),
        "nested": {"rng": np.random.default_rng(7).bit_generator.state, "list": [1, 2.5, None, "x", [np.ones(2)]]},
        "big_int": 2**100 + 1,
        "nan": float("nan"), "inf": float("inf"), "flag": True, "none": None, "text": "naïve ☃",
        "tuple": (1, 2),
    }
    path = save_state(tmp_path / "state.npz", state)
    loaded = load_state(path)
    assert_same(state, loaded)
    assert loaded["tuple"] == [1, 2]  # tuples come back as lists, as documented


def test_numpy_scalars_become_python_scalars(tmp_path):
    save_state(tmp_path / "s.npz", {"a": np.float32(0.5), "b": np.int64(3), "c": np.bool_(True)})
    assert load_state(tmp_path / "s.npz") == {"a": 0.5, "b": 3, "c": True}


def test_overwrite_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "state.npz"
    save_state(path, {"v": np.arange(3)})
    save_state(path, {"v": np.arange(5)})
    np.testing.assert_array_equal(load_state(path)["v"], np.arange(5))
    assert sorted(os.listdir(path.parent)) == ["state.npz"]
    # a state that cannot be written fails before touching the old file, and cleans up after itself
    with pytest.raises(ValueError, match="object array"):
        save_state(path, {"v": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="str keys"):
        save_state(path, {1: "x"})
    with pytest.raises(ValueError, match="cannot hold"):
        save_state(path, {"v": {1, 2}})
    np.testing.assert_array_equal(load_state(path)["v"], np.arange(5))
    assert sorted(os.listdir(path.parent)) == ["state.npz"]


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no state file"):
        load_state(tmp_path / "missing.npz")
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="not a tracerl state"):
        load_state(tmp_path / "plain.npz")
    save_state(tmp_path / "other.npz", {"format": "something else"})
    with pytest.raises(ValueError, match="holds no predictor"):
        load_predictor(tmp_path / "other.npz")


def test_hashed_logistic_predictor_survives_save_and_load(tmp_path):
    rng = np.random.default_rng(0)
    words = ["ok", "error", "search", "answer", "tool", "retry"]
    histories = [History(" ".join(rng.choice(words, 8)), depth=int(rng.integers(0, 4))) for _ in range(300)]
    targets = rng.random(300)
    predictor = HashedLogisticPredictor(num_buckets=2**10, replay_size=200, seed=3, prior=0.4)
    predictor.update(histories[:150], targets[:150], rng.integers(1, 5, 150))
    predictor.update(histories[150:], targets[150:])
    path = save_predictor(tmp_path / "predictor.npz", predictor)
    restored = load_predictor(path)
    assert isinstance(restored, HashedLogisticPredictor) and restored.config() == predictor.config()
    np.testing.assert_array_equal(restored.predict(histories), predictor.predict(histories))
    # training continues identically (replay window, optimiser moments and shuffling generator restored)
    for p in (predictor, restored):
        p.update(histories[:50], targets[:50])
    np.testing.assert_array_equal(restored.predict(histories), predictor.predict(histories))


def test_constant_and_oracle(tmp_path):
    mean = ConstantPredictor(p=0.2, track_mean=True)
    mean.update([History("a"), History("b")], [1.0, 0.0], [3, 1])
    restored = load_predictor(save_predictor(tmp_path / "c.npz", mean))
    np.testing.assert_allclose(restored.predict([History("z")]), 0.75)
    oracle = OraclePredictor(lambda hs: [0.5] * len(hs))
    with pytest.raises(ValueError, match="oracle predictor cannot be saved"):
        save_predictor(tmp_path / "o.npz", oracle)
    assert not (tmp_path / "o.npz").exists()
