"""Held-out evaluation of a policy through the real rollout driver: avg@k success with its standard error.

Deliberately not here: pass@k, per-turn statistics, or evaluation of anything but a transformers model.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.chat import ChatRenderer
from tracerl.io.rollout.driver import DriverLimits, ReActDriver
from tracerl.io.rollout.engine import SamplingParams


MAX_TYPES = 32  # more distinct question types than this get no per-type keys (the metrics stay bounded)


def type_key(value: Any) -> str:
    """A question type (a row's `extra_info["type"]`) as a metric-name part: letters, digits, `_`, `.`, `-`, at most
    40 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:40]


def success_by_type(per_prompt: Sequence[float], rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """`eval/success_type_<type>` (mean success of each question type, from a row's `extra_info["type"]`, any task)
    and `eval/num_types`; with more than MAX_TYPES types only the count is given."""
    types = [type_key(t) if (t := (r.get("extra_info") or {}).get("type")) is not None else None for r in rows]
    names = sorted({t for t in types if t is not None})
    if not names:
        return {}
    out: dict[str, float] = {"eval/num_types": float(len(names))}
    if len(names) <= MAX_TYPES:
        for name in names:
            out[f"eval/success_type_{name}"] = float(np.mean([p for p, t in zip(per_prompt, types) if t == name]))
    return out


def evaluate_rows(model: torch.nn.Module, renderer: ChatRenderer, domain: Any, limits: DriverLimits,
                  rows: Sequence[dict[str, Any]], samples_per_prompt: int = 4, temperature: float = 1.0,
                  seed: int = 0, max_batch_size: int = 64, coupled: bool = False) -> dict[str, Any]:
    """avg@k success on `rows`, k = samples_per_prompt; with `coupled`, every sample from its own stream keyed by
    (seed, question, sample, turn) (`tracerl.io.rollout.driver`), so two policies evaluated on the same rows and seed
    draw the same random numbers and the draws do not depend on `max_batch_size`.

    success = mean over prompts of the prompt's mean reward; success_se = std over prompts / sqrt(num_prompts)
    (the prompts are the independent draws; 0 when there is one prompt). `eval/per_prompt` lists each prompt's
    mean reward in row order, so two evaluations on the same rows can be compared pairwise. A reward that fails
    scores its leaf 0 and is counted (`eval/reward_errors`, `eval/reward_timeouts`, `eval/failed_rollouts`), so a
    success rate of 0 from a broken reward does not pass for a policy that learned nothing."""
    engine = TransformersEngine(model, max_batch_size=max_batch_size)
    driver = ReActDriver(engine, renderer, domain, limits=limits,
                         sampling=SamplingParams(temperature=temperature, seed=seed), coupled=coupled)
    driver.set_rows(rows)
    started = time.perf_counter()
    trees, num_sampled = driver.run_roots(list(range(len(rows))), [samples_per_prompt] * len(rows))
    per_prompt = np.array([tree.rewards().mean() for tree in trees])
    leaves = [tree.nodes[i] for tree in trees for i in tree.leaves()]
    result: dict[str, Any] = {
        "eval/success": float(per_prompt.mean()),
        "eval/success_se": float(per_prompt.std(ddof=1) / math.sqrt(len(per_prompt))) if len(rows) > 1 else 0.0,
        "eval/num_prompts": len(rows), "eval/num_rollouts": len(leaves), "eval/sampled_tokens": num_sampled,
        "eval/total_tokens": sum(len(tree.prefix_token_ids(i)) for tree in trees for i in tree.leaves()),
        "eval/answered": float(np.mean([n.finish_reason == "answer" for n in leaves])),
        "eval/tool_errors": driver.counters["rollout/tool_errors"],
        "eval/tool_timeouts": driver.counters["rollout/tool_timeouts"],  # a user's tool calls stopped at the deadline
        # leaves failed by the environment, not the model: a user's reward that raised or timed out, among others
        "eval/failed_rollouts": sum(n.finish_reason == "error" for n in leaves),
        "eval/reward_calls": driver.counters["rollout/reward_calls"],
        "eval/reward_errors": driver.counters["rollout/reward_errors"],
        "eval/reward_timeouts": driver.counters["rollout/reward_timeouts"],
        "eval/seconds": time.perf_counter() - started}
    for hops in sorted({r.get("extra_info", {}).get("hops") for r in rows} - {None}):
        chosen = [p for p, r in zip(per_prompt, rows) if r["extra_info"].get("hops") == hops]
        result[f"eval/success_hops{hops}"] = float(np.mean(chosen))
    result.update(success_by_type(per_prompt, rows))
    result["eval/per_prompt"] = [float(x) for x in per_prompt]
    return result
