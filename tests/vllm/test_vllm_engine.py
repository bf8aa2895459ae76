"""VLLMEngine, a real in-process vLLM (CPU build) on a tiny Qwen3: same answers as tracerl's own engine on the same
weights, the trainer's logprobs, and weight sync (the engine follows new weights, its prefix cache is reset)."""

import pytest

from vllm_support import skip_without_vllm

skip_without_vllm()

import torch

from vllm_support import TOLERANCE, trainer_logprobs

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.engines.vllm_engine import VLLMEngine
from tracerl.io.rollout.engine import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def engine(model_a):
    """One vLLM engine for the module, on model A's weights (tests that load others put A back)."""
    with VLLMEngine.from_model(model_a, max_model_len=1024, kv_cache_gib=0.25) as engine:
        yield engine


def max_gap(completions_a, completions_b) -> float:
    return max(abs(x - y) for a, b in zip(completions_a, completions_b) for x, y in zip(a.logprobs, b.logprobs))


def test_greedy_continuations_from_tree_prefixes_equal_the_transformers_engine(engine, model_a, tree_prefixes):
    ours = TransformersEngine(model_a).generate(tree_prefixes, GREEDY)
    theirs = engine.generate(tree_prefixes, GREEDY)
    assert [s[0].token_ids for s in theirs] == [s[0].token_ids for s in ours]
    assert all(len(set(s[0].token_ids)) > 4 for s in ours), "the continuations must not be trivial repeats"
    assert max_gap([s[0] for s in theirs], [s[0] for s in ours]) < TOLERANCE  # log_softmax(logits) at T = 0
    assert all(s[0].finish_reason == "length" and len(s[0].token_ids) == 16 for s in theirs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_agree_with_the_trainers_recomputation(engine, model_a, tree_prefixes, temperature):
    out = engine.generate(tree_prefixes, SamplingParams(temperature=temperature, max_tokens=16, seed=3), n=3)
    assert [len(s) for s in out] == [3] * len(tree_prefixes)
    worst = wrong_temperature = 0.0
    for prefix, samples in zip(tree_prefixes, out):
        for c in samples:
            got = torch.tensor(c.logprobs)
            worst = max(worst, (got - trainer_logprobs(model_a, prefix, c, temperature)).abs().max().item())
            other = trainer_logprobs(model_a, prefix, c, 1.0 if temperature != 1.0 else 0.7)
            wrong_temperature = max(wrong_temperature, (got - other).abs().max().item())
    assert worst < TOLERANCE, f"vLLM's logprobs differ from log_softmax(logits / {temperature}) by {worst:.2e}"
    assert wrong_temperature > 100 * TOLERANCE  # the tolerance tells the temperatures apart


def test_stop_tokens_counts_and_seeds(engine, tree_prefixes):
    stops = tuple(range(0, 512, 7))
    params = SamplingParams(temperature=1.0, max_tokens=40, stop_token_ids=stops, seed=11)
    out = engine.generate(tree_prefixes[:4], params, n=[2, 0, 3, 1])
    assert [len(s) for s in out] == [2, 0, 3, 1]
    samples = [c for s in out for c in s]
    assert any(c.finish_reason == "stop" for c in samples)
    for c in samples:  # a stop token ends the sample and is its last id; a sample without one ran to max_tokens
        assert len(c.token_ids) == len(c.logprobs)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in stops and not set(c.token_ids[:-1]) & set(stops)
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == 40 and not set(c.token_ids) & set(stops)
    ids = [[c.token_ids for c in s] for s in out]
    assert [[c.token_ids for c in s] for s in engine.generate(tree_prefixes[:4], params, n=[2, 0, 3, 1])] == ids
    other = SamplingParams(temperature=1.0, max_tokens=40, stop_token_ids=stops, seed=12)
    assert [[c.token_ids for c in s] for s in engine.generate(tree_prefixes[:4], other, n=[2, 0, 3, 1])] != ids
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], params)


def test_after_a_weight_sync_samples_and_logprobs_follow_the_new_weights(engine, model_a, model_b, tree_prefixes):
    engine.generate(tree_prefixes, GREEDY)  # every prefix is now in vLLM's prefix cache, computed with A
    before = dict(engine.stats)
    greedy_a = TransformersEngine(model_a).generate(tree_prefixes, GREEDY)
    greedy_b = TransformersEngine(model_b).generate(tree_prefixes, GREEDY)
    assert all(a[0].token_ids != b[0].token_ids for a, b in zip(greedy_a, greedy_b))  # a skipped sync would show
    try:
        engine.load_weights(model_b.state_dict())
        after = engine.generate(tree_prefixes, GREEDY)
        hits = engine.stats["prefix_cache_hits"] - before["prefix_cache_hits"]
        assert [s[0].token_ids for s in after] == [s[0].token_ids for s in greedy_b]
        assert max_gap([s[0] for s in after], [s[0] for s in greedy_b]) < TOLERANCE
        # the prefixes were cached under A; after the reset, only prefixes sharing whole blocks of a prompt hit
        shared = sum(32 for p in tree_prefixes[3:])  # each depth-1/2 prefix starts with a 40-token prompt
        assert hits <= shared, f"{hits} prefix-cache hits after a weight sync: keys/values of the old weights reused"
        sampled = engine.generate(tree_prefixes, SamplingParams(temperature=0.7, max_tokens=16, seed=5), n=2)
        for prefix, samples in zip(tree_prefixes, sampled):
            for c in samples:
                new = trainer_logprobs(model_b, prefix, c, 0.7)
                assert (torch.tensor(c.logprobs) - new).abs().max().item() < TOLERANCE
        assert engine.stats["weight_loads"] == before["weight_loads"] + 1
    finally:
        engine.load_weights(model_a.state_dict())
    assert [s[0].token_ids for s in engine.generate(tree_prefixes, GREEDY)] == [s[0].token_ids for s in greedy_a]


def test_weights_load_from_a_torch_save_file(engine, model_a, model_b, tree_prefixes, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(model_b.state_dict(), path)
    try:
        engine.load_weights(str(path))
        out = engine.generate(tree_prefixes[:3], GREEDY)
        assert [s[0].token_ids for s in out] == [s[0].token_ids for s in TransformersEngine(model_b).generate(
            tree_prefixes[:3], GREEDY)]
    finally:
        engine.load_weights(model_a.state_dict())
