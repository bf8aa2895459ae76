"""A real vLLM server (a subprocess on 127.0.0.1, tracerl's worker extension, dev mode) behind OpenAIEngine: the
same answers as tracerl's own engine, the trainer's logprobs, and `OpenAIEngine.load_weights(path)` (what the
trainer calls after every update) making the server sample from the new weights."""

import pytest

from vllm_support import skip_without_vllm

skip_without_vllm()

import httpx
import torch

from vllm_support import TOLERANCE, trainer_logprobs, vllm_server
from helpers import free_port

from tracerl.engines.openai_engine import EngineError, OpenAIEngine
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.engines.vllm_worker import load_served_weights
from tracerl.io.rollout.engine import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def server(model_a, tmp_path_factory):
    """The server on model A's weights, saved with save_pretrained; yields its base URL."""
    model_dir = tmp_path_factory.mktemp("tiny-qwen3")
    model_a.save_pretrained(model_dir)
    with vllm_server(model_dir, free_port()) as url:
        yield url


def counters(url: str) -> dict[str, float]:
    """vLLM's prefix-cache counters from its Prometheus endpoint."""
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def test_served_vllm_answers_like_the_transformers_engine(server, model_a, tree_prefixes):
    with OpenAIEngine(server) as engine:
        theirs = engine.generate(tree_prefixes, GREEDY)
        assert [s[0].token_ids for s in theirs] == [s[0].token_ids for s in
                                                    TransformersEngine(model_a).generate(tree_prefixes, GREEDY)]
        sampled = engine.generate(tree_prefixes, SamplingParams(temperature=0.7, max_tokens=16, seed=2), n=2)
    for prefix, samples in zip(tree_prefixes, sampled):
        assert len(samples) == 2
        for c in samples:
            gap = (torch.tensor(c.logprobs) - trainer_logprobs(model_a, prefix, c, 0.7)).abs().max().item()
            assert gap < TOLERANCE, f"the server's logprobs differ from the trainer's by {gap:.2e}"


def test_load_weights_syncs_the_served_model(server, model_a, model_b, tree_prefixes, tmp_path):
    """The trainer's call: torch.save the weights, then OpenAIEngine.load_weights(path). Without the sync the server
    would keep answering with A (asserted different from B), or with A's cached keys/values."""
    greedy_a = [s[0].token_ids for s in TransformersEngine(model_a).generate(tree_prefixes, GREEDY)]
    greedy_b = [s[0].token_ids for s in TransformersEngine(model_b).generate(tree_prefixes, GREEDY)]
    assert all(a != b for a, b in zip(greedy_a, greedy_b))
    path_a, path_b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(model_a.state_dict(), path_a)
    torch.save(model_b.state_dict(), path_b)
    with OpenAIEngine(server) as engine:
        engine.generate(tree_prefixes, GREEDY)  # cached under A
        engine.load_weights(str(path_b))
        before = counters(server)
        assert [s[0].token_ids for s in engine.generate(tree_prefixes, GREEDY)] == greedy_b
        after = counters(server)
        hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        assert hits <= 32 * (len(tree_prefixes) - 3), f"{hits} hits: the prefix cache was not reset"
        sampled = engine.generate(tree_prefixes, SamplingParams(temperature=1.0, max_tokens=16, seed=4))
        for prefix, samples in zip(tree_prefixes, sampled):
            gap = (torch.tensor(samples[0].logprobs) - trainer_logprobs(model_b, prefix, samples[0], 1.0)).abs().max()
            assert gap.item() < TOLERANCE
        engine.load_weights(str(path_a))
        assert [s[0].token_ids for s in engine.generate(tree_prefixes, GREEDY)] == greedy_a


def test_a_failed_sync_raises_with_the_servers_reason(server, tmp_path):
    with OpenAIEngine(server, timeout_s=60) as engine, \
            pytest.raises(EngineError, match="HTTP 500.*worker-extension-cls"):
        load_served_weights(engine.post_small, server, str(tmp_path / "missing.pt"))
    with OpenAIEngine(server) as engine:  # the server survives a failed call
        assert len(engine.generate([[1, 2, 3]], GREEDY)[0]) == 1
