"""Shared by the tests in tests/vllm: tiny Qwen3 weights vLLM's CPU backend runs, the trainer's logprob
recomputation, the logprob tolerance. Imports nothing from vLLM."""

import importlib.util

VOCAB = 512
TOLERANCE = 1e-4  # |vLLM logprob - trainer logprob| on float32 weights (measured: at most 3e-5)


def skip_without_vllm() -> None:
    """Skip the calling test module unless vLLM is installed. Not `pytest.importorskip("vllm")`: with tests/ on
    sys.path, this folder is importable as a namespace package named vllm."""
    import pytest

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here; tests/vllm run in .venv-vllm (.ci/vllm)", allow_module_level=True)


def sharp_qwen3(seed: int):
    """A random tiny Qwen3 (head_dim 32, which vLLM's CPU attention supports) with its matrices scaled up (x16, the
    tied embedding x32), so that its logits spread (std ~7): a random init's greedy path merely repeats the last
    token, and near-ties would make greedy comparisons between two implementations flip on rounding."""
    import torch

    from tracerl.engines.tiny import tiny_qwen3

    model = tiny_qwen3(VOCAB, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(32 if "embed" in name else 16)
    return model


def trainer_logprobs(model, prefix, completion, temperature):
    """The trainer's recomputation of a completion's token logprobs: `tracerl.train.loss.token_logprobs`, i.e.
    log_softmax(logits / T) of each sampled token given the prefix and the tokens before it."""
    import torch

    from tracerl.train.loss import token_logprobs

    ids = torch.tensor([list(prefix) + list(completion.token_ids)])
    with torch.no_grad():
        values = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return values[0, len(prefix):]
