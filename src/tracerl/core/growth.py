"""One step of tree growth for any method: predict -> stage 1 -> bare rollouts -> stage 2 rounds.

`grow_trees` is the part of a TRACE step that decides where sampling goes; `plan_roots` (stage 1 and each
tree's share of the stage-2 budget) and `expand_trees` (stage 2 on given trees) are its two halves, public so
that a caller that grows trees in several places (verl: stage 1 in the manager, one tree per worker) runs the
same code. The sampling itself is done by a `RolloutRunner` (the simulator here, the ReAct driver with a real
engine elsewhere), the probabilities come from any `predict` callable, every price comes from a `Prices` object
(`tracerl.core.ledger`: trajectory units or expected tokens; growth never asks which) and every cost is charged to
the step's `BudgetLedger` first, so no method can overspend. Rewards, backup, predictor updates and advantages
happen after (`tracerl.core.step`).

Stage 2 runs per prompt by default: the prefix budget is split across prompts in proportion to their
stage-1 grants (in whole continuations, largest remainder first), so a prompt can expand as soon as
its own bare rollouts are done. `stage2_mode="global"` solves each round over all prompts at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from tracerl.core.allocation import root_value
from tracerl.core.history import History
from tracerl.core.ledger import BudgetLedger, Prices
from tracerl.core.methods import PREFIX_POLICIES, ROOT_POLICIES, AllocationConfig, MethodPreset
from tracerl.core.samplers import ROUND_SAMPLERS, Branches, Round, Seen
from tracerl.core.tree import Tree

PredictFn = Callable[[Sequence[History]], np.ndarray]


class RolloutRunner(Protocol):
    """Samples rollouts. Both calls return the number of tokens they generated."""

    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        """One new tree per prompt (index into the step's pool) with counts[i] bare rollouts."""

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        """For each (tree, node_id, k): grow k continuations from that node, in place."""


@dataclass
class GrowthResult:
    trees: list[Tree]
    selected: np.ndarray  # (S,) pool indices of the prompts that got budget, aligned with trees
    p_pool: np.ndarray  # (P,) predicted p of every pool prompt (0.5 where the method reads none)
    root_counts: np.ndarray  # (P,) stage-1 grants over the pool
    seconds: dict[str, float] = field(default_factory=dict)  # predict / allocate / rollout wall time
    num_prefix_anchors: int = 0  # (tree, node) pairs granted continuations, summed over rounds
    num_continuations: int = 0  # continuations sampled in stage 2, summed over rounds
    stage1_value: float = 0.0  # sum_i V(p_i, m_i) under config.root_value: the stage-1 objective of the grants
    kept: list[Tree] | None = None  # the groups the update trains on (a round sampler's keep); None = all of `trees`
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (rollouts, tokens) of each stage-1 round, in order

    @property
    def trained(self) -> list[Tree]:
        """What the update trains on: the kept groups, or every tree when the method keeps all."""
        return self.trees if self.kept is None else self.kept


@dataclass(frozen=True)
class RootPlan:
    """Stage 1 over a pool, and each selected prompt's share of the stage-2 budget."""

    counts: np.ndarray  # (P,) fresh rollouts per prompt; 0 = filtered out
    cost: np.ndarray  # (P,) budget cost of one fresh rollout of each prompt (1 in units)
    prefix_budget: np.ndarray  # (P,) stage-2 budget per prompt, in the budget's unit (0 where not selected)
    value: float  # sum_i V(p_i, counts_i) under config.root_value


def intermediate_nodes(tree: Tree, which: str = "unmixed") -> tuple[list[int], np.ndarray]:
    """Stage-2 candidates: non-root, non-leaf nodes with leaves below them; `which` (a method's `prefix_candidates`):
    "all" of them, "unmixed" (their leaves agree) or "failed" (their leaves agree, and all failed).

    Returns node ids and the shared outcome of each candidate's leaves (1 if Vhat > 0.5)."""
    backup = tree.backup()
    mixed = tree.mixed(backup)
    ids = [n.node_id for n in tree.nodes[1:] if not n.is_leaf and backup.num_leaves[n.node_id] > 0
           and not (which != "all" and mixed[n.node_id]) and not (which == "failed" and backup.vhat[n.node_id] > 0.5)]
    outcome = (backup.vhat[ids] > 0.5).astype(np.int64) if ids else np.zeros(0, dtype=np.int64)
    return ids, outcome


def plan_roots(method: MethodPreset, config: AllocationConfig, p_pool: np.ndarray, budget: float,
               rng: np.random.Generator, prices: Prices, cost: np.ndarray | None = None) -> RootPlan:
    """Stage 1 on a step budget of `budget` (in the prices' unit; `cost` (P,) of one fresh rollout per prompt, None =
    1 each), then what is left of it split across the selected prompts for stage 2 (`Prices.prefix_budgets`)."""
    p_pool = np.asarray(p_pool, dtype=float)
    root_policy = ROOT_POLICIES[method.root_policy]
    counts = np.asarray(root_policy(p_pool, method.root_budget(config, budget), config, rng, cost=cost),
                        dtype=np.int64)
    unit_cost = np.ones(len(p_pool)) if cost is None else np.asarray(cost, dtype=float)
    return _with_prefix_budget(method, config, p_pool, counts, unit_cost, budget, prices)


def _with_prefix_budget(method, config, p_pool, counts, unit_cost, budget, prices: Prices) -> RootPlan:
    prefix_budget = np.zeros(len(counts))
    selected = np.flatnonzero(counts)
    left = max(budget - float(np.sum(counts * unit_cost)), 0.0)
    if method.prefix_policy is not None and config.expand_rounds > 0 and selected.size:
        granule = PREFIX_POLICIES[method.prefix_policy].granule(config)
        prefix_budget[selected] = prices.prefix_budgets(left, counts[selected], unit_cost[selected], granule)
    value = float(np.sum(root_value(p_pool, counts, config.root_value))) if len(counts) else 0.0
    return RootPlan(counts, unit_cost, prefix_budget, value)


def force_plan(method: MethodPreset, config: AllocationConfig, plan: RootPlan, p_pool: np.ndarray,
               budget: float, prices: Prices) -> RootPlan:
    """`plan` with m_min rollouts for the prompt closest to p = 0.5 when it selected none (a caller that cannot
    sample an empty batch, such as verl's synchronous sampler)."""
    if plan.counts.any():
        return plan
    counts = plan.counts.copy()
    counts[int(np.argmin(np.abs(np.asarray(p_pool) - 0.5)))] = config.m_min
    return _with_prefix_budget(method, config, np.asarray(p_pool, dtype=float), counts, plan.cost, budget, prices)


def mark_roots(trees: Sequence[Tree], p: Sequence[float] | None, counts: Sequence[int]) -> None:
    """Record stage 1 on the trees' roots: the predicted p (None where the method reads none) and the grant."""
    for j, tree in enumerate(trees):
        tree.root.p_pred = None if p is None else float(p[j])
        tree.root.expand_reason = "root"
        tree.root.num_granted = int(counts[j])


def grow_trees(method: MethodPreset, config: AllocationConfig, pool: Sequence[History], predict: PredictFn | None,
               runner: RolloutRunner, ledger: BudgetLedger, rng: np.random.Generator, prices: Prices) -> GrowthResult:
    """Spend one step's budget (`ledger`, priced by `prices`) on `pool` the way `method` says; returns the grown
    trees."""
    seconds = {"predict": 0.0, "allocate": 0.0, "rollout": 0.0}
    uses_p = method.predictor != "none"
    if uses_p and predict is None:
        raise ValueError(f"method {method.name!r} reads predicted success probabilities; pass a predictor")

    t0 = time.perf_counter()
    p_pool = np.asarray(predict(pool), dtype=float) if uses_p else np.full(len(pool), 0.5)
    t1 = time.perf_counter()
    cost = prices.fresh([h.prompt_id for h in pool])
    seconds["predict"] += t1 - t0
    if method.in_rounds:
        return grow_in_rounds(method, config, p_pool if uses_p else None, cost, runner, ledger, rng, seconds,
                              size=len(pool), predict=predict, prices=prices)
    plan = plan_roots(method, config, p_pool, ledger.budget_left, rng, prices, cost)
    root_counts = plan.counts
    seconds["allocate"] += time.perf_counter() - t1

    selected = np.flatnonzero(root_counts)
    ledger.charge(ledger.rollout_units(root_counts.sum(), continuation=False), kind="root",
                  cost=float(np.sum(root_counts * plan.cost)))
    t0 = time.perf_counter()
    trees, num_tokens = runner.run_roots(selected.tolist(), root_counts[selected].tolist())
    seconds["rollout"] += time.perf_counter() - t0
    ledger.charge_tokens(num_tokens, kind="root")
    mark_roots(trees, p_pool[selected] if uses_p else None, root_counts[selected])

    result = GrowthResult(trees, selected, p_pool, root_counts, seconds, stage1_value=plan.value)
    if method.prefix_policy is not None and config.expand_rounds > 0 and trees:
        stats = expand_trees(method, config, trees, plan.prefix_budget[selected], predict, runner, ledger, rng,
                             prices)
        result.num_prefix_anchors = stats["num_prefix_anchors"]
        result.num_continuations = stats["num_continuations"]
        for key in ("predict", "allocate", "rollout"):
            seconds[key] += stats[key]
    return result


def grow_in_rounds(method: MethodPreset, config: AllocationConfig, p_pool: np.ndarray | None, cost: np.ndarray | None,
                   runner: RolloutRunner, ledger: BudgetLedger, rng: np.random.Generator,
                   seconds: dict[str, float], size: int, predict: PredictFn | None = None,
                   prices: Prices | None = None) -> GrowthResult:
    """Stage 1 in rounds (`tracerl.core.samplers`): the method's round sampler grants each round's fresh rollouts from
    what the earlier rounds showed, until it grants none, `config.max_rounds` rounds have run or the ledger's token
    cap is reached; each round is charged before it is sampled (a sampler that overspends raises `BudgetExceeded`).
    A prompt's first rollouts start its tree (`run_roots`); its later rounds are more rollouts from the same root
    (`run_continuations` from node 0), recorded as fresh rollouts. A sampler that `branches` is also shown, each
    round, the prefixes of trees not yet mixed (`offer_branches`: predicted with `predict`, priced by `prices`) and
    may grant continuations from them, charged as stage 2's. Then the sampler keeps each prompt's training group
    (`GrowthResult.kept`); every sampled tree stays in `trees`, for the predictor, the prices and the record.
    `p_pool` (None where the method reads none) and `cost` (None: 1 each) are over the `size` pool prompts."""
    sampler = ROUND_SAMPLERS[method.root_policy](config)
    if sampler.branches and (predict is None or prices is None):
        raise ValueError(f"round sampler {method.root_policy!r} branches from prefixes; pass predict and prices")
    unit_cost = np.ones(size) if cost is None else np.asarray(cost, dtype=float)
    seen = Seen(p=np.full(size, 0.5) if p_pool is None else np.asarray(p_pool, dtype=float), cost=unit_cost,
                order=rng.permutation(size), budget=ledger.budget_left)
    tree_of: dict[int, Tree] = {}
    rounds: list[tuple[int, int]] = []
    branch_stats = {"num_prefix_anchors": 0, "num_continuations": 0}
    predicted: dict[tuple[int, int], float] = {}  # (pool index, node id) -> p: a prefix is predicted once a step
    for round_index in range(config.max_rounds):
        seen.round_index, seen.budget_left = round_index, ledger.budget_left
        t0 = time.perf_counter()
        if sampler.branches:
            seen.branches = offer_branches(method, tree_of, seen, predict, prices, predicted)
        t1 = time.perf_counter()
        granted = sampler.grants(seen, rng)
        seconds["allocate"] += time.perf_counter() - t1
        seconds["predict"] += t1 - t0
        grants = np.asarray(granted.fresh if isinstance(granted, Round) else granted, dtype=np.int64)
        branches = granted.branches if isinstance(granted, Round) else []
        if grants.shape != (size,) or np.any(grants < 0):
            raise ValueError(f"round sampler {method.root_policy!r} granted {grants.shape} counts, some negative; "
                             f"it must grant (P,) = ({size},) counts >= 0")
        price = float(np.sum(grants * unit_cost))
        if not (grants.any() or branches) or not ledger.can_afford(0.0):  # nothing granted, or the token cap is used up
            break
        if grants.any():
            ledger.charge(ledger.rollout_units(grants.sum(), continuation=False), kind="root", cost=price)
        requests = charge_branches(branches, tree_of, seen, ledger, method.root_policy) if branches else []
        new = [int(i) for i in np.flatnonzero(grants) if int(i) not in tree_of]
        more = [(tree_of[int(i)], 0, int(grants[i])) for i in np.flatnonzero(grants) if int(i) in tree_of]
        sizes = {id(tree): len(tree) for tree, _, _ in more}
        t0 = time.perf_counter()
        tokens = branch_tokens = 0
        if new:
            trees, num_tokens = runner.run_roots(new, grants[new].tolist())
            tree_of.update(zip(new, trees))
            tokens += num_tokens
        if more:
            tokens += runner.run_continuations(more)
            for tree, _, _ in more:  # a rollout from the root is a fresh rollout, whichever call sampled it
                for node in tree.nodes[sizes[id(tree)]:]:
                    if node.anchor_id == 0:
                        node.origin = "bare"
        if requests:
            branch_tokens = runner.run_continuations(requests)
            branch_stats["num_prefix_anchors"] += len(requests)
            branch_stats["num_continuations"] += sum(k for _, _, k in requests)
        seconds["rollout"] += time.perf_counter() - t0
        ledger.charge_tokens(tokens, kind="root")
        if requests:
            ledger.charge_tokens(branch_tokens, kind="prefix")
        rounds.append((int(grants.sum()) + sum(k for _, _, k in branches), int(tokens + branch_tokens)))
        for i in {int(i) for i in np.flatnonzero(grants)} | {i for i, _, _ in branches}:  # prompts with new leaves
            leaves = [tree_of[i].nodes[leaf] for leaf in tree_of[i].leaves()]
            rewards = [leaf.reward for leaf in leaves]
            fresh = [leaf.reward for leaf in leaves if leaf.anchor_id == 0]
            seen.rollouts[i], seen.successes[i] = len(fresh), sum(r > 0.5 for r in fresh)
            seen.tree_mixed[i] = any(r > 0.5 for r in rewards) and not all(r > 0.5 for r in rewards)
    selected = np.array(sorted(tree_of), dtype=np.int64)
    trees = [tree_of[int(i)] for i in selected]
    mark_roots(trees, None if p_pool is None else seen.p[selected], seen.rollouts[selected])
    seen.budget_left = ledger.budget_left
    t0 = time.perf_counter()
    groups = sampler.keep(dict(tree_of), seen, rng)
    kept = [groups[i] for i in sorted(groups)]
    seconds["allocate"] += time.perf_counter() - t0
    value = float(np.sum(root_value(seen.p, seen.rollouts, config.root_value))) if size else 0.0
    return GrowthResult(trees, selected, seen.p, seen.rollouts.copy(), seconds, stage1_value=value, kept=kept,
                        rounds=rounds, **branch_stats)


def offer_branches(method: MethodPreset, tree_of: dict[int, Tree], seen: Seen, predict: PredictFn,
                   prices: Prices, predicted: dict[tuple[int, int], float]) -> Branches:
    """The prefixes a branching round sampler may continue: `intermediate_nodes` (by the method's
    `prefix_candidates`) of every tree not yet mixed, with the predictor's p from each prefix (`predicted` keeps
    them across the step's rounds: a prefix's history does not change) and its price."""
    found = [(i, ids, outcome) for i, tree in sorted(tree_of.items()) if not seen.tree_mixed[i]
             for ids, outcome in [intermediate_nodes(tree, method.prefix_candidates)] if ids]
    if not found:
        empty = np.zeros(0)
        return Branches(empty.astype(np.int64), empty.astype(np.int64), empty, empty.astype(np.int64), empty)
    keys = [(i, node) for i, ids, _ in found for node in ids]
    unseen = [key for key in keys if key not in predicted]
    if unseen:
        predicted.update(zip(unseen, np.asarray(predict([tree_of[i].history(y) for i, y in unseen]), dtype=float)))
    drawn = np.array([drawn_from(tree_of[i], y) for i, y in keys], dtype=np.int64).reshape(-1, 2)
    return Branches(prompt=np.concatenate([np.full(len(ids), i, dtype=np.int64) for i, ids, _ in found]),
                    node=np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids, _ in found]),
                    p=np.array([predicted[key] for key in keys], dtype=float),
                    outcome=np.concatenate([outcome for _, _, outcome in found]),
                    cost=np.concatenate([prices.continuation(tree_of[i], ids) for i, ids, _ in found]),
                    rollouts=drawn[:, 0], successes=drawn[:, 1])


