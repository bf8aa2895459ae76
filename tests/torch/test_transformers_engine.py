"""TransformersEngine on a tiny random Qwen3: KV reuse must not change what is generated; `make_engine` builds the
engine a policy config names.

The reference for every reuse check is the same model without reuse (every sample prefills its whole prefix)
and a plain forward pass over the full sequence.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import engine_contract
from engine_contract import (check_rows_max_tokens_and_length_finish, check_stop_token_ends_sample_and_is_included,
                             forward_logprobs)

from tracerl.engines import make_engine
from tracerl.engines.tiny import tiny_qwen3
from tracerl.engines.transformers_engine import TransformersEngine, sample_next
from tracerl.io.rollout.engine import SamplingParams

VOCAB = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)


def tokens(n: int, seed: int) -> list[int]:
    return engine_contract.tokens(n, seed, VOCAB)


def assert_same(got, want, what: str) -> None:
    assert got.token_ids == want.token_ids, f"{what}: tokens {got.token_ids} != {want.token_ids}"
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4, err_msg=f"{what}: logprobs differ")
    assert got.finish_reason == want.finish_reason, what


def test_continuation_after_cached_ancestor_equals_full_recomputation(model):
    reuse, full = TransformersEngine(model), TransformersEngine(model, reuse_kv=False)
    root = tokens(30, seed=1)
    turn = reuse.generate([root], GREEDY)[0][0]
    history = root + turn.token_ids + tokens(6, seed=2)  # the next turn's prefix: output + an observation
    # cut points inside the prompt, inside the output, right after it, and the whole history (a new turn)
    for cut in (1, 7, 30, 35, 40, 41, len(history)):
        prefix = history[:cut]
        before = dict(reuse.stats)
        got = reuse.generate([prefix], GREEDY)[0][0]
        want = full.generate([prefix], GREEDY)[0][0]
        assert_same(got, want, f"prefix of {cut} tokens")
        np.testing.assert_allclose(got.logprobs, forward_logprobs(model, prefix, got.token_ids), atol=1e-4,
                                   err_msg=f"prefix of {cut} tokens: logprobs differ from a forward pass")
        if cut > 1:
            assert reuse.stats["prefill_tokens_reused"] > before["prefill_tokens_reused"], f"cut {cut} reused nothing"
    # the next turn's prefix only prefills the output's last token (never fed) and the observation
    before = reuse.stats["prefill_tokens_computed"]
    reuse.generate([history + [3]], GREEDY)
    assert reuse.stats["prefill_tokens_computed"] - before == 1, "an extension of a cached sequence recomputed it"


def test_mixed_length_batch_with_and_without_cache_equals_one_by_one(model):
    reuse, full = TransformersEngine(model), TransformersEngine(model, reuse_kv=False)
    base = tokens(25, seed=3)
    reuse.generate([base[:12]], GREEDY)  # caches an ancestor of some prefixes below
    prefixes = [base[:1], base[:12] + [7], tokens(40, seed=4), base, tokens(3, seed=5), base[:12]]
    got = reuse.generate(prefixes, GREEDY, n=[1, 2, 1, 1, 1, 2])
    for i, p in enumerate(prefixes):
        want = full.generate([p], GREEDY)[0][0]  # alone: no padding at all
        for j, c in enumerate(got[i]):
            assert_same(c, want, f"prefix {i} (length {len(p)}) sample {j}")
            np.testing.assert_allclose(c.logprobs, forward_logprobs(model, p, c.token_ids), atol=1e-4)


def test_sampled_logprobs_are_temperature_scaled_forward_logprobs(model):
    engine = TransformersEngine(model)
    prefixes = [tokens(9, seed=6), tokens(20, seed=7)]
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, seed=0)
    for _ in range(2):  # the second call reuses the first call's keys/values
        for p, samples in zip(prefixes, engine.generate(prefixes, params, n=2)):
            for c in samples:
                want = forward_logprobs(model, p, c.token_ids, temperature=0.7)
                np.testing.assert_allclose(c.logprobs, want, atol=1e-4, err_msg="not log_softmax(logits / T)")


def test_seed_determines_output(model):
    prefixes = [tokens(8, seed=8), tokens(15, seed=9)]
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    engine = TransformersEngine(model)
    first = engine.generate(prefixes, params, n=2)
    again = engine.generate(prefixes, params, n=2)  # now with the prefixes cached
    fresh = TransformersEngine(model, reuse_kv=False).generate(prefixes, params, n=2)
    other = engine.generate(prefixes, SamplingParams(temperature=1.0, max_tokens=12, seed=8), n=2)

    def ids(res):
        return [[c.token_ids for c in s] for s in res]

    assert ids(first) == ids(again) == ids(fresh), "same seed and inputs gave different outputs"
    assert ids(first) != ids(other), "seeds 7 and 8 gave identical samples"
    assert first[0][0].token_ids != first[0][1].token_ids, "two samples of one prefix are identical at T=1"


def test_n_rows_max_tokens_and_length_finish(model):
    check_rows_max_tokens_and_length_finish(TransformersEngine(model), VOCAB)


def test_stop_token_ends_sample_and_is_included(model):
    check_stop_token_ends_sample_and_is_included(TransformersEngine(model), VOCAB)


def test_stats_count_shared_prefill_and_reuse_off_recomputes(model):
    prefix = tokens(20, seed=15)
    on, off = TransformersEngine(model), TransformersEngine(model, reuse_kv=False)
    on.generate([prefix], GREEDY, n=4)
    off.generate([prefix], GREEDY, n=4)
    assert on.stats["prefill_tokens_computed"] == 20 and on.stats["prefill_tokens_reused"] == 60
    assert off.stats["prefill_tokens_computed"] == 80 and off.stats["prefill_tokens_reused"] == 0
    off.generate([prefix], GREEDY)
    assert off.stats["prefill_tokens_computed"] == 100, "reuse_kv=False must not reuse across calls"


def test_lru_store_is_bounded_and_evicts_oldest(model):
    engine = TransformersEngine(model, cache_capacity_tokens=100)
    prompts = [tokens(30, seed=100 + i) for i in range(6)]
    for p in prompts:
        engine.generate([p], GREEDY)
        assert engine.store.num_tokens <= 100, "store grew past its capacity"
    assert engine.stats["cache_evictions"] > 0 and engine.stats["cache_tokens"] <= 100
    before = engine.stats["prefill_tokens_computed"]
    engine.generate([prompts[-1]], GREEDY)  # most recent: kept
    assert engine.stats["prefill_tokens_computed"] - before == 1
    before = engine.stats["prefill_tokens_computed"]
    engine.generate([prompts[0]], GREEDY)  # oldest: evicted
    assert engine.stats["prefill_tokens_computed"] - before == 30


def test_weight_update_invalidates_cached_keys_values():
    model = tiny_qwen3(vocab_size=VOCAB, seed=1)
    engine = TransformersEngine(model)
    prefix = tokens(16, seed=16)
    engine.generate([prefix], GREEDY)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # in place, as an optimizer step does
    got = engine.generate([prefix], GREEDY)[0][0]
    assert engine.stats["cache_invalidations"] == 1
    assert_same(got, TransformersEngine(model, reuse_kv=False).generate([prefix], GREEDY)[0][0], "after update")


def test_chunked_batches_match_one_batch(model):
    prefixes = [tokens(5 + 3 * i, seed=20 + i) for i in range(4)]
    one = TransformersEngine(model, max_batch_size=32).generate(prefixes, GREEDY, n=2)
    chunked = TransformersEngine(model, max_batch_size=3).generate(prefixes, GREEDY, n=2)
    for i, (a, b) in enumerate(zip(one, chunked)):
        for x, y in zip(a, b):
            assert_same(y, x, f"prefix {i} in chunks of 3")


def test_bad_inputs_raise_clear_errors(model):
    engine = TransformersEngine(model)
    with pytest.raises(ValueError, match="empty.*at least one token"):
        engine.generate([[1, 2], []], GREEDY)
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, VOCAB]], GREEDY)
    with pytest.raises(ValueError, match="positions"):
        engine.generate([[1] * 4090], SamplingParams(max_tokens=10))


def test_sampler_matches_distribution_and_top_p_truncates():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).repeat(20_000, 1)  # (B, V)
    gen = torch.Generator().manual_seed(0)
    tok, logp = sample_next(logits, SamplingParams(temperature=1.0), gen)
    freq = np.bincount(tok.numpy(), minlength=5) / len(tok)
    np.testing.assert_allclose(freq, torch.softmax(logits[0], -1).numpy(), atol=0.015)
    np.testing.assert_allclose(logp.numpy(), torch.log_softmax(logits[0], -1)[tok].numpy(), atol=1e-6)
    # softmax ~ [.56, .21, .13, .08, .03]: top_p=0.7 keeps the first two (the mass before the third is .77)
    tok, _ = sample_next(logits, SamplingParams(temperature=1.0, top_p=0.7), gen)
    assert set(tok.tolist()) == {0, 1}
    tok, _ = sample_next(logits, SamplingParams(temperature=1.0, top_p=0.8), gen)
    assert set(tok.tolist()) == {0, 1, 2}
    tok, _ = sample_next(logits[:100], SamplingParams(temperature=1.0, top_p=1e-6), gen)
    assert set(tok.tolist()) == {0}, "top_p near 0 must be greedy"


def test_from_pretrained_loads_a_local_directory(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = TransformersEngine.from_pretrained(str(tmp_path), max_batch_size=4)
    prefix = tokens(12, seed=30)
    assert_same(loaded.generate([prefix], GREEDY)[0][0], TransformersEngine(model).generate([prefix], GREEDY)[0][0],
                "reloaded model")


def test_bench_reuse_cuts_prefill_by_the_shared_prefix_fraction():
    from tracerl.bench.engine import EngineBenchConfig, run, to_markdown

    cfg = EngineBenchConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            num_prompts=2, prompt_tokens=16, num_turns=3, turn_tokens=4, observation_tokens=3,
                            branch_depths=(1, 2), repeats=1, roofline=False)  # roofline: test_bench_roofline.py
    result = run(cfg)
    on, off, w = result["modes"]["on"], result["modes"]["off"], result["workload"]
    assert on["generated_tokens"] == off["generated_tokens"] == w["num_samples"] * 4
    assert off["prefill_tokens_computed"] == w["prefix_tokens"], "reuse off must prefill every prefix token"
    assert 0.5 < w["shared_prefix_frac"] < 1
    assert result["prefill_cut_frac"] >= w["shared_prefix_frac"] - 1e-12, to_markdown(result)
    assert "meets the shared-prefix bound" in to_markdown(result)


def test_shared_prefix_tokens_by_hand():
    from types import SimpleNamespace as C

    from tracerl.bench.engine import shared_prefix_tokens

    calls = [([[1, 2, 3]], [2], [[C(token_ids=[4, 5]), C(token_ids=[6, 7])]]),  # 3 + 3 prefix tokens, 3 shared
             ([[1, 2, 3, 4, 5, 9], [1, 2, 8]], [1, 1], [[C(token_ids=[0])], [C(token_ids=[0])]])]
    # [1,2,3,4,5,9]: fed before [1,2,3,4] (5 was sampled, never fed) -> 4 shared; [1,2,8]: 2 shared
    assert shared_prefix_tokens(calls) == (3 + 3 + 6 + 3, 3 + 4 + 2)


def test_coupled_samples_do_not_depend_on_the_batch_and_are_shared_by_close_policies(model):
    """keys: sample j of prefix i draws from stream (keys[i], j) whatever else is in the call, so the same keys give
    the same tokens alone, in a batch, reordered and in chunks; two policies close to each other sample mostly the
    same tokens with the same keys and mostly different ones with independent draws."""
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    prefixes = [tokens(10, seed=40 + i) for i in range(4)]  # one length: the same padding in every batch
    keys = [101, 102, 103, 104]

    def ids(res):
        return [[c.token_ids for c in s] for s in res]

    together = ids(TransformersEngine(model).generate(prefixes, params, n=2, keys=keys))
    alone = [ids(TransformersEngine(model).generate([p], params, n=2, keys=[k]))[0] for p, k in zip(prefixes, keys)]
    backwards = ids(TransformersEngine(model).generate(prefixes[::-1], params, n=2, keys=keys[::-1]))[::-1]
    chunked = ids(TransformersEngine(model, max_batch_size=3).generate(prefixes, params, n=2, keys=keys))
    assert together == alone == backwards == chunked, "a row's coupled draws depended on the rest of the batch"
    assert together[0][0] != together[0][1], "two samples of one prefix drew the same stream"
    other_keys = ids(TransformersEngine(model).generate(prefixes, params, n=2, keys=[201, 202, 203, 204]))
    assert other_keys != together

    nudged = tiny_qwen3(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    with torch.no_grad():
        for p in nudged.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    many = [tokens(10, seed=60 + i) for i in range(32)]
    first = [[s[0] for s in r] for r in (ids(TransformersEngine(m).generate(many, params, keys=list(range(32))))
                                       for m in (model, nudged))]
    independent = ids(TransformersEngine(nudged).generate(many, SamplingParams(temperature=1.0, max_tokens=12,
                                                                              seed=9)))
    coupled_agree = np.mean([a[0] == b[0] for a, b in zip(*first)])
    independent_agree = np.mean([a[0] == b[0][0] for a, b in zip(first[0], independent)])
    assert coupled_agree >= 0.8 > 0.3 >= independent_agree, (coupled_agree, independent_agree)


def test_keys_must_be_one_per_prefix(model):
    with pytest.raises(ValueError, match="one key per prefix"):
        TransformersEngine(model).generate([[1, 2], [3]], SamplingParams(seed=0), keys=[1])


def test_make_engine_builds_the_engine_the_policy_config_names(model, monkeypatch):
    from tracerl.engines.openai_engine import OpenAIEngine
    from tracerl.engines.vllm_engine import VLLMEngine
    from tracerl.train.config import PolicyConfig

    engine = make_engine(PolicyConfig(max_batch_size=5), model, device="cpu", compute_dtype=torch.bfloat16)
    assert isinstance(engine, TransformersEngine) and engine.model is model
    assert (engine.max_batch_size, engine.compute_dtype) == (5, torch.bfloat16)

    said = []
    served = PolicyConfig(engine="openai", base_url="http://127.0.0.1:9/v1", served_model_name="m", n_mode="repeat",
                          max_batch_size=3, sync_weights=False)
    client = make_engine(served, model, say=said.append)  # builds a client: nothing is sent until it generates
    assert isinstance(client, OpenAIEngine)
    assert (client.base_url, client.model, client.n_mode, client.max_concurrency, client.vocab_size) == (
        "http://127.0.0.1:9", "m", "repeat", 3, VOCAB), "the client must refuse ids outside the policy's vocabulary"
    assert said == ["generating with the server at http://127.0.0.1:9/v1"]

    built = {}
    monkeypatch.setattr(VLLMEngine, "from_model", classmethod(
        lambda cls, m, state_dict=None, **kwargs: built.update(model=m, state_dict=state_dict, **kwargs) or "vllm"))
    weights = {"w": torch.zeros(1)}
    cfg = PolicyConfig(engine="vllm", max_batch_size=7, vllm_max_model_len=512, vllm_kv_cache_gib=0.5,
                       vllm_gpu_memory_utilization=0.4, vllm_sleep=False)
    assert make_engine(cfg, model, device=torch.device("cpu"), weights=lambda: weights, seed=3) == "vllm"
    assert built == {"model": model, "state_dict": weights, "device": "cpu", "seed": 3, "max_model_len": 512,
                     "max_num_seqs": 7, "kv_cache_gib": 0.5, "gpu_memory_utilization": 0.4,
                     "enable_sleep_mode": False}


def test_make_engine_refuses_an_unknown_engine_naming_the_choices(model):
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"policy.engine='sglang'.*transformers, vllm, openai"):
        make_engine(SimpleNamespace(engine="sglang", max_batch_size=4), model)
