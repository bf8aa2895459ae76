"""A policy's regime on a set of prompts: the all-fail / mixed / all-success shares of its groups of n samples.

A prompt sampled n times (n = 8, GRPO's group) is all-fail, mixed or all-success. Only mixed groups carry a policy
gradient under a group-mean baseline, so the shares say how much an allocator can add and how much RL has to learn
from (`tracerl regime` prints them; the warm-start search, `tracerl.policy.warmstart`, aims at the largest mixed
share). A prompt's success is its mean reward over the n samples: all-fail means every reward is 0, all-success every
reward is 1 (rewards are in [0, 1]); the histogram counts round(mean * n) successes, exact for 0/1 rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# row extra_info fields that name a question's type, when a domain or a user's task sets them (`type`: any task's own,
# docs/tasks.md)
GROUP_KEYS = ("type", "hops", "answerable", "task", "generator")


def regime_shares(per_prompt: Sequence[float], n: int) -> dict[str, Any]:
    """Histogram of successes out of n and the all-fail / mixed / all-success shares of prompts.

    per_prompt: each prompt's mean reward over its n samples, in [0, 1]."""
    p = np.asarray(per_prompt, dtype=float)
    if n < 1 or p.ndim != 1 or np.any((p < 0) | (p > 1)):
        raise ValueError(f"regime_shares needs n >= 1 and per-prompt mean rewards in [0, 1] (n={n}, "
                         f"range {p.min(initial=0):.3g}..{p.max(initial=0):.3g})")
    fail, success = p == 0, p == 1
    num = max(len(p), 1)
    return {"num_prompts": int(len(p)), "n": int(n),
            "histogram": np.bincount(np.rint(p * n).astype(int), minlength=n + 1).tolist(),
            "all_fail": float(fail.sum() / num), "mixed": float((~fail & ~success).sum() / num),
            "all_success": float(success.sum() / num), "mean_success": float(p.mean()) if len(p) else 0.0,
            "sd_success": float(p.std()) if len(p) else 0.0}


def regime_by_group(per_prompt: Sequence[float], rows: Sequence[dict[str, Any]], n: int,
                    keys: Sequence[str] = GROUP_KEYS) -> dict[str, Any]:
    """`regime_shares` overall and for each value of each key found in the rows' `extra_info` (e.g. hops=3)."""
    out: dict[str, Any] = {"overall": regime_shares(per_prompt, n), "groups": {}}
    for key in keys:
        values = [r.get("extra_info", {}).get(key) for r in rows]
        for value in sorted({v for v in values if v is not None}, key=str):
            chosen = [p for p, v in zip(per_prompt, values) if v == value]
            out["groups"][f"{key}={value}"] = regime_shares(chosen, n)
    return out
