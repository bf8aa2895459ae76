"""OpenAIEngine against a real `tracerl serve` on loopback: the engine contract TransformersEngine passes
(tests/torch/test_transformers_engine.py), now through HTTP, JSON and the vLLM-shaped response."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import engine_contract
from engine_contract import (check_rows_max_tokens_and_length_finish, check_stop_token_ends_sample_and_is_included,
                             forward_logprobs)
from serve_support import VOCAB

from tracerl.engines.openai_engine import EngineError, OpenAIEngine
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.engine import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


@pytest.fixture(scope="module")
def engine(server):
    with OpenAIEngine(server, max_concurrency=4, max_retries=0) as engine:
        yield engine


def tokens(n: int, seed: int) -> list[int]:
    return engine_contract.tokens(n, seed, VOCAB)


def ids(results) -> list[list[list[int]]]:
    return [[c.token_ids for c in samples] for samples in results]


def test_seed_determines_output(engine):
    prefixes = [tokens(8, seed=8), tokens(15, seed=9), tokens(8, seed=8)]  # the first and last are equal
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    first = engine.generate(prefixes, params, n=2)
    again = engine.generate(prefixes, params, n=2)
    other = engine.generate(prefixes, SamplingParams(temperature=1.0, max_tokens=12, seed=8), n=2)
    assert ids(first) == ids(again), "same seed and inputs gave different outputs"
    assert ids(first) != ids(other), "seeds 7 and 8 gave identical samples"
    assert first[0][0].token_ids != first[0][1].token_ids, "two samples of one prefix are identical at T=1"
    assert ids(first)[0] != ids(first)[2], "equal prefixes in one seeded call drew the same samples"


def test_n_rows_max_tokens_and_length_finish(engine):
    check_rows_max_tokens_and_length_finish(engine, VOCAB)


def test_stop_token_ends_sample_and_is_included(engine):
    check_stop_token_ends_sample_and_is_included(engine, VOCAB)


def test_logprobs_are_temperature_scaled_forward_logprobs(engine, model):
    prefixes = [tokens(9, seed=6), tokens(20, seed=7)]
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, seed=0)
    for p, samples in zip(prefixes, engine.generate(prefixes, params, n=2)):
        for c in samples:
            want = forward_logprobs(model, p, c.token_ids, temperature=0.7)
            np.testing.assert_allclose(c.logprobs, want, atol=1e-4, err_msg="not log_softmax(logits / T)")
    greedy = engine.generate(prefixes[:1], GREEDY)[0][0]
    np.testing.assert_allclose(greedy.logprobs, forward_logprobs(model, prefixes[0], greedy.token_ids), atol=1e-4)


def test_greedy_output_equals_transformers_engine(engine, model):
    prefixes = [tokens(1, seed=15), tokens(12, seed=16), tokens(33, seed=17)]
    want = TransformersEngine(model).generate(prefixes, GREEDY, n=2)
    got = engine.generate(prefixes, GREEDY, n=2)
    assert ids(got) == ids(want)
    for a, b in zip((c for s in got for c in s), (c for s in want for c in s)):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert a.finish_reason == b.finish_reason == "length"


def test_repeat_mode_sends_one_request_per_sample(server):
    prefixes = [tokens(6, seed=18), tokens(9, seed=19)]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=5)
    with OpenAIEngine(server, n_mode="repeat", max_retries=0) as repeat:
        first = repeat.generate(prefixes, params, n=[3, 2])
        assert repeat.stats["num_requests"] == 5
        assert ids(repeat.generate(prefixes, params, n=[3, 2])) == ids(first), "repeat mode is not seeded"
    assert [len(s) for s in first] == [3, 2]
    assert len({tuple(c.token_ids) for c in first[0]}) == 3, "repeated requests drew the same sample"


def test_bad_inputs_raise_clear_errors(engine, server):
    with pytest.raises(ValueError, match="empty.*at least one token"):
        engine.generate([[1, 2], []], GREEDY)
    with pytest.raises(EngineError, match="HTTP 400.*outside"):
        engine.generate([[1, VOCAB]], GREEDY)
    with pytest.raises(EngineError, match="HTTP 400.*positions"):
        engine.generate([[1] * 4090], SamplingParams(max_tokens=10))
    with pytest.raises(EngineError, match="HTTP 404.*not served here"):
        OpenAIEngine(server, model="some-other-model", max_retries=0).generate([[1]], GREEDY)
    with pytest.raises(ValueError, match="n_mode"):
        OpenAIEngine(server, n_mode="best_of")
