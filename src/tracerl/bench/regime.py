"""`tracerl regime`: which allocation regime a policy is in on a domain, from its per-prompt success at n samples.

A prompt sampled n times (n = 8, GRPO's group) is all-fail, mixed or all-success. Only mixed groups carry a policy
gradient under a group-mean baseline, so the shares say how much an allocator can add: at 85% mixed even a perfect
one adds little ("little to allocate"); in a U-shaped regime (the paper's GRPO runs had about 27% mixed) skipping
the all-fail and all-success prompts matters. The pure part (histogram and shares, overall and by question type) is
`tracerl.core.regime`; `run` samples a training config's starting policy through the real driver (`evaluate_rows`)
and `to_markdown` writes the table docs/testbeds.md quotes.

Deliberately not here: training, a checkpointed policy (it reads the config's starting policy), pass@k.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tracerl.core.regime import regime_by_group


def run(config: Any, split: str = "train", num_prompts: int = 256, n: int = 8, temperature: float = 1.0,
        seed: int = 0, say=lambda message: None) -> dict[str, Any]:
    """Sample the starting policy of a `TrainConfig` n times on `num_prompts` rows of `split` (drawn with `seed`)."""
    import torch

    from tracerl.engines import torch_threads
    from tracerl.policy.embedded import weights_hash
    from tracerl.policy.evaluation import evaluate_rows
    from tracerl.train.policy import load_policy

    if num_prompts < 1 or n < 1:
        raise ValueError(f"--prompts {num_prompts} and --samples {n} must be >= 1")
    started = time.perf_counter()
    policy = load_policy(config, say)
    rows = policy.domain.rows(split, num_prompts, seed=seed)
    say(f"regime: {num_prompts} {split} prompts x {n} samples at temperature {temperature}")
    with torch_threads(config.run.num_threads), torch.no_grad():
        result = evaluate_rows(policy.model, policy.renderer, policy.domain, policy.limits, rows, n, temperature,
                               seed=seed)
    out = regime_by_group(result["eval/per_prompt"], rows, n)
    out.update(split=split, temperature=temperature, seed=seed, policy=str(policy.source),
               weights_sha256=weights_hash(policy.model), sampled_tokens=int(result["eval/sampled_tokens"]),
               seconds=time.perf_counter() - started)
    return out


def to_markdown(result: dict[str, Any]) -> str:
    """One table: overall, then each question type; shares in percent, then the success histogram."""
    n = result["overall"]["n"]
    lines = [f"| prompts | count | all-fail | mixed | all-success | mean success | successes out of {n} |",
             "|---|---|---|---|---|---|---|"]
    for name, row in [("all", result["overall"]), *result["groups"].items()]:
        lines.append(f"| {name} | {row['num_prompts']} | {row['all_fail']:.1%} | {row['mixed']:.1%} | "
                     f"{row['all_success']:.1%} | {row['mean_success']:.3f} | {row['histogram']} |")
    if "split" in result:
        lines += ["", f"{result['overall']['num_prompts']} {result['split']} prompts x {n} samples at temperature "
                  f"{result['temperature']}, seed {result['seed']}, policy {Path(result['policy']).name}"
                  + (f" (weights sha256 {result['weights_sha256'][:16]})" if result.get("weights_sha256") else "")
                  + f"; {result['seconds']:.0f} s."]
    return "\n".join(lines)
