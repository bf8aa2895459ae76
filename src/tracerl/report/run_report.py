"""`tracerl report`: one run's `report.md` and its PNG figures, written into the run directory.

From `metrics.jsonl`: training success (`rollout/success_rate`) and held-out success (`eval/success`, error bars
`eval/success_se`) per step (`success.png`), and the effective ratio per step (`effective_ratio.png`). A method whose
stage 1 selects prompts (anything but GRPO's uniform random batch) gets a note there (`selection_note`): its training
success is over the prompts it chose, near p = 0.5, not the policy's success on the training set. From the
saved trees (`trees/step-*.json.gz`, `run.save_trees=true`):

- predictor calibration (`calibration.png`): every node that carries a prediction (`p_pred`: roots scored by stage 1,
  prefixes scored as stage-2 candidates) against its natural backed-up success (`Tree.natural_backup().vhat`, weight
  = its leaf count), i.e. what the predictor said against what then happened, with Brier, ECE and AUC from
  `tracerl.core.calibration`. Methods without a predictor (grpo, treepo) have no p; the report says so;

From each step's rollout records (`rollouts/step-*.json`, written whether trees are kept or not), stage 1's batch
(`tally.batch_shape`): prompts a step, fresh rollouts a prompt, prompts by group size and how far their predicted p
lies from 1/2; two allocations that rank prompts alike can still build very different batches.

From `metrics.jsonl` again, the budget split per step (`budget.png`): the step ledger's own spend by kind
(`alloc/units_root`, `alloc/units_prefix`, `alloc/num_continuations`, logged by `tracerl.core.step`), next to the
logged `rollout/units`; nothing is re-derived from the trees.

`write_run_report(run_dir)` is meant to be called at the end of `tracerl train` and per run by `tracerl compare`.
Deliberately not here: comparisons across runs (`tracerl.report.compare`), the trees themselves
(`tracerl.report.view`), and any recomputation of training metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.core.calibration import calibration_metrics, expand_soft_targets, reliability
from tracerl.core.methods import METHODS
from tracerl.core.tally import batch_shape, from_columns
from tracerl.core.tree import Tree
from tracerl.io.files import read_utf8
from tracerl.io.files.run_folder import run_path, write_atomic
from tracerl.io.files.runlog import read_metrics, read_rollouts, read_trees
from tracerl.report.figures import finish_axes, save_figure
from tracerl.report.view import tree_steps

REPORT_FILE = "report.md"
FIGURES = {"success": "success.png", "effective_ratio": "effective_ratio.png", "calibration": "calibration.png",
           "budget": "budget.png"}


def _value(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    return float("nan") if v is None else float(v)


def read_run(run_dir: Path) -> dict[str, Any]:
    """Metrics rows, config and per-step tree summaries of one run directory."""
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is not a directory; pass a run directory written by `tracerl train`")
    rows = read_metrics(run_dir)
    config_path = run_path(run_dir, "config.json")  # a symlink there is refused, not read as this run's
    config = json.loads(read_utf8(config_path)) if config_path.is_file() else {}
    try:
        steps = tree_steps(run_dir)
    except ValueError:
        steps = []
    preds, method, domain = [], config.get("method"), config.get("data", {}).get("domain")
    for step in steps:
        record = read_trees(run_dir, step)
        method, domain = method or record.get("method"), domain or record.get("domain")
        for raw in record.get("trees", []):
            tree = Tree.from_dict(raw)
            natural = tree.natural_backup()
            for node in tree.nodes:
                n = int(natural.num_leaves[node.node_id])
                if node.p_pred is not None and n > 0:
                    preds.append((step, node.node_id == 0, float(node.p_pred), float(natural.vhat[node.node_id]), n))
    budget = [{"step": r["step"], "root_units": float(r["alloc/units_root"]),
               "num_continuations": int(r.get("alloc/num_continuations", 0)),
               "prefix_units": float(r.get("alloc/units_prefix", 0.0)), "logged_units": r.get("rollout/units")}
              for r in rows if r["kind"] == "train" and "alloc/units_root" in r]
    shapes = [batch_shape(from_columns(columns)) for _, columns in sorted(read_rollouts(run_dir).items())]
    return {"dir": run_dir, "train": [r for r in rows if r["kind"] == "train"], "batch": shapes,
            "eval": [r for r in rows if r["kind"] == "eval"], "config": config, "has_config": bool(config),
            "tree_steps": steps, "budget": budget,
            "predictions": np.array(preds, dtype=float).reshape(-1, 5), "method": method or "unknown",
            "domain": domain or "unknown"}


def selecting_stage1(method: str) -> str | None:
    """The stage-1 policy of `method` when it chooses which prompts to sample and how many rollouts each gets (pcl,
    trace's knapsack, the round samplers: anything but GRPO's uniform random batch); None for a uniform stage 1 or a
    method this version does not know."""
    preset = METHODS.get(method)
    return preset.root_policy if preset is not None and preset.root_policy != "uniform" else None


def selection_note(method: str) -> str:
    """Why a selecting stage 1's training success is not the policy's success on the training set ('' otherwise)."""
    stage1 = selecting_stage1(method)
    if stage1 is None:
        return ""
    return (f"Training success is over the prompts `{method}`'s stage 1 (`{stage1}`) chose to sample, not over the "
            "training set: it draws prompts whose success is near p = 0.5 (mixed groups, where the gradient is) and "
            "spends little or nothing on those that all fail or all succeed, so this rate moves with what it chose as "
            "well as with the policy, and can fall while held-out success rises. Held-out success, on questions drawn "
            "without selection, is the policy's.")


def type_table(first: dict[str, Any], last: dict[str, Any]) -> list[str]:
    """Held-out success by question type (`eval/success_type_<type>`, from the rows' `extra_info["type"]`), at the
    first and the last evaluation; no lines when the rows name no types."""
    prefix = "eval/success_type_"
    names = sorted(k[len(prefix):] for k in last if k.startswith(prefix))
    if not names:
        return []
    lines = ["", f"By question type (`extra_info[\"type\"]`), step {first['step']} -> step {last['step']}:", "",
             "| type | held-out success |", "|---|---|"]
    return lines + [f"| {name} | {_pct(first.get(prefix + name))} -> {_pct(last.get(prefix + name))} |"
                    for name in names]


def calibration_summary(pred: np.ndarray) -> dict[str, dict[str, float]]:
    """Brier / ECE / AUC and counts for all predicted nodes, roots only and prefixes only."""
    out = {}
    for name, keep in (("all", np.ones(len(pred), bool)), ("roots", pred[:, 1] == 1), ("prefixes", pred[:, 1] == 0)):
        sel = pred[keep]
        if len(sel):
            metrics = calibration_metrics(sel[:, 2], sel[:, 3], sel[:, 4])
            out[name] = {**metrics, "num_nodes": int(len(sel)), "num_leaves": int(sel[:, 4].sum()),
                         "mean_p": float(np.average(sel[:, 2], weights=sel[:, 4])),
                         "mean_success": float(np.average(sel[:, 3], weights=sel[:, 4]))}
    return out


def plot_run(run: dict[str, Any], out: Path) -> dict[str, Path]:
    """The figures the run's data allows, keyed as in FIGURES."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    train, evals = run["train"], run["eval"]
    if train or evals:
        fig, ax = plt.subplots(figsize=(6, 4))
        if train:
            chosen = ", on prompts chosen near p = 0.5" if selecting_stage1(run["method"]) else ""
            ax.plot([r["step"] for r in train], [_value(r, "rollout/success_rate") for r in train], ".-",
                    label=f"training rollouts (rollout/success_rate{chosen})")
        if evals:
            ax.errorbar([r["step"] for r in evals], [_value(r, "eval/success") for r in evals],
                        yerr=[_value(r, "eval/success_se") for r in evals], fmt="o-", capsize=3,
                        label="held-out (eval/success ± SE)")
        finish_axes(ax, "step", "success rate", "success over training", (0, 1))
        paths["success"] = save_figure(plt, fig, out / FIGURES["success"])
    if train:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["step"] for r in train], [_value(r, "alloc/effective_ratio") for r in train], "o-")
        finish_axes(ax, "step", "effective ratio (mixed trees / prompts)", "effective ratio per step", (0, 1),
                    legend=False)
        paths["effective_ratio"] = save_figure(plt, fig, out / FIGURES["effective_ratio"])
    pred = run["predictions"]
    if len(pred):
        fig, (ax, hist) = plt.subplots(2, 1, figsize=(6, 6), height_ratios=(3, 1), sharex=True)
        ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", label="perfect calibration")
        for name, keep, marker in (("roots", pred[:, 1] == 1, "o"), ("prefixes", pred[:, 1] == 0, "s")):
            sel = pred[keep]
            if not len(sel):
                continue
            p, y, w = expand_soft_targets(sel[:, 2], sel[:, 3], sel[:, 4])
            _, mean_p, mean_y, mass = reliability(p, y, w)
            ok = ~np.isnan(mean_p)
            ax.plot(mean_p[ok], mean_y[ok], marker=marker, label=f"{name} ({len(sel)} nodes)")
            hist.hist(sel[:, 2], bins=10, range=(0, 1), weights=sel[:, 4], alpha=0.5, label=name)
        finish_axes(ax, "", "natural backed-up success", "predictor calibration (saved trees)", (0, 1))
        ax.set_xlim(0, 1)
        hist.set_xlabel("predicted p (p_pred)")
        hist.set_ylabel("leaves")
        hist.grid(alpha=0.3)
        paths["calibration"] = save_figure(plt, fig, out / FIGURES["calibration"])
    if run["budget"]:
        b = run["budget"]
        steps = np.array([x["step"] for x in b])
        roots, prefixes = np.array([x["root_units"] for x in b]), np.array([x["prefix_units"] for x in b])
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(steps, roots, label="roots (stage 1)")
        ax.bar(steps, prefixes, bottom=roots, label="prefixes (stage 2)")
        finish_axes(ax, "step", "budget units", "budget split per step", None)
        paths["budget"] = save_figure(plt, fig, out / FIGURES["budget"])
    return paths


