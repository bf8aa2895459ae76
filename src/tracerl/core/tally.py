"""Every rollout of a step as the stage-2 and grant tables read it, and its compact per-step record.

A rollout (a leaf) is where it started (the root, or a prefix stage 2 branched from), what it cost (budget units and
the policy tokens it sampled itself, `BudgetLedger.rollout_price`), whether it carries signal (a non-zero advantage
before batch whitening, as the step metrics count it), and for a continuation the outcome of the rollout that created
its anchor, whether it flipped it, and the predictor's p at the anchor; for a fresh rollout, how many fresh rollouts
its prompt got (its grant). `tracerl.report.stage2` tallies these into its tables, `studies/stage2_calibration.py`
reads the continuations one by one. `batch_shape` reads stage 1's batch off a step's fresh rollouts (prompts granted,
their group sizes, how far their predicted p lies from 1/2), as the run report and `studies/batch_shape.py` state it.

The trainer writes each step's rollouts in columns (`to_columns`, one short list per field: a few kB a step, where
the step's trees take about 0.3 MB), so a run whose trees are not kept can still be read by those tables, exactly:
`from_columns(to_columns(items)) == items`.

Pure numpy over core types; no file is read or written here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from tracerl.core.advantages import AdvantageConfig, TreeAdvantages, compute_advantages
from tracerl.core.ledger import BudgetLedger
from tracerl.core.metrics import raw_advantages
from tracerl.core.tree import Tree

P_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # bins of the predicted p at the anchor: [0, 0.2), ..., [0.8, 1.0]
MEASURES = ("informative_units_per_unit", "informative_sampled_tokens_per_token")
FLIP_MEASURES = ("flip_rate", "predicted_flip_rate")  # continuations only
TABLES = ("origin", "depth", "p", "outcome", "grant")


@dataclass(frozen=True)
class Rollout:
    """One leaf's rollout: where it started, what it cost, and whether it carries signal."""

    continuation: bool  # anchored below the root (stage 2)
    anchor_depth: int  # turns in the anchor's prefix (0 for a fresh rollout)
    p_anchor: float | None  # the predictor's success probability at the anchor; None where none was recorded
    units: float  # budget units (BudgetLedger.rollout_price)
    sampled_tokens: int  # policy tokens sampled below the anchor (BudgetLedger.rollout_price)
    informative: bool  # non-zero advantage before batch-level whitening
    anchor_outcome: int | None = None  # continuations: the outcome (0/1) of the rollout that created the anchor
    flipped: bool | None = None  # continuations: its outcome differs from anchor_outcome
    grant: int = 0  # fresh rollouts in its tree (stage 1's m for trace; the group size for a uniform method)

    @property
    def p_flip(self) -> float | None:
        """Stage 2's predicted probability that this continuation flips the anchor's outcome (None without p)."""
        if self.anchor_outcome is None or self.p_anchor is None:
            return None
        return 1.0 - self.p_anchor if self.anchor_outcome else self.p_anchor


@dataclass
class Tally:
    """Counts of a group of rollouts; its ratios are ratios of these sums."""

    num_rollouts: int = 0
    num_informative: int = 0
    units: float = 0.0
    informative_units: float = 0.0
    sampled_tokens: int = 0
    informative_sampled_tokens: int = 0
    num_judged: int = 0  # continuations whose anchor outcome is known
    num_flipped: int = 0
    num_predicted: int = 0  # continuations with a predicted flip probability
    predicted_flips: float = 0.0  # sum of those probabilities

    def add(self, r: Rollout) -> None:
        self.num_rollouts += 1
        if r.flipped is not None:
            self.num_judged += 1
            self.num_flipped += int(r.flipped)
        if r.p_flip is not None:
            self.num_predicted += 1
            self.predicted_flips += r.p_flip
        self.units += r.units
        self.sampled_tokens += r.sampled_tokens
        if r.informative:
            self.num_informative += 1
            self.informative_units += r.units
            self.informative_sampled_tokens += r.sampled_tokens

    def ratios(self) -> dict[str, float]:
        """The MEASURES and FLIP_MEASURES (nan for an empty group)."""
        return {"informative_units_per_unit": _div(self.informative_units, self.units),
                "informative_sampled_tokens_per_token": _div(self.informative_sampled_tokens, self.sampled_tokens),
                "flip_rate": _div(self.num_flipped, self.num_judged),
                "predicted_flip_rate": _div(self.predicted_flips, self.num_predicted)}


def _div(a: float, b: float) -> float:
    return float(a) / float(b) if b else float("nan")


def rollouts(trees: Sequence[Tree], estimator: str, config: AdvantageConfig, prices: BudgetLedger,
             atol: float = 1e-12, advantages: Sequence[TreeAdvantages] | None = None) -> list[Rollout]:
    """Every leaf of one step's `trees` as a `Rollout`, priced by `prices` (a ledger of the run's prices). Advantages
    are the step metrics' own: `compute_advantages` of the run's estimator (or `advantages`, the step's, where the
    caller has them), then `raw_advantages` (its form before batch whitening); a rollout is informative when any of
    its segments' values exceeds `atol` in size (`tracerl.core.metrics.step_counts`' test)."""
    if advantages is None:
        advantages = compute_advantages(estimator, trees, config)
    raw = raw_advantages(estimator, trees, advantages, config)
    out = []
    for tree, adv in zip(trees, raw):
        creator = creator_leaves(tree)
        grant = sum(1 for n in tree.nodes if n.is_leaf and n.anchor_id == 0)
        for leaf, row in zip(adv.leaf_ids, adv.values):
            anchor = tree.nodes[tree.nodes[leaf].anchor_id]
            units, tokens = prices.rollout_price(tree, leaf)
            r = flipped = None
            if anchor.node_id != 0:
                r = _outcome(tree.nodes[creator[anchor.node_id]].reward)
                flipped = _outcome(tree.nodes[leaf].reward) != r
            out.append(Rollout(anchor.node_id != 0, anchor.depth, anchor.p_pred, units, tokens,
                               bool(np.any(np.abs(row) > atol)), r, flipped, grant))
    return out


