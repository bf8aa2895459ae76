"""The comparison report: several methods' run directories read at equal cost, paired by seed and question.

`tracerl compare` (`tracerl.train.compare.run_compare`) trains every (method, seed) as an ordinary run in
`<out>/<label>-seed<seed>/`, with the same config apart from the method, so every method gets the same steps,
per-step budget, data order and held-out questions. This module only reads those run directories and writes:

- `compare.md` / `compare.json`: per method, held-out success before and after (mean ± std over seeds), budget
  units and sampled tokens spent, the informative samples per unit and per sampled token (rollouts with a
  non-zero advantage: what the gradient learns from) beside mixed trees per unit and the effective ratio; and
  against the baseline, the paired difference of held-out success with its 95% confidence interval, read at the
  baseline's final budget units and at its final sampled tokens (each run's per-question curve interpolated
  between its evaluations, `tracerl.core.stats`), and the share of the baseline's tokens and units a method
  needs to reach the baseline's final success (seed-mean curves, interpolated).
- the regime: the share of all-fail / mixed / all-success prompts in the baseline's first step, when the baseline
  samples a fixed n per prompt (GRPO: its first batch is a sample of the starting policy's regime);
- plots: success against cumulative tokens and against units, and informative rollouts per unit per step.

Only seeds whose runs exist for every method and reached the same last step are read, so a comparison still
running (or stopped part-way) reports what is complete.

Deliberately not here: training (`tracerl.train.compare`), multiple-comparison corrections.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.core.stats import cost_to_reach, interpolate_at, paired_difference
from tracerl.io.runlog import read_metrics, read_trees

Say = Callable[[str], None]
INFORMATIVE = ("informative_rollouts_per_budget", "informative_rollouts_per_ktoken", "informative_tokens_per_token")
ALLOCATION = ("effective_ratio", "mixed_trees_per_budget")


def run_dir_name(label: str, seed: int) -> str:
    """`<label>-seed<seed>`, with characters a folder name should not hold replaced by '_'."""
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in label)
    return f"{safe}-seed{seed}"


def load_run(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    rows = read_metrics(run_dir)
    run = {"train": [r for r in rows if r["kind"] == "train"], "eval": [r for r in rows if r["kind"] == "eval"]}
    if run["train"] and "alloc/informative_rollouts_per_budget" not in run["train"][-1]:
        _informative_from_trees(run_dir, run["train"])
    return run


def _informative_from_trees(run_dir: Path, train: list[dict[str, Any]]) -> None:
    """Fill in the informative-sample measures of runs logged before they were, from the saved trees (the
    advantages are a pure function of the trees and the run's estimator). Steps without trees stay without."""
    import dataclasses

    from tracerl.core.advantages import AdvantageConfig, compute_advantages
    from tracerl.core.metrics import INFORMATIVE_MEASURES, raw_advantages, ratios, step_counts
    from tracerl.core.methods import get_method
    from tracerl.core.tree import Tree

    config_path = run_dir / "config.json"
    if not config_path.exists():
        return
    config = json.loads(config_path.read_text())
    known = {f.name for f in dataclasses.fields(AdvantageConfig)}
    adv_config = AdvantageConfig(**{k: v for k, v in config.get("advantages", {}).items() if k in known})
    estimator = get_method(config["method"]).advantage
    for row in train:
        try:
            trees = [Tree.from_dict(t) for t in read_trees(run_dir, row["step"])["trees"]]
        except ValueError:
            continue
        advantages = compute_advantages(estimator, trees, adv_config)
        raw = raw_advantages(estimator, trees, advantages, adv_config)
        counts = step_counts(trees, advantages, row["rollout/units"], row["rollout/tokens"], raw_advantages=raw)
        row.update({f"alloc/{key}": value for key, value in ratios(counts).items() if key in INFORMATIVE_MEASURES})


def complete_seeds(out: Path, labels: list[str], seeds: list[int]) -> tuple[list[int], dict[str, list[dict]]]:
    """The seeds whose runs exist for every label and end at the same step, and those runs."""
    kept, runs = [], {label: [] for label in labels}
    for seed in seeds:
        dirs = [out / run_dir_name(label, seed) for label in labels]
        if not all((d / "metrics.jsonl").exists() for d in dirs):
            continue
        loaded = [load_run(d) for d in dirs]
        ends = {run["eval"][-1]["step"] if run["eval"] else -1 for run in loaded}
        if len(ends) != 1 or -1 in ends or not all(run["train"] and run["train"][-1]["step"] == run["eval"][-1]["step"]
                                                   for run in loaded):
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
            "num_questions": len(seed_runs[0]["eval"][0]["eval/per_prompt"]),
            **{key: _train_mean(seed_runs, f"alloc/{key}") for key in INFORMATIVE + ALLOCATION},
        }
    if baseline:
        base = runs[baseline]
        for label, seed_runs in runs.items():
            row = rows[label]
            for axis in ("units", "tokens"):
                mine, theirs, short = [], [], 0
                for run, base_run in zip(seed_runs, base):
                    bx, by = curve(base_run, axis)
                    x, y = curve(run, axis)
                    value, reached = interpolate_at(x, y, bx[-1])
                    short += not reached
                    mine.append(value)
                    theirs.append(by[-1])
                row[f"diff_at_equal_{axis}"] = paired_difference(mine, theirs).to_dict()
                row[f"seeds_short_of_{axis}"] = short  # runs that spent less than the baseline: read at their end
                x, y = _mean_curve(seed_runs, axis)
                cost = cost_to_reach(x, y, rows[baseline]["success_after"])
                row[f"{axis}_to_baseline"] = cost
                row[f"share_of_baseline_{axis}"] = None if cost is None else cost / rows[baseline][axis]
    first = next(iter(runs.values()))
    return {"baseline": baseline, "seeds": seeds, "methods": rows,
            "regime": [r for r in (run.get("regime") for run in runs.get(baseline, first)) if r]}


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{100 * value:.{digits}f}%"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, fmt)


