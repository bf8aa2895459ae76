"""Does a method's step point up the held-out success? One checkpoint, each method's batches, one reference gradient.

`tracerl bench alignment RUN_DIR` loads the latest checkpoint of a training run (weights, optimizer, predictor,
sampler state) and, from that one state, lets each method draw `draws` independent steps exactly as the trainer
would take its next one (draw d is the step the run would take after skipping d pools, with step index + d).
Each draw's batch gives the trainer's loss gradient g and the update u that the optimizer, in the checkpoint's state,
would apply; neither is kept (the state is restored before every draw). The reference is the trainer's loss on a
large batch of held-out questions (test split, `reference_prompts` x `reference_samples`, Dr. GRPO advantages
r - group mean): minus its gradient, a, is the direction that raises held-out success, to first order.

Per draw: cos(-g, a) (how well the batch's gradient points up the held-out success), cos(u, a) (the same for the
update the optimizer makes of it) and <u, a> / |a| (how far the update moves along a), beside the batch's sampled
tokens and informative rollouts. The reference is computed in two halves on disjoint questions; cos(a_1, a_2) says
how much of it is signal: every method's cosines are shrunk by the same reference noise, so they compare with each
other but are not the cosine with the true gradient (docs/design.md, section 3, "Measuring a step's direction").
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.stats import seed_mean

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class AlignmentConfig:
    draws: int = 8  # steps each method draws from the checkpoint's state
    reference_prompts: int = 256  # held-out questions of the reference gradient (two halves of disjoint questions)
    reference_samples: int = 8  # rollouts per reference question
    reference_seed: int = 7919  # its questions and sampling seed (another draw than the run's evaluation questions)

    def __post_init__(self) -> None:
        if self.draws < 2 or self.reference_prompts < 4 or self.reference_samples < 2:
            raise ValueError(f"alignment needs draws >= 2, reference_prompts >= 4 and reference_samples >= 2 "
                             f"(an interval over draws, two halves, a group per question); got {self}")


def _flat(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(params).detach().double()


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0


def _trainer(run_config: dict[str, Any], method: str, out: Path, overrides: Sequence[str]):
    from tracerl.train.config import load_config
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import Trainer

    sets = [f"method={method}", *overrides, f"run.out_dir={out}", "run.tensorboard=false", "run.save_trees=false",
            "run.progress=false"]
    config = load_config(base=copy.deepcopy(run_config), overrides=sets)
    return Trainer(config, load_policy(config))


def _reference(trainer, cfg: AlignmentConfig, say: Say) -> tuple[torch.Tensor, float, dict[str, float]]:
    """Minus the gradient of the trainer's loss on held-out questions (Dr. GRPO advantages): two halves of
    disjoint questions, combined with their token shares. Returns (a, cos of the halves, facts)."""
    rows = trainer.policy.domain.rows("test", cfg.reference_prompts, seed=cfg.reference_seed)
    if len(rows) < 4:
        raise ValueError(f"the domain's test split gave {len(rows)} questions; the reference needs at least 4")
    say(f"reference: {len(rows)} held-out questions x {cfg.reference_samples} rollouts")
    trees, sampled = trainer.rollouts(rows, cfg.reference_samples, seed=cfg.reference_seed)
    advantages = compute_advantages("grpo", trees, AdvantageConfig(norm_by_std=False))
    half = len(trees) // 2
    parts, totals = [], []
    for part in (slice(0, half), slice(half, len(trees))):
        gradient, total = trainer.gradient(trees[part], advantages[part])
        parts.append(-gradient)
        totals.append(total)
    a = (parts[0] * totals[0] + parts[1] * totals[1]) / sum(totals)
    if not float(a.norm()) > 0:
        raise ValueError(f"the reference batch ({len(rows)} questions x {cfg.reference_samples}) has no question with "
                         "both outcomes, so no direction to measure against; raise reference_prompts or "
                         "reference_samples")
    success = float(np.mean([tree.rewards().mean() for tree in trees]))
    mixed = float(np.mean([tree.mixed()[0] for tree in trees]))
    return a, _cos(parts[0], parts[1]), {"reference_success": success, "reference_mixed": mixed,
                                         "reference_sampled_tokens": int(sampled), "reference_questions": len(rows)}


def _draws(trainer, state: dict[str, Any], cfg: AlignmentConfig, a: torch.Tensor) -> list[dict[str, float]]:
    """Each draw from the checkpoint's `state` (a `Trainer.snapshot` with the checkpoint's sampler, step and totals):
    the step the run would take after skipping d pools."""
    from tracerl.train.policy import trainable_parameters

    params = list(trainable_parameters(trainer.model))
    unit = a / a.norm()
    rows = []
    for d in range(cfg.draws):
        trainer.restore(state)  # the moments are the run's; the optimizer's settings this entry's own
        start = _flat(params)
        trainer.skip_steps(d)
        step = trainer.sample_step()
        g, _ = trainer.gradient(step.trees, step.advantages)
        trainer.apply_gradient()
        u = _flat(params) - start
        rows.append({"cos_gradient": _cos(-g, a), "cos_update": _cos(u, a), "along": float(u @ unit),
                     "update_norm": float(u.norm()), "sampled_tokens": float(step.ledger.tokens_spent),
                     "units": float(step.ledger.units_spent),
                     "informative_rollouts": float(step.counts["num_informative_rollouts"]),
                     "rollouts": float(step.counts["num_leaves"]), "g": g})
    return rows  # the trainer is left after its last draw: the caller closes it


def _interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95% Student t interval over checkpoints (nan bounds from one)."""
    s = seed_mean(values)
    return s.mean, s.lo, s.hi