def creator_leaves(tree: Tree) -> dict[int, int]:
    """Node id -> the leaf of the rollout that sampled the node (every node strictly below a leaf's anchor on its
    path). Rounds run one after another, so a candidate's leaves all agreed with this rollout when stage 2 chose it."""
    creator: dict[int, int] = {}
    for node in tree.nodes:
        if node.is_leaf:
            i = node.node_id
            while i is not None and i != node.anchor_id:
                creator[i] = node.node_id
                i = tree.nodes[i].parent_id
    return creator


def _outcome(reward: float | None) -> int:
    """A leaf's binary outcome as stage 2 reads it (`growth.intermediate_nodes`: 1 above 0.5)."""
    return int(reward is not None and reward > 0.5)


def p_bin(p: float | None, edges: Sequence[float] = P_EDGES) -> str:
    """The label of p's bin, "[lo, hi)" (the last bin closed), or "none"."""
    if p is None:
        return "none"
    j = min(max(int(np.searchsorted(edges, p, side="right")) - 1, 0), len(edges) - 2)
    close = "]" if j == len(edges) - 2 else ")"
    return f"[{edges[j]:.1f}, {edges[j + 1]:.1f}{close}"


def tally(items: Sequence[Rollout], key: Callable[[Rollout], Hashable | None]) -> dict[Hashable, Tally]:
    """Rollouts grouped by `key` (None leaves a rollout out), each group tallied."""
    groups: dict[Hashable, Tally] = defaultdict(Tally)
    for r in items:
        k = key(r)
        if k is not None:
            groups[k].add(r)
    return dict(groups)


def summarize_run(items: Sequence[Rollout], edges: Sequence[float] = P_EDGES) -> dict[str, dict[Hashable, Tally]]:
    """A run's rollouts (every step pooled) tallied by origin; its continuations by anchor depth, by p bin and by the
    anchor's outcome; its fresh rollouts by their prompt's grant."""
    return {
        "origin": tally(items, lambda r: "continuation" if r.continuation else "fresh"),
        "depth": tally(items, lambda r: r.anchor_depth if r.continuation else None),
        "p": tally(items, lambda r: p_bin(r.p_anchor, edges) if r.continuation else None),
        "outcome": tally(items, lambda r: ("failed", "succeeded")[r.anchor_outcome]
                         if r.continuation and r.anchor_outcome is not None else None),
        "grant": tally(items, lambda r: None if r.continuation else r.grant),
    }


def batch_shape(items: Sequence[Rollout]) -> dict[str, Any]:
    """Stage 1's batch as one step's fresh rollouts show it: a prompt is its fresh rollouts, each weighing 1/grant.
    `prompts` granted, `fresh` rollouts, `prompts_by_grant` (group size -> prompts), `distance` the granted prompts'
    mean |p - 1/2| (the predictor's p at the root, one count a prompt; nan where none carried one). A fresh rollout
    without a recorded grant (0, records older than the grant column) leaves every count nan."""
    fresh = [r for r in items if not r.continuation]
    if any(r.grant < 1 for r in fresh):
        return {"prompts": math.nan, "fresh": len(fresh), "prompts_by_grant": {}, "distance": math.nan}
    by_grant: dict[int, float] = defaultdict(float)
    near, weight = 0.0, 0.0
    for r in fresh:
        by_grant[r.grant] += 1.0 / r.grant
        if r.p_anchor is not None:
            near += abs(r.p_anchor - 0.5) / r.grant
            weight += 1.0 / r.grant
    return {"prompts": sum(by_grant.values()), "fresh": len(fresh), "prompts_by_grant": dict(sorted(by_grant.items())),
            "distance": near / weight if weight else math.nan}


def to_columns(items: Sequence[Rollout]) -> dict[str, list]:
    """A step's rollouts as one list per field (JSON-ready: booleans as 0/1, missing values as None)."""
    columns: dict[str, list] = {f.name: [] for f in fields(Rollout)}
    for r in items:
        for f in fields(Rollout):
            value = getattr(r, f.name)
            columns[f.name].append(int(value) if isinstance(value, bool) else value)
    return columns


def from_columns(columns: dict[str, list]) -> list[Rollout]:
    """The rollouts `to_columns` wrote, field for field."""
    names = [f.name for f in fields(Rollout)]
    missing = [n for n in names if n not in columns]
    if missing:
        raise ValueError(f"a rollout record lacks the columns {missing}; it was not written by to_columns")
    flags = {"continuation", "informative", "flipped"}
    out = []
    for row in zip(*(columns[n] for n in names)):
        values = dict(zip(names, row))
        for n in flags:
            values[n] = None if values[n] is None else bool(values[n])
        out.append(Rollout(**values))
    return out