def _ci(diff: dict[str, Any]) -> str:
    return f"{100 * diff['mean']:+.1f} [{100 * diff['lo']:+.1f}, {100 * diff['hi']:+.1f}]"


def to_markdown(summary: dict[str, Any], command: str) -> str:
    base, methods = summary["baseline"], summary["methods"]
    any_row = next(iter(methods.values()))
    lines = [f"Held-out success (avg@k) on the same {any_row['num_questions']} questions per seed for every method, "
             f"{any_row['seeds']} seed(s) ({', '.join(map(str, summary['seeds']))}), {any_row['steps']} steps.", ""]
    if summary["regime"]:
        shares = {k: np.mean([r[k] for r in summary["regime"]]) for k in ("all_fail", "mixed", "all_success")}
        num = sum(r["num_prompts"] for r in summary["regime"])
        lines += [f"Regime ({base}'s first batch, {num} prompts over the seeds): all-fail {_pct(shares['all_fail'])}, "
                  f"mixed {_pct(shares['mixed'])}, all-success {_pct(shares['all_success'])}.", ""]
    head = ["method", "success before", "after (mean ± std over seeds)", "mean SE per run", "budget units",
            "sampled tokens", "informative rollouts / unit", "informative rollouts / 1k tokens",
            "informative tokens / token", "mixed trees / unit", "effective ratio"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, r in methods.items():
        lines.append("| " + " | ".join([
            label, _pct(r["success_before"]), f"{_pct(r['success_after'])} ± {_pct(r['success_after_std'])}",
            _pct(r["success_after_se"]), f"{r['units']:.0f}", f"{r['tokens']:,.0f}",
            _num(r["informative_rollouts_per_budget"], ".3f"), _num(r["informative_rollouts_per_ktoken"], ".2f"),
            _num(r["informative_tokens_per_token"], ".3f"), _num(r["mixed_trees_per_budget"], ".4f"),
            _num(r["effective_ratio"], ".3f")]) + " |")
    if base:
        head = ["method", f"minus {base} at equal units, points [95% CI]", f"minus {base} at equal tokens [95% CI]",
                f"tokens to reach {base}'s final success", f"share of {base}'s tokens", f"share of {base}'s units"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, r in methods.items():
            if label == base:
                continue
            short = r["seeds_short_of_tokens"]
            lines.append("| " + " | ".join([
                label, _ci(r["diff_at_equal_units"]),
                _ci(r["diff_at_equal_tokens"]) + (f" ({short} run(s) read at their last, lower, token count)"
                                                  if short else ""),
                "not reached" if r["tokens_to_baseline"] is None else f"{r['tokens_to_baseline']:,.0f}",
                _pct(r["share_of_baseline_tokens"], 0), _pct(r["share_of_baseline_units"], 0)]) + " |")
        over = next((r["diff_at_equal_units"]["over"] for k, r in methods.items() if k != base), "seeds")
        lines += ["", "Differences are paired by seed and question; the interval is "
                  + ("Student's t over the per-seed mean differences." if over == "seeds" else
                     "normal over questions (one seed: training noise is not in it).")
                  + " A curve is read at another cost by interpolating between its evaluations, never beyond its "
                  "last one."]
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines)


def write_report(out: Path, labels: list[str], seeds: list[int], baseline: str | None, command: str,
                 say: Say = print) -> str:
    """Read the complete seeds' runs in `out`, write compare.md, compare.json and the plots; return the Markdown."""
    kept, runs = complete_seeds(out, labels, seeds)
    if not kept:
        raise ValueError(f"{out} holds no seed with a finished run for every one of {labels}; run tracerl compare")
    if len(kept) < len(seeds):
        say(f"compare: reporting seeds {kept}; the others are missing or unfinished for some method")
    base = baseline if baseline in runs else None
    if base:
        for seed, run in zip(kept, runs[base]):
            run["regime"] = regime(out / run_dir_name(base, seed))
    summary = summarize(runs, base, kept)
    report = to_markdown(summary, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(report + "\n")
    (out / "compare.json").write_text(json.dumps(summary, indent=1))
    plot(runs, out)
    return report


def plot(runs: dict[str, list[dict]], out: Path) -> list[Path]:
    """accuracy_vs_tokens.png, accuracy_vs_units.png and informative_per_unit.png in `out` (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = len(next(iter(runs.values())))
    paths = []
    for axis, xlabel in (("tokens", "cumulative sampled tokens"), ("units", "cumulative budget units")):
        curves = {label: (*_mean_curve(seed_runs, axis), "o") for label, seed_runs in runs.items()}
        paths.append(_figure(plt, curves, xlabel, "held-out success (avg@k)",
                             f"success vs sampled {axis} ({seeds} seed(s))", None, out / f"accuracy_vs_{axis}.png"))
    curves = {}
    for label, seed_runs in runs.items():
        num = min(len(run["train"]) for run in seed_runs)
        values = [[r.get("alloc/informative_rollouts_per_budget", np.nan) for r in run["train"][:num]]
                  for run in seed_runs]
        curves[label] = (np.arange(1, num + 1), np.nanmean(np.array(values, dtype=float), axis=0), ".")
    paths.append(_figure(plt, curves, "step", "rollouts with a non-zero advantage / unit",
                         f"informative rollouts per unit ({seeds} seed(s))", None, out / "informative_per_unit.png"))
    return paths


def _figure(plt, curves: dict[str, tuple], xlabel: str, ylabel: str, title: str, ylim, path: Path) -> Path:
    """One line per method: curves[method] = (x, y, marker)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (x, y, marker) in curves.items():
        ax.plot(x, y, marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
