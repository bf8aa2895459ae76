"""`tracerl train` on real vLLM: with policy.engine=vllm (in process) and with policy.engine=openai against a vLLM
server (a subprocess with tracerl's worker extension); either way vLLM's weights follow the trainer's after every
update (full fine-tuning, and LoRA merged)."""

import json

import pytest

from vllm_support import skip_without_vllm

skip_without_vllm()

import numpy as np
import torch

from helpers import TINY_POLICY as TINY, free_port
from vllm_support import TOLERANCE, trainer_logprobs, vllm_server

from tracerl.engines.openai_engine import OpenAIEngine
from tracerl.io.files.runlog import read_metrics
from tracerl.io.rollout.engine import SamplingParams
from tracerl.train.config import load_config
from tracerl.train.policy import load_policy
from tracerl.train.trainer import Trainer, run_training

# the tests' tiny policy (tests/helpers.py), 128 wide (head_dim 32: vLLM's CPU attention has no kernel for 16), a
# shorter warm start
TINY_POLICY = {**TINY, "sft_steps": 150, "hidden_size": 128}


@pytest.fixture(scope="module")
def policy_cache(tmp_path_factory):
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded

    cache = tmp_path_factory.mktemp("policy-cache")
    return build_embedded(EmbeddedConfig.from_dict(TINY_POLICY), cache).path, cache


@pytest.fixture(scope="module")
def overrides(policy_cache):
    cache = policy_cache[1]
    return [f"policy.embedded={json.dumps(TINY_POLICY)}", f"policy.cache_dir={cache}", "data.num_train_prompts=120",
            "allocation.num_prompts=4", "allocation.rollouts_per_prompt=4", "allocation.m_max=8",
            "run.eval_prompts=4", "run.eval_samples=1", "run.num_threads=1", "run.progress=false",
            "optim.micro_batch_rollouts=8", "policy.engine=vllm", "policy.vllm_max_model_len=1024",
            "policy.vllm_kv_cache_gib=0.25", "run.num_steps=2"]


def test_train_runs_end_to_end_on_vllm(overrides, tmp_path):
    result = run_training(load_config(None, [*overrides, f"run.out_dir={tmp_path / 'run'}"]))
    rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert result["steps"] == 2 and len(rows) == 2
    assert all(r["rollout/num_rollouts"] > 0 and r["rollout/tokens"] > 0 for r in rows)
    assert all(np.isfinite(r["train/grad_norm"]) for r in rows)


def test_vllm_follows_the_trainers_weights_with_lora_merged(overrides, tmp_path):
    """Two updates of LoRA adapters; vLLM then samples what the adapted model computes. The initial policy's
    logprobs on the same samples differ far beyond the tolerance, so a skipped sync fails this test."""
    pytest.importorskip("peft")
    config = load_config(None, [*overrides, f"run.out_dir={tmp_path / 'run'}", "policy.lora_rank=4",
                                "optim.lr=5e-2"])
    trainer = Trainer(config, load_policy(config))
    try:
        initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        trainer.sync_weights()
        for _ in range(2):
            trainer.train_step()
        assert trainer.engine.stats["weight_loads"] == 4  # at start (from_model), the run's first sync, two updates
        rng = np.random.default_rng(0)
        prefixes = [rng.integers(0, len(trainer.policy.tokenizer), 30).tolist() for _ in range(4)]
        out = trainer.engine.generate(prefixes, SamplingParams(temperature=1.0, max_tokens=12, seed=0), n=2)
        trained_gap = initial_gap = 0.0
        with torch.no_grad():
            for prefix, samples in zip(prefixes, out):
                for c in samples:
                    got = torch.tensor(c.logprobs)
                    trained_gap = max(trained_gap, (got - trainer_logprobs(trainer.model, prefix, c, 1.0)).abs().max())
                    with trainer.policy.peft.disable_adapter():  # the base model: what vLLM held before the updates
                        base = trainer_logprobs(trainer.model, prefix, c, 1.0)
                    initial_gap = max(initial_gap, (got - base).abs().max())
        assert trained_gap < TOLERANCE, f"vLLM's logprobs are {trained_gap:.2e} off the trained policy's"
        assert initial_gap > 100 * TOLERANCE, "the updates did not move the policy enough to tell a skipped sync"
        assert any(not torch.equal(initial[k], v) for k, v in trainer.model.state_dict().items())
    finally:
        trainer.close()


def test_training_through_a_vllm_server_keeps_it_on_the_trainers_weights(overrides, policy_cache, tmp_path):
    """The served run: the server starts on other weights; the trainer pushes its own before the first step and
    after each update (OpenAIEngine.load_weights -> /collective_rpc + /reset_prefix_cache). At the end the server's
    logprobs are the final checkpoint's, not the initial policy's."""
    from tracerl.policy.embedded import load_embedded

    path, _ = policy_cache
    served = load_embedded(path).model
    initial = {k: v.clone() for k, v in served.state_dict().items()}
    with torch.no_grad():  # the server starts from other weights: the run must push its own first
        for p in served.parameters():
            p.add_(0.05)
    served.save_pretrained(tmp_path / "served")
    with vllm_server(tmp_path / "served", free_port()) as url:
        config = load_config(None, [*overrides, f"run.out_dir={tmp_path / 'run'}", "method=grpo", "optim.lr=5e-2",
                                    "policy.engine=openai", f"policy.base_url={url}"])
        run_training(config)
        rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
        assert len(rows) == 2 and all(r["rollout/num_rollouts"] > 0 for r in rows)
        trained = load_embedded(path).model
        trained.load_state_dict(torch.load(tmp_path / "run" / "checkpoints" / "step-000002" / "model.pt",
                                           weights_only=True))
        start = load_embedded(path).model
        start.load_state_dict(initial)
        rng = np.random.default_rng(1)
        prefixes = [rng.integers(0, 500, 30).tolist() for _ in range(4)]
        with OpenAIEngine(url) as engine:
            out = engine.generate(prefixes, SamplingParams(temperature=1.0, max_tokens=12, seed=0), n=2)
    trained_gap = initial_gap = 0.0
    for prefix, samples in zip(prefixes, out):
        for c in samples:
            got = torch.tensor(c.logprobs)
            trained_gap = max(trained_gap, (got - trainer_logprobs(trained, prefix, c, 1.0)).abs().max().item())
            initial_gap = max(initial_gap, (got - trainer_logprobs(start, prefix, c, 1.0)).abs().max().item())
    assert trained_gap < TOLERANCE, f"the server's logprobs are {trained_gap:.2e} off the trained policy's"
    assert initial_gap > 100 * TOLERANCE, "training did not move the policy enough to tell a skipped sync"
