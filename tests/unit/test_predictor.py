"""Hashed features and the success predictors: stable hashing, structure, learning a known logistic, state."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tracerl.core.calibration import calibration_metrics
from tracerl.core.features import NUM_STRUCTURAL, HashedFeatures, SparseBatch, fnv1a_spans, token_spans
from tracerl.core.history import History
from tracerl.core.predictor import (PREDICTORS, ConstantPredictor, HashedLogisticPredictor, OraclePredictor,
                                    make_predictor)

# ---------------------------------------------------------------- an independent reference of the spec'd hash
M64 = (1 << 64) - 1


def ref_tokens(text):
    return re.findall(r"[0-9a-z_\u0080-\U0010ffff]+|[!-/:-@\[-^`{-~]", text.lower())


def ref_fnv1a(data: bytes, seed: int = 0) -> int:
    h = 2166136261 ^ seed
    for byte in data[:64]:
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def ref_bucket(tokens, num_buckets, seed=0):
    g = ref_fnv1a(tokens[0].encode(), seed)
    for tok in tokens[1:]:
        g = (g * 0x9E3779B97F4A7C15 + ref_fnv1a(tok.encode(), seed) + 1) & M64
    g ^= g >> 33
    g = (g * 0xFF51AFD7ED558CCD) & M64
    g ^= g >> 33
    return g % num_buckets


def ref_text_columns(text, num_buckets, ngram=(1, 2), seed=0):
    """{bucket: sublinear tf} for texts short enough (<= 64 distinct n-grams) to keep raw tf."""
    toks = ref_tokens(text)
    counts = {}
    for n in range(ngram[0], ngram[1] + 1):
        for i in range(len(toks) - n + 1):
            b = ref_bucket(toks[i:i + n], num_buckets, seed)
            counts[b] = counts.get(b, 0) + 1
    return {b: 1 + np.log(c) for b, c in counts.items()}


def text_part(batch: SparseBatch, row: int, num_buckets: int) -> dict:
    sel = (batch.rows == row) & (batch.cols < num_buckets)
    return dict(zip(batch.cols[sel].tolist(), batch.values[sel].tolist()))


# ---------------------------------------------------------------- features
def test_fnv1a_matches_published_test_vectors():
    for data, expected in [(b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)]:
        buf = np.frombuffer(data, dtype=np.uint8)
        got = fnv1a_spans(buf, np.array([0]), np.array([len(data)]), seed=0)
        assert int(got[0]) == expected == ref_fnv1a(data)


def test_tokens_split_on_whitespace_and_keep_punctuation_as_tokens():
    text = "Level -3, tool_call(x)! ÄÖ don’t\ta\nb"
    buf = np.frombuffer(text.lower().encode(), dtype=np.uint8)
    starts, lengths = token_spans(buf)
    got = [bytes(buf[s:s + n]).decode() for s, n in zip(starts, lengths)]
    assert got == ref_tokens(text)
    assert got == ["level", "-", "3", ",", "tool_call", "(", "x", ")", "!", "äö", "don’t", "a", "b"]


def test_columns_follow_the_spec_hash_formula():
    texts = ["The tool call failed: error 42!", "good good good bad", "Ünïcode wörds ok"]
    for seed in (0, 7):
        f = HashedFeatures(num_buckets=2**14, seed=seed)
        batch = f.transform([History(t) for t in texts])
        for row, text in enumerate(texts):
            want = ref_text_columns(text, 2**14, seed=seed)
            got = text_part(batch, row, 2**14)
            assert got.keys() == want.keys()
            for b in want:
                assert got[b] == pytest.approx(want[b], rel=1e-6)


def test_columns_are_stable_across_processes_with_different_hash_seeds():
    text = "search the knowledge base for alpha, then beta"
    code = ("from tracerl.core.features import HashedFeatures; from tracerl.core.history import History; "
            f"print(HashedFeatures().transform([History({text!r})]).cols.tolist())")
    env = dict(os.environ, PYTHONHASHSEED="12345",
               PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..", "src"),
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = HashedFeatures().transform([History(text)]).cols.tolist()
    assert eval(out.stdout) == here


def test_bigrams_carry_word_order():
    f = HashedFeatures()
    a, b = f.transform([History("alpha beta"), History("beta alpha")]).to_dense()[:, :f.num_buckets]
    assert (a > 0).sum() == 3 and (b > 0).sum() == 3  # two unigrams + one bigram each
    assert (a * b > 0).sum() == 2  # they share the unigrams only
    uni = HashedFeatures(ngram=(1, 1)).transform([History("alpha beta")])
    assert uni.nnz == 2 + NUM_STRUCTURAL


def test_ngrams_do_not_cross_texts_and_batching_does_not_change_rows():
    f = HashedFeatures(cache_size=0)
    texts = ["alpha", "beta gamma", "", "delta! epsilon", "alpha"]
    together = f.transform([History(t) for t in texts]).to_dense()
    alone = np.vstack([f.transform([History(t)]).to_dense() for t in texts])
    np.testing.assert_array_equal(together, alone)
    assert (together[0, :f.num_buckets] > 0).sum() == 1  # no "alpha beta" bigram leaked from row 1


def test_structural_columns():
    f = HashedFeatures(num_buckets=64)
    batch = f.transform([History("x", depth=3, num_tool_errors=2, num_tokens=100), History("y")])
    dense = batch.to_dense()
    assert dense.shape == (2, 64 + NUM_STRUCTURAL)
    np.testing.assert_allclose(dense[0, 64:], [1, 3, 2, np.log1p(100), 0], rtol=1e-6)
    np.testing.assert_allclose(dense[1, 64:], [1, 0, 0, 0, 1])
    assert f.column("depth") == 65 and f.column("is_root") == 68


def test_long_texts_are_scaled_down_and_short_ones_keep_raw_tf():
    f = HashedFeatures(ngram=(1, 1), norm_ngrams=64)
    short = " ".join(f"w{i}" for i in range(10)) + " w0"
    long = " ".join(f"w{i}" for i in range(256))
    b = f.transform([History(short), History(long)])
    short_vals = sorted(text_part(b, 0, f.num_buckets).values())
    assert short_vals[-1] == pytest.approx(1 + np.log(2)) and short_vals[0] == pytest.approx(1.0)
    long_vals = np.array(list(text_part(b, 1, f.num_buckets).values()))
    num_distinct = len(long_vals)  # 256 words, a few may share a bucket
    np.testing.assert_allclose(long_vals.min(), 1 / np.sqrt(num_distinct / 64), rtol=1e-6)


def test_cache_is_bounded_and_does_not_change_results():
    texts = [f"text number {i}" for i in range(10)]
    cached = HashedFeatures(cache_size=3)
    first = cached.transform([History(t) for t in texts]).to_dense()
    again = cached.transform([History(t) for t in texts[::-1]]).to_dense()[::-1]
    plain = HashedFeatures(cache_size=0).transform([History(t) for t in texts]).to_dense()
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(again, plain)
    assert len(cached._text_cache) == 3


def test_sparse_batch_products_match_dense():
    rng = np.random.default_rng(0)
    f = HashedFeatures(num_buckets=32)
    batch = f.transform([History(" ".join(rng.choice(list("abcdefg"), 12)), depth=i) for i in range(6)])
    dense = batch.to_dense()
    w, g = rng.normal(size=batch.num_cols), rng.normal(size=batch.num_rows)
    np.testing.assert_allclose(batch.dot(w), dense @ w, rtol=1e-6)
    np.testing.assert_allclose(batch.rdot(g), dense.T @ g, rtol=1e-6, atol=1e-12)
    idx = np.array([4, 1, 1, 5])
    np.testing.assert_array_equal(batch.take(idx).to_dense(), dense[idx])
    stacked = SparseBatch.concat([batch, batch.take(idx)]).to_dense()
    np.testing.assert_array_equal(stacked, np.vstack([dense, dense[idx]]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_buckets=0), "num_buckets"), (dict(ngram=(2, 1)), "ngram"), (dict(seed=-1), "seed"),
    (dict(norm_ngrams=0), "norm_ngrams"), (dict(cache_size=-1), "cache_size")])
def test_featuriser_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HashedFeatures(**kwargs)


def test_featuriser_rejects_non_histories():
    with pytest.raises(ValueError, match="History"):
        HashedFeatures().transform(["just a string"])


# ---------------------------------------------------------------- a task with a known logistic
FILLER = [f"filler{i}" for i in range(40)]


def known_logistic_task(rng, num):
    """Histories where 'good'/'bad' and depth set p = sigmoid(2.5 good - 2.5 bad - 0.5 depth + 0.75).

    The words hide among 5-24 random filler words, in random order; the features can represent this
    logistic exactly (presence, raw tf for short texts, depth column), so calibration is reachable.
    The best possible held-out AUC (true p as the prediction) is about 0.85.
    """
    good, bad = rng.random(num) < 0.5, rng.random(num) < 0.5
    depth = rng.integers(0, 4, num)
    histories = []
    for g, b, d in zip(good, bad, depth):
        words = list(rng.choice(FILLER, int(rng.integers(5, 25)))) + ["good"] * int(g) + ["bad"] * int(b)
        rng.shuffle(words)
        histories.append(History(" ".join(words), depth=int(d)))
    return histories, 1 / (1 + np.exp(-(2.5 * good - 2.5 * bad - 0.5 * depth + 0.75)))


def train(predictor, rng, soft, num_updates=8, num=300):
    for _ in range(num_updates):
        histories, p_true = known_logistic_task(rng, num)
        num_leaves = rng.integers(1, 9, num) if soft else np.ones(num, dtype=int)
        targets = rng.binomial(num_leaves, p_true) / num_leaves  # backed-up success rate of n leaves
        metrics = predictor.update(histories, targets, num_leaves)
    return metrics


@pytest.mark.parametrize("soft", [False, True], ids=["binary", "soft"])
def test_learns_a_known_logistic(soft):
    rng = np.random.default_rng(0)
    predictor = HashedLogisticPredictor(seed=0)
    metrics = train(predictor, rng, soft)
    assert metrics["replay_size"] == 8 * 300
    histories, p_true = known_logistic_task(rng, 2000)  # fresh held-out samples
    p = predictor.predict(histories)
    held_out = calibration_metrics(p, p_true)  # soft targets = true p: scoring against infinitely many leaves
    bayes = calibration_metrics(p_true, p_true)
    assert held_out["auc"] > 0.8, held_out
    assert held_out["ece"] < 0.05, held_out
    assert held_out["brier"] < calibration_metrics(np.full_like(p, p_true.mean()), p_true)["brier"] - 0.03
    assert held_out["auc"] <= bayes["auc"] + 0.01  # sanity: nothing beats the truth by much


def test_predicts_the_prior_before_any_update_and_clips():
    histories = [History("anything"), History("else", depth=4, num_tool_errors=3, num_tokens=900)]
    np.testing.assert_allclose(HashedLogisticPredictor(prior=0.3).predict(histories), 0.3)
    predictor = HashedLogisticPredictor(lr=1.0, l2=0.0)
    for _ in range(5):
        predictor.update(histories * 50, np.ones(100))
    assert np.all(predictor.predict(histories) == 1 - 1e-4)


def test_replay_window_is_bounded_fifo():
    predictor = HashedLogisticPredictor(replay_size=50, batch_size=16)
    rng = np.random.default_rng(0)
    all_targets = []
    for step in range(4):
        histories = [History(f"step {step} item {i}", depth=1) for i in range(30)]
        targets = rng.random(30)
        all_targets.extend(targets)
        metrics = predictor.update(histories, targets)
    assert metrics["replay_size"] == 50 and predictor.replay_x.num_rows == 50
    np.testing.assert_array_equal(predictor.replay_targets, all_targets[-50:])  # the newest 50, in order
    kept = predictor.replay_x.take(np.array([49])).to_dense()
    np.testing.assert_array_equal(kept, predictor.features.transform([History("step 3 item 29", depth=1)]).to_dense())


def test_roots_keep_a_window_of_their_own():
    predictor = HashedLogisticPredictor(replay_size=40, root_replay_size=25, batch_size=16)
    for step in range(5):
        histories = [History(f"step {step} root {i}") for i in range(10)]
        histories += [History(f"step {step} turn {i}", depth=2) for i in range(20)]
        predictor.update(histories, np.full(30, 0.5))
    assert predictor.replay_is_root.sum() == 25 and (~predictor.replay_is_root).sum() == 40
    newest_root = predictor.features.transform([History("step 4 root 9")]).to_dense()
    rows = np.flatnonzero(predictor.replay_is_root)
    np.testing.assert_array_equal(predictor.replay_x.take(rows[-1:]).to_dense(), newest_root)
    shared = HashedLogisticPredictor(replay_size=40, root_replay_size=0, root_head=False, batch_size=16)
    for step in range(5):
        shared.update([History(f"r{step}")] * 10 + [History(f"t{step}", depth=2)] * 20, np.full(30, 0.5))
    assert shared.replay_x.num_rows == 40 and not shared.replay_is_root.any()


def test_root_head_predicts_roots_from_root_samples_only():
    # roots say "easy"/"hard" and succeed 0.9/0.1; prefixes carry the same words but succeed at 0.5, so a
    # shared model squeezes the roots towards the middle and the root head does not
    rng = np.random.default_rng(0)
    words = rng.choice(["easy", "hard"], size=400)
    roots = [History(f"q{i} {w}") for i, w in enumerate(words)]
    prefixes = [History(f"q{i} {w} turn {t}", depth=1 + t) for i, w in enumerate(words) for t in range(4)]
    root_t = np.where(words == "easy", 0.9, 0.1)
    targets = np.concatenate([root_t, np.full(len(prefixes), 0.5)])
    probe = [History("q999 easy"), History("q998 hard")]
    gaps = {}
    for root_head in (True, False):
        predictor = HashedLogisticPredictor(root_head=root_head, recalibrate=False)  # the heads themselves
        for _ in range(4):
            predictor.update(roots + prefixes, targets)
        p_easy, p_hard = predictor.predict(probe)
        gaps[root_head] = p_easy - p_hard
    assert gaps[True] > 0.55 and gaps[True] > gaps[False] + 0.15
    with pytest.raises(ValueError, match="root_replay_size"):
        HashedLogisticPredictor(root_head=True, root_replay_size=0)


def test_same_seed_same_predictions_and_state_round_trip():
    histories, _ = known_logistic_task(np.random.default_rng(5), 200)
    runs = []
    for seed in (0, 0, 1):
        predictor = HashedLogisticPredictor(seed=seed)
        train(predictor, np.random.default_rng(1), soft=True, num_updates=3, num=200)
        runs.append(predictor)
    np.testing.assert_array_equal(runs[0].predict(histories), runs[1].predict(histories))
    assert not np.array_equal(runs[0].predict(histories), runs[2].predict(histories))  # the seed drives shuffling

    copy = make_predictor("hashed_logistic", **runs[0].config())
    copy.load_state_dict(runs[0].state_dict())
    np.testing.assert_array_equal(copy.predict(histories), runs[0].predict(histories))
    # the generator's state travels too: both continue identically
    for predictor in (copy, runs[0]):
        train(predictor, np.random.default_rng(2), soft=True, num_updates=1, num=200)
    np.testing.assert_array_equal(copy.predict(histories), runs[0].predict(histories))


def test_update_input_errors():
    predictor = HashedLogisticPredictor()
    hs = [History("a"), History("b")]
    with pytest.raises(ValueError, match="one target"):
        predictor.update(hs, [0.5])
    with pytest.raises(ValueError, match="no leaves"):
        predictor.update(hs, [0.5, np.nan])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        predictor.update(hs, [0.5, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        predictor.update(hs, [0.5, 1.0], [1, -1])
    with pytest.raises(ValueError, match="prior"):
        HashedLogisticPredictor(prior=1.0)


# ---------------------------------------------------------------- constant, oracle, registry
def test_constant_predictor():
    hs = [History("a"), History("b"), History("c")]
    fixed = ConstantPredictor(p=0.3)
    fixed.update(hs, [1, 1, 1])
    np.testing.assert_allclose(fixed.predict(hs), 0.3)

    mean = ConstantPredictor(p=0.3, track_mean=True)
    np.testing.assert_allclose(mean.predict(hs), 0.3)  # nothing seen yet
    mean.update(hs[:2], [1.0, 0.0], [3, 1])
    np.testing.assert_allclose(mean.predict(hs), 0.75)
    mean.update(hs[:1], [0.5], [4])
    np.testing.assert_allclose(mean.predict(hs), (3 + 2) / 8)
    restored = make_predictor("constant", **mean.config())
    restored.load_state_dict(mean.state_dict())
    np.testing.assert_allclose(restored.predict(hs), (3 + 2) / 8)


def test_oracle_predictor():
    hs = [History("a", meta={"true_p": 0.2}), History("b", meta={"true_p": 1.0})]
    oracle = OraclePredictor(lambda histories: [h.meta["true_p"] for h in histories])
    np.testing.assert_allclose(oracle.predict(hs), [0.2, 1 - 1e-4])
    assert oracle.update(hs, [1, 0]) == {} and oracle.state_dict() == {}
    np.testing.assert_allclose(oracle.predict(hs), [0.2, 1 - 1e-4])
    with pytest.raises(ValueError, match="cannot be saved"):
        oracle.config()
    with pytest.raises(ValueError, match="one probability"):
        OraclePredictor(lambda histories: [0.5]).predict(hs)


def test_registry():
    assert set(PREDICTORS) == {"hashed_logistic", "constant", "oracle", "minilm_head", "lm_value"}
    assert isinstance(make_predictor("constant", p=0.2), ConstantPredictor)
    assert make_predictor("hashed_logistic", seed=3).config()["seed"] == 3
    with pytest.raises(ValueError, match="known predictors: constant, hashed_logistic, lm_value, minilm_head, oracle"):
        make_predictor("nope")


def test_recalibration_tracks_the_success_rate_on_new_prompts():
    # every step brings new prompts (each with its own entity names, like a real transcript) whose text says nothing
    # about success (rate 0.25): the raw model memorises the window's names and misses the rate on the next step's
    # prompts; the recalibrated one learns a ~ 0 and b ~ logit(0.25). Mean absolute miss over steps 3-7, 3 streams.
    errors = {}
    for recalibrate in (False, True):
        gaps = []
        for stream in range(3):
            rng = np.random.default_rng(stream)
            predictor = HashedLogisticPredictor(recalibrate=recalibrate, l2=1e-3, seed=0)
            for step in range(8):
                histories = [History(" ".join([f"name{step}x{i}x{k}" for k in range(6)] +
                                              list(rng.choice(list("abcdefgh"), 6))), depth=i % 3) for i in range(200)]
                targets = (rng.random(200) < 0.25).astype(float)
                if step >= 3:
                    gaps.append(abs(predictor.predict(histories).mean() - 0.25))
                predictor.update(histories, targets)
        errors[recalibrate] = float(np.mean(gaps))
    assert errors[True] < 0.015 and errors[True] < errors[False] / 3, errors


def test_recalibration_keeps_a_calibrated_model_near_identity_and_round_trips():
    rng = np.random.default_rng(1)
    predictor = HashedLogisticPredictor(seed=0)
    for step in range(6):
        words = rng.choice(["good", "bad"], size=300)
        histories = [History(f"{w} s{step} q{i}") for i, w in enumerate(words)]
        predictor.update(histories, (rng.random(300) < np.where(words == "good", 0.8, 0.2)).astype(float))
    p_good, p_bad = predictor.predict([History("good new"), History("bad new")])
    assert p_good > 0.65 and p_bad < 0.35  # the ranking survives recalibration (a > 0)
    head = predictor.heads["shared"]
    assert 0.5 < head.cal_a < 1.5 and abs(head.cal_b) < 0.5
    copy = HashedLogisticPredictor(**predictor.config())
    copy.load_state_dict(predictor.state_dict())
    probe = [History("good x"), History("bad y", depth=2), History("q")]
    np.testing.assert_array_equal(copy.predict(probe), predictor.predict(probe))
    with pytest.raises(ValueError, match="calibration_window"):
        HashedLogisticPredictor(calibration_window=0)


def test_state_features_get_columns_of_their_own_and_drive_predictions():
    """A domain hook's named features land in the state block; text that says nothing is then enough to rank."""
    from tracerl.core.features import HashedFeatures

    def hook(h):
        return {"on_track": 1.0} if "ok" in h.meta.get("tag", "") else {"off_track": 1.0}

    rng = np.random.default_rng(0)
    tags = rng.random(600) < 0.5
    histories = [History(f"step {i % 7} filler words", 1 + i % 3, prompt_id=f"toystate:train:{i}",
                         meta={"tag": "ok" if t else "no"}) for i, t in enumerate(tags)]
    feats = HashedFeatures(num_buckets=64, state_buckets=32, state_features=hook)
    x = feats.transform(histories[:2]).to_dense()
    assert x.shape == (2, 64 + 5 + 32)
    assert x[:, 69:].sum(axis=1).tolist() == [1.0, 1.0], "one state column per history"
    assert HashedFeatures(num_buckets=64, state_features=hook).transform(histories[:2]).num_cols == 69, \
        "state_buckets=0: no block"
    assert HashedFeatures(num_buckets=64, state_buckets=32).transform(histories[:2]).to_dense()[:, 69:].sum() == 0, \
        "no hook handed in: an empty state block"
    targets = np.where(tags, 0.8, 0.1)
    with_state = make_predictor("hashed_logistic", num_buckets=64, state_buckets=32, seed=0, state_features=hook)
    text_only = make_predictor("hashed_logistic", num_buckets=64, state_buckets=0, seed=0)
    for p in (with_state, text_only):
        for step in range(8):  # eight steps of 50 fresh samples, as a run feeds it
            p.update(histories[50 * step: 50 * step + 50], targets[50 * step: 50 * step + 50])
    held_out = (with_state.predict(histories[400:]), text_only.predict(histories[400:]))
    gap = [float(p[tags[400:]].mean() - p[~tags[400:]].mean()) for p in held_out]
    assert gap[0] > 0.4 and abs(gap[1]) < 0.1, gap


def test_domain_state_hooks_take_any_model_text():
    """Bad model output is data: every domain's hook returns features for garbage, cut-off calls and empty text."""
    from tracerl.io.domains import make_domain

    rng = np.random.default_rng(0)
    alphabet = list("ab <>/{}\":\n?") + ["<tool_call>", "</tool_call>", "error:", "Who is the mentor of ", "Error"]
    texts = ["", "\n", "<tool_call>", "Who is the mentor of Arlo Venn?\n<tool_call>{\"name\": \"search\""]
    texts += ["".join(rng.choice(alphabet, size=int(rng.integers(1, 40)))) for _ in range(200)]
    for source in ("multihop", "math", "funcall"):
        state_features = make_domain(source).state_features
        for depth, text in enumerate(texts):
            out = state_features(History(text, depth % 5, prompt_id=f"{source}:train:0"))
            assert all(isinstance(v, float) for v in out.values()), (source, text)