def drawn_from(tree: Tree, node_id: int) -> tuple[int, int]:
    """The rollouts drawn from the prefix ending at `node_id`, and their successes: the leaves below it whose rollout
    started at it or above it (a continuation from a deeper node is a draw from that node's prefix instead)."""
    above = set(tree.path(node_id))
    drawn = [leaf for leaf in tree.leaves_below(node_id) if tree.nodes[leaf].anchor_id in above]
    return len(drawn), sum(tree.nodes[leaf].reward > 0.5 for leaf in drawn)


def charge_branches(branches: list[tuple[int, int, int]], tree_of: dict[int, Tree], seen: Seen,
                    ledger: BudgetLedger, reason: str) -> list[tuple[Tree, int, int]]:
    """Charge a round's continuations as stage 2's (at the prices `seen.branches` offered them), record them on
    their anchors, and return them as `run_continuations` requests."""
    offered = seen.branches
    price = {(int(i), int(y)): float(c) for i, y, c in zip(offered.prompt, offered.node, offered.cost)}
    unknown = [(i, y) for i, y, _ in branches if (i, y) not in price]
    if unknown:
        raise ValueError(f"round sampler {reason!r} granted continuations from prefixes it was not offered: {unknown}")
    if any(int(k) != k or k < 1 for _, _, k in branches):
        raise ValueError(f"round sampler {reason!r} granted {[k for _, _, k in branches]} continuations; each grant "
                         "must be a whole number >= 1")
    ledger.charge(ledger.rollout_units(sum(k for _, _, k in branches), continuation=True), kind="prefix",
                  cost=sum(k * price[(i, y)] for i, y, k in branches))
    p_of = {(int(i), int(y)): float(p) for i, y, p in zip(offered.prompt, offered.node, offered.p)}
    requests = []
    for i, y, k in branches:
        node = tree_of[i].nodes[y]
        node.p_pred, node.expand_reason = p_of[(i, y)], reason
        node.num_granted += k
        requests.append((tree_of[i], y, k))
    return requests


