"""ScriptedEngine: the same cut rules as a real engine, deterministic per seed."""

import pytest

from tracerl.io.rollout.engine import SamplingParams
from tracerl.io.rollout.scripted_engine import ScriptedEngine


def noisy(prefix, sample_index, rng):
    return [rng.randrange(100) for _ in range(20)]


def test_max_tokens_cuts_with_length_finish():
    out = ScriptedEngine(noisy).generate([[1, 2]], SamplingParams(max_tokens=5))[0][0]
    assert len(out.token_ids) == len(out.logprobs) == 5 and out.finish_reason == "length"
    assert out.logprobs == [0.0] * 5


def test_stop_token_cuts_after_first_stop_and_is_included():
    engine = ScriptedEngine(lambda p, i, rng: [5, 6, 9, 7, 9, 8])
    out = engine.generate([[1]], SamplingParams(max_tokens=10, stop_token_ids=(9, 7)))[0][0]
    assert out.token_ids == [5, 6, 9] and out.finish_reason == "stop"
    # a stop token beyond max_tokens does not count
    out = engine.generate([[1]], SamplingParams(max_tokens=2, stop_token_ids=(9,)))[0][0]
    assert out.token_ids == [5, 6] and out.finish_reason == "length"


def test_seed_determines_output_independent_of_batch():
    engine = ScriptedEngine(noisy)
    params = SamplingParams(max_tokens=8, seed=3)
    both = engine.generate([[1, 2], [3]], params, n=2)
    alone = engine.generate([[3]], params, n=2)
    assert [c.token_ids for c in both[1]] == [c.token_ids for c in alone[0]]
    assert both[0][0].token_ids != both[0][1].token_ids, "samples of one prefix should differ"
    other = engine.generate([[1, 2], [3]], SamplingParams(max_tokens=8, seed=4), n=2)
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in both[0]]
    unseeded = ScriptedEngine(noisy, seed=3).generate([[3]], SamplingParams(max_tokens=8), n=2)
    assert [c.token_ids for c in unseeded[0]] == [c.token_ids for c in alone[0]], "params.seed=None uses engine seed"


def test_script_sees_prefix_and_sample_index_and_can_give_logprobs():
    seen = []

    def script(prefix, sample_index, rng):
        seen.append((tuple(prefix), sample_index))
        return [sample_index, 0], [-0.5, -1.5]

    engine = ScriptedEngine(script)
    out = engine.generate([[4, 5], [6]], SamplingParams(max_tokens=4, stop_token_ids=(0,)), n=[2, 1])
    assert [[c.token_ids for c in s] for s in out] == [[[0], [1, 0]], [[0]]]
    assert out[0][1].logprobs == [-0.5, -1.5]
    assert seen == [((4, 5), 0), ((4, 5), 1), ((6,), 0)]
    assert engine.calls[0][2] == [2, 1]


def test_bad_inputs_raise_clear_errors():
    engine = ScriptedEngine(lambda p, i, rng: [1, 2])
    with pytest.raises(ValueError, match="empty.*at least one token"):
        engine.generate([[1], []], SamplingParams())
    with pytest.raises(ValueError, match="one count per prefix"):
        engine.generate([[1]], SamplingParams(), n=[1, 1])
    with pytest.raises(ValueError, match="stop token"):
        engine.generate([[1]], SamplingParams(max_tokens=5))  # ends early with no stop token
    with pytest.raises(ValueError, match="logprobs"):
        ScriptedEngine(lambda p, i, rng: ([1, 2], [0.0])).generate([[1]], SamplingParams(max_tokens=2))


def test_sampling_params_refuse_a_temperature_that_is_not_a_finite_number():
    import math

    import pytest

    from tracerl.io.rollout.engine import SamplingParams

    for bad in (math.nan, math.inf, -0.5):
        with pytest.raises(ValueError, match="finite temperature"):
            SamplingParams(temperature=bad)
    assert SamplingParams(temperature=0.0).temperature == 0.0
