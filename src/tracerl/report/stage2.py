"""`tracerl bench stage2`: do stage-2 continuations pay for what they cost, compared with fresh rollouts?

Read from the trees a `method=trace` run saves (`trees/step-*.json.gz`, `run.save_trees=true`). Every rollout (leaf)
is one sample bought at a price (`tracerl.core.ledger.BudgetLedger.rollout_price`): a fresh rollout (anchored at the root) costs
1 budget unit, a continuation (anchored at an intermediate prefix) `allocation.continuation_cost` units, and each
sampled the policy tokens below its anchor itself (a shared prefix counts once, with the rollout that sampled it).
A rollout is informative when its advantage before any batch-level whitening is non-zero
(`tracerl.core.metrics.raw_advantages` of the run's estimator and advantage config, as the step metrics count it):
that is what a policy gradient learns from. Per group of rollouts the report gives

- informative units per unit: the units of informative rollouts over the units of all of them. Within one origin
  every rollout has one price, so this is the informative share of its rollouts; priced as the step metrics price
  (an informative sample counts at what it cost), a continuation pays for its units when its share is at least
  the fresh rollouts' share;
- informative sampled tokens per sampled token: the tokens informative rollouts sampled over all tokens sampled.
  A continuation samples only its suffix, so this is where a cheap prefix shows;

for fresh rollouts, for continuations, and for continuations by the anchor's depth (its turn index), by the
predictor's success probability at the anchor (`Node.p_pred`, written by stage 2 when it scores its candidates;
"none" for prefix policies that read no probability) and by the anchor's outcome; and for fresh rollouts by their
prompt's grant (how many fresh rollouts its tree holds: stage 1's m for `trace`, the group size n for a uniform
method), which says where stage 1's allocation puts its rollouts and how much each size of group carries. Any
method's runs can be read (`grpo`'s and `pcl`'s have fresh rollouts only), so the fresh rollouts of `trace`'s
allocation can be set beside a uniform method's.

Stage 2's promise against what it got. A candidate anchor's leaves all share one outcome r (the rollout that
created the anchor; `growth.intermediate_nodes`), and stage 2 buys continuations there because one of them reaches
the other outcome with probability p (r = 0) or 1 - p (r = 1) (`allocation.prefix_value`). Per continuation the
report sets that predicted flip probability beside whether it flipped (its reward on the other side of 0.5 from
the anchor's rollout): where the predicted column sits well above the realized one, the predictor promised
contrast the policy did not deliver, and the budget went where the objective was miscalibrated.

Steps pool within a run as ratios of sums, with the counts behind each ratio; across runs (seeds) the report gives
the mean of the per-seed ratios with a Student-t 95% interval over seeds (`tracerl.core.stats.seed_mean`), and
the paired difference continuation minus fresh per seed with its interval and t-test p-value. One seed gives no
interval: the spread between training runs is the noise a conclusion must clear.

Reading it: with a group baseline, whether a rollout is informative is mostly a property of its tree (a mixed tree
makes nearly all its rollouts informative), so fresh rollouts and continuations of the same trees read alike per
unit; the token measure (a continuation's suffix is shorter) and the depth and p breakdowns are where they differ.

Deliberately not here: training, and any reading of `metrics.jsonl` (everything is recomputed from the trees).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.ledger import BudgetLedger, make_prices
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.metrics import raw_advantages
from tracerl.core.stats import SeedMean, seed_mean
from tracerl.core.tree import Tree
from tracerl.io.files.config import from_dict, load_file
from tracerl.io.files.runlog import TREES_DIR, read_trees

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
             atol: float = 1e-12) -> list[Rollout]:
    """Every leaf of one step's `trees` as a `Rollout`, priced by `prices` (a ledger of the run's prices). Advantages are the step metrics' own: `compute_advantages`
    of the run's estimator, then `raw_advantages` (its form before batch whitening); a rollout is informative when
    any of its segments' values exceeds `atol` in size (`tracerl.core.metrics.step_counts`' test)."""
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


def across_seeds(runs: Sequence[dict[str, dict[Hashable, Tally]]]) -> dict[str, Any]:
    """Per table and group: the seed mean of each measure and the counts summed over seeds; and, per measure, the
    paired difference continuation minus fresh (seeds with both)."""
    tables: dict[str, dict[Hashable, dict[str, Any]]] = {}
    for table in TABLES:
        keys = _ordered(table, {k for run in runs for k in run[table]})
        tables[table] = {}
        for k in keys:
            present = [run[table][k] for run in runs if k in run[table]]
            total = Tally(**{f.name: sum(getattr(t, f.name) for t in present) for f in dataclasses.fields(Tally)})
            tables[table][k] = {"counts": total, "num_seeds": len(present),
                                **{m: seed_mean([t.ratios()[m] for t in present]) for m in MEASURES + FLIP_MEASURES}}
    paired = {}
    for m in MEASURES:
        both = [run["origin"] for run in runs if {"fresh", "continuation"} <= set(run["origin"])]
        paired[m] = seed_mean([o["continuation"].ratios()[m] - o["fresh"].ratios()[m] for o in both], test=True)
    return {"tables": tables, "paired": paired}


def _ordered(table: str, keys) -> list:
    """A table's groups in reading order: fresh before continuation; depths, p bins and outcomes ascending ("none"
    last)."""
    return sorted(keys, key=lambda k: {"fresh": 0, "continuation": 1}[k]) if table == "origin" else sorted(keys)


# ---------------------------------------------------------------------------------------------- run directories
def read_run(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's rollouts, every saved step pooled, priced and judged with the run's own config (any method
    with saved trees)."""
    run_dir = Path(run_dir)
    config = load_file(run_dir / "config.json")
    estimator = get_method(config["method"]).advantage
    adv_config = from_dict(AdvantageConfig, config.get("advantages", {}), where="advantages")
    allocation = from_dict(AllocationConfig, config.get("allocation", {}), where="allocation")
    prices = make_prices(allocation).ledger()
    steps = sorted(int(p.name[5:11]) for p in (run_dir / TREES_DIR).glob("step-*.json.gz"))
    if not steps:
        raise ValueError(f"{run_dir} has no saved trees; train with run.save_trees=true")
    items: list[Rollout] = []
    for step in steps:
        trees = [Tree.from_dict(t) for t in read_trees(run_dir, step)["trees"]]
        items += rollouts(trees, estimator, adv_config, prices)
    return {"name": run_dir.name, "method": config["method"], "estimator": estimator,
            "continuation_cost": prices.rollout_cost(continuation=True), "num_steps": len(steps), "rollouts": items}