def _pct(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


FAULTS = ("reward_calls", "reward_errors", "reward_timeouts", "env_exceptions")


def fault_counts(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Rollouts, reward calls and the failures counted in them, summed over training steps (`rollout/*`) and over
    evaluations (`eval/*`): a reward that raised or returned a non-number, one that timed out, any environment
    failure (rewards included)."""
    def total(kind: str, key: str) -> int:
        return int(sum(r.get(key) or 0 for r in rows if r.get("kind") == kind))
    return {"train": {"rollouts": total("train", "rollout/num_rollouts"),
                      **{k: total("train", f"rollout/{k}") for k in FAULTS}},
            "eval": {"rollouts": total("eval", "eval/num_rollouts"),
                     "env_exceptions": total("eval", "eval/failed_rollouts"),
                     **{k: total("eval", f"eval/{k}") for k in FAULTS[:3]}}}


def fault_lines(counts: dict[str, dict[str, int]]) -> list[str]:
    """One line per phase whose reward calls failed, and a warning when they are most of them."""
    lines = []
    for phase, label in (("train", "training"), ("eval", "held-out evaluation")):
        c = counts[phase]
        failed = c["reward_errors"] + c["reward_timeouts"]
        if failed:
            lines.append(f"reward failures in {label}: {failed} of {c['reward_calls']} reward calls "
                         f"({c['reward_errors']} raised or returned a non-number, {c['reward_timeouts']} timed out; "
                         f"{c['rollouts']} rollouts); each is a failed leaf with reward 0 (the trees show the error)")
            if failed * 2 > c["reward_calls"]:
                lines.append(f"WARNING: most {label} reward calls failed, so the success rate says nothing about the "
                             "policy: fix the reward function")
    return lines


def _spread(values: list[float]) -> str:
    return "every step" if min(values) == max(values) else f"from {min(values):g} to {max(values):g}"


def batch_lines(shapes: list[dict[str, Any]]) -> list[str]:
    """Stage 1's batch over the run's steps (`tally.batch_shape` of each step's fresh rollouts)."""
    known = [b for b in shapes if b["fresh"] and math.isfinite(b["prompts"])]
    if not known:
        return ["No step recorded its fresh rollouts with their grants (`rollouts/`): nothing to say of the batch."]
    prompts = [b["prompts"] for b in known]
    by_grant: dict[int, float] = {}
    for b in known:
        for g, n in b["prompts_by_grant"].items():
            by_grant[g] = by_grant.get(g, 0.0) + n
    sizes = ", ".join(f"{g}: {n / sum(prompts):.1%}" for g, n in sorted(by_grant.items()))
    near = [b["distance"] for b in known if math.isfinite(b["distance"])]
    return [f"Stage 1's batch, from each step's fresh rollouts ({len(known)} steps): {np.mean(prompts):.1f} prompts a "
            f"step ({_spread(prompts)}), {sum(b['fresh'] for b in known) / sum(prompts):.2f} "
            f"fresh rollouts a prompt. Prompts by the fresh rollouts granted: {sizes}. "
            + (f"The granted prompts' mean |p - 1/2| (the predictor's p at the root): {np.mean(near):.3f}; 0 is a "
               "batch at p = 1/2 (PCL's choice), 0.5 one of prompts the predictor calls certain."
               if near else "No granted prompt carried a prediction.")]


def to_markdown(run: dict[str, Any], figures: dict[str, Path], calibration: dict[str, dict[str, float]]) -> str:
    train, evals = run["train"], run["eval"]
    lines = [f"# Run report: {run['dir'].resolve().name}", "",
             f"Method `{run['method']}`, domain `{run['domain']}`, {len(train)} training steps, {len(evals)} "
             f"evaluations, trees saved for {len(run['tree_steps'])} steps.", ""]
    counts = fault_counts([*train, *evals])
    faults = fault_lines(counts)
    lines += ["## Failures", ""] + ([f"- {line}" for line in faults] or [
        f"No reward failures ({counts['train']['reward_calls']} training and {counts['eval']['reward_calls']} "
        "held-out reward calls)."])
    if counts["train"]["env_exceptions"]:
        lines.append(f"- environment failures in training (`rollout/env_exceptions`, rewards included): "
                     f"{counts['train']['env_exceptions']}")
    lines.append("")
    lines += ["## Success", ""]
    if evals:
        first, last = evals[0], evals[-1]
        lines.append(f"Held-out success (eval/success ± SE): {_pct(first.get('eval/success'))} ± "
                     f"{_pct(first.get('eval/success_se'))} at step {first['step']} -> "
                     f"{_pct(last.get('eval/success'))} ± {_pct(last.get('eval/success_se'))} at step {last['step']}.")
        lines += type_table(first, last)
    if train:
        lines.append(f"Training rollouts (rollout/success_rate): {_pct(train[0].get('rollout/success_rate'))} at "
                     f"step {train[0]['step']} -> {_pct(train[-1].get('rollout/success_rate'))} at step "
                     f"{train[-1]['step']}.")
        note = selection_note(run["method"])
        if note:
            lines += ["", note]
    lines += [""] + ([f"![training and held-out success per step]({FIGURES['success']})", ""]
                     if "success" in figures else ["No training or evaluation rows in metrics.jsonl.", ""])
    lines += ["## Effective ratio", ""]
    if "effective_ratio" in figures:
        ratios = [_value(r, "alloc/effective_ratio") for r in train]
        priced = [_value(r, "alloc/informative_units_per_unit") for r in train]
        informative = [_value(r, "alloc/informative_rollouts_per_budget") for r in train]
        mean_ratio = np.nanmean(ratios) if np.isfinite(ratios).any() else float("nan")  # nan: no step selected any
        lines += [f"Share of selected prompts whose tree is mixed; mean over steps {mean_ratio:.3f}."
                  + (f" Informative samples (a non-zero advantage before batch whitening: what the gradient learns "
                     f"from) per budget unit, a continuation counted at its cost, mean over steps: "
                     f"{np.nanmean(priced):.3f} ({np.nanmean(informative):.3f} counting every rollout whole)."
                     if np.isfinite(priced).any() and np.isfinite(informative).any() else ""), "",
                  f"![effective ratio per step]({FIGURES['effective_ratio']})", ""]
    else:
        lines += ["No training steps logged.", ""]
    lines += ["## Batch", ""] + batch_lines(run["batch"]) + [""]
    lines += ["## Predictor calibration", ""]
    if not run["tree_steps"]:
        lines += ["No saved trees (train with run.save_trees=true): calibration needs them.", ""]
    elif "calibration" not in figures:
        lines += [f"Method `{run['method']}` has no predictor (p is None in the saved trees): nothing to "
                  "calibrate.", ""]
    else:
        lines += ["Each node with a prediction (roots scored by stage 1, prefixes scored as stage-2 candidates) "
                  "against its natural backed-up success (`Tree.natural_backup`), weighted by its leaves, over all "
                  "saved steps.", "", "| nodes | count | leaves | mean p | mean success | Brier | ECE | AUC |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, c in calibration.items():
            lines.append(f"| {name} | {c['num_nodes']} | {c['num_leaves']} | {c['mean_p']:.3f} | "
                         f"{c['mean_success']:.3f} | {c['brier']:.4f} | {c['ece']:.4f} | {c['auc']:.3f} |")
        lines += ["", f"![reliability diagram of the predictor]({FIGURES['calibration']})", ""]
    lines += ["## Budget split", ""]
    if not run["budget"]:
        lines += ["No step logged the ledger's split (`alloc/units_root`, written since the shared step function).", ""]
    else:
        lines += ["The step ledger's spend by kind, as logged: roots are stage-1 rollouts (1 unit each), prefixes "
                  "stage-2 continuations (`allocation.continuation_cost` each).", "",
                  "| step | root units | continuations | prefix units | total | prefix share | logged rollout/units |",
                  "|---|---|---|---|---|---|---|"]
        for b in run["budget"]:
            total = b["root_units"] + b["prefix_units"]
            logged = "-" if b["logged_units"] is None else f"{b['logged_units']:g}"
            share = f"{b['prefix_units'] / total:.1%}" if total else "-"
            lines.append(f"| {b['step']} | {b['root_units']:g} | {b['num_continuations']} | {b['prefix_units']:g} | "
                         f"{total:g} | {share} | {logged} |")
        lines += ["", f"![budget split between roots and prefixes per step]({FIGURES['budget']})", ""]
    return "\n".join(lines)


def write_run_report(run_dir: str | Path) -> Path:
    """Write `<run>/report.md` and its figures (see the module docstring); return the report's path."""
    run_dir = Path(run_dir)
    run = read_run(run_dir)
    figures = plot_run(run, run_dir)
    calibration = calibration_summary(run["predictions"]) if len(run["predictions"]) else {}
    path = run_path(run_dir, REPORT_FILE)
    write_atomic(path, (to_markdown(run, figures, calibration) + "\n").encode())
    return path
