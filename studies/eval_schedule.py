"""Where to evaluate, how much, and over how many builds: the primary's precision per core-second, from a table's runs.

    python studies/eval_schedule.py RUNS_DIR [--methods grpo,pcl,trace] [--baseline grpo] [--axis tokens]
        [--coupling 0.68] [--curve-steps 0,6,12] [--var-build V --build-seconds S [--effect 0.5]]
        [--title T] [--out FILE.md]

RUNS_DIR holds a `tracerl compare` table's run folders (`<method>-seed<s>/metrics.jsonl`, e.g. the headroom table's
archive unpacked). The primary is each method's held-out success read at the baseline's final sampled tokens minus
the baseline's final success (`tracerl.core.stats.diff_at_baseline_cost`, per question, then averaged). Per seed
it spreads for two reasons:

- **evaluation noise**: each question's success is the mean of k sampled answers; its sampling variance is
  estimated without bias from the k samples themselves, x(1 - x) / (k - 1) with x the question's observed success,
  and carried through the interpolation weights of the two evaluations the reading uses, over Q questions;
- **training**: what is left, var_train = var_seed - mean evaluation noise (the seeds share the test split, so the
  questions drawn add nothing between seeds).

A design is (the evaluation steps, questions x samples Q k per evaluation, coupled or independent sampling). Its
variance per seed is var_train + noise0 * c * Q0 k0 / (Q k), with c the share of the noise coupled sampling keeps
(0.68 [0.48, 0.89] over five pairs, `coupled-eval-headroom-pilot/`; 1 without it); its cost per seed is the runs'
training seconds plus one evaluation's seconds (scaled by Q k / Q0 k0) for each distinct evaluation (step 0 is
shared by the methods of a seed). Seeds needed for a standard error scale as variance; so the precision per
core-second of a design is 1 / (variance x cost), and the core-seconds it needs for the registered design's standard
error are cost x variance / variance_registered per registered seed.

The evaluation steps of a design: every step whose evaluation a primary reading of this table used (the two
around the baseline's final tokens, for every method and seed), the last step, and `--curve-steps` (points that
draw the curves the token-share reading needs; their number is the design's choice, their cost is counted).

With builds (`--var-build`, the variance of the primary between independently built starting policies, and
`--build-seconds`, one build's cost): B builds of S seeds give var_build / B + var_seed / (B S) at B (build + S x
cost); the script prints, per B, the S that gives the standard error resolving `--effect`, where one exists.
Single-build tables cannot estimate var_build: give it from two or more builds' readings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracerl.core.stats import interpolate_at

_spec = importlib.util.spec_from_file_location("eval_design", Path(__file__).resolve().parent / "eval_design.py")
eval_design = importlib.util.module_from_spec(_spec)
sys.modules["eval_design"] = eval_design  # its dataclasses look their module up there
_spec.loader.exec_module(eval_design)


COUPLING = 0.68  # share of the evaluation noise coupled sampling keeps (coupled-eval-headroom-pilot/, five pairs)


@dataclass(frozen=True)
class SeedReading:
    """One method's primary against the baseline on one seed: the difference, its evaluation noise, the steps read."""

    difference: float
    noise: float
    steps: tuple[int, ...]


def load_evals(run_dir: Path) -> tuple[list[dict], float]:
    """(the run's evaluation rows, its training seconds)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r["kind"] == "eval"]
    return evals, sum(r.get("sys/step_seconds", 0.0) for r in rows if r["kind"] == "train")


def sampling_variance(per_question: np.ndarray, samples: int) -> np.ndarray:
    """Unbiased estimate of the variance of each question's mean of `samples` 0/1 answers: x (1 - x) / (k - 1)."""
    return per_question * (1.0 - per_question) / (samples - 1)


def reading(method: list[dict], baseline: list[dict], axis: str, samples: int) -> SeedReading:
    """The primary on one seed, with the weights `interpolate_at` gives the evaluations it reads."""
    cost = np.array([r[f"rollout/cum_{axis}"] for r in method], dtype=float)
    y = np.array([r["eval/per_prompt"] for r in method], dtype=float)
    base = np.array(baseline[-1]["eval/per_prompt"], dtype=float)
    at = float(baseline[-1][f"rollout/cum_{axis}"])
    # the reading's weights, found by reading an identity: entry j is evaluation j's weight, and the value is
    # weights @ y, what `interpolate_at(cost, y, at)` returns
    weights, _ = interpolate_at(cost, np.eye(len(cost)), at)
    value = weights @ y
    used = tuple(int(method[j]["step"]) for j in np.flatnonzero(weights > 0))
    noise = (weights ** 2) @ sampling_variance(y, samples).sum(axis=1) + sampling_variance(base, samples).sum()
    q = len(base)
    return SeedReading(float((value - base).mean()), float(noise / q / q), used)


