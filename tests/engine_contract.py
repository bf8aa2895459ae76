"""Checks every token-level engine must pass, shared by the engines' own test files (TransformersEngine in
tests/torch, OpenAIEngine against a real `tracerl serve` in tests/serve): each takes a ready engine and the vocabulary
size of the model behind it."""

from __future__ import annotations

import numpy as np
import pytest

from tracerl.io.rollout.engine import SamplingParams


def tokens(n: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def forward_logprobs(model, prefix: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of each output token, from one forward pass over prefix + output."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prefix + output])).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits / temperature, -1)
    return [logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(output)]


def check_rows_max_tokens_and_length_finish(engine, vocab: int) -> None:
    """One row of `n[i]` samples per prefix (0 allowed), each cut at max_tokens with finish "length"; no prefixes,
    no rows; a count list of the wrong length is refused."""
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=0)
    out = engine.generate([tokens(4, 10, vocab), tokens(6, 11, vocab), tokens(2, 12, vocab)], params, n=[3, 0, 2])
    assert [len(s) for s in out] == [3, 0, 2]
    for c in (c for s in out for c in s):
        assert len(c.token_ids) == len(c.logprobs) == 5 and c.finish_reason == "length"
    assert engine.generate([], params) == []
    with pytest.raises(ValueError, match="one count"):
        engine.generate([tokens(4, 10, vocab)], params, n=[1, 2])


def check_stop_token_ends_sample_and_is_included(engine, vocab: int) -> None:
    """A stop token ends its sample, is its last token, and finishes it with "stop", greedy and sampled."""
    prefix = tokens(10, 13, vocab)
    free = engine.generate([prefix], SamplingParams(temperature=0.0, max_tokens=10))[0][0]
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    got = engine.generate([prefix], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=(stop,)))[0][0]
    assert got.token_ids == free.token_ids[: first + 1] and got.finish_reason == "stop"
    # sampled: half the vocabulary stops, so every sample ends early, at its first stop token
    stops = tuple(range(0, vocab, 2))
    out = engine.generate([prefix, tokens(5, 14, vocab)], SamplingParams(max_tokens=40, stop_token_ids=stops, seed=1),
                          n=4)
    for c in (c for s in out for c in s):
        assert c.finish_reason == "stop" and c.token_ids[-1] in stops
        assert not set(c.token_ids[:-1]) & set(stops), f"sample went on after a stop token: {c.token_ids}"
