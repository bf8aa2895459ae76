"""Questions per evaluation against seeds: the cheapest design that resolves an effect, from a pilot's runs.

    python studies/eval_design.py RUNS_DIR [--effect 1.0] [--power 0.8] [--alpha 0.025] [--planned-seeds 60]
                                     [--comparison "trace - grpo"] [--questions 64,128,256,512,1024,2048]

RUNS_DIR is a `tracerl compare` output folder (its compare.json and one run folder per method and seed). A seed's
paired difference at equal tokens spreads for two reasons: its training (which questions each step drew, what the
policy learnt) and its evaluation (which held-out questions, which samples). With n0 questions in the pilot,

    var_seed(n) = var_train + s_q^2 / n,        var_train = var_seed(n0) - s_q^2 / n0

where s_q is the spread of the paired difference per question (compare.json, `resolution.sd_paired_per_question`,
against the table's baseline; where the runs stop at different steps, as runs trained to one token budget do, and
no evaluation pairs by step, the spread between each seed's last evaluations) and var_seed(n0) the variance of the
pilot's per-seed differences. The model assumes
each seed draws its own held-out questions from a large pool (math and function calling generate them from the
seed); where seeds share most of their questions (the multihop testbeds draw from a fixed test split), question
sampling does not spread the seeds, s_q^2 / n0 can exceed var_seed, and the script says the model does not apply.
A seed costs its training seconds (every run's `sys/step_seconds`) plus its evaluations' seconds, which scale with
the questions: cost(n) = train + eval(n0) * n / n0, read from the runs' metrics.jsonl (an evaluation copied from
another run of the seed, `tracerl compare`'s shared step-0 evaluation, counts once). For each question count the
script prints the seeds for the target power at the effect (`power.seeds_needed`), the total cost of that design,
and the power a fixed compute budget buys (`--planned-seeds` seeds at n0 questions) at that question count. The
seed spread from a pilot of a few seeds is uncertain, so the design is also given with var_train at its 80%
chi-square bounds.

Deliberately not here: choosing the evaluation's samples per question (held fixed) and any reading of the
effect itself (the planned effect, not the pilot's estimate, sizes the design).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracerl.io.files.runlog import read_metrics
from tracerl.report.compare import load_run, paired_spread

_spec = importlib.util.spec_from_file_location("power", Path(__file__).resolve().parent / "power.py")
power_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(power_module)


@dataclass(frozen=True)
class SeedCost:
    """Seconds one seed of a comparison took: training (every method's steps) and evaluation (distinct ones)."""

    train_seconds: float
    eval_seconds: float


def seed_costs(runs_dir: Path, labels: list[str], seeds: list[int]) -> list[SeedCost]:
    """Per seed, summed over the methods' runs `<label>-seed<s>/metrics.jsonl`. An evaluation row repeated verbatim
    in another run of the same seed was copied from it, not recomputed, so it counts once."""
    costs = []
    for seed in seeds:
        train, evals = 0.0, {}
        for label in labels:
            path = runs_dir / f"{label}-seed{seed}" / "metrics.jsonl"
            if not path.exists():
                raise SystemExit(f"{path} is missing: pass the folder `tracerl compare --out` wrote, with its runs")
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("kind") == "eval":
                    evals[json.dumps(row, sort_keys=True)] = float(row.get("eval/seconds", 0.0))
                else:
                    train += float(row.get("sys/step_seconds", 0.0))
        costs.append(SeedCost(train, sum(evals.values())))
    return costs


def paired_spread_at_stop(runs_dir: Path, method: str, baseline: str, seeds: list[int]) -> float:
    """The spread per question (points) of `method` minus `baseline` between each seed's last evaluations
    (`tracerl.report.compare.paired_spread`): what a reading at equal sampled tokens pays where the two runs stop at
    different steps, so that no evaluation but the start pairs by step."""
    def runs(label: str) -> list[dict]:
        return [load_run(runs_dir / f"{label}-seed{seed}") for seed in seeds]

    return 100 * paired_spread(runs(method), runs(baseline), at_stop=True)


def chi2_bounds(n: int, level: float = 0.8) -> tuple[float, float]:
    """(lower, upper) factors on a variance estimated with n - 1 degrees of freedom at a two-sided `level`: the
    Wilson-Hilferty approximation of the chi-square quantiles, divided by n - 1."""
    dof = n - 1
    z = abs(float(power_module.t_quantile((1 - level) / 2, 10_000)))

    def quantile(zz: float) -> float:
        return dof * (1 - 2 / (9 * dof) + zz * math.sqrt(2 / (9 * dof))) ** 3

    return dof / quantile(z), dof / quantile(-z)


@dataclass(frozen=True)
class DesignRow:
    questions: int
    sd_seed: float  # points
    seeds: int | None  # for the target power; None beyond the search's cap
    cost_per_seed: float  # seconds
    total_cost: float | None  # seeds * cost_per_seed
    budget_seeds: int  # seeds the planned budget buys at this question count
    budget_power: float  # the power those seeds give


def design(var_train: float, sd_q: float, cost: SeedCost, n0: int, questions: list[int], effect: float,
           target: float, alpha: float, planned_seeds: int, max_seeds: int = 400) -> list[DesignRow]:
    """One row per question count; var_train in points^2, sd_q in points per question."""
    budget = planned_seeds * (cost.train_seconds + cost.eval_seconds)
    rows = []
    for n in questions:
        sd = math.sqrt(var_train + sd_q ** 2 / n)
        per_seed = cost.train_seconds + cost.eval_seconds * n / n0
        seeds = power_module.seeds_needed(effect, sd, target, alpha, max_seeds)
        affordable = int(budget // per_seed)
        rows.append(DesignRow(n, sd, seeds, per_seed, None if seeds is None else seeds * per_seed, affordable,
                              power_module.power(effect, sd, affordable, alpha)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--effect", type=float, default=1.0, help="the effect to resolve, in points")
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--alpha", type=float, default=0.025, help="two-sided level of the test")
    parser.add_argument("--planned-seeds", type=int, default=60, help="the current plan's seeds: its compute budget")
    parser.add_argument("--comparison", default=None,
                        help='e.g. "trace - pcl" (default: "trace - BASELINE", else the first entry)')
    parser.add_argument("--questions", default="64,128,256,512,1024,2048")
    args = parser.parse_args()
    summary = json.loads((args.runs_dir / "compare.json").read_text())
    pairs = dict(power_module.comparisons(summary))
    name = args.comparison or next((k for k in pairs if k == f"trace - {summary['baseline']}"), next(iter(pairs)))
    if name not in pairs:
        raise SystemExit(f"no comparison {name!r} in {args.runs_dir / 'compare.json'}; there are {sorted(pairs)}")
    diffs = pairs[name]
    res = summary["resolution"]
    n0, sd_q = int(res["num_questions"]), 100 * float(res["sd_paired_per_question"])
    at_stop = not math.isfinite(sd_q)
    if at_stop:  # runs stopped at different steps (a token budget): pair their last evaluations instead
        sd_q = paired_spread_at_stop(args.runs_dir, *name.split(" - "), list(summary["seeds"]))
    var_seed = float(np.var(diffs, ddof=1))
    var_eval = sd_q ** 2 / n0
    var_train = max(var_seed - var_eval, 0.0)
    if var_eval > var_seed:
        raise SystemExit(f"{name}: the evaluation's part alone (sd {math.sqrt(var_eval):.2f} points) exceeds the "
                         f"per-seed spread (sd {math.sqrt(var_seed):.2f}): the seeds share most of their held-out "
                         "questions, so this model (independent questions per seed) does not apply")
    labels = list(summary["methods"])
    costs = seed_costs(args.runs_dir, labels, list(summary["seeds"]))
    cost = SeedCost(float(np.mean([c.train_seconds for c in costs])), float(np.mean([c.eval_seconds for c in costs])))
    questions = sorted({int(q) for q in args.questions.split(",") if q} | {n0})
    where = ", between each seed's last evaluations" if at_stop else ""
    print(f"{args.runs_dir}: {name}, {len(diffs)} seeds, per-seed sd {math.sqrt(var_seed):.2f} points at {n0} "
          f"questions; the evaluation's part sd {math.sqrt(var_eval):.2f} (paired sd {sd_q:.1f} points per "
          f"question{where}), training's sd {math.sqrt(var_train):.2f}. A seed costs {cost.train_seconds:.0f} s of "
          f"training and {cost.eval_seconds:.0f} s of evaluation "
          f"({cost.eval_seconds / (cost.train_seconds + cost.eval_seconds):.0%})"
          f", mean over {len(costs)} seeds (all methods).\n")
    print(f"Two-sided paired t-test at level {args.alpha:g}, {args.power:.0%} power at +{args.effect:g} points; "
          f"the budget is {args.planned_seeds} seeds at {n0} questions.\n")
    lo, hi = chi2_bounds(len(diffs))
    for label, factor in (("as estimated", 1.0), ("training's variance at its 80% lower bound", lo),
                          ("training's variance at its 80% upper bound", hi)):
        rows = design(var_train * factor, sd_q, cost, n0, questions, args.effect, args.power, args.alpha,
                      args.planned_seeds)
        best = min((r for r in rows if r.total_cost is not None), key=lambda r: r.total_cost, default=None)
        print(f"### {label} (training sd {math.sqrt(var_train * factor):.2f})\n")
        print("| questions | per-seed sd | seeds for the power | core-s per seed | core-h in all | seeds the budget "
              "buys | power at them |\n|---|---|---|---|---|---|---|")
        for r in rows:
            mark = " (cheapest)" if r is best else ""
            print(f"| {r.questions}{mark} | {r.sd_seed:.2f} | {'> 400' if r.seeds is None else r.seeds} | "
                  f"{r.cost_per_seed:.0f} | {'-' if r.total_cost is None else f'{r.total_cost / 3600:.1f}'} | "
                  f"{r.budget_seeds} | {r.budget_power:.0%} |")
        print()


if __name__ == "__main__":
    main()
