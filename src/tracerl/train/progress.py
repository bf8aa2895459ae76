"""What `tracerl train` shows while it runs: a progress bar with the key figures, and the closing summary."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any

from tracerl.train.config import TrainConfig


class _Bar:
    def __init__(self, config: TrainConfig):
        from tqdm import tqdm

        self.budget = config.run.total_token_budget  # with a token budget the bar counts sampled tokens, not steps
        self.bar = tqdm(total=self.budget or config.run.num_steps, desc=config.method,
                        unit="token" if self.budget else "step", file=sys.stderr, dynamic_ncols=True)

    def update(self, row: dict[str, Any]) -> None:
        self.bar.n = min(row["rollout/cum_tokens"], self.budget) if self.budget else row["step"]
        self.bar.set_postfix_str(
            f"success {row['rollout/success_rate']:.2f} eff {row['alloc/effective_ratio']:.2f} "
            f"mixed/unit {row['alloc/mixed_trees_per_budget']:.3f} units {row['rollout/cum_units']:.0f} "
            f"loss {row.get('train/pg_loss', 0.0):+.3f}", refresh=True)

    def write(self, message: str) -> None:
        self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


@contextmanager
def progress_bar(config: TrainConfig):
    """A tqdm bar over the run's steps (None when run.progress is false)."""
    bar = _Bar(config) if config.run.progress else None
    try:
        yield bar
    finally:
        if bar:
            bar.close()


def print_summary(result: dict[str, Any]) -> None:
    before, after = result["before"], result["after"]
    se = max(before["eval/success_se"], after["eval/success_se"])
    print(f"held-out success before: {before['eval/success']:.1%} ± {before['eval/success_se']:.1%} (SE)")
    print(f"held-out success after:  {after['eval/success']:.1%} ± {after['eval/success_se']:.1%} (SE), "
          f"{result['steps']} steps, {result['cum_units']:.0f} budget units, {result['cum_tokens']:,} sampled tokens")
    ratio = f" = {result['improvement'] / se:+.1f} x the larger SE" if se > 0 else ""
    diff, paired = result["improvement"], result["improvement_se"]
    print(f"improvement: {diff:+.1%}{ratio} (paired over the same questions: SE {paired:.1%}, 95% interval "
          f"[{diff - 1.96 * paired:+.1%}, {diff + 1.96 * paired:+.1%}]); run directory {result['out_dir']}")
    if result.get("report"):
        print(f"report: {result['report']} (trees: tracerl view {result['out_dir']})")
