"""One sampling step, the same for the trainer, `tracerl bench alloc`, `tracerl bench predictors` and verl:

    pool -> predict -> stage 1 -> bare rollouts -> stage 2 -> predictor scored, then updated -> advantages
    -> measures

`run_step` does all of it on a `RolloutRunner` (the simulator, a ReAct driver, Ray workers) and returns the trees,
their advantages and the step's metrics (`alloc/`, `rollout/`, `predictor/` keys). The policy update is the
caller's (the trainer's), and so is anything timed around it.

`Sampler` is a run's sampling state, built one way by the trainer, both benches and verl: the prompt pool (a cursor
over a shuffled order), the allocation RNG, the prices (`tracerl.core.ledger`: units or tokens, learned over the
run) and the predictor, with one seed convention (pool `[seed, 1]`, allocation `[seed, 2]`, the predictor built
with `seed`) and one `state_dict`, so a run saved and resumed samples what an uninterrupted one samples.
`Sampler.step(runner)` is the whole step: it draws the pool and has the runner (a `PoolRunner`) load it. Each step
gets a fresh ledger from the prices; its per-kind spend is logged as `alloc/units_root`, `alloc/units_prefix`,
`alloc/tokens_root`, `alloc/tokens_prefix` (and `alloc/cost_*` when the budget is in tokens), which is what the run
report reads.

Deliberately not here: sampling (the runner), the policy gradient, checkpoints, I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from tracerl.core.advantages import AdvantageConfig, TreeAdvantages, compute_advantages
from tracerl.core.calibration import calibration_metrics
from tracerl.core.growth import GrowthResult, RolloutRunner, grow_trees
from tracerl.core.history import History
from tracerl.core.ledger import BudgetLedger, Prices, make_prices
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
    pool: list[History] = field(default_factory=list)  # the candidate prompts, aligned with growth.p_pool


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
             prices: Prices | None = None) -> StepResult:
    """One step on `pool` (histories of the candidate prompts, in the runner's pool order).

    `predictor` (with `predict` and `update`) steers stages 1 and 2 when the method reads one; it is scored on the
    step's fresh nodes (natural backup targets) before it is updated on them. `prices` (config's, fresh, when None)
    price every rollout, give the step's ledger, and learn the step's rollout lengths afterwards."""
    prices = make_prices(config) if prices is None else prices
    ledger = prices.ledger()
    predict = predictor.predict if (predictor is not None and method.predictor != "none") else None
    grown = grow_trees(method, config, pool, predict, runner, ledger, rng, prices)
    trees = grown.trained  # what the update trains on; the prices and the predictor learn from every sampled tree
    prices.observe(grown.trees)
    metrics: dict[str, Any] = {}
    scored = targets = None
    update_seconds = 0.0
    if predict is not None:
        learned = learn(predictor, grown.trees)
        metrics.update(learned.metrics)
        scored, targets, update_seconds = learned.scored, learned.targets, learned.update_seconds
    advs = compute_advantages(method.advantage, trees, advantages)
    counts, measured = measure(trees, advs, ledger, method.advantage, advantages)
    metrics.update(measured)
    metrics.update({"alloc/num_prompts": len(trees), "alloc/num_prefix_anchors": grown.num_prefix_anchors,
                    "alloc/num_continuations": grown.num_continuations, "alloc/stage1_value": grown.stage1_value})
    # the share of the step's budget charged (at most 1: the ledger refuses more) and, in tokens, the share actually
    # sampled (above 1 where rollouts ran longer than the prices expected: the overspend, reported, never hidden)
    metrics["alloc/budget_used"] = ledger.budget_spent / ledger.budget if ledger.budget else 0.0
    if ledger.unit == "tokens":
        metrics["alloc/tokens_of_budget"] = ledger.tokens_spent / ledger.budget if ledger.budget else 0.0
    if grown.kept is not None:  # a round sampler: what each round spent, and what the step kept of it
        metrics.update(round_metrics(grown))
    seconds = dict(grown.seconds, update=update_seconds)
    return StepResult(trees, advs, grown, ledger, counts, metrics, scored, targets, seconds, list(pool))


def measure(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], ledger: BudgetLedger, estimator: str,
            options: AdvantageConfig | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """The step's measures from its trees, the advantages `estimator` (with `options`) gave them and its ledger, the one
    place they are built (this step, and verl's coordinator for trees grown by verl's workers): the counts
    (`tracerl.core.metrics.step_counts`, to pool over steps) and the metrics, every ratio as `alloc/<name>`, the spend
    by kind (`alloc/units_root`, `alloc/tokens_prefix`, ...; zero for a kind not spent) and `rollout/success_rate`,
    `num_rollouts`, `units`, `tokens`. The informative counts read the estimator's advantages before any batch
    whitening (`tracerl.core.metrics.raw_advantages`, which recomputes them tree by tree, so advantages computed over
    the batch and one tree at a time are read alike)."""
    raw = raw_advantages(estimator, trees, advantages, options)
    counts = step_counts(trees, advantages, ledger.units_spent, ledger.tokens_spent, prices=ledger, raw_advantages=raw)
    measures = ratios(counts)
    metrics: dict[str, Any] = {f"alloc/{k}": v for k, v in measures.items()}
    metrics.update({"alloc/units_root": 0.0, "alloc/units_prefix": 0.0, "alloc/tokens_root": 0,
                    "alloc/tokens_prefix": 0})
    metrics.update({f"alloc/{k}": v for k, v in ledger.split().items()})  # units_root, tokens_prefix, ...
    metrics.update({"rollout/success_rate": measures["success_rate"], "rollout/num_rollouts": counts["num_leaves"],
                    "rollout/units": ledger.units_spent, "rollout/tokens": ledger.tokens_spent})
    return counts, metrics


def round_metrics(grown: GrowthResult) -> dict[str, float]:
    """A round sampler's step: `alloc/rounds`, each round's rollouts and sampled tokens (`alloc/round1_rollouts`,
    `alloc/round1_tokens`, ...), the prompts and rollouts sampled and kept, and the sampled tokens of the rollouts
    the update trains on (`alloc/tokens_kept`; the rest, `rollout/tokens` minus it, bought no gradient)."""
    out: dict[str, float] = {"alloc/rounds": len(grown.rounds)}
    for r, (rollouts, tokens) in enumerate(grown.rounds, start=1):
        out[f"alloc/round{r}_rollouts"], out[f"alloc/round{r}_tokens"] = rollouts, tokens
    out.update({
        "alloc/prompts_sampled": len(grown.trees), "alloc/prompts_kept": len(grown.trained),
        "alloc/rollouts_sampled": sum(len(t.leaves()) for t in grown.trees),
        "alloc/rollouts_kept": sum(len(t.leaves()) for t in grown.trained),
        "alloc/tokens_kept": sum(n.segment.num_tokens for t in grown.trained for n in t.nodes[1:]),
    })
    return out


class PoolRunner(RolloutRunner, Protocol):
    """A `RolloutRunner` a `Sampler` steps: it also loads each step's candidate prompts (the simulator; the trainer's
    runner bound to the run's rows and the step's seed, `tracerl.executors.runner.StepRunner`)."""

    def set_pool(self, prompt_indices: np.ndarray) -> list[History]:
        """Make the prompts at `prompt_indices` (into the run's prompts) the step's pool, in that order (`run_roots`
        then indexes into it); returns the histories of their bare prompts."""


class Sampler:
    """A run's sampling state and its step: the prompt pool, the allocation RNG, the prices and the predictor.

    One seed convention for every caller: the pool's order from `[seed, 1]`, stage 1 and 2's draws from
    `[seed, 2]`; the predictor is built by the caller with `seed` (`tracerl.core.predictor.make_predictor`). A step
    is `step(runner)`: the next pool's indices, the runner's `set_pool` on them, then `run_step`.
    `state_dict` holds everything a resumed run needs to sample what an uninterrupted run samples, the predictor's
    state included."""

    def __init__(self, method: MethodPreset, config: AllocationConfig, num_prompts: int, seed: int, *,
                 predictor=None, advantages: AdvantageConfig | None = None):
        self.method, self.config, self.advantages = method, config, advantages
        self.pool = PromptPool(num_prompts, config.pool_size, np.random.default_rng([seed, 1]))
        self.rng = np.random.default_rng([seed, 2])
        self.prices = make_prices(config)
        self.predictor = predictor if method.predictor != "none" else None

    def step(self, runner: PoolRunner) -> StepResult:
        """One step (`run_step`) on the next pool, which `runner` loads (`StepResult.pool`: its histories)."""
        pool = runner.set_pool(self.pool.next())
        return run_step(self.method, self.config, pool, runner, self.rng, predictor=self.predictor,
                        advantages=self.advantages, prices=self.prices)

    def skip_pools(self, num: int) -> None:
        """Pass over the next `num` pools without sampling them: the pool's cursor moves on as `num` steps would
        move it, and nothing else changes (the allocation RNG, the prices and the predictor stay as they are)."""
        for _ in range(num):
            self.pool.next()

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict(), "rng": self.rng.bit_generator.state,
                "prices": self.prices.state_dict(),
                "predictor": None if self.predictor is None else self.predictor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
        self.rng.bit_generator.state = state["rng"]
        self.prices.load_state_dict(state["prices"])
        if self.predictor is not None:
            self.predictor.load_state_dict(state["predictor"])