def run(run_dir: str | Path, methods: Sequence[str | tuple[str, str, Sequence[str]]],
        cfg: AlignmentConfig = AlignmentConfig(), overrides: Sequence[str] = (), say: Say = print) -> dict[str, Any]:
    """Measure every method's draws from `run_dir`'s latest checkpoint against one reference (module docstring).

    `methods`: preset names, or (label, preset, overrides) entries as `tracerl.train.compare.parse_entries` gives
    them (a variant such as grpo[allocation.num_prompts=32;allocation.rollouts_per_prompt=4]); `overrides` apply to
    every entry (before its own)."""
    from tracerl.core.methods import get_method
    from tracerl.engines import torch_threads
    from tracerl.policy.embedded import weights_hash
    from tracerl.train import checkpoint
    from tracerl.train.checkpoint import read_json

    entries = [(m, m, []) if isinstance(m, str) else (m[0], m[1], list(m[2])) for m in methods]
    run_dir = Path(run_dir)
    config_path = run_dir / checkpoint.CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{run_dir} has no {checkpoint.CONFIG_FILE}: point at a training run's directory")
    run_config = read_json(config_path)
    with tempfile.TemporaryDirectory(prefix="tracerl-alignment-") as tmp:
        loader = _trainer(run_config, run_config.get("method", "trace"), Path(tmp) / "loader", overrides)
        with torch_threads(loader.config.run.num_threads):
            state = loader.load_checkpoint(run_dir)  # the predictor is the sampler's
            if state is None:
                raise ValueError(f"{run_dir} has no checkpoint yet; train at least one step first")
            steered = [label for label, method, _ in entries if get_method(method).predictor != "none"]
            if steered and state["sampler"].get("predictor") is None:
                raise ValueError(f"{', '.join(steered)} steer by a predictor, and {run_dir} was trained without one "
                                 f"(method {run_config.get('method')}); measure them from the checkpoint of a run "
                                 "that has one (pcl, trace)")
            say(f"checkpoint of {run_dir} at step {state['step']}, weights {weights_hash(loader.model)[:12]}")
            a, halves, facts = _reference(loader, cfg, say)
            result: dict[str, Any] = {"run_dir": str(run_dir), "step": int(state["step"]),
                                      "weights": weights_hash(loader.model), "reference_halves_cos": halves,
                                      **facts, "config": dataclasses.asdict(cfg), "methods": {}}
            start = {**loader.snapshot(), **state}  # the checkpoint's weights and moments, sampler, step and totals
            for i, (label, method, own) in enumerate(entries):
                trainer = _trainer(run_config, method, Path(tmp) / f"entry{i}", [*overrides, *own])
                say(f"{label}: {cfg.draws} draws")
                try:
                    rows = _draws(trainer, start, cfg, a)  # each loads the run's sampler state, predictor included
                finally:
                    trainer.close()
                gradients = [r.pop("g") for r in rows]
                pairwise = [_cos(gradients[i], gradients[j])
                            for i in range(len(gradients)) for j in range(i + 1, len(gradients))]
                result["methods"][label] = {"draws": rows, "gradient_pairwise_cos": float(np.mean(pairwise))}
            loader.close()
    return result


MEASURES = (("cos_gradient", "cos(-g, a)"), ("cos_update", "cos(u, a)"), ("along", "<u, a>/|a|"),
            ("along_per_ktoken", "<u, a>/|a| per 1k sampled tokens"))


