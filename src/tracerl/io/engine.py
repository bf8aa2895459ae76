"""Engine protocol: token ids in, token ids + logprobs + finish reason out.

Engines know nothing about text, chat templates or tools (the rollout driver is the only code that
tokenizes). A branch never re-tokenizes: the tree stores the exact ids and logprobs returned here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

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
        """For each prefix, `n` (or n[i]) sampled continuations. Batched over all prefixes."""


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
