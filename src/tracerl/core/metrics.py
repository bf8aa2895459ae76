"""The allocation measures of docs/design.md (section 3), computed from one step's trees.

Counts are returned alongside the ratios so that several steps can be pooled as a ratio of sums
(`pool_counts`) instead of a mean of ratios, which overweights small steps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tracerl.core.advantages import TreeAdvantages, nonzero_adv_token_counts
from tracerl.core.history import History
from tracerl.core.tree import Tree


def step_counts(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], units_spent: float,
                tokens_spent: int, atol: float = 1e-12) -> dict[str, float]:
    """Raw counts of one step: selected prompts, mixed trees and anchors, policy tokens, budget spent."""
    num_mixed_trees = num_anchors = num_mixed_anchors = 0
    num_leaves = num_success = 0
    for tree in trees:
        mixed = tree.mixed()
        num_mixed_trees += bool(mixed[0])
        anchors = [n.node_id for n in tree.nodes if n.num_granted > 0]
        num_anchors += len(anchors)
        num_mixed_anchors += int(mixed[anchors].sum())
        rewards = tree.rewards()
        num_leaves += len(rewards)
        num_success += int((rewards > 0.5).sum())
    num_nonzero, num_tokens = nonzero_adv_token_counts(trees, advantages, atol)
    return {
        "num_prompts": len(trees), "num_mixed_trees": num_mixed_trees, "num_anchors": num_anchors,
        "num_mixed_anchors": num_mixed_anchors, "num_leaves": num_leaves, "num_success": num_success,
        "num_policy_tokens": num_tokens, "num_nonzero_adv_tokens": num_nonzero,
        "units_spent": float(units_spent), "tokens_spent": int(tokens_spent),
    }


def ratios(counts: dict[str, float]) -> dict[str, float]:
    """The named measures from (possibly pooled) counts."""
    def div(a, b):
        return float(a) / float(b) if b else float("nan")
    return {
        "effective_ratio": div(counts["num_mixed_trees"], counts["num_prompts"]),
        "mixed_trees_per_budget": div(counts["num_mixed_trees"], counts["units_spent"]),
        "mixed_anchors_per_budget": div(counts["num_mixed_anchors"], counts["units_spent"]),
        "nonzero_adv_token_frac": div(counts["num_nonzero_adv_tokens"], counts["num_policy_tokens"]),
        "success_rate": div(counts["num_success"], counts["num_leaves"]),
    }


def pool_counts(steps: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = steps[0].keys() if steps else []
    return {k: sum(s[k] for s in steps) for k in keys}


def predictor_targets(trees: Sequence[Tree]) -> tuple[list[History], np.ndarray, np.ndarray]:
    """(h_y, Vhat(y), n_y) for every non-leaf node with leaves: what the predictor is scored and trained on.

    Targets come from `Tree.natural_backup` (leaves of rollouts started at or above y), not from the full
    backup, so stage 2's choice of where to branch does not bias what the predictor learns."""
    histories, targets, weights = [], [], []
    for tree in trees:
        backup = tree.natural_backup()
        for node in tree.nodes:
            if node.is_leaf or backup.num_leaves[node.node_id] == 0:
                continue
            histories.append(tree.history(node.node_id))
            targets.append(backup.vhat[node.node_id])
            weights.append(backup.num_leaves[node.node_id])
    return histories, np.asarray(targets, dtype=float), np.asarray(weights, dtype=float)
