"""A tiny embedded policy built once per session (about a minute on 2 cores), and run overrides that keep
training steps to a few seconds: 2-hop questions over a 40-entity world, a 64-wide model, short turns."""

import json

import pytest
from helpers import TINY_POLICY

torch = pytest.importorskip("torch")



@pytest.fixture(scope="session")
def tiny_overrides(tmp_path_factory):
    """--set overrides for a fast run on the tiny policy (the policy is built here, once)."""
    from tracerl.engines import torch_threads
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded

    cache = tmp_path_factory.mktemp("policy-cache")
    with torch_threads(1):
        build_embedded(EmbeddedConfig.from_dict(TINY_POLICY), cache)
    return [f"policy.embedded={json.dumps(TINY_POLICY)}", f"policy.cache_dir={cache}", "data.num_train_prompts=120",
            "allocation.num_prompts=4", "allocation.rollouts_per_prompt=4", "allocation.m_max=8",
            "run.eval_prompts=6", "run.eval_samples=2", "run.num_threads=1", "run.progress=false",
            "optim.micro_batch_rollouts=8"]