def report(run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Per run and across runs (see the module docstring)."""
    runs = [read_run(d) for d in run_dirs]
    for run in runs:
        run["summary"] = summarize_run(run["rollouts"])
    return {"runs": runs, "pooled": across_seeds([run["summary"] for run in runs])}


# ---------------------------------------------------------------------------------------------- markdown
TITLES = {"origin": "Fresh rollouts and continuations", "depth": "Continuations by anchor depth (turns)",
          "p": "Continuations by predicted success probability at the anchor",
          "outcome": "Continuations by the outcome of the anchor's rollout",
          "grant": "Fresh rollouts by their prompt's grant (fresh rollouts in its tree)"}
MEASURE_HEADER = ["inf. units / unit", "inf. sampled tokens / token", "flipped", "predicted flip"]


def _num(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"


def _estimate(e: SeedMean) -> str:
    if not e.per_seed:
        return "n/a"
    if not math.isfinite(e.lo):
        return _num(e.mean)
    return f"{_num(e.mean)} [{_num(e.lo)}, {_num(e.hi)}]"


def _counts_cells(t: Tally) -> list[str]:
    return [str(t.num_rollouts), str(t.num_informative), f"{t.units:g}", f"{t.informative_units:g}",
            str(t.sampled_tokens), str(t.informative_sampled_tokens), str(t.num_flipped)]


COUNT_HEADER = ["rollouts", "informative", "units", "inf. units", "sampled tokens", "inf. sampled tokens", "flips"]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def to_markdown(result: dict[str, Any]) -> str:
    """The report as Markdown: the across-seed tables, the paired difference, then each run's counts."""
    runs, pooled = result["runs"], result["pooled"]
    measures = MEASURES + FLIP_MEASURES
    lines = ["# Stage 2 on its own terms", "",
             f"{len(runs)} run(s): " + ", ".join(f"`{r['name']}` ({r['method']}, {r['num_steps']} steps, "
                                                  f"continuation {r['continuation_cost']:g} units)" for r in runs), "",
             "A rollout is informative when its advantage before batch whitening is non-zero. A continuation "
             "flipped when its outcome differs from that of the rollout which created its anchor; predicted flip "
             "is stage 2's own probability of that (p at a failed anchor, 1 - p at a succeeded one). Ratios pool a "
             "run's steps as ratios of sums; across runs, the mean of the per-seed ratios with a 95% t interval "
             "over seeds (none for one seed). Counts are summed over seeds. A prompt's grant is the fresh rollouts "
             "in its tree.", ""]
    for table, title in TITLES.items():
        lines += [f"## {title}", "", _row(["group", "seeds", *MEASURE_HEADER, *COUNT_HEADER]),
                  "|---" * (2 + len(MEASURE_HEADER) + len(COUNT_HEADER)) + "|"]
        for k, row in pooled["tables"][table].items():
            lines.append(_row([str(k), str(row["num_seeds"]), *(_estimate(row[m]) for m in measures),
                               *_counts_cells(row["counts"])]))
        if not pooled["tables"][table]:
            lines.append("| (no rollouts) |" + " |" * (1 + len(MEASURE_HEADER) + len(COUNT_HEADER)))
        lines.append("")
    lines += ["## Continuation minus fresh, paired by seed", "",
              "| measure | seeds | mean [95% CI] | p (t-test) | per seed |", "|---|---|---|---|---|"]
    for m, e in pooled["paired"].items():
        lines.append(f"| {m} | {len(e.per_seed)} | {_estimate(e)} | {_num(e.p_value)} | "
                     f"{', '.join(_num(v) for v in e.per_seed) or 'n/a'} |")
    lines += ["", "## Per run", "", _row(["run", "table", "group", *MEASURE_HEADER, *COUNT_HEADER]),
              "|---" * (3 + len(MEASURE_HEADER) + len(COUNT_HEADER)) + "|"]
    for run in runs:
        for table in TITLES:
            for k in _ordered(table, run["summary"][table]):
                t = run["summary"][table][k]
                r = t.ratios()
                lines.append(_row([run["name"], table, str(k), *(_num(r[m]) for m in measures), *_counts_cells(t)]))
    return "\n".join(lines) + "\n"


def write_report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> str:
    """The Markdown report of `run_dirs`, written to `out` when given; returns the Markdown."""
    text = to_markdown(report(run_dirs))
    if out is not None:
        Path(out).write_text(text)
    return text
