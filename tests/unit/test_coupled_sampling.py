"""Coupled sampling's streams (`tracerl.io.rollout.engine.stream_key`, `stream_uniforms`) and how the driver keys them:
one stream per rollout and turn, never shared by two rollouts, never depending on how calls were batched."""

import numpy as np
import pytest

from tracerl.io.rollout.driver import DriverLimits, ReActDriver
from tracerl.io.rollout.engine import SamplingParams, stream_key, stream_uniforms


def test_stream_keys_are_stable_and_order_sensitive():
    assert stream_key(1, 2, 3) == stream_key(1, 2, 3)
    assert len({stream_key(1, 2), stream_key(2, 1), stream_key(1, 2, 0), stream_key(1, 3)}) == 4
    assert 0 <= stream_key(-5, 2**70) < 2**64  # any integers, folded into 64 bits


def test_stream_uniforms_are_uniform_and_per_position():
    keys = np.array([stream_key(0, i) for i in range(50_000)], dtype=np.uint64)
    u = stream_uniforms(keys, 3)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    np.testing.assert_array_equal(stream_uniforms(keys[::-1], 3), u[::-1])  # a key's draw ignores its neighbours
    assert abs(np.corrcoef(u, stream_uniforms(keys, 4))[0, 1]) < 0.02  # the next position is a fresh draw


class KeyRecorder:
    """Wraps a scripted engine: answers as it does, records the keys of every call."""

    supports_keys = True

    def __init__(self, inner):
        self.inner, self.keys = inner, []

    def generate(self, prefixes, params, n=1, keys=None):
        self.keys.append(None if keys is None else list(keys))
        return self.inner.generate(prefixes, params, n)


@pytest.fixture(scope="module")
def multihop():
    pytest.importorskip("transformers")
    from helpers import expert_engine, make_renderer
    from tracerl.io.domains.multihop import MultiHopDomain

    domain = MultiHopDomain(num_entities=80, num_distractors=20, seed=0)
    rows = domain.rows("test", 6, seed=0)
    renderer = make_renderer([d["title"] + " " + d["text"] for d in domain.kb.documents]
                             + [r["prompt"][-1]["content"] for r in rows])
    return domain, rows, renderer, lambda: expert_engine(renderer, rows, domain=domain)


def run(multihop, order, coupled=True, seed=5):
    domain, rows, renderer, engine = multihop
    recorder = KeyRecorder(engine())
    driver = ReActDriver(recorder, renderer, domain, sampling=SamplingParams(seed=seed), coupled=coupled,
                         limits=DriverLimits(max_turns=8, max_tokens_per_turn=512, max_tokens_per_rollout=60_000,
                                             max_observation_chars=100_000))
    driver.set_rows(rows)
    trees, _ = driver.run_roots(order, [2] * len(order))
    return recorder.keys, trees


def test_every_rollout_and_turn_gets_its_own_stream_even_where_histories_coincide(multihop):
    keys, trees = run(multihop, list(range(6)))
    assert keys[0] == [stream_key(5, i, 0) for i in range(6)]  # first turn: one key per question, samples j apart
    assert len(keys) > 1, "the expert's episodes take more than one turn"
    later = [k for call in keys[1:] for k in call]
    assert len(later) == len(set(later)), "two rollouts (or two turns) shared a stream"
    # the scripted expert answers both samples of a question alike: their histories coincide, their streams do not
    assert all(len({tuple(t.prefix_token_ids(leaf)) for leaf in t.leaves()}) == 1 for t in trees)


def test_streams_follow_the_question_not_the_position_in_the_call(multihop):
    forward, _ = run(multihop, list(range(6)))
    backward, _ = run(multihop, list(range(6))[::-1])
    assert sorted(k for call in forward for k in call) == sorted(k for call in backward for k in call)
    other_seed, _ = run(multihop, list(range(6)), seed=6)
    assert not set(k for call in forward for k in call) & set(k for call in other_seed for k in call)


def test_uncoupled_sampling_passes_no_keys_and_coupled_needs_an_engine_that_takes_them(multihop):
    keys, _ = run(multihop, [0, 1], coupled=False)
    assert keys and all(k is None for k in keys)
    domain, rows, renderer, engine = multihop
    with pytest.raises(ValueError, match="needs an engine that takes per-prefix keys"):
        ReActDriver(engine(), renderer, domain, sampling=SamplingParams(seed=0), coupled=True)
    with pytest.raises(ValueError, match="needs a sampling seed"):
        ReActDriver(KeyRecorder(engine()), renderer, domain, coupled=True)
