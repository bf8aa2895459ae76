"""One sampling step, the same for the trainer, `tracerl bench alloc`, `tracerl bench predictors` and verl:

    pool -> predict -> stage 1 -> bare rollouts -> stage 2 -> predictor scored, then updated -> advantages
    -> measures

`run_step` does all of it on a `RolloutRunner` (the simulator, a ReAct driver, Ray workers) and returns the trees,
their advantages and the step's metrics (`alloc/`, `rollout/`, `predictor/` keys). The policy update is the
caller's (the trainer's), and so is anything timed around it. `PromptPool` owns the cursor over a shuffled prompt
order. The step's `BudgetLedger` is built here from the allocation config (`make_ledger`), so the budget, its unit,
the continuation cost and the token cap are read in one place; the ledger's per-kind spend is logged as
`alloc/units_root`, `alloc/units_prefix`, `alloc/tokens_root`, `alloc/tokens_prefix` (and `alloc/cost_*` when the
budget is in tokens), which is what the run report reads.

Deliberately not here: sampling (the runner), the policy gradient, checkpoints, I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tracerl.core.advantages import AdvantageConfig, TreeAdvantages, compute_advantages
from tracerl.core.allocation import BudgetLedger
from tracerl.core.calibration import calibration_metrics
from tracerl.core.growth import GrowthResult, RolloutRunner, TokenEstimate, grow_trees
from tracerl.core.history import History
from tracerl.core.methods import AllocationConfig, MethodPreset
from tracerl.core.metrics import predictor_targets, ratios, raw_advantages, step_counts
from tracerl.core.tree import Tree


class PromptPool:
    """Draws each step's candidate pool from `num_prompts` prompts: consecutive slices of a shuffled order,
    reshuffled (by `rng`) when the next slice would run past its end."""

    def __init__(self, num_prompts: int, pool_size: int, rng: np.random.Generator):
        if num_prompts < 1:
            raise ValueError("a prompt pool needs at least one prompt; check the data's size")
        self.num_prompts, self.rng = num_prompts, rng
        self.pool_size = min(pool_size, num_prompts)
        self.order = rng.permutation(num_prompts)
        self.cursor = 0

    def next(self) -> np.ndarray:
        """Indices of the next pool's prompts."""
        if self.cursor + self.pool_size > len(self.order):
            self.order, self.cursor = self.rng.permutation(self.num_prompts), 0
        out = self.order[self.cursor: self.cursor + self.pool_size]
        self.cursor += self.pool_size
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order, "cursor": self.cursor, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order, self.cursor = np.asarray(state["order"]), int(state["cursor"])
        self.rng.bit_generator.state = state["rng"]


def make_ledger(config: AllocationConfig) -> BudgetLedger:
    """A step's ledger: config.step_budget in config.budget_unit, the continuation cost and the token cap."""
    return BudgetLedger(config.step_budget, config.token_cap, config.continuation_cost, unit=config.budget_unit)


@dataclass
class StepResult:
    trees: list[Tree]
    advantages: list[TreeAdvantages]
    growth: GrowthResult  # pool predictions, stage-1 grants, phase seconds
    ledger: BudgetLedger
    counts: dict[str, float]  # `tracerl.core.metrics.step_counts`, to pool over steps
    metrics: dict[str, Any]  # alloc/, rollout/ and predictor/ values of the step
    scored: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (p before the update, Vhat, n) of fresh nodes
    targets: tuple[list[History], np.ndarray, np.ndarray] | None = None  # what the predictor learned from
    seconds: dict[str, float] = field(default_factory=dict)  # predict, allocate, rollout, update


@dataclass
class Learned:
    metrics: dict[str, float]  # predictor/brier, ece, auc (before the update) and the update's own values
    targets: tuple[list[History], np.ndarray, np.ndarray]  # (h_y, Vhat, n) it learned from
    scored: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (p before the update, Vhat, n); None if no nodes
    update_seconds: float


def learn(predictor, trees: Sequence[Tree]) -> Learned:
    """Score `predictor` on the trees' nodes (natural backup targets), then update it on them."""
    targets = predictor_targets(trees)
    histories, vhat, weights = targets
    if not len(histories):
        return Learned({}, targets, None, 0.0)
    p_fresh = np.asarray(predictor.predict(histories), dtype=float)
    metrics = {f"predictor/{k}": float(v) for k, v in calibration_metrics(p_fresh, vhat, weights).items()}
    t0 = time.perf_counter()  # the update alone is what allocation overhead counts
    fit = predictor.update(histories, vhat, weights) or {}
    seconds = time.perf_counter() - t0
    metrics.update({f"predictor/{k}": float(v) for k, v in fit.items()})
    return Learned(metrics, targets, (p_fresh, vhat, weights), seconds)


def run_step(method: MethodPreset, config: AllocationConfig, pool: Sequence[History], runner: RolloutRunner,
             rng: np.random.Generator, *, predictor=None, advantages: AdvantageConfig | None = None,
             tokens: TokenEstimate | None = None) -> StepResult:
    """One step on `pool` (histories of the candidate prompts, in the runner's pool order).

    `predictor` (with `predict` and `update`) steers stages 1 and 2 when the method reads one; it is scored on the
    step's fresh nodes (natural backup targets) before it is updated on them. `tokens` prices rollouts when the
    budget is in tokens, and learns the step's rollout lengths afterwards."""
    ledger = make_ledger(config)
    predict = predictor.predict if (predictor is not None and method.predictor != "none") else None
    grown = grow_trees(method, config, pool, predict, runner, ledger, rng, tokens)
    trees = grown.trees
    if tokens is not None:
        tokens.observe(trees)
    metrics: dict[str, Any] = {}
    scored = targets = None
    update_seconds = 0.0
    if predict is not None:
        learned = learn(predictor, trees)
        metrics.update(learned.metrics)
        scored, targets, update_seconds = learned.scored, learned.targets, learned.update_seconds
    advs = compute_advantages(method.advantage, trees, advantages)
    counts = step_counts(trees, advs, ledger.units_spent, ledger.tokens_spent,
                         raw_advantages=raw_advantages(method.advantage, trees, advs, advantages))
    measures = ratios(counts)
    metrics.update({f"alloc/{k}": v for k, v in measures.items()})
    metrics.update({
        "alloc/num_prompts": len(trees), "alloc/num_prefix_anchors": grown.num_prefix_anchors,
        "alloc/num_continuations": grown.num_continuations, "alloc/units_root": 0.0, "alloc/units_prefix": 0.0,
        "alloc/tokens_root": 0, "alloc/tokens_prefix": 0,
        "alloc/stage1_value": grown.stage1_value,
        "rollout/success_rate": measures["success_rate"], "rollout/num_rollouts": counts["num_leaves"],
        "rollout/units": ledger.units_spent, "rollout/tokens": ledger.tokens_spent,
    })
    metrics.update({f"alloc/{k}": v for k, v in ledger.split().items()})  # units_root, tokens_prefix, ...
    seconds = dict(grown.seconds, update=update_seconds)
    return StepResult(trees, advs, grown, ledger, counts, metrics, scored, targets, seconds)
