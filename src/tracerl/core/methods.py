"""Methods as presets of one machinery: a root policy (stage 1), a prefix policy (stage 2), an advantage.

GRPO, PCL, TreePO, TRACE and TRACE's ablations differ only in which registered policy fills each
slot, so every method runs through the same step (`tracerl.core.growth.grow_trees`) and is compared
at the same budget. Root policies share one signature, `fn(p_pool, budget, config, rng) -> counts`;
prefix policies share `fn(p, outcome, budget, config, rng) -> K`. Both receive arrays, never a
predictor, so an oracle or any user model can stand behind the probabilities.

This module decides *how much* to sample where. It does not sample, score or train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tracerl.core.allocation import ROOT_VALUES, allocate_prefixes, allocate_roots
from tracerl.core.ledger import BUDGET_UNITS, CONTINUATION_COST
from tracerl.core.rules import check_fields, knob, raise_problems
from tracerl.core.samplers import ROUND_SAMPLERS, knapsack_rl_counts, take_in_order


@dataclass(frozen=True)
class AllocationConfig:
    """The sampling budget of one step and how it may be spent. Every method sees the same values."""

    num_prompts: int = knob(64, ge=1)  # prompts per step for uniform methods; budget = num_prompts * rollouts_per_prompt
    rollouts_per_prompt: int = knob(8, ge=2)  # n of GRPO-style methods (one rollout is never mixed); sets the budget
    pool_factor: int = knob(4, ge=1)  # candidate pool = pool_factor * num_prompts (PCL and the knapsack select from it)
    m_min: int = knob(2, ge=2)  # fewest rollouts a selected prompt gets (one rollout can never be mixed)
    m_max: int | None = knob(16, ge=2)  # most rollouts one prompt may get in stage 1; None = only the budget limits it
    root_value: str = knob("v_root", choices=ROOT_VALUES)  # stage-1 objective: v_root (paper), knapsack_rl or nonzero_adv
    root_share: float = knob(0.75, gt=0, le=1)  # share of the budget spent on fresh rollouts by methods with a stage 2
    continuation_cost: float = knob(CONTINUATION_COST, gt=0)  # budget units of one continuation (a fresh rollout costs 1)
    expand_rounds: int = knob(2, ge=0)  # stage-2 rounds; each round can branch from nodes the previous one created
    k_max: int | None = knob(4, ge=1)  # most continuations one prefix gets per round; None = no limit
    branch_width: int = knob(2, ge=1)  # TreePO: continuations per randomly chosen prefix
    stage2_width: int = knob(1, ge=1)  # TRACE stage 2 grants continuations in groups of this many (budget shape)
    stage2_mode: str = knob("per_prompt", choices=("per_prompt", "global"))  # per_prompt: B_prefix split by stage-1 grants; global: one exact solve per round
    budget_unit: str = knob("units", choices=BUDGET_UNITS)  # units: a rollout costs its trajectory units; tokens: its expected sampled tokens
    token_budget: int | None = knob(None, ge=1)  # budget_unit=tokens: a step's budget in tokens; None = budget x default_rollout_tokens
    default_rollout_tokens: int = knob(256, ge=1)  # expected tokens of a rollout before any has been seen (budget_unit=tokens)
    token_cap: int | None = knob(None, ge=1)  # hard cap on a step's sampled tokens: no stage-2 round starts past it; None = none
    round_prompts: int | None = knob(None, ge=1)  # round samplers: new prompts per round (dapo's generation batch, speed's and pilot_commit's screening batch), reinforce_ada's prompts per step; None = num_prompts (reinforce_ada: num_prompts // 2)
    round_rollouts: int = knob(4, ge=1)  # reinforce_ada: rollouts per unfinished prompt per round; speed, pilot_commit: screening (pilot) rollouts per prompt
    commit_rollouts: int = knob(12, ge=1)  # speed, pilot_commit: rollouts added to a prompt that passed screening (its group: screening + these)
    pilot_low: float = knob(0.125, ge=0, le=1)  # pilot_commit: a prompt is committed when pilot_low <= pilot accuracy <= pilot_high
    pilot_high: float = knob(0.75, ge=0, le=1)  # pilot_commit: the upper end of that window (both ends included)
    keep_prompts: int | None = knob(None, ge=1)  # dapo, speed, pilot_commit: rounds stop once this many groups are kept (the train batch); None = when the budget is spent
    max_rounds: int = knob(10, ge=1)  # most rounds of fresh rollouts a round sampler runs in one step (verl's max_num_gen_batches)
    prior_strength: float = knob(4.0, gt=0)  # posterior: the predictor's p counts as this many rollouts (Beta(kappa p, kappa (1 - p)))
    ada_exit: str = knob("balanced", choices=("balanced", "positive"))  # reinforce_ada: a prompt stops at n/2 successes and n/2 failures, or at its first success

    def __post_init__(self) -> None:
        problems = check_fields(self, "allocation.")
        if self.m_max is not None and self.m_max < self.m_min:
            problems.append(f"m_max={self.m_max} < m_min={self.m_min}; raise m_max or lower m_min")
        if self.k_max is not None and self.k_max < self.stage2_width:
            problems.append(f"k_max={self.k_max} < stage2_width={self.stage2_width}: no prefix could get one group; "
                            "raise k_max (or set it to none) or lower stage2_width")
        if self.pilot_low > self.pilot_high:
            problems.append(f"pilot_low={self.pilot_low} > pilot_high={self.pilot_high}: no pilot accuracy would pass; "
                            "lower pilot_low or raise pilot_high")
        if not problems and self.budget < self.m_min:
            problems.append(f"budget {self.budget} is below m_min={self.m_min}; raise num_prompts or rollouts_per_prompt")
        raise_problems(problems, "invalid allocation config")

    @property
    def budget(self) -> float:
        """B = B_root + B_prefix in trajectory units: what GRPO spends on num_prompts * n fresh rollouts."""
        return float(self.num_prompts * self.rollouts_per_prompt)

    @property
    def pool_size(self) -> int:
        return self.num_prompts * self.pool_factor


# ---------------------------------------------------------------------------------------------- stage 1
# fn(p_pool, budget, config, rng, cost) -> counts; cost: (P,) budget cost of one fresh rollout per prompt, None = 1
RootPolicy = Callable[..., np.ndarray]
ROOT_POLICIES: dict[str, RootPolicy] = {}


def register_root_policy(name: str):
    def wrap(fn: RootPolicy) -> RootPolicy:
        ROOT_POLICIES[name] = fn
        return fn
    return wrap


@register_root_policy("uniform")
def uniform_roots(p_pool, budget, config, rng, cost=None):
    """GRPO's batch: floor(budget / n) prompts drawn at random from the pool, n rollouts each (with per-prompt
    costs: prompts in a random order while n of their rollouts fit)."""
    n = config.rollouts_per_prompt
    counts = np.zeros(len(p_pool), dtype=np.int64)
    if cost is None:
        num = min(len(p_pool), int(budget // n))
        counts[rng.choice(len(p_pool), size=num, replace=False)] = n
    else:
        counts[take_in_order(rng.permutation(len(p_pool)), n * np.asarray(cost, float), budget)] = n
    return counts


@register_root_policy("pcl")
def pcl_roots(p_pool, budget, config, rng, cost=None):
    """PCL (arXiv 2510.01135): the floor(budget / n) pool prompts with predicted p closest to 0.5, n each (with
    per-prompt costs: closest first while n of their rollouts fit)."""
    n = config.rollouts_per_prompt
    order = np.argsort(np.abs(np.asarray(p_pool) - 0.5), kind="stable")
    counts = np.zeros(len(p_pool), dtype=np.int64)
    if cost is None:
        counts[order[:min(len(p_pool), int(budget // n))]] = n
    else:
        counts[take_in_order(order, n * np.asarray(cost, float), budget)] = n
    return counts


@register_root_policy("knapsack")
def knapsack_roots(p_pool, budget, config, rng, cost=None):
    """TRACE stage 1: maximise sum_i V(p_i, m_i) s.t. sum_i m_i cost_i <= budget (see allocation.solve_roots)."""
    return allocate_roots(p_pool, budget, m_min=config.m_min, m_max=config.m_max, value=config.root_value, cost=cost)


@register_root_policy("knapsack_rl")
def knapsack_rl_roots(p_pool, budget, config, rng, cost=None):
    """KnapsackRL (arXiv 2509.25849, liziniu/KnapsackRL): GRPO's random batch (`uniform_roots`), its n rollouts per
    prompt redistributed by `samplers.knapsack_rl_counts` (m_min each, the rest by KnapsackRL's exact programme with
    m_max a prompt). With per-prompt costs, prompts leave the end of the batch until the redistributed rollouts fit."""
    n = config.rollouts_per_prompt
    order = rng.permutation(len(p_pool))  # the batch in the data loader's order: ties and remainders go to the first
    batch = order[: min(len(p_pool), int(budget // n))] if cost is None else \
        take_in_order(order, n * np.asarray(cost, dtype=float), budget)
    counts = np.zeros(len(p_pool), dtype=np.int64)
    while len(batch):
        total = n * len(batch)
        counts[:] = 0
        counts[batch] = knapsack_rl_counts(np.asarray(p_pool, dtype=float)[batch], total, config.m_min,
                                           config.m_max or total)
        if cost is None or float(np.sum(counts * np.asarray(cost, dtype=float))) <= budget + 1e-9:
            break
        batch = batch[:-1]
    return counts


# ---------------------------------------------------------------------------------------------- stage 2
# fn(p, outcome, budget, config, rng, cost) -> K; cost: (Y,) budget cost of one continuation per candidate
PrefixPolicy = Callable[[np.ndarray, np.ndarray, float, AllocationConfig, np.random.Generator, np.ndarray], np.ndarray]
PREFIX_POLICIES: dict[str, PrefixPolicy] = {}


def register_prefix_policy(name: str, *, needs_p: bool = True, granule: Callable[[AllocationConfig], int] = lambda c: 1):
    """Register a stage-2 policy. `needs_p`: whether it reads predicted p (else no prediction is paid for);
    `granule`: the continuations it grants at a time, so a per-prompt budget is split in whole granules."""
    def wrap(fn: PrefixPolicy) -> PrefixPolicy:
        fn.needs_p, fn.granule = needs_p, granule
        PREFIX_POLICIES[name] = fn
        return fn
    return wrap


@register_prefix_policy("predictor", granule=lambda c: c.stage2_width)
def predictor_prefixes(p, outcome, budget, config, rng, cost):
    """TRACE stage 2: maximise sum_y 1 - q_y^K_y with q = r p + (1 - r)(1 - p) (greedy, optimal at equal costs).

    With stage2_width w > 1 every K_y is a multiple of w: the same objective over groups g_y = K_y / w, since
    1 - q^(w g) = 1 - (q^w)^g, solved as stage 2 with flip probabilities 1 - q^w and group costs w * cost; k_max
    then caps a prefix at its whole groups. The paper's budget shapes (root rollouts, continuations per branch
    point) are root_share x stage2_width."""
    w = config.stage2_width
    if w == 1:
        return allocate_prefixes(p, outcome, budget, cost=cost, k_max=config.k_max)
    r = np.asarray(outcome)
    q = np.where(r == 1, np.asarray(p, float), 1.0 - np.asarray(p, float)) ** w
    groups = allocate_prefixes(np.where(r == 1, q, 1.0 - q), r, budget, cost=w * np.asarray(cost, float),
                               k_max=None if config.k_max is None else config.k_max // w)
    return groups * w


@register_prefix_policy("uniform", needs_p=False)
def uniform_prefixes(p, outcome, budget, config, rng, cost):
    """Ablation: the same candidates and budget as TRACE, spread evenly (lower index first), p ignored."""
    num = len(p)
    cost = np.asarray(cost, dtype=float)
    if num and np.all(cost == cost[0]):
        total = int(budget // cost[0] + 1e-9)
        if config.k_max is not None:
            total = min(total, num * config.k_max)
        counts = np.full(num, total // num, dtype=np.int64)
        counts[: total - int(counts.sum())] += 1
        return counts
    counts, spent = np.zeros(num, dtype=np.int64), 0.0  # unequal costs: round robin while a grant still fits
    cap = config.k_max if config.k_max is not None else np.iinfo(np.int64).max
    grew = True
    while grew:
        grew = False
        for y in range(num):
            if counts[y] < cap and spent + cost[y] <= budget + 1e-9:
                counts[y] += 1
                spent += cost[y]
                grew = True
    return counts


@register_prefix_policy("random", needs_p=False, granule=lambda c: c.branch_width)
def random_prefixes(p, outcome, budget, config, rng, cost):
    """TreePO-style heuristic: branch at randomly chosen visited prefixes, branch_width continuations each."""
    num = len(p)
    cost = np.asarray(cost, dtype=float)
    counts = np.zeros(num, dtype=np.int64)
    if num and np.all(cost == cost[0]):
        num_branches = min(num, int(budget // (config.branch_width * cost[0]) + 1e-9))
        counts[rng.choice(num, size=num_branches, replace=False)] = config.branch_width
    elif num:
        counts[take_in_order(rng.permutation(num), config.branch_width * cost, budget)] = config.branch_width
    return counts


# ---------------------------------------------------------------------------------------------- presets
@dataclass(frozen=True)
class MethodPreset:
    name: str
    root_policy: str  # key of ROOT_POLICIES
    prefix_policy: str | None  # key of PREFIX_POLICIES, None = no stage 2
    advantage: str  # key of tracerl.core.advantages.ADVANTAGES
    predictor: str  # "learned", "oracle" (true p, simulator only) or "none"
    prefix_candidates: str = "unmixed"  # "unmixed": nodes whose leaves agree; "failed": those whose leaves all failed; "all": every visited prefix
    description: str = ""
    source: str = ""  # the paper or code it follows

    @property
    def in_rounds(self) -> bool:
        """Whether stage 1 is a round sampler (`tracerl.core.samplers`) rather than one allocation."""
        return self.root_policy in ROUND_SAMPLERS

    def root_budget(self, config: AllocationConfig, total: float | None = None) -> float:
        """Stage 1's share of `total` (the step's budget in its unit; config.budget by default)."""
        total = config.budget if total is None else total
        return total if self.prefix_policy is None else total * config.root_share


METHODS: dict[str, MethodPreset] = {m.name: m for m in [
    MethodPreset("grpo", "uniform", None, "grpo", "none",
                 description="uniform n per prompt, batch drawn at random, no branching"),
    MethodPreset("pcl", "pcl", None, "grpo", "learned",
                 description="prompts with predicted p closest to 0.5 from a larger pool, n each"),
    MethodPreset("treepo", "uniform", "random", "treepo", "none", prefix_candidates="all",
                 description="uniform n, then fixed-width branches at random visited prefixes"),
    MethodPreset("trace", "knapsack", "predictor", "trace", "learned",
                 description="knapsack over the pool, then predictor-guided prefix expansion"),
    MethodPreset("trace-failed", "knapsack", "predictor", "trace", "learned", prefix_candidates="failed",
                 source="ours: continuations from failed anchors only (docs/allocation.md)",
                 description="trace, its stage 2 branching only from prefixes whose rollouts all failed"),
    MethodPreset("trace-root-only", "knapsack", None, "trace", "learned",
                 description="ablation: stage 1 only, the whole budget on fresh rollouts"),
    MethodPreset("trace-prefix-only", "uniform", "predictor", "trace", "learned",
                 description="ablation: GRPO's random batch, then predictor-guided expansion"),
    MethodPreset("trace-oracle", "knapsack", "predictor", "trace", "oracle",
                 description="ablation: trace with the true success probability (simulator only)"),
    MethodPreset("trace-uniform-prefix", "knapsack", "uniform", "trace", "learned",
                 description="ablation: knapsack roots, stage-2 budget spread evenly over prefixes"),
    MethodPreset("trace-uniform", "uniform", "uniform", "trace", "none",
                 description="ablation: GRPO's random batch, stage-2 budget spread evenly over prefixes (neither "
                             "stage active: the baseline of the stage ablation)"),
    MethodPreset("dapo", "dapo", None, "grpo", "none", source=ROUND_SAMPLERS["dapo"].source,
                 description="dynamic sampling: batches of n rollouts per prompt, groups with equal rewards dropped, "
                             "refilled while the budget lasts"),
    MethodPreset("reinforce_ada", "reinforce_ada", None, "reinforce_ada", "none",
                 source=ROUND_SAMPLERS["reinforce_ada"].source,
                 description="rounds per prompt until n/2 successes and n/2 failures, downsampled to n, baseline from "
                             "all samples"),
    MethodPreset("speed", "speed", None, "grpo", "none", source=ROUND_SAMPLERS["speed"].source,
                 description="a screening round, then more rollouts only for prompts whose screening was mixed"),
    MethodPreset("pilot_commit", "pilot_commit", None, "grpo", "none", source=ROUND_SAMPLERS["pilot_commit"].source,
                 description="a pilot round, then a commit batch for prompts with pilot accuracy in [0.125, 0.75]"),
    MethodPreset("posterior", "posterior", None, "grpo", "learned", source=ROUND_SAMPLERS["posterior"].source,
                 description="rounds by posterior value per expected token: probes of round_rollouts, mixed groups "
                             "filled to n, a Beta prior around the predictor updated with every rollout"),
    MethodPreset("posterior-tree", "posterior_tree", None, "trace", "learned",
                 source=ROUND_SAMPLERS["posterior_tree"].source,
                 description="posterior, its probes also continuations from the prefixes of unmixed trees, whichever "
                             "is worth more per expected token; whole trees trained with tree advantages"),
    MethodPreset("knapsack_rl", "knapsack_rl", None, "grpo", "learned",
                 source="KnapsackRL (arXiv 2509.25849), liziniu/KnapsackRL",
                 description="GRPO's batch, its rollouts redistributed by KnapsackRL's knapsack on predicted p"),
]}


def get_method(name: str) -> MethodPreset:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}") from None