def summarize(results: Sequence[dict[str, Any]], baseline: str = "grpo") -> dict[str, Any]:
    """Per checkpoint, each method's mean over its draws; then over checkpoints (seeds), mean and t interval, and
    each method minus `baseline` paired by checkpoint."""
    methods = list(results[0]["methods"])
    per_seed = {m: {key: [float(np.mean([d[key] for d in r["methods"][m]["draws"]])) for r in results]
                    for key in ("cos_gradient", "cos_update", "along", "update_norm", "sampled_tokens",
                                "informative_rollouts", "rollouts")} for m in methods}
    for m in methods:  # the gain along a per sampled token: a checkpoint's mean gain over its mean tokens per draw
        per_seed[m]["along_per_ktoken"] = [1e3 * a / t
                                           for a, t in zip(per_seed[m]["along"], per_seed[m]["sampled_tokens"])]
    out: dict[str, Any] = {"num_checkpoints": len(results), "methods": {}, "differences": {},
                           "reference_halves_cos": [r["reference_halves_cos"] for r in results]}
    for m in methods:
        out["methods"][m] = {key: _interval(values) for key, values in per_seed[m].items()}
        out["methods"][m]["gradient_pairwise_cos"] = _interval(
            [r["methods"][m]["gradient_pairwise_cos"] for r in results])
    if baseline in methods:
        for m in methods:
            if m != baseline:
                out["differences"][m] = {key: _interval(np.subtract(per_seed[m][key], per_seed[baseline][key]))
                                         for key, _ in MEASURES}
    out["baseline"] = baseline
    out["per_seed"] = per_seed
    return out


def to_markdown(results: Sequence[dict[str, Any]], baseline: str = "grpo") -> str:
    s = summarize(results, baseline)
    n = s["num_checkpoints"]
    unit = "checkpoint" if n == 1 else "checkpoints (seeds)"

    def fmt(x: tuple[float, float, float], digits: int = 3) -> str:
        mean, lo, hi = x
        return f"{mean:+.{digits}f}" if math.isnan(lo) else f"{mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"

    first = results[0]
    lines = [f"Step direction from {n} {unit}: " + ", ".join(f"`{r['run_dir']}` step {r['step']} "
                                                               f"(weights {r['weights'][:12]})" for r in results),
             "",
             f"Reference: {first['reference_questions']} held-out questions x {first['config']['reference_samples']} "
             f"rollouts per checkpoint (success {np.mean([r['reference_success'] for r in results]):.1%}, mixed "
             f"{np.mean([r['reference_mixed'] for r in results]):.1%}); cos between its two halves "
             + ", ".join(f"{c:.3f}" for c in s["reference_halves_cos"]) + ".",
             "",
             "| method | draws | sampled tokens / draw | informative rollouts / draw | cos(-g, a) | cos(u, a) | "
             "<u, a>/\\|a\\| (x1e-3) | per 1k sampled tokens (x1e-3) | \\|u\\| (x1e-3) | "
             "cos between draws' gradients |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m, row in s["methods"].items():
        draws = first["methods"][m]["draws"]
        lines.append(f"| {m} | {len(draws)} x {n} | {row['sampled_tokens'][0]:,.0f} | "
                     f"{row['informative_rollouts'][0]:.1f} of {row['rollouts'][0]:.1f} | {fmt(row['cos_gradient'])} | "
                     f"{fmt(row['cos_update'])} | {fmt(tuple(1e3 * v for v in row['along']), 2)} | "
                     f"{fmt(tuple(1e3 * v for v in row['along_per_ktoken']))} | "
                     f"{1e3 * row['update_norm'][0]:.2f} | {fmt(row['gradient_pairwise_cos'])} |")
    if s["differences"]:
        lines += ["", f"| method minus {baseline}, paired by {unit} | cos(-g, a) | cos(u, a) | "
                      "<u, a>/\\|a\\| (x1e-3) | per 1k sampled tokens (x1e-3) |",
                  "|---|---|---|---|---|"]
        for m, d in s["differences"].items():
            lines.append(f"| {m} | {fmt(d['cos_gradient'])} | {fmt(d['cos_update'])} | "
                         f"{fmt(tuple(1e3 * v for v in d['along']), 2)} | "
                         f"{fmt(tuple(1e3 * v for v in d['along_per_ktoken']))} |")
    lines += ["", "a: minus the gradient of the trainer's loss on the reference batch (the direction that raises "
              "held-out success, to first order); g: a draw's loss gradient; u: the update the optimizer, in the "
              "checkpoint's state, makes of it; per 1k sampled tokens: a checkpoint's mean <u, a>/|a| over its mean "
              "sampled tokens per draw. Means over draws, then over checkpoints; intervals are 95% Student t over "
              + ("checkpoints." if n > 1 else "nothing (one checkpoint: no interval).")]
    return "\n".join(lines) + "\n"