def expand_trees(method: MethodPreset, config: AllocationConfig, trees: Sequence[Tree], budgets: np.ndarray,
                 predict: PredictFn | None, runner: RolloutRunner, ledger: BudgetLedger, rng: np.random.Generator,
                 prices: Prices) -> dict[str, float]:
    """Stage 2 on `trees`, tree i spending at most budgets[i] (in the prices' unit; `plan_roots` gives them) over
    config.expand_rounds rounds; with stage2_mode="global" their sum is solved over all trees at once.
    Charges the ledger before sampling; a round stops when the ledger's token cap is reached.
    Returns seconds spent (predict, allocate, rollout), num_prefix_anchors and num_continuations."""
    stats = {"predict": 0.0, "allocate": 0.0, "rollout": 0.0, "num_prefix_anchors": 0, "num_continuations": 0}
    policy = PREFIX_POLICIES[method.prefix_policy]
    granule = policy.granule(config)
    purse = prices.purse(budgets, granule)
    if config.stage2_mode != "per_prompt":
        purse = purse.pooled()
    for round_index in range(config.expand_rounds):
        rounds_left = config.expand_rounds - round_index
        t0 = time.perf_counter()
        cands = [intermediate_nodes(t, method.prefix_candidates) for t in trees]
        histories = [t.history(i) for t, (ids, _) in zip(trees, cands) for i in ids]
        cost_all = np.concatenate([prices.continuation(t, ids) for t, (ids, _) in zip(trees, cands)] or [[]])
        t1 = time.perf_counter()
        p_all = np.asarray(predict(histories), dtype=float) if (policy.needs_p and histories) else np.full(len(histories), 0.5)
        t2 = time.perf_counter()
        offsets = np.cumsum([0] + [len(ids) for ids, _ in cands])
        outcome_all = np.concatenate([outcome for _, outcome in cands])
        grants = np.zeros(len(histories), dtype=np.int64)
        groups = [slice(offsets[i], offsets[i + 1]) for i in range(len(trees))] \
            if config.stage2_mode == "per_prompt" else [slice(0, len(histories))]
        for g, sl in enumerate(groups):
            if sl.stop == sl.start:
                continue
            budget = purse.round_budget(g, rounds_left, cost_all[sl])
            if budget <= 0:
                continue
            grants[sl] = policy(p_all[sl], outcome_all[sl], budget, config, rng, cost_all[sl])
            purse.spend(g, grants[sl], cost_all[sl], granule)
        stats["predict"] += t2 - t1
        stats["allocate"] += (t1 - t0) + (time.perf_counter() - t2)
        requests = []
        for tree_index, (ids, _) in enumerate(cands):
            for j, node_id in enumerate(ids):
                k = int(grants[offsets[tree_index] + j])
                node = trees[tree_index].nodes[node_id]
                if policy.needs_p:
                    node.p_pred = float(p_all[offsets[tree_index] + j])
                if k:
                    node.expand_reason = method.prefix_policy
                    node.num_granted += k
                    requests.append((trees[tree_index], node_id, k))
        if not requests:
            continue
        cost = prices.cost(grants, cost_all)
        if not ledger.can_afford(cost):
            for tree, node_id, k in requests:  # the token cap is reached: nothing of this round is sampled
                node = tree.nodes[node_id]
                node.num_granted -= k
                node.expand_reason = node.expand_reason if node.num_granted else None
            break
        ledger.charge(ledger.rollout_units(grants.sum(), continuation=True), kind="prefix", cost=cost)
        stats["num_prefix_anchors"] += len(requests)
        stats["num_continuations"] += int(grants.sum())
        t0 = time.perf_counter()
        ledger.charge_tokens(runner.run_continuations(requests), kind="prefix")
        stats["rollout"] += time.perf_counter() - t0
    return stats
