"""Engine protocol: token ids in, token ids + logprobs + finish reason out.

Engines know nothing about text, chat templates or tools (the rollout driver is the only code that
tokenizes). A branch never re-tokenizes: the tree stores the exact ids and logprobs returned here.

Coupled sampling (optional, `generate(..., keys=...)`): one key per prefix, and sample j of prefix i draws its
random numbers from the stream `stream_key(keys[i], j)`, one uniform per generated position (`stream_uniforms`),
whatever else is in the batch. Two policies sampled with the same keys then draw the same random numbers, so where
their distributions agree they sample the same tokens (common random numbers): the difference of their success on
the same questions carries less sampling noise than with independent draws. The keys are counter-based (splitmix64),
so a row's draws do not depend on the batch size, the order of the prefixes or the other rows. An engine that takes
`keys` says so with `supports_keys = True`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

# the smallest sampling temperature an engine serves (above 0, which is greedy): logits / T below it overflows float32
# and the logprobs the trainer scores would not be the ones sampled; `tracerl serve` and `VLLMEngine` refuse smaller
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 256  # most tokens generated per call (one turn)
    stop_token_ids: tuple[int, ...] = ()  # generation ends after one of these; it is included in the output
    seed: int | None = None  # same seed and inputs -> same outputs

    def __post_init__(self) -> None:
        # written as "not (ok)" so that NaN, which fails every comparison, is refused too
        if not (0 <= self.temperature < float("inf")) or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            raise ValueError(f"bad sampling params {self}: need a finite temperature >= 0, 0 < top_p <= 1, "
                             "max_tokens >= 1")


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each sampled token under the sampling distribution's model
    finish_reason: str  # "stop" (a stop token was sampled) or "length" (max_tokens reached)


class Engine(Protocol):
    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1) -> list[list[Completion]]:
        """For each prefix, `n` (or n[i]) sampled continuations. Batched over all prefixes. An engine with
        `supports_keys = True` also takes `keys=` (one int per prefix) for coupled sampling (module docstring)."""


_MASK = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's output mix of uint64 values (wrapping arithmetic, as splitmix64 intends)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        return z ^ (z >> np.uint64(31))


def stream_key(*parts: int) -> int:
    """A 64-bit key from integers (splitmix64 folded over them): `stream_key(seed, question, sample, turn)`.
    Different parts give unrelated keys; the same parts always the same key."""
    h = _GOLDEN
    for part in parts:
        h = int(_splitmix(np.array([((h ^ (int(part) & _MASK)) + _GOLDEN) & _MASK], dtype=np.uint64))[0])
    return h


def stream_uniforms(keys: np.ndarray, position: int) -> np.ndarray:
    """(B,) uint64 stream keys -> (B,) float64 uniforms in [0, 1), the `position`-th draw of each stream (splitmix64
    of key + (position + 1) * golden ratio; 53 bits)."""
    with np.errstate(over="ignore"):
        z = _splitmix(keys.astype(np.uint64) + np.uint64(((position + 1) * _GOLDEN) & _MASK))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def check_request(prefixes: Sequence[Sequence[int]], n: int | Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """The prefixes as lists of ints and one sample count per prefix, or ValueError naming what is wrong: `n` an
    int >= 0 or one count >= 0 per prefix, every prefix non-empty."""
    prompts = [[int(t) for t in p] for p in prefixes]
    counts = [n] * len(prompts) if isinstance(n, int) else [int(c) for c in n]
    if len(counts) != len(prompts) or any(c < 0 for c in counts):
        raise ValueError(f"n={n!r} must be an int >= 0 or one count >= 0 per prefix ({len(prompts)} prefixes)")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prefix {i} is empty; start every prefix with at least one token (e.g. a BOS id)")
    return prompts, counts
