"""The comparison report: several methods' run directories read at equal cost, paired by seed and question.

`tracerl compare` (`tracerl.train.compare.run_compare`) trains every (method, seed) as an ordinary run in
`<out>/<label>-seed<seed>/`, with the same config apart from the method, so every method gets the same steps,
per-step budget, data order and held-out questions. This module only reads those run directories and writes:

- `compare.md` / `compare.json`: per method, held-out success before and after (mean ± std over seeds), budget
  units and sampled tokens spent, the informative samples priced at what they cost (informative units per unit,
  informative sampled tokens per token: `tracerl.core.metrics`) first, then counted (per unit, per 1k tokens),
  beside mixed trees per unit and the effective ratio; and against the baseline:
  - the paired difference of held-out success at the baseline's final sampled tokens (and units), each run's
    per-question curve interpolated between its evaluations: a t interval over seeds, a bootstrap interval over
    seeds, the t-test's p-value and its Holm adjustment over the table's comparisons;
  - the share of the baseline's tokens (and units) a method needs to reach the baseline's final success, read on
    each seed's own curves (`tracerl.core.stats.share_to_reach`) and pooled as the mean over seeds, with a
    bootstrap interval over seeds. Never read off the seed-mean curve: with a few evaluation points
    that reading is an artefact of where the points fall.
  - where the tokens went, per seed (exploratory): the ratio of sampled tokens per unit and the differences of the
    learning-signal measures, each run's mean over its steps, with a t interval over seeds.
- the regime: the share of all-fail / mixed / all-success prompts in the baseline's first step, when the baseline
  samples a fixed n per prompt (GRPO: its first batch is a sample of the starting policy's regime);
- the evaluation's resolution: the spread of one question's avg@k success, the standard error of one evaluation
  point, and the questions per point a target standard error needs (`tracerl.core.stats.num_eval_questions`);
- plots: success against cumulative tokens and against units, each seed's curve and the pooled one, and
  informative samples per unit per step.

Only seeds whose runs exist for every method and reached the same last step are read, so a comparison still
running (or stopped part-way) reports what is complete. Runs whose starting weights differ are refused with their
names, and the code and machines the runs recorded are stated (`tracerl.report.provenance`).

Deliberately not here: training (`tracerl.train.compare`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.core.stats import (
    Curve,
    bootstrap_over_seeds,
    diff_at_baseline_cost,
    holm,
    interpolate_at,
    num_eval_questions,
    paired_difference,
    paired_t_pvalue,
    seed_bootstrap,
    seed_mean,
    share_to_reach,
)
from tracerl.io.files import read_utf8
from tracerl.io.files.run_folder import run_path
from tracerl.io.files.runlog import finished_run, read_metrics, read_trees
from tracerl.report.figures import finish_axes, save_figure
from tracerl.report.provenance import check_same_weights, provenance_sentence, read_provenance

Say = Callable[[str], None]
INFORMATIVE = ("informative_units_per_unit", "informative_sampled_tokens_per_token",  # priced: these lead
               "informative_rollouts_per_budget", "informative_rollouts_per_ktoken", "informative_tokens_per_token")
ALLOCATION = ("effective_ratio", "mixed_trees_per_budget")
SIGNAL_DIFFS = ("informative_sampled_tokens_per_token", "informative_units_per_unit", "mixed_trees_per_budget")
TARGET_POINT_SE = 0.025  # the standard error of one evaluation point the report sizes the question count for
NUM_RESAMPLES = 2000  # bootstrap resamples per interval


def run_dir_name(label: str, seed: int) -> str:
    """`<label>-seed<seed>`, with characters a folder name should not hold replaced by '_'."""
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in label)
    return f"{safe}-seed{seed}"


def seed_spans(seeds: Sequence[int]) -> list[str]:
    """The seeds as runs of consecutive ones: [0, 1, 2, 7] -> ["0-2", "7"]; [] -> []."""
    seeds = sorted(set(seeds))
    spans, start = [], seeds[0] if seeds else None
    for previous, current in zip(seeds, seeds[1:] + [None]):
        if current is None or current != previous + 1:
            spans.append(f"{start}-{previous}" if previous > start else str(start))
            start = current
    return spans


def load_run(run_dir: Path) -> dict[str, Any]:
    rows = read_metrics(run_dir)
    run = {"train": [r for r in rows if r["kind"] == "train"], "eval": [r for r in rows if r["kind"] == "eval"],
           "name": run_dir.name, "provenance": read_provenance(run_dir)}
    if run["train"] and "alloc/informative_units_per_unit" not in run["train"][-1]:
        _informative_from_trees(run_dir, run["train"])
    return run


def _informative_from_trees(run_dir: Path, train: list[dict[str, Any]]) -> None:
    """Fill in the informative-sample measures of runs logged before they were, from the saved trees (the
    advantages are a pure function of the trees and the run's estimator). Steps without trees stay without."""
    import dataclasses

    from tracerl.core.advantages import AdvantageConfig, compute_advantages
    from tracerl.core.ledger import make_prices
    from tracerl.core.methods import AllocationConfig, get_method
    from tracerl.core.metrics import INFORMATIVE_MEASURES, raw_advantages, ratios, step_counts
    from tracerl.core.tree import Tree
    from tracerl.io.files.config import from_dict

    config_path = run_path(run_dir, "config.json")
    if not config_path.exists():
        return
    config = json.loads(read_utf8(config_path))
    known = {f.name for f in dataclasses.fields(AdvantageConfig)}
    adv_config = AdvantageConfig(**{k: v for k, v in config.get("advantages", {}).items() if k in known})
    estimator = get_method(config["method"]).advantage
    allocation = {k: v for k, v in config.get("allocation", {}).items()
                  if k in {f.name for f in dataclasses.fields(AllocationConfig)}}  # as the run priced its rollouts
    prices = make_prices(from_dict(AllocationConfig, allocation, where="allocation")).ledger()
    for row in train:
        try:
            trees = [Tree.from_dict(t) for t in read_trees(run_dir, row["step"])["trees"]]
        except ValueError:
            continue
        advantages = compute_advantages(estimator, trees, adv_config)
        raw = raw_advantages(estimator, trees, advantages, adv_config)
        counts = step_counts(trees, advantages, row["rollout/units"], row["rollout/tokens"], prices=prices,
                             raw_advantages=raw)
        row.update({f"alloc/{key}": value for key, value in ratios(counts).items() if key in INFORMATIVE_MEASURES})


def complete_seeds(out: Path, labels: list[str], seeds: list[int]) -> tuple[list[int], dict[str, list[dict]]]:
    """The seeds whose runs exist and finished for every label, and those runs. A run finished when its last step
    was evaluated and, by its saved config, reached its `run.num_steps` or its `run.total_token_budget` (so methods
    under one token budget may end at different steps); runs without a saved config must all end at the same step."""
    kept, runs = [], {label: [] for label in labels}
    for seed in seeds:
        dirs = [out / run_dir_name(label, seed) for label in labels]
        finished = [finished_run(d) for d in dirs]
        if False in finished:
            continue
        loaded = [load_run(d) for d in dirs]
        if None in finished and len({run["eval"][-1]["step"] for run in loaded}) != 1:
            continue
        kept.append(seed)
        for label, run in zip(labels, loaded):
            runs[label].append(run)
    return kept, runs


def curve(run: dict[str, list[dict]], axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(cost at each evaluation, (E, Q) per-question success) of one run; axis is "tokens" or "units"."""
    evals = run["eval"]
    x = np.array([r[f"rollout/cum_{axis}"] for r in evals], dtype=float)
    y = np.array([r["eval/per_prompt"] for r in evals], dtype=float)
    return x, y


def _curves(seed_runs: list[dict], axis: str) -> list[Curve]:
    return [Curve(*curve(run, axis)) for run in seed_runs]


def _mean_curve(seed_runs: list[dict], axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Seed-mean (cost, success) at the evaluation steps every seed shares."""
    steps = sorted(set.intersection(*[{r["step"] for r in run["eval"]} for run in seed_runs]))
    x = np.array([np.mean([next(r for r in run["eval"] if r["step"] == s)[f"rollout/cum_{axis}"]
                           for run in seed_runs]) for s in steps])
    y = np.array([np.mean([next(r for r in run["eval"] if r["step"] == s)["eval/success"] for run in seed_runs])
                  for s in steps])
    return x, y


def _train_mean(seed_runs: list[dict], key: str) -> float | None:
    values = [r[key] for run in seed_runs for r in run["train"] if r.get(key) is not None]
    return float(np.nanmean(values)) if values else None


def _run_mean(run: dict[str, Any], key: str) -> float:
    """One run's mean over its steps of a logged train measure (nan where it logged none)."""
    values = [r[key] for r in run["train"] if r.get(key) is not None]
    return float(np.nanmean(values)) if values else float("nan")


def _tokens_per_unit(run: dict[str, Any]) -> float:
    last = run["train"][-1]
    return last["rollout/cum_tokens"] / last["rollout/cum_units"] if last["rollout/cum_units"] else float("nan")


def _signal_against_baseline(seed_runs: list[dict], base_runs: list[dict]) -> dict[str, Any]:
    """Where the method's tokens went, against the baseline and per seed: the ratio of sampled tokens per budget
    unit, and the difference of each learning-signal measure (each run's mean over its steps), each with a t
    interval over seeds and a paired t-test's p. Exploratory: it says why a held-out difference is what it is."""
    def interval(values: list[float]) -> dict[str, Any]:
        est = seed_mean(values, test=True)
        return {"mean": _finite(est.mean), "lo": _finite(est.lo), "hi": _finite(est.hi), "p": _finite(est.p_value),
                "per_seed": list(est.per_seed)}

    ratio = [_tokens_per_unit(m) / _tokens_per_unit(b) - 1.0 for m, b in zip(seed_runs, base_runs)]
    signal = {"tokens_per_unit_ratio": {**interval(ratio), "ratio_of": "tokens per unit, minus 1"}}
    for key in SIGNAL_DIFFS:
        signal[key] = interval([_run_mean(m, f"alloc/{key}") - _run_mean(b, f"alloc/{key}")
                                for m, b in zip(seed_runs, base_runs)])
    return signal


def regime(run_dir: Path) -> dict[str, float] | None:
    """Shares of all-fail / mixed / all-success trees in a run's first saved step, or None without trees."""
    try:
        record = read_trees(run_dir, 1)
    except ValueError:
        return None
    counts = {"all_fail": 0, "mixed": 0, "all_success": 0}
    for tree in record["trees"]:
        rewards = [n["reward"] for n in tree["nodes"] if n.get("reward") is not None]
        key = "all_success" if min(rewards) > 0.5 else "all_fail" if max(rewards) <= 0.5 else "mixed"
        counts[key] += 1
    total = sum(counts.values())
    return {**{k: v / total for k, v in counts.items()}, "num_prompts": total} if total else None


def summarize(runs: dict[str, list[dict]], baseline: str | None, seeds: list[int]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for label, seed_runs in runs.items():
        before = np.array([run["eval"][0]["eval/success"] for run in seed_runs])
        after = np.array([run["eval"][-1]["eval/success"] for run in seed_runs])
        rows[label] = {
            "success_before": float(before.mean()), "success_after": float(after.mean()),
            "success_after_std": float(after.std(ddof=1)) if len(after) > 1 else 0.0,
            "success_after_se": float(np.mean([run["eval"][-1]["eval/success_se"] for run in seed_runs])),
            "units": float(np.mean([run["train"][-1]["rollout/cum_units"] for run in seed_runs])),
            "tokens": float(np.mean([run["train"][-1]["rollout/cum_tokens"] for run in seed_runs])),
            "steps": int(seed_runs[0]["train"][-1]["step"]), "seeds": len(seed_runs),
            "steps_range": [min(run["train"][-1]["step"] for run in seed_runs),
                            max(run["train"][-1]["step"] for run in seed_runs)],
            "num_questions": len(seed_runs[0]["eval"][0]["eval/per_prompt"]),
            **{key: _train_mean(seed_runs, f"alloc/{key}") for key in INFORMATIVE + ALLOCATION},
        }
    if baseline:
        for label, seed_runs in runs.items():
            rows[label].update(_against_baseline(seed_runs, runs[baseline], rows[baseline]))
        _holm_within_table(rows, baseline)
    first = next(iter(runs.values()))
    return {"baseline": baseline, "seeds": seeds, "methods": rows, "resolution": resolution(runs, baseline),
            "regime": [r for r in (run.get("regime") for run in runs.get(baseline, first)) if r]}


def _finite(value: float) -> float | None:
    """JSON has no infinity: a share that was never reached is stored as None."""
    return float(value) if np.isfinite(value) else None


def _against_baseline(seed_runs: list[dict], base_runs: list[dict], base_row: dict[str, Any]) -> dict[str, Any]:
    """One entry against the baseline, per seed then pooled: difference at the baseline's final cost (t and
    bootstrap intervals, p-value) and share of the baseline's cost to reach its final success (bootstrap)."""
    row: dict[str, Any] = {"signal_vs_baseline": _signal_against_baseline(seed_runs, base_runs)}
    for axis in ("units", "tokens"):
        mine, theirs = _curves(seed_runs, axis), _curves(base_runs, axis)
        pairs = list(zip(mine, theirs))
        at, short = [], 0
        for m, b in pairs:
            value, reached = interpolate_at(m.cost, m.per_question, float(b.cost[-1]))
            short += not reached
            at.append(value)
        diff = paired_difference(at, [b.per_question[-1] for b in theirs]).to_dict()
        boot = (seed_bootstrap(diff_at_baseline_cost, pairs, num_resamples=NUM_RESAMPLES) if len(pairs) == 1 else
                bootstrap_over_seeds(diff["per_seed"], num_resamples=NUM_RESAMPLES))  # the t interval's values
        diff.update({"boot_lo": boot.lo, "boot_hi": boot.hi, "p": paired_t_pvalue(diff["per_seed"])})
        row[f"diff_at_equal_{axis}"] = diff
        row[f"seeds_short_of_{axis}"] = short  # runs that spent less than the baseline: read at their end
        share = seed_bootstrap(share_to_reach, pairs, num_resamples=NUM_RESAMPLES)
        row[f"share_of_baseline_{axis}"] = _finite(share.mean)
        row[f"share_of_baseline_{axis}_ci"] = {"lo": _finite(share.lo), "hi": _finite(share.hi),
                                               "per_seed": [_finite(v) for v in share.per_seed],
                                               "num_unreached": sum(not np.isfinite(v) for v in share.per_seed),
                                               "median": _finite(share.median), "median_lo": _finite(share.median_lo),
                                               "median_hi": _finite(share.median_hi)}
        row[f"{axis}_to_baseline"] = None if row[f"share_of_baseline_{axis}"] is None else \
            row[f"share_of_baseline_{axis}"] * base_row[axis]
    return row


def _holm_within_table(rows: dict[str, dict[str, Any]], baseline: str) -> None:
    """Holm-adjusted p-values over the table's comparisons with the baseline, one family per cost axis."""
    labels = [label for label in rows if label != baseline]
    for axis in ("units", "tokens"):
        adjusted = holm([rows[label][f"diff_at_equal_{axis}"]["p"] for label in labels])
        for label, p in zip(labels, adjusted):
            rows[label][f"diff_at_equal_{axis}"]["p_holm"] = p


def _paired_variances(runs: list[dict], base_runs: list[dict], at_stop: bool) -> list[float]:
    variances = []
    for run, base_run in zip(runs, base_runs):
        if at_stop:
            pairs = [(run["eval"][-1], base_run["eval"][-1])] if run["eval"] and base_run["eval"] else []
        else:
            base = {r["step"]: r for r in base_run["eval"] if r["step"] > 0}
            pairs = [(r, base[r["step"]]) for r in run["eval"] if r["step"] in base]
        variances += [float(np.var(np.subtract(a["eval/per_prompt"], b["eval/per_prompt"]), ddof=1))
                      for a, b in pairs if a["step"] > 0 and b["step"] > 0 and len(a["eval/per_prompt"]) > 1]
    return variances


def _root_mean(variances: list[float]) -> float:
    return float(np.sqrt(np.mean(variances))) if variances else float("nan")


def paired_spread(runs: list[dict], base_runs: list[dict], at_stop: bool = False) -> float:
    """The spread per question of one method's held-out success minus a baseline's, seed by seed on the same
    questions: the root of the mean, over the paired evaluations, of the per-question difference's variance. Pairs
    the evaluations of the same step (step 0 left out) or, with `at_stop`, each seed's two last evaluations, which
    is what a reading at equal sampled tokens compares where the two runs stop at different steps. NaN without a
    pair (or with fewer than two questions)."""
    return _root_mean(_paired_variances(runs, base_runs, at_stop))


def resolution(runs: dict[str, list[dict]], baseline: str | None = None) -> dict[str, Any]:
    """How finely one evaluation point resolves success: the spread over questions of a question's avg@k success
    (pooled over every run's evaluations), the standard error of one point with the questions used, and the
    questions per point for a standard error of TARGET_POINT_SE; with a baseline, the same for the paired
    difference (method minus baseline on the same questions: `paired_spread`), which is what a paired reading pays:
    question difficulty cancels in it. The paired difference is read twice: at the same step, and between each
    seed's last evaluations (the only pairing where runs under one token budget stop at different steps)."""
    variances = [np.var(r["eval/per_prompt"], ddof=1) for seed_runs in runs.values() for run in seed_runs
                 for r in run["eval"] if len(r["eval/per_prompt"]) > 1]
    first = next(iter(runs.values()))[0]["eval"]
    num_q = len(first[0]["eval/per_prompt"])
    sd = _root_mean(variances)
    others = [label for label in runs if baseline is not None and label != baseline]

    def pooled(at_stop: bool) -> float:  # every method's paired evaluations against the baseline, pooled
        return _root_mean([v for label in others for v in _paired_variances(runs[label], runs[baseline], at_stop)])

    def questions(spread):
        return num_eval_questions(spread, TARGET_POINT_SE) if np.isfinite(spread) else None

    sd_paired, sd_stop = pooled(False), pooled(True)
    return {"sd_per_question": sd, "num_questions": num_q, "point_se": sd / np.sqrt(num_q),
            "eval_steps": [r["step"] for r in first], "target_point_se": TARGET_POINT_SE,
            "questions_for_target": questions(sd), "sd_paired_per_question": sd_paired,
            "paired_point_se": sd_paired / np.sqrt(num_q), "paired_questions_for_target": questions(sd_paired),
            "sd_paired_at_stop_per_question": sd_stop, "paired_at_stop_point_se": sd_stop / np.sqrt(num_q),
            "paired_at_stop_questions_for_target": questions(sd_stop)}


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{100 * value:.{digits}f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, fmt)


def _ci(diff: dict[str, Any]) -> str:
    return f"{100 * diff['mean']:+.1f} [{100 * diff['lo']:+.1f}, {100 * diff['hi']:+.1f}]"


def _boot(diff: dict[str, Any]) -> str:
    return f"[{100 * diff['boot_lo']:+.1f}, {100 * diff['boot_hi']:+.1f}]"


def _p(value: float | None) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.3f}"


def _share(row: dict[str, Any], axis: str) -> str:
    """Mean per-seed share with its bootstrap interval; an unreached seed makes the share unbounded."""
    ci = row[f"share_of_baseline_{axis}_ci"]
    if row[f"share_of_baseline_{axis}"] is None:
        return f"not reached on {ci['num_unreached']} of {len(ci['per_seed'])} seeds"
    hi = "unbounded" if ci["hi"] is None else _pct(ci["hi"], 0)  # over 2.5% of resamples never reached
    return f"{_pct(row[f'share_of_baseline_{axis}'], 0)} [{_pct(ci['lo'], 0)}, {hi}]"


def _signal_table(methods: dict[str, dict[str, Any]], base: str) -> list[str]:
    """Per-seed readings of where each method's tokens went against the baseline (exploratory)."""
    rows = [(label, r["signal_vs_baseline"]) for label, r in methods.items()
            if label != base and r.get("signal_vs_baseline")]
    if not rows:
        return []

    def cell(d: dict[str, Any], scale: float, fmt: str, unit: str = "") -> str:
        if d["mean"] is None:
            return "-"
        bounds = f" [{scale * d['lo']:{fmt}}, {scale * d['hi']:{fmt}}]" if d["lo"] is not None else ""
        return f"{scale * d['mean']:{fmt}}{unit}{bounds}, p {_p(d['p'])}"

    head = ["method", f"sampled tokens per unit, % more than {base} [95% t CI]",
            f"informative sampled tokens / token, minus {base} [95% t CI]",
            f"informative units / unit, minus {base} [95% t CI]", f"mixed trees / unit, minus {base} [95% t CI]"]
    lines = ["", f"Where the tokens went, per seed against {base} (exploratory: it explains a held-out difference, "
             "it is not one):", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, sig in rows:
        lines.append("| " + " | ".join([
            label, cell(sig["tokens_per_unit_ratio"], 100, "+.1f", "%"),
            cell(sig["informative_sampled_tokens_per_token"], 1, "+.3f"),
            cell(sig["informative_units_per_unit"], 1, "+.3f"), cell(sig["mixed_trees_per_budget"], 1, "+.4f")])
                     + " |")
    lines += ["", "Each run's measure is its mean over its training steps; the interval is Student's t over the "
              "per-seed differences (ratios for tokens per unit), p the paired t-test's, not corrected."]
    return lines


def _steps(methods: dict[str, dict[str, Any]]) -> str:
    """"24 steps" when every run trained as many; under a token budget, each entry's range over seeds."""
    ranges = {label: tuple(r.get("steps_range", (r["steps"], r["steps"]))) for label, r in methods.items()}
    if len(set(ranges.values())) == 1 and len(set(next(iter(ranges.values())))) == 1:
        return f"{next(iter(ranges.values()))[0]} steps"
    return "steps per run " + ", ".join(f"{label} {lo}" + (f"-{hi}" if hi > lo else "")
                                       for label, (lo, hi) in ranges.items())


def _paired_sentence(res: dict[str, Any], base: str) -> str:
    """The resolution of the paired difference: at the same steps, or where the runs share no evaluation step but
    the start (runs under one token budget), between each seed's last evaluations."""
    if res.get("paired_questions_for_target"):
        sd, se, needs, where = (res["sd_paired_per_question"], res["paired_point_se"],
                                res["paired_questions_for_target"], "")
    elif res.get("paired_at_stop_questions_for_target"):
        sd, se, needs, where = (res["sd_paired_at_stop_per_question"], res["paired_at_stop_point_se"],
                                res["paired_at_stop_questions_for_target"], " between each seed's last evaluations")
    else:
        return ""
    return (f" The paired difference from {base}{where} spreads sd {sd:.3f} per question: SE {_pct(se)} a point; "
            f"SE {_pct(res['target_point_se'])} needs {needs} questions.")


def to_markdown(summary: dict[str, Any], command: str) -> str:
    base, methods = summary["baseline"], summary["methods"]
    any_row = next(iter(methods.values()))
    lines = [f"Held-out success (avg@k) on the same {any_row['num_questions']} questions per seed for every method, "
             f"{any_row['seeds']} seed(s) ({', '.join(map(str, summary['seeds']))}), {_steps(methods)}.", ""]
    if summary.get("weights"):
        lines += [provenance_sentence(summary["weights"]), ""]
    if summary["regime"]:
        shares = {k: np.mean([r[k] for r in summary["regime"]]) for k in ("all_fail", "mixed", "all_success")}
        num = sum(r["num_prompts"] for r in summary["regime"])
        lines += [f"Regime ({base}'s first batch, {num} prompts over the seeds): all-fail {_pct(shares['all_fail'])}, "
                  f"mixed {_pct(shares['mixed'])}, all-success {_pct(shares['all_success'])}.", ""]
    head = ["method", "success before", "after (mean ± std over seeds)", "mean SE per run", "budget units",
            "sampled tokens", "informative units / unit (priced)", "informative sampled tokens / token (priced)",
            "informative rollouts / unit (counted)", "informative rollouts / 1k tokens",
            "informative tokens / token (counted per rollout)", "mixed trees / unit", "effective ratio"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, r in methods.items():
        lines.append("| " + " | ".join([
            label, _pct(r["success_before"]), f"{_pct(r['success_after'])} ± {_pct(r['success_after_std'])}",
            _pct(r["success_after_se"]), f"{r['units']:.0f}", f"{r['tokens']:,.0f}",
            _num(r["informative_units_per_unit"], ".3f"), _num(r["informative_sampled_tokens_per_token"], ".3f"),
            _num(r["informative_rollouts_per_budget"], ".3f"), _num(r["informative_rollouts_per_ktoken"], ".2f"),
            _num(r["informative_tokens_per_token"], ".3f"), _num(r["mixed_trees_per_budget"], ".4f"),
            _num(r["effective_ratio"], ".3f")]) + " |")
    lines += ["", "Priced: an informative rollout counts at its budget cost (a continuation at `continuation_cost`) "
              "and with the tokens it sampled itself; counted: every informative rollout as one."]
    if base:
        head = ["method", f"minus {base} at equal tokens, points [95% t CI]", "[95% bootstrap CI]", "p", "p (Holm)",
                f"share of {base}'s tokens to reach its final success [95% bootstrap CI]",
                f"minus {base} at equal units [95% t CI]", f"share of {base}'s units"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, r in methods.items():
            if label == base:
                continue
            tokens, short = r["diff_at_equal_tokens"], r["seeds_short_of_tokens"]
            lines.append("| " + " | ".join([
                label, _ci(tokens) + (f" ({short} run(s) read at their last, lower, token count)" if short else ""),
                _boot(tokens), _p(tokens["p"]), _p(tokens.get("p_holm")), _share(r, "tokens"),
                _ci(r["diff_at_equal_units"]), _share(r, "units")]) + " |")
        over = next((r["diff_at_equal_units"]["over"] for k, r in methods.items() if k != base), "seeds")
        lines += ["", "Differences are paired by seed and question; the t interval is "
                  + ("Student's t over the per-seed mean differences" if over == "seeds" else
                     "normal over questions (one seed: training noise is not in it)")
                  + f", the bootstrap interval resamples seeds ({NUM_RESAMPLES} resamples; each seed's value holds its "
                  "own evaluation noise, so its questions are resampled only where there is one seed); p is the "
                  "paired t-test's over seeds, and p (Holm) its Holm adjustment over this "
                  "table's comparisons (read it for every comparison a pre-registration names secondary). A curve "
                  "is read at another cost by interpolating between its evaluations, never beyond its last one. "
                  "The share is read on each seed's own curves (nondecreasing fits), then averaged over seeds."]
        if any(r.get("seeds_short_of_tokens") for label, r in methods.items() if label != base):
            lines += ["", f"Runs that sampled fewer tokens than {base} in all are read at their own last token "
                      f"count, having had fewer tokens to learn from than {base}: not equal tokens. Train every run "
                      "to one sampled-token budget (`--set run.total_token_budget=N`, with `run.num_steps` as a "
                      "cap) to read them at equal tokens."]
        lines += _signal_table(methods, base)
    res = summary.get("resolution")
    if res and res["questions_for_target"]:
        lines += ["", f"Resolution: one question's avg@k success spreads sd {res['sd_per_question']:.3f} over "
                  f"questions, so one evaluation point of {res['num_questions']} questions has SE "
                  f"{_pct(res['point_se'])}; SE {_pct(res['target_point_se'])} needs {res['questions_for_target']} "
                  f"questions a point."
                  + _paired_sentence(res, base)
                  + f" Evaluated at steps {', '.join(map(str, res['eval_steps']))}."]
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines)


def write_report(out: Path, labels: list[str], seeds: list[int], baseline: str | None, command: str,
                 say: Say = print) -> str:
    """Read the complete seeds' runs in `out`, write compare.md, compare.json and the plots; return the Markdown."""
    kept, runs = complete_seeds(out, labels, seeds)
    if not kept:
        asked = (f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1))
                 else ",".join(map(str, seeds)))
        raise ValueError(f"{out} holds no seed with a finished run for every one of {labels} among the seeds asked "
                         f"for ({asked}); run tracerl compare, or name the seeds that ran (--seeds 7 means seeds "
                         "0-6; seed 7 alone is --seeds 7-7)")
    if len(kept) < len(seeds):
        say(f"compare: reporting seeds {kept}; the others are missing or unfinished for some method")
    base = baseline if baseline in runs else None
    if base:
        for seed, run in zip(kept, runs[base]):
            run["regime"] = regime(out / run_dir_name(base, seed))
    weights = check_same_weights(runs)
    summary = {**summarize(runs, base, kept), "weights": weights}
    report = to_markdown(summary, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(report + "\n")
    (out / "compare.json").write_text(json.dumps(summary, indent=1))
    plot(runs, out, kept)
    return report


def plot(runs: dict[str, list[dict]], out: Path, seeds: list[int] | None = None) -> list[Path]:
    """accuracy_vs_tokens.png, accuracy_vs_units.png (pooled, each seed faint), their `_per_seed.png` panels and
    informative_per_unit.png in `out` (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_seeds = len(next(iter(runs.values())))
    seeds = seeds or list(range(num_seeds))
    paths = []
    for axis, xlabel in (("tokens", "cumulative sampled tokens"), ("units", "cumulative budget units")):
        curves = {label: (*_mean_curve(seed_runs, axis), "o") for label, seed_runs in runs.items()}
        per_seed = {label: [(x, y.mean(axis=1)) for x, y in (curve(run, axis) for run in seed_runs)]
                    for label, seed_runs in runs.items()}
        paths.append(_figure(plt, curves, xlabel, "held-out success (avg@k)",
                             f"success vs sampled {axis} ({num_seeds} seed(s); thin: each seed)", None,
                             out / f"accuracy_vs_{axis}.png", per_seed))
        paths.append(_seed_panels(plt, per_seed, seeds,
                                  xlabel, out / f"accuracy_vs_{axis}_per_seed.png"))
    curves = {}
    for label, seed_runs in runs.items():
        num = min(len(run["train"]) for run in seed_runs)
        values = [[r.get("alloc/informative_units_per_unit", np.nan) for r in run["train"][:num]]
                  for run in seed_runs]
        curves[label] = (np.arange(1, num + 1), np.nanmean(np.array(values, dtype=float), axis=0), ".")
    paths.append(_figure(plt, curves, "step", "units spent on rollouts with a non-zero advantage / unit",
                         f"informative units per unit, priced ({num_seeds} seed(s))", None,
                         out / "informative_per_unit.png"))
    return paths


def _figure(plt, curves: dict[str, tuple], xlabel: str, ylabel: str, title: str, ylim, path: Path,
            thin: dict[str, list[tuple]] | None = None) -> Path:
    """One line per method: curves[method] = (x, y, marker); thin[method], if given, adds a faint line per seed."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, (x, y, marker)) in enumerate(curves.items()):
        color = f"C{i}"
        ax.plot(x, y, marker=marker, label=label, color=color)
        for sx, sy in (thin or {}).get(label, []):
            ax.plot(sx, sy, color=color, alpha=0.25, linewidth=0.8)
    finish_axes(ax, xlabel, ylabel, title, ylim)
    return save_figure(plt, fig, path, dpi=120)


def _seed_panels(plt, per_seed: dict[str, list[tuple]], seeds: list[int], xlabel: str, path: Path) -> Path:
    """One panel per seed, every method's curve in it: the curves a per-seed reading reads."""
    num = len(next(iter(per_seed.values())))
    cols = min(num, 4)
    rows = -(-num // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for s in range(num):
        ax = axes[s // cols][s % cols]
        for i, (label, seed_curves) in enumerate(per_seed.items()):
            ax.plot(*seed_curves[s], marker=".", label=label, color=f"C{i}")
        ax.set_title(f"seed {seeds[s]}", fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
    for s in range(num, rows * cols):
        axes[s // cols][s % cols].axis("off")
    axes[0][0].set_ylabel("held-out success")
    axes[0][0].legend(fontsize=7)
    return save_figure(plt, fig, path, dpi=100)
