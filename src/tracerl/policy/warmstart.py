"""The warm start's regime search: how many supervised steps leave the embedded policy where RL has most to learn.

The target is the largest share of *mixed* training questions at n = 8 samples (some succeed, some fail;
`tracerl.core.regime`): under a group-mean baseline only a mixed group carries a policy gradient, so that share is
the part of a step's rollouts RL learns from, whatever the allocator. Too few supervised steps leave nearly every
question all-fail (nothing to reinforce), too many leave it all-success (nothing left to learn); the share peaks
between. It is read on training questions only (RL's own split, drawn with the search's seed): the held-out split
stays for the run's evaluation. docs/tasks.md ("A warm start that finds its regime") gives the measurements behind
the target and the floor.

The search walks a doubling ladder of `sft_steps` (min_steps, 2 min_steps, ..., then max_steps), each candidate a
complete build cached under its own key (so the chosen one is exactly what `tracerl train` with that `sft_steps`
loads), and stops going up once mean success has reached one half and the mixed share has fallen below the best so
far (past the peak). It then tries the geometric midpoint between the best candidate and each neighbour it tried,
once. Every candidate is sampled on the same questions with coupled random streams (the draws depend on question,
sample and turn only), so two candidates differ by their weights, not by their luck. The imitation noise
(`p_noise_turn`) stays as configured: each noise level would be another ladder.

`next_steps` and `choose` are the pure part (tests drive them with made-up readings); `search` builds and measures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tracerl.core.regime import regime_shares
from tracerl.engines import torch_threads
from tracerl.io.rollout.driver import DriverLimits
from tracerl.policy.embedded import build_embedded
from tracerl.policy.embedded_config import EmbeddedConfig
from tracerl.policy.evaluation import evaluate_rows

# below this share of mixed questions no build "reached" a start to learn from: the default testbed's start has about
# 30% mixed and its runs gain (docs/testbeds.md)
MIXED_FLOOR = 0.25


def ladder(min_steps: int, max_steps: int) -> list[int]:
    """min_steps, 2 min_steps, 4 min_steps, ... below max_steps, then max_steps itself: the largest count asked for
    is always a rung (with --max-steps 3000 the search builds 3000, not only 2000)."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"the warm-start search needs 1 <= --min-steps <= --max-steps (got {min_steps}, {max_steps})")
    steps = [min_steps * 2 ** k for k in range(int(math.log2(max_steps / min_steps)) + 1)]
    return steps if steps[-1] == max_steps else [*steps, max_steps]


def _best(readings: dict[int, dict[str, float]]) -> int:
    """The step count with the largest mixed share; ties go to fewer steps (a cheaper build, more left to learn)."""
    return max(sorted(readings), key=lambda s: readings[s]["mixed"])


def _past_peak(readings: dict[int, dict[str, float]]) -> bool:
    last = max(readings)
    return readings[last]["mean_success"] >= 0.5 and readings[last]["mixed"] < readings[_best(readings)]["mixed"]


def next_steps(readings: dict[int, dict[str, float]], steps_ladder: list[int]) -> int | None:
    """The next step count to build, or None when the search is done.

    readings: step count -> its regime shares (`mixed`, `mean_success`). Up the ladder until past the peak (mean
    success >= 1/2 and the mixed share below the best) or the ladder's end; then the geometric midpoint (to two
    significant digits) between the best step count of the ladder and each ladder neighbour tried, below first,
    each once."""
    untried = [s for s in steps_ladder if s not in readings]
    if untried and not (readings and _past_peak(readings)):
        return untried[0]
    on_ladder = {s: r for s, r in readings.items() if s in steps_ladder}
    best = _best(on_ladder)
    tried = sorted(on_ladder)
    i = tried.index(best)
    for neighbour in ([tried[i - 1]] if i > 0 else []) + ([tried[i + 1]] if i + 1 < len(tried) else []):
        mid = int(float(f"{math.sqrt(best * neighbour):.2g}"))  # two significant digits: 707 -> 710
        if mid not in readings and min(best, neighbour) < mid < max(best, neighbour):
            return mid
    return None


def choose(readings: dict[int, dict[str, float]], max_steps: int, min_steps: int) -> dict[str, Any]:
    """The chosen step count and whether it reached the floor, with the reason in words when it did not."""
    best = _best(readings)
    shares = readings[best]
    out = {"steps": best, "reached": shares["mixed"] >= MIXED_FLOOR, "floor": MIXED_FLOOR, "advice": ""}
    if not out["reached"]:
        if shares["all_fail"] >= shares["all_success"]:
            out["advice"] = (f"most training questions fail at every sample; check that the expert's traces succeed "
                             f"(the build prints their share), then raise --max-steps (now {max_steps}) or the "
                             f"model's size (policy.embedded.hidden_size, num_layers)")
        else:
            out["advice"] = (f"most training questions succeed at every sample already; lower --min-steps (now "
                             f"{min_steps}) or raise policy.embedded.p_noise_turn")
    elif len(readings) > 1 and best == max(readings):  # the ladder ran out while the share still rose
        out["advice"] = "the mixed share was still rising at the largest step count; a larger --max-steps may do better"
    return out


