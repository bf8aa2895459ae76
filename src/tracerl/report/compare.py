"""`tracerl compare`: several methods trained at equal budget on the same seeds, as a table and two plots.

Each (method, seed) is one ordinary run (`run_training`) in `<out>/<method>-seed<seed>/`, with the same config
apart from `method`, so every method gets the same steps, the same per-step budget, the same data order and
the same evaluation questions. Runs resume: calling compare again finishes what a killed call left. The step-0
evaluation does not depend on the method (same policy, questions and sampling seed), so it is run once per
seed and shared.

Outputs in `<out>/`: `compare.md` (the table and the command), `compare.json` (the numbers),
`accuracy_vs_cost.png` (held-out success against cumulative budget units) and `effective_ratio.png`
(effective ratio per step). "Cost to reach the baseline" is the budget a method has spent at its first
evaluation whose seed-mean success is at least the baseline's final seed-mean success.

Deliberately not here: statistical tests beyond the spread over seeds, or runs in parallel (2 cores).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.io.runlog import read_metrics

Say = Callable[[str], None]


def run_compare(methods: Sequence[str], seeds: Sequence[int], out: str | Path, *, config_path: str | None = None,
                overrides: Sequence[str] = (), say: Say = print, baseline: str = "grpo") -> str:
    """Train every method on every seed (or finish what is there), then write and return the Markdown report."""
    from tracerl.train.config import load_config
    from tracerl.train.trainer import run_training

    out = Path(out)
    if not methods:
        raise ValueError("--methods is empty; name at least one preset, e.g. --methods grpo,trace")
    configs = {(m, s): load_config(config_path, [*overrides, f"method={m}", f"run.seed={s}",
                                                 f"run.out_dir={out / f'{m}-seed{s}'}", "run.progress=false"])
               for s in seeds for m in methods}  # every config is checked before the first run starts
    for s in seeds:
        initial = None
        for m in methods:
            say(f"compare: {m}, seed {s}")
            result = run_training(configs[(m, s)], resume=True, say=say, initial_eval=initial)
            initial = result["before"]
            say(f"  held-out success {result['before']['eval/success']:.1%} -> {result['after']['eval/success']:.1%}")
    runs = {m: [load_run(out / f"{m}-seed{s}") for s in seeds] for m in methods}
    summary = summarize(runs, baseline if baseline in runs else None)
    command = "tracerl compare --methods " + ",".join(methods) + f" --seeds {len(seeds)}" + \
        (f" --config {config_path}" if config_path else "") + "".join(f" --set {shlex.quote(o)}" for o in overrides)
    report = to_markdown(summary, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(report + "\n")
    (out / "compare.json").write_text(json.dumps(summary, indent=1))
    plot(runs, out)
    return report


def load_run(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    rows = read_metrics(run_dir)
    return {"train": [r for r in rows if r["kind"] == "train"], "eval": [r for r in rows if r["kind"] == "eval"]}


def _eval_curve(runs: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, seed-mean cumulative units, seed-mean success) at the evaluation steps all seeds share."""
    steps = sorted(set.intersection(*[{r["step"] for r in run["eval"]} for run in runs]))
    units = np.array([np.mean([next(r for r in run["eval"] if r["step"] == s)["rollout/cum_units"] for run in runs])
                      for s in steps])
    success = np.array([np.mean([next(r for r in run["eval"] if r["step"] == s)["eval/success"] for run in runs])
                        for s in steps])
    return np.array(steps), units, success


def summarize(runs: dict[str, list[dict]], baseline: str | None) -> dict[str, Any]:
    rows = {}
    for method, seed_runs in runs.items():
        final = [run["eval"][-1] for run in seed_runs]
        initial = [run["eval"][0] for run in seed_runs]
        train = [run["train"] for run in seed_runs]
        success = np.array([r["eval/success"] for r in final])
        rows[method] = {
            "success_before": float(np.mean([r["eval/success"] for r in initial])),
            "success_after": float(success.mean()),
            "success_after_std": float(success.std(ddof=1)) if len(success) > 1 else 0.0,
            "success_after_se": float(np.mean([r["eval/success_se"] for r in final])),
            "units": float(np.mean([t[-1]["rollout/cum_units"] for t in train])),
            "tokens": float(np.mean([t[-1]["rollout/cum_tokens"] for t in train])),
            "effective_ratio": float(np.mean([np.nanmean([r["alloc/effective_ratio"] for r in t]) for t in train])),
            "mixed_trees_per_budget": float(np.mean([np.nanmean([r["alloc/mixed_trees_per_budget"] for r in t])
                                                     for t in train])),
            "steps": int(np.mean([len(t) for t in train])), "seeds": len(seed_runs),
        }
    if baseline:
        target = rows[baseline]["success_after"]
        for method, seed_runs in runs.items():
            _, units, success = _eval_curve(seed_runs)
            reached = np.flatnonzero(success >= target)
            cost = float(units[reached[0]]) if len(reached) else None
            rows[method]["units_to_baseline"] = cost
            rows[method]["cost_vs_baseline"] = None if cost is None else cost / rows[baseline]["units"]
    return {"baseline": baseline, "methods": rows}


def to_markdown(summary: dict[str, Any], command: str) -> str:
    base = summary["baseline"]
    head = ["method", "held-out success before", "after (mean ± std over seeds)", "mean SE per run",
            "budget units", "sampled tokens", "effective_ratio", "mixed_trees_per_budget"]
    if base:
        head += [f"units to reach {base}'s final success", f"share of {base}'s cost"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, r in summary["methods"].items():
        cells = [method, f"{r['success_before']:.1%}", f"{r['success_after']:.1%} ± {r['success_after_std']:.1%}",
                 f"{r['success_after_se']:.1%}", f"{r['units']:.0f}", f"{r['tokens']:,.0f}",
                 f"{r['effective_ratio']:.3f}", f"{r['mixed_trees_per_budget']:.4f}"]
        if base:
            reached = r["units_to_baseline"]
            cells += ["not reached" if reached is None else f"{reached:.0f}",
                      "-" if reached is None else f"{r['cost_vs_baseline']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    seeds = next(iter(summary["methods"].values()))["seeds"]
    lines += ["", f"{seeds} seed(s) per method; success is avg@k on held-out questions. Command: `{command}`"]
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], out: Path) -> list[Path]:
    """accuracy_vs_cost.png and effective_ratio.png in `out` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = len(next(iter(runs.values())))
    curves = {}
    for method, seed_runs in runs.items():
        _, units, success = _eval_curve(seed_runs)
        curves[method] = (units, success, "o")
    acc = _figure(plt, curves, "cumulative sampling cost (budget units)", "held-out success (avg@k)",
                  f"accuracy vs sampling cost ({seeds} seed(s))", None, out / "accuracy_vs_cost.png")
    curves = {}
    for method, seed_runs in runs.items():
        num = min(len(run["train"]) for run in seed_runs)
        ratio = np.nanmean([[r["alloc/effective_ratio"] for r in run["train"][:num]] for run in seed_runs], axis=0)
        curves[method] = (np.arange(1, num + 1), ratio, ".")
    eff = _figure(plt, curves, "step", "effective ratio (mixed trees / prompts)",
                  f"effective ratio per step ({seeds} seed(s))", (0, 1), out / "effective_ratio.png")
    return [acc, eff]


def _figure(plt, curves: dict[str, tuple], xlabel: str, ylabel: str, title: str, ylim, path: Path) -> Path:
    """One line per method: curves[method] = (x, y, marker)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, (x, y, marker) in curves.items():
        ax.plot(x, y, marker=marker, label=method)
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
