"""One step of tree growth for any method: predict -> stage 1 -> bare rollouts -> stage 2 rounds.

`grow_trees` is the part of a TRACE step that decides where sampling goes. The sampling itself is
done by a `RolloutRunner` (the simulator here, the ReAct driver with a real engine elsewhere), the
probabilities come from any `predict` callable, and every unit spent is charged to a `BudgetLedger`
first, so no method can overspend. Rewards, backup, predictor updates and advantages happen after.

Stage 2 runs per prompt by default: the prefix budget is split across prompts in proportion to their
stage-1 grants (in whole continuations, largest remainder first), so a prompt can expand as soon as
its own bare rollouts are done. `stage2_mode="global"` solves each round over all prompts at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from tracerl.core.allocation import BudgetLedger
from tracerl.core.history import History
from tracerl.core.methods import PREFIX_POLICIES, ROOT_POLICIES, AllocationConfig, MethodPreset
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


def intermediate_nodes(tree: Tree, unmixed_only: bool) -> tuple[list[int], np.ndarray]:
    """Stage-2 candidates: non-root, non-leaf nodes; with `unmixed_only`, only those whose leaves agree.

    Returns node ids and the shared outcome of each candidate's leaves (1 if Vhat > 0.5)."""
    backup = tree.backup()
    mixed = tree.mixed(backup)
    ids = [n.node_id for n in tree.nodes[1:]
           if not n.is_leaf and backup.num_leaves[n.node_id] > 0 and not (unmixed_only and mixed[n.node_id])]
    outcome = (backup.vhat[ids] > 0.5).astype(np.int64) if ids else np.zeros(0, dtype=np.int64)
    return ids, outcome


def split_whole(total: int, weights: np.ndarray) -> np.ndarray:
    """Split `total` whole items in proportion to `weights` (largest remainder, ties to lower index)."""
    weights = np.asarray(weights, dtype=float)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: total - int(out.sum())]] += 1
    return out


def grow_trees(method: MethodPreset, config: AllocationConfig, pool: Sequence[History], predict: PredictFn | None,
               runner: RolloutRunner, ledger: BudgetLedger, rng: np.random.Generator) -> GrowthResult:
    """Spend one step's budget on `pool` the way `method` says; returns the grown trees."""
    seconds = {"predict": 0.0, "allocate": 0.0, "rollout": 0.0}
    uses_p = method.predictor != "none"
    if uses_p and predict is None:
        raise ValueError(f"method {method.name!r} reads predicted success probabilities; pass a predictor")

    t0 = time.perf_counter()
    p_pool = np.asarray(predict(pool), dtype=float) if uses_p else np.full(len(pool), 0.5)
    t1 = time.perf_counter()
    root_counts = ROOT_POLICIES[method.root_policy](p_pool, method.root_budget(config), config, rng)
    seconds["predict"] += t1 - t0
    seconds["allocate"] += time.perf_counter() - t1

    selected = np.flatnonzero(root_counts)
    ledger.charge(float(root_counts.sum()), kind="root")
    t0 = time.perf_counter()
    trees, num_tokens = runner.run_roots(selected.tolist(), root_counts[selected].tolist())
    seconds["rollout"] += time.perf_counter() - t0
    ledger.charge_tokens(num_tokens, kind="root")
    for tree, i in zip(trees, selected):
        tree.root.p_pred = float(p_pool[i]) if uses_p else None
        tree.root.expand_reason = "root"
        tree.root.num_granted = int(root_counts[i])

    result = GrowthResult(trees, selected, p_pool, root_counts, seconds)
    if method.prefix_policy is not None and config.expand_rounds > 0 and trees:
        expand_trees(method, config, result, predict, runner, ledger, rng)
    return result


def expand_trees(method, config, result, predict, runner, ledger, rng) -> None:
    policy = PREFIX_POLICIES[method.prefix_policy]
    granule = policy.granule(config)
    unit = granule * config.continuation_cost
    num_granules = int(ledger.units_left // unit + 1e-9)
    if config.stage2_mode == "per_prompt":
        left = split_whole(num_granules, result.root_counts[result.selected])  # granules per tree
    else:
        left = np.array([num_granules])
    trees = result.trees
    for round_index in range(config.expand_rounds):
        rounds_left = config.expand_rounds - round_index
        t0 = time.perf_counter()
        cands = [intermediate_nodes(t, unmixed_only=method.prefix_candidates == "unmixed") for t in trees]
        histories = [t.history(i) for t, (ids, _) in zip(trees, cands) for i in ids]
        t1 = time.perf_counter()
        p_all = np.asarray(predict(histories), dtype=float) if (policy.needs_p and histories) else np.full(len(histories), 0.5)
        t2 = time.perf_counter()
        offsets = np.cumsum([0] + [len(ids) for ids, _ in cands])
        outcome_all = np.concatenate([outcome for _, outcome in cands])
        grants = np.zeros(len(histories), dtype=np.int64)
        groups = [slice(offsets[i], offsets[i + 1]) for i in range(len(trees))] \
            if config.stage2_mode == "per_prompt" else [slice(0, len(histories))]
        for g, sl in enumerate(groups):
            this_round = math.ceil(left[g] / rounds_left)
            if this_round <= 0 or sl.stop == sl.start:
                continue
            grants[sl] = policy(p_all[sl], outcome_all[sl], this_round * unit, config, rng)
            left[g] -= int(math.ceil(grants[sl].sum() / granule))
        result.seconds["predict"] += t2 - t1
        result.seconds["allocate"] += (t1 - t0) + (time.perf_counter() - t2)
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
        ledger.charge(float(grants.sum()) * config.continuation_cost, kind="prefix")
        result.num_prefix_anchors += len(requests)
        t0 = time.perf_counter()
        ledger.charge_tokens(runner.run_continuations(requests), kind="prefix")
        result.seconds["rollout"] += time.perf_counter() - t0
