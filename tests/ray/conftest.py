"""Shared pieces of the Ray tests, all on loopback: a tiny embedded policy (built in seconds), `tracerl serve`'s app
over it in a uvicorn thread, and one local Ray cluster for the session (2 CPUs), shut down at the end."""

import pytest

from helpers import BUILD_SEED, thread_server

torch = pytest.importorskip("torch")
pytest.importorskip("uvicorn")

# a plumbing-grade policy: 20 SFT steps, so it writes mostly malformed turns (multi-turn rollouts, some answers)
TINY_POLICY = {"seed": BUILD_SEED, "num_entities": 40, "num_distractors": 0, "hops": [2, 2], "num_train_rows": 60,
               "sft_steps": 20, "vocab_size": 400, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "max_turns": 3,
               "max_tokens_per_turn": 24, "max_tokens_per_rollout": 240, "num_eval_prompts": 2,
               "eval_samples_per_prompt": 1}


@pytest.fixture(scope="session")
def policy(tmp_path_factory):
    from tracerl.engines import torch_threads
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded

    with torch_threads(1):
        return build_embedded(EmbeddedConfig.from_dict(TINY_POLICY), tmp_path_factory.mktemp("policy-cache"))


@pytest.fixture(scope="session")
def server_url(policy):
    """`tracerl serve`'s app over the tiny policy. No KV reuse: every request is computed from scratch, so equal
    requests get bit-equal answers whatever was asked before (the tests compare runs sample by sample)."""
    from tracerl.engines.transformers_engine import TransformersEngine
    from tracerl.serve.app import create_app

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with thread_server(create_app(TransformersEngine(policy.model, reuse_kv=False), "tiny",
                                      policy.tokenizer)) as url:
            yield url
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_cluster():
    from tracerl.executors import start_ray

    import ray

    info = start_ray(num_cpus=2)
    try:
        yield info
    finally:
        ray.shutdown()