def table(runs_dir: Path, methods: list[str], baseline: str, axis: str) -> dict:
    """Per comparison: per-seed readings; and the per-seed costs (training seconds, evaluation seconds)."""
    seeds = sorted({int(p.name.rsplit("seed", 1)[1]) for p in runs_dir.glob(f"{baseline}-seed*")})
    seeds = [s for s in seeds if all((runs_dir / f"{m}-seed{s}" / "metrics.jsonl").exists() for m in methods)]
    loaded = {(m, s): load_evals(runs_dir / f"{m}-seed{s}") for m in methods for s in seeds}
    samples = int(round(loaded[(baseline, seeds[0])][0][-1]["eval/num_rollouts"]
                        / loaded[(baseline, seeds[0])][0][-1]["eval/num_prompts"]))
    readings = {m: [reading(loaded[(m, s)][0], loaded[(baseline, s)][0], axis, samples) for s in seeds]
                for m in methods if m != baseline}
    train = [sum(loaded[(m, s)][1] for m in methods) for s in seeds]
    eval_seconds = [r["eval/seconds"] for m in methods for s in seeds for r in loaded[(m, s)][0]]
    steps = sorted({int(r["step"]) for r in loaded[(baseline, seeds[0])][0]})
    first = loaded[(baseline, seeds[0])][0][-1]
    return {"seeds": seeds, "readings": readings, "train_seconds": float(np.mean(train)),
            "eval_seconds": float(np.mean(eval_seconds)), "steps": steps, "samples": samples,
            "questions": int(first["eval/num_prompts"]), "num_methods": len(methods)}


def spread(rows: list[SeedReading]) -> tuple[float, float]:
    """(the per-seed variance of a primary, its mean evaluation noise), in points^2; training's part is their
    difference."""
    d = 100 * np.array([r.difference for r in rows])
    return float(np.var(d, ddof=1)), 1e4 * float(np.mean([r.noise for r in rows]))


def evaluations_per_seed(steps: list[int], num_methods: int) -> int:
    """Distinct evaluations a seed pays for: step 0 once (shared by its methods), every other step per method."""
    return (0 in steps) + num_methods * len([s for s in steps if s != 0])


@dataclass(frozen=True)
class Design:
    name: str
    steps: list[int]
    coupling: float  # share of the evaluation noise kept
    scale: float  # Q k / (Q0 k0)


def variance(design: Design, var_train: float, noise: float) -> float:
    return var_train + noise * design.coupling / design.scale


def cost(design: Design, t: dict) -> float:
    return t["train_seconds"] + evaluations_per_seed(design.steps, t["num_methods"]) * t["eval_seconds"] * design.scale


