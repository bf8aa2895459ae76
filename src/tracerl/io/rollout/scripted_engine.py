"""A scripted engine for tests only: a Python function decides which tokens each sample emits.

`ScriptedEngine(fn)` implements the Engine protocol without a model, so the rollout driver, environments and
trainers can be tested fast and deterministically. `fn(prefix_ids, sample_index, rng)` returns the tokens to emit
(or `(tokens, logprobs)`); the engine applies the same cut rules as a real engine: the output ends after the first
stop token (finish "stop", the stop token included) or at `max_tokens` (finish "length").

It does not model a distribution: logprobs are 0.0 unless the script gives them, temperature and top_p are ignored,
and nothing is cached. Never use it to produce training data.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from tracerl.io.rollout.engine import Completion, SamplingParams

Script = Callable[[list[int], int, random.Random], "list[int] | tuple[list[int], list[float]]"]


def _sample_rng(seed: int, prefix: Sequence[int], sample_index: int) -> random.Random:
    """A private RNG per (seed, prefix, sample): stable across processes and independent of call order."""
    digest = hashlib.sha256(repr((seed, tuple(prefix), sample_index)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def _counts(n: int | Sequence[int], num_prefixes: int) -> list[int]:
    counts = [n] * num_prefixes if isinstance(n, int) else [int(c) for c in n]
    if len(counts) != num_prefixes:
        raise ValueError(f"n has {len(counts)} entries for {num_prefixes} prefixes; give one count per prefix "
                         f"or a single int")
    if any(c < 0 for c in counts):
        raise ValueError(f"n={counts} has a negative count; use 0 to skip a prefix")
    return counts


class ScriptedEngine:
    """Engine protocol driven by `fn(prefix_ids, sample_index, rng) -> tokens` (tests only).

    `rng` is a `random.Random` seeded from (params.seed or the engine's `seed`, the prefix, sample_index), so the
    same seed gives the same outputs whatever the batch composition. `logprob` is reported for every token unless
    `fn` returns `(tokens, logprobs)`. Every call is recorded in `calls` as (prefixes, params, counts).
    """

    def __init__(self, fn: Script, *, seed: int = 0, logprob: float = 0.0):
        self.fn = fn
        self.seed = seed
        self.logprob = logprob
        self.calls: list[tuple[list[list[int]], SamplingParams, list[int]]] = []

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1) -> list[list[Completion]]:
        prefixes = [[int(t) for t in p] for p in prefixes]
        counts = _counts(n, len(prefixes))
        for i, p in enumerate(prefixes):
            if not p:
                raise ValueError(f"prefix {i} is empty; start every prefix with at least one token (e.g. a BOS id)")
        self.calls.append((prefixes, params, counts))
        seed = self.seed if params.seed is None else params.seed
        return [[self._one(p, j, params, seed) for j in range(c)] for p, c in zip(prefixes, counts)]

    def _one(self, prefix: list[int], sample_index: int, params: SamplingParams, seed: int) -> Completion:
        out = self.fn(list(prefix), sample_index, _sample_rng(seed, prefix, sample_index))
        tokens, logprobs = out if isinstance(out, tuple) else (out, None)
        tokens = [int(t) for t in tokens]
        logprobs = [self.logprob] * len(tokens) if logprobs is None else [float(x) for x in logprobs]
        if len(logprobs) != len(tokens):
            raise ValueError(f"script returned {len(tokens)} tokens but {len(logprobs)} logprobs; give one per token")
        stops = set(params.stop_token_ids)
        for k, t in enumerate(tokens[: params.max_tokens]):
            if t in stops:
                return Completion(tokens[: k + 1], logprobs[: k + 1], "stop")
        if len(tokens) >= params.max_tokens:
            return Completion(tokens[: params.max_tokens], logprobs[: params.max_tokens], "length")
        # A real engine only ends at a stop token or at max_tokens; a script that ends early would fake a finish.
        raise ValueError(f"script returned {len(tokens)} tokens for sample {sample_index}, none of them a stop token "
                         f"{sorted(stops)}, and fewer than max_tokens={params.max_tokens}; end the script's output "
                         f"with a stop token (and pass it in stop_token_ids) or return at least max_tokens tokens")
