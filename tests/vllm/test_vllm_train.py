"""`tracerl train` with policy.engine=vllm: rollouts sampled by a real in-process vLLM, whose weights follow the
trainer's after every update (full fine-tuning and LoRA, merged)."""

import json

import pytest

from vllm_support import skip_without_vllm

skip_without_vllm()

import numpy as np
import torch

from vllm_support import TOLERANCE, trainer_logprobs

from tracerl.io.engine import SamplingParams
from tracerl.io.runlog import read_metrics
from tracerl.train.config import load_config
from tracerl.train.trainer import Trainer, run_training

# the tests/e2e tiny policy, 128 wide (head_dim 32: vLLM's CPU attention has no kernel for 16), a shorter warm start
TINY_POLICY = {"num_entities": 40, "num_distractors": 0, "hops": [2, 2], "num_train_rows": 150, "sft_steps": 150,
               "vocab_size": 500, "hidden_size": 128, "max_turns": 4, "max_tokens_per_turn": 40,
               "max_tokens_per_rollout": 400, "num_eval_prompts": 8, "eval_samples_per_prompt": 2, "lr": 1e-2}


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded

    cache = tmp_path_factory.mktemp("policy-cache")
    build_embedded(EmbeddedConfig.from_dict(TINY_POLICY), cache)
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
    trainer = Trainer(config)
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