def best_scale(steps: list[int], coupling: float, var_train: float, noise: float, t: dict) -> float:
    """The Q k / (Q0 k0) minimising variance x cost: sqrt(train x noise x c / (evaluation x var_train))."""
    evals = evaluations_per_seed(steps, t["num_methods"]) * t["eval_seconds"]
    if var_train <= 0:
        return math.inf
    return math.sqrt(t["train_seconds"] * noise * coupling / (evals * var_train))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--methods", default="grpo,pcl,trace")
    parser.add_argument("--baseline", default="grpo")
    parser.add_argument("--axis", default="tokens", choices=("tokens", "units"))
    parser.add_argument("--coupling", type=float, default=COUPLING, help="share of evaluation noise coupling keeps")
    parser.add_argument("--curve-steps", default="0,6,12", help="evaluations kept to draw the curves")
    parser.add_argument("--var-build", type=float, default=None, help="between-build variance of the primary "
                        "(points^2)")
    parser.add_argument("--build-seconds", type=float, default=None, help="one build's cost (core-seconds)")
    parser.add_argument("--effect", type=float, default=0.5, help="with builds: the effect (points) to resolve at "
                        "80%% power, two-sided level 0.025 (the plan's smallest effect worth the machinery)")
    parser.add_argument("--title", default=None, help="the report's heading (default: the runs folder's path)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    methods = args.methods.split(",")
    t = table(args.runs_dir, methods, args.baseline, args.axis)
    curve_steps = [int(s) for s in args.curve_steps.split(",") if s]
    lines = [f"# {args.title or f'Evaluation design from `{args.runs_dir}`'}", "",
             f"{len(t['seeds'])} seeds of {', '.join(methods)}; registered: evaluations at steps "
             f"{t['steps'][0]}-{t['steps'][-1]} ({len(t['steps'])}), {t['questions']} questions x {t['samples']} "
             f"samples, independent sampling. A seed's training {t['train_seconds']:.0f} s (its {len(methods)} runs), "
             f"an evaluation {t['eval_seconds']:.1f} s (means over the table). Points are percentage points.", ""]
    for method, rows in t["readings"].items():
        var_seed, noise = spread(rows)
        var_train = var_seed - noise
        # the optimum is sized at var_train's upper 80% bound: a design tuned to a training variance of zero
        # would spend everything on evaluation
        var_train_hi = var_seed * eval_design.chi2_bounds(len(rows))[1] - noise
        read = sorted({s for r in rows for s in r.steps})
        keep = sorted(set(read) | {t["steps"][-1]} | set(curve_steps))
        opt = best_scale(keep, args.coupling, max(var_train_hi, 0.0), noise, t)
        designs = [Design("registered", t["steps"], 1.0, 1.0),
                   Design("registered, coupled", t["steps"], args.coupling, 1.0),
                   Design("where it reads + curve points", keep, 1.0, 1.0),
                   Design("where it reads + curve points, coupled", keep, args.coupling, 1.0)]
        if math.isfinite(opt):
            designs.append(Design(f"... coupled, Q k x {opt:.2f} (optimal at var_train's upper 80% bound "
                                  f"{var_train_hi:.3f})", keep, args.coupling, opt))
        ref_var, ref_cost = variance(designs[0], var_train, noise), cost(designs[0], t)
        lines += [f"## {method} - {args.baseline}", "",
                  f"Per-seed sd {math.sqrt(var_seed):.2f} points; evaluation noise {noise:.3f} points^2 "
                  f"({100 * noise / var_seed:.0f}% of the per-seed variance {var_seed:.3f}); training "
                  f"{var_train:.3f} points^2" + (" (negative: noise explains all of the spread; the optimum below "
                                                 "is then unbounded and not shown)" if var_train <= 0 else "")
                  + f". The reading used the evaluations at steps {read}.", "",
                  "| design | evaluation steps | distinct evaluations a seed | variance a seed (points^2) | "
                  "core-seconds a seed | precision per core-second, x registered | core-seconds for the "
                  "registered SE, share |", "|---|---|---|---|---|---|---|"]
        for design in designs:
            v, c = variance(design, var_train, noise), cost(design, t)
            lines.append(f"| {design.name} | {design.steps} | {evaluations_per_seed(design.steps, t['num_methods'])}"
                         f" | {v:.3f} | {c:.0f} | {ref_var * ref_cost / (v * c):.2f}"
                         f" | {v * c / (ref_var * ref_cost):.0%} |")
        if args.var_build is not None and args.build_seconds is not None:
            z = eval_design.power_module.t_quantile(1 - 0.025 / 2, 10_000) + \
                eval_design.power_module.t_quantile(0.8, 10_000)
            se = args.effect / z
            lines += ["", f"With builds (var_build {args.var_build:.3f} points^2, a build {args.build_seconds:.0f} s): "
                      f"the SE that resolves {args.effect} points (80% power, level 0.025), {se:.3f} points, over B "
                      f"builds of S seeds each, with the last design above (the interval is over builds):", "",
                      "| builds B | seeds per build S | core-seconds |", "|---|---|---|"]
            target = se * se
            v, c = variance(designs[-1], max(var_train, 0.0), noise), cost(designs[-1], t)
            for b in (3, 5, 8, 10, 15, 20, 30):
                rest = target - args.var_build / b
                if rest <= 0:
                    lines.append(f"| {b} | none reaches it (var_build / B alone is above it) | - |")
                    continue
                s = max(1, math.ceil(v / (b * rest)))
                lines.append(f"| {b} | {s} | {b * (args.build_seconds + s * c):.0f} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
