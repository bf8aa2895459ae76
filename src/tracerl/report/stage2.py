"""`tracerl bench stage2`: do stage-2 continuations pay for what they cost, compared with fresh rollouts?

Read from the trees a `method=trace` run saves (`trees/step-*.json.gz`, `run.save_trees=true`). Every rollout (leaf)
is one sample bought at a price (`tracerl.core.ledger.BudgetLedger.rollout_price`): a fresh rollout (anchored at the
root) costs 1 budget unit, a continuation (anchored at an intermediate prefix) `allocation.continuation_cost` units,
and each sampled the policy tokens below its anchor itself (a shared prefix counts once, with the rollout that sampled
it).
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

What a rollout is and how rollouts are tallied live in `tracerl.core.tally`, which the trainer also uses to write each
step's rollouts (`rollouts/`), so a run whose trees are not kept is read from those records instead, the same way.

Deliberately not here: training, and any reading of `metrics.jsonl` (everything is recomputed from the trees or the
rollout records).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Hashable, Sequence

from tracerl.core.advantages import AdvantageConfig
from tracerl.core.ledger import make_prices
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.stats import SeedMean, seed_mean
from tracerl.core.tally import FLIP_MEASURES, MEASURES, TABLES, Rollout, Tally, from_columns, rollouts, summarize_run
from tracerl.core.tree import Tree
from tracerl.io.files.config import from_dict, load_file
from tracerl.io.files.runlog import TREES_DIR, read_rollouts, read_trees

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
    """A run directory's rollouts, every step pooled, priced and judged with the run's own config (any method): from
    its saved trees when it kept every step's, else from the rollout records the trainer writes every step
    (`rollouts/`, `tracerl.core.tally.to_columns`: the same rollouts, field for field)."""
    run_dir = Path(run_dir)
    config = load_file(run_dir / "config.json")
    estimator = get_method(config["method"]).advantage
    adv_config = from_dict(AdvantageConfig, config.get("advantages", {}), where="advantages")
    allocation = from_dict(AllocationConfig, config.get("allocation", {}), where="allocation")
    prices = make_prices(allocation).ledger()
    steps = sorted(int(p.name[5:11]) for p in (run_dir / TREES_DIR).glob("step-*.json.gz"))
    records = read_rollouts(run_dir)
    items: list[Rollout] = []
    if records and set(steps) < set(records):  # the trees of some steps are not kept: read the records
        steps = sorted(records)
        for step in steps:
            items += from_columns(records[step])
    elif steps:
        for step in steps:
            trees = [Tree.from_dict(t) for t in read_trees(run_dir, step)["trees"]]
            items += rollouts(trees, estimator, adv_config, prices)
    else:
        raise ValueError(f"{run_dir} has no saved trees and no rollout records; train with run.save_trees=true "
                         "or a tracerl that writes rollouts/")
    return {"name": run_dir.name, "method": config["method"], "estimator": estimator,
            "continuation_cost": prices.rollout_cost(continuation=True), "num_steps": len(steps), "rollouts": items}


def report(run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Per run and across runs (see the module docstring)."""
    runs = [read_run(d) for d in run_dirs]
    if len({run["name"] for run in runs}) < len(runs):  # one seed of many builds: build5/trace-seed0, build6/...
        for run, d in zip(runs, run_dirs):
            run["name"] = f"{Path(d).resolve().parent.name}/{run['name']}"
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
