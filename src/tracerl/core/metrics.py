"""The allocation measures (docs/design.md, "Measures"), computed from one step's trees.

The primary measure is informative samples: rollouts, and policy tokens, whose advantage before any batch-level
whitening is non-zero. That is what a policy gradient can learn from. It leads priced, each sample at what it cost:

- `informative_units_per_unit`: informative rollouts weighted by their budget cost (a fresh rollout 1, a
  continuation `allocation.continuation_cost`, as the step's ledger prices it) over the units spent: the share of the
  budget that bought signal. Counting a continuation as a whole rollout per unit (`informative_rollouts_per_budget`) makes a tree look
  better by accounting alone: 2 informative continuations then count 2 for the price of 1.
- `informative_sampled_tokens_per_token`: the tokens each informative rollout sampled itself (below its anchor;
  a shared prefix counts once, with the rollout that sampled it) over all sampled tokens. At most 1.

The unpriced counts stay beside them (`informative_rollouts_per_budget`, `informative_rollouts_per_ktoken`,
`informative_tokens_per_token`, `informative_rollout_frac`). Mixed trees per unit (what `v_root` maximises) and the
effective ratio are reported beside these, never alone: spreading the budget thinly raises both while producing
fewer informative rollouts.

Counts are returned alongside the ratios so that several steps can be pooled as a ratio of sums
(`pool_counts`) instead of a mean of ratios, which overweights small steps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tracerl.core.ledger import BudgetLedger
from tracerl.core.advantages import (
    BEFORE_BATCH_WHITENING,
    AdvantageConfig,
    TreeAdvantages,
    nonzero_adv_token_counts,
)
from tracerl.core.history import History
from tracerl.core.tree import Tree


PRICED_MEASURES = ("informative_units_per_unit", "informative_sampled_tokens_per_token")
INFORMATIVE_MEASURES = (*PRICED_MEASURES, "informative_rollouts_per_budget", "informative_rollouts_per_ktoken",
                        "informative_tokens_per_token", "informative_rollout_frac")


def raw_advantages(name: str, trees: Sequence[Tree], advantages: Sequence[TreeAdvantages],
                   config: AdvantageConfig | None = None) -> Sequence[TreeAdvantages]:
    """The estimator's advantages before batch-level whitening: for a batch-whitened estimator its form before the
    whitening (`advantages.BEFORE_BATCH_WHITENING`: a tree without contrast stays all zero); for the others,
    `advantages` as they are."""
    before = BEFORE_BATCH_WHITENING.get(name)
    return advantages if before is None else before(list(trees), config or AdvantageConfig())


def step_counts(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], units_spent: float,
                tokens_spent: int, *, prices: BudgetLedger, atol: float = 1e-12,
                raw_advantages: Sequence[TreeAdvantages] | None = None) -> dict[str, float]:
    """Raw counts of one step: selected prompts, mixed trees and anchors, policy tokens, budget spent, and the
    informative rollouts and tokens, counted and priced by `prices` (the step's ledger, or one built from the run's
    config: `BudgetLedger.rollout_price`).

    `advantages` are what the policy is trained on; `raw_advantages` the same estimator's output before any
    batch-level whitening (defaults to `advantages`, right for every estimator that does not whiten over the
    batch). Informative counts read the raw ones: whitening gives an all-equal tree non-zero advantages that
    carry no contrast."""
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
    raw = advantages if raw_advantages is None else raw_advantages
    num_informative_tokens, _ = nonzero_adv_token_counts(trees, raw, atol)
    num_informative, informative_units, informative_sampled = 0, 0.0, 0
    for tree, adv in zip(trees, raw):
        for leaf, row in zip(adv.leaf_ids, adv.values):
            if np.any(np.abs(row) > atol):
                units, tokens = prices.rollout_price(tree, leaf)
                num_informative += 1
                informative_units += units
                informative_sampled += tokens
    return {
        "num_prompts": len(trees), "num_mixed_trees": num_mixed_trees, "num_anchors": num_anchors,
        "num_mixed_anchors": num_mixed_anchors, "num_leaves": num_leaves, "num_success": num_success,
        "num_policy_tokens": num_tokens, "num_nonzero_adv_tokens": num_nonzero,
        "num_informative_rollouts": num_informative, "num_informative_tokens": num_informative_tokens,
        "informative_units": informative_units, "num_informative_sampled_tokens": informative_sampled,
        "units_spent": float(units_spent), "tokens_spent": int(tokens_spent),
    }


def ratios(counts: dict[str, float]) -> dict[str, float]:
    """The named measures from (possibly pooled) counts."""
    def div(a, b):
        return float(a) / float(b) if b else float("nan")
    return {
        "informative_units_per_unit": div(counts["informative_units"], counts["units_spent"]),
        "informative_sampled_tokens_per_token": div(counts["num_informative_sampled_tokens"], counts["tokens_spent"]),
        "informative_rollouts_per_budget": div(counts["num_informative_rollouts"], counts["units_spent"]),
        "informative_rollouts_per_ktoken": div(1000 * counts["num_informative_rollouts"], counts["tokens_spent"]),
        "informative_tokens_per_token": div(counts["num_informative_tokens"], counts["tokens_spent"]),
        "informative_rollout_frac": div(counts["num_informative_rollouts"], counts["num_leaves"]),
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