def search(config: EmbeddedConfig, domain: Any = None, cache_dir: str | Path | None = None, *,
           limits: DriverLimits | None = None, num_prompts: int = 128, n: int = 8, seed: int = 0,
           min_steps: int = 250, max_steps: int = 8000, num_threads: int = 1,
           say: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Build and measure candidates (`next_steps`) and choose one (`choose`); `domain` as for `build_embedded`.

    Each candidate is `config` with its `sft_steps`, built (or loaded from the cache) and sampled n times at
    temperature 1 on the same `num_prompts` training questions (drawn with `seed`), with `limits` (default: the
    build's own turn limits)."""
    if num_prompts < 2 or n < 2:
        raise ValueError(f"the warm-start search needs --prompts >= 2 and --samples >= 2 (got {num_prompts}, {n}): "
                         f"a mixed group needs two samples")
    steps_ladder = ladder(min_steps, max_steps)
    readings: dict[int, dict[str, Any]] = {}
    started = time.perf_counter()
    while (steps := next_steps(readings, steps_ladder)) is not None:
        say(f"warm-start search: {steps} supervised steps ({len(readings) + 1} built so far)")
        policy = build_embedded(dataclasses.replace(config, sft_steps=steps), cache_dir, progress=say, domain=domain)
        rows = policy.domain.rows("train", num_prompts, seed=seed)
        measured = time.perf_counter()
        with torch_threads(num_threads), torch.no_grad():
            result = evaluate_rows(policy.model, policy.renderer, policy.domain, limits or config.limits(), rows, n,
                                   1.0, seed=seed, coupled=True)
        shares = regime_shares(result["eval/per_prompt"], n)
        metrics = policy.metrics()
        readings[steps] = {**{k: shares[k] for k in ("all_fail", "mixed", "all_success", "mean_success")},
                           "histogram": shares["histogram"], "path": str(policy.path),
                           "build_seconds": float(metrics.get("sys/build_seconds", 0.0)),
                           "measure_seconds": time.perf_counter() - measured,
                           "check_success": float(metrics.get("eval/success", float("nan")))}
        say(f"warm-start search: {steps} steps: {shares['mixed']:.0%} of {num_prompts} training questions mixed at "
            f"n={n} (all-fail {shares['all_fail']:.0%}, all-success {shares['all_success']:.0%}, mean success "
            f"{shares['mean_success']:.0%})")
    return {"candidates": {str(s): readings[s] for s in sorted(readings)}, **choose(readings, max_steps, min_steps),
            "num_prompts": num_prompts, "n": n, "seed": seed, "min_steps": min_steps, "max_steps": max_steps,
            "p_noise_turn": config.p_noise_turn, "seconds": time.perf_counter() - started}


def to_markdown(result: dict[str, Any]) -> str:
    """The candidates' regimes, the chosen one marked, and the verdict in a sentence."""
    n = result["n"]
    lines = [f"| sft_steps | all-fail | mixed at n={n} | all-success | mean success | build s |",
             "|---|---|---|---|---|---|"]
    for steps, r in result["candidates"].items():
        mark = " (chosen)" if int(steps) == result["steps"] else ""
        lines.append(f"| {steps}{mark} | {r['all_fail']:.1%} | {r['mixed']:.1%} | {r['all_success']:.1%} | "
                     f"{r['mean_success']:.1%} | {r['build_seconds']:.0f} |")
    chosen = result["candidates"][str(result["steps"])]
    verdict = (f"Chosen: sft_steps = {result['steps']}, {chosen['mixed']:.0%} of training questions mixed"
               + (f" (at least the {result['floor']:.0%} floor)." if result["reached"] else
                  f": no setting reached the {result['floor']:.0%} floor; {result['advice']}."))
    if result["reached"] and result["advice"]:
        verdict += f" Note: {result['advice']}."
    return "\n".join(lines + ["", verdict, "", f"{result['num_prompts']} training questions x {n} samples at "
                              f"temperature 1 (coupled), seed {result['seed']}, p_noise_turn {result['p_noise_turn']}; "
                              f"{result['seconds']:.0f} s."])
