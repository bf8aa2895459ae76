"""One TRACE training step on the math domain (configs/math.toml) of a local model, timed by phase.

The step is `tracerl.train.trainer.Trainer.train_step`, the one `tracerl train` runs: candidate pool -> predictor ->
stage 1 -> bare rollouts (ReAct driver, sandboxed Python tool) -> stage 2 continuations -> rewards -> predictor
update -> advantages -> clipped policy update. The config is `configs/math.toml` with `--set` overrides, loaded by
`tracerl.train.config.load_config` exactly as `tracerl train --config configs/math.toml --set ...` loads it.

Reported: seconds to build the trainer (model, tokenizer, data), the step's phases from its metrics row (the same
row `<run>/metrics.jsonl` holds: `sys/rollout_seconds`, `sys/alloc_seconds` (prediction, allocation and predictor
update), `sys/train_seconds` (policy update and weight sync), the rest of `sys/step_seconds`), rollout and policy
tokens, the engine's generated tokens/s over the rollout phase and its KV-reuse hit rate, and peak GPU memory
(torch's allocator) when the model is on a GPU.

Device: `--device cuda` sets `policy.device=cuda`. The script reports the device the model's parameters actually
sit on, so a CPU figure is never labelled as a GPU one (and says so if an older `PolicyConfig` lacks `device`).

`--host-profile FILE` runs the step under cProfile and writes where its host time went, function by function: on a
GPU the transformers engine is host-bound (`benchmarks/gpu/README.md`), so this is the profile that explains a
step's rollout seconds.

What it does not do: held-out evaluation (`tracerl train` evaluates before and after training, which would dwarf
one step), more than one step, or any quality measure (one step of a random or barely trained model).

    python benchmarks/gpu/train_step_math.py --device cpu                      # smoke: tiny random model
    python benchmarks/gpu/train_step_math.py --model models/Qwen3-0.6B --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from gpu_bench_common import (add_random_model_arg, check_device, device_name, host_profiled, model_dir_for,
                              model_label, quiet_transformers, software_versions)

MATH_PRESET = Path(__file__).resolve().parents[2] / "configs" / "math.toml"
# A step the tiny random model finishes in seconds; a real model runs the preset as it is. The KL term makes the
# update train every tree: a random model fails every rollout, so all advantages are zero and, without a KL term,
# the trainer skips the backward pass the smoke run is there to exercise.
SMOKE_OVERRIDES = ("allocation.num_prompts=4", "allocation.rollouts_per_prompt=2", "allocation.pool_factor=2",
                   "data.num_train_prompts=32", "data.max_turns=3", "data.max_tokens_per_turn=32",
                   "data.max_tokens_per_rollout=256", "run.eval_prompts=2", "optim.lr=1e-3", "optim.kl_coef=0.01")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local Hugging Face model directory, e.g. models/Qwen3-0.6B (default: a tiny "
                                   "random Qwen3 and a small step, for a smoke run)")
    add_random_model_arg(p)
    p.add_argument("--device", default="cuda", help="where the trainer should hold the model: cuda or cpu")
    p.add_argument("--config", default=str(MATH_PRESET), help="preset file (default: configs/math.toml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as tracerl train --set does (repeatable; applied last)")
    p.add_argument("--out", help="run directory to keep (default: a temporary one, removed afterwards)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (run.num_threads; 0: torch's default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown table")
    p.add_argument("--host-profile", metavar="FILE",
                   help="run the step under cProfile and write its Python functions by own and cumulative time to "
                        "FILE (where a host-bound step's seconds go; the phases' times then include cProfile's "
                        "overhead)")
    return p.parse_args(argv)


def policy_has_device_setting() -> bool:
    from tracerl.train.config import PolicyConfig

    return "device" in {f.name for f in dataclasses.fields(PolicyConfig)}


def config_overrides(args: argparse.Namespace, model_dir: str, out_dir: str) -> tuple[list[str], str | None]:
    """The `--set` list for this run, and a note when the device cannot be set."""
    overrides = [f"policy.model={model_dir}", "data.domain=math", f"run.out_dir={out_dir}", "run.num_steps=1",
                 "run.tensorboard=false", "run.progress=false", f"run.num_threads={args.threads}"]
    if args.model is None and args.random_model is None:
        overrides += SMOKE_OVERRIDES
    note = None
    if policy_has_device_setting():
        overrides.append(f"policy.device={args.device}")
    elif args.device != "cpu":
        note = (f"this tracerl's PolicyConfig has no `device` field: the trainer holds the model on the CPU, so "
                f"--device {args.device} cannot take effect and the figures below are CPU figures")
    return overrides + list(args.set), note


def run(args: argparse.Namespace) -> dict:
    import torch

    from tracerl.train.config import load_config
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import Trainer

    check_device(args.device)
    quiet_transformers()
    with tempfile.TemporaryDirectory(prefix="tracerl-train-step-") as tmp:
        model_dir = model_dir_for(args, tmp)
        out_dir = args.out or str(Path(tmp) / "run")
        if (Path(out_dir) / "metrics.jsonl").exists():
            raise SystemExit(f"--out {out_dir} already holds a run (metrics.jsonl); choose another directory")
        overrides, note = config_overrides(args, model_dir, out_dir)
        if note:
            print(f"train_step_math: {note}", file=sys.stderr)
        try:
            config = load_config(args.config, overrides)
        except ValueError as err:
            raise SystemExit(f"train_step_math: {err}") from None
        t0 = time.perf_counter()
        try:
            trainer = Trainer(config, load_policy(config))
        except ValueError as err:  # a model that does not load, a domain without its extra: the message names the fix
            raise SystemExit(f"train_step_math: {err}") from None
        build_seconds = time.perf_counter() - t0
        try:
            param = next(trainer.model.parameters())
            on_gpu = param.device.type == "cuda"
            if on_gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            engine_before = dict(getattr(trainer.engine, "stats", {}))
            with host_profiled(args.host_profile):
                row = trainer.train_step()
            peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
            engine = {k: v - engine_before.get(k, 0) for k, v in getattr(trainer.engine, "stats", {}).items()
                      if isinstance(v, int)}
        finally:
            trainer.close()
            trainer.log.close()
        metrics_file = str(Path(out_dir) / "metrics.jsonl") if args.out else None
    step, rollout, alloc, train = (row[f"sys/{k}_seconds"] for k in ("step", "rollout", "alloc", "train"))
    generated = engine.get("generated_tokens")
    requested = engine.get("prefill_tokens_computed", 0) + engine.get("prefill_tokens_reused", 0)
    return {
        "model": model_label(args),
        "num_parameters": sum(p.numel() for p in trainer.model.parameters()),
        "requested_device": args.device, "model_device": str(param.device),
        "dtype": str(param.dtype).removeprefix("torch."), "precision": config.policy.precision,
        "device": device_name(str(param.device)), "device_note": note,
        "config": {"method": config.method, "num_prompts": config.allocation.num_prompts,
                   "rollouts_per_prompt": config.allocation.rollouts_per_prompt,
                   "budget_units": config.allocation.budget, "max_turns": config.data.max_turns,
                   "max_tokens_per_turn": config.data.max_tokens_per_turn,
                   "micro_batch_rollouts": config.optim.micro_batch_rollouts, "overrides": overrides},
        "seconds": {"build": build_seconds, "step": step, "rollout": rollout, "alloc": alloc, "train": train,
                    "other": step - rollout - alloc - train},
        "tokens": {"num_prompts_sampled": row["alloc/num_prompts"], "rollout_tokens": row["rollout/tokens"],
                   "policy_tokens_trained": row["train/num_policy_tokens"],
                   "generated_tokens": generated, "num_rollouts": row["rollout/num_rollouts"]},
        "generated_tokens_per_rollout_s": generated / rollout if generated and rollout > 0 else None,
        "kv_reuse_hit_rate": engine.get("prefill_tokens_reused", 0) / requested if requested else None,
        "peak_gpu_memory_gib": peak,
        "num_trained_trees": row.get("train/num_trained_trees"), "pg_loss": row.get("train/pg_loss"),
        "success_rate": row["rollout/success_rate"],
        "metrics_file": metrics_file,
        "versions": software_versions(),
    }


def to_markdown(result: dict) -> str:
    s, t = result["seconds"], result["tokens"]
    c = result["config"]
    lines = [f"model: {result['model']} ({result['num_parameters']:,} parameters, {result['dtype']} weights, "
             f"{result['precision']} compute) on "
             f"{result['model_device']}: {result['device']}"]
    if result["device_note"]:
        lines.append(f"NOTE: {result['device_note']}")
    lines += [f"step: {c['method']}, budget {c['budget_units']:.0f} units (a uniform method's {c['num_prompts']} "
              f"prompts x {c['rollouts_per_prompt']} rollouts), up to {c['max_turns']} turns of "
              f"{c['max_tokens_per_turn']} tokens", "",
              "| phase | seconds |", "|---|---|"]
    lines += [f"| {name} | {s[key]:.2f} |" for name, key in (
        ("build trainer (model, tokenizer, data)", "build"), ("rollouts (bare + continuations)", "rollout"),
        ("prediction, allocation, predictor update", "alloc"), ("policy update", "train"),
        ("rest of the step (rewards, advantages, trees)", "other"), ("whole step", "step"))]
    rate = result["generated_tokens_per_rollout_s"]
    hit = result["kv_reuse_hit_rate"]
    peak = result["peak_gpu_memory_gib"]
    lines += ["", (f"tokens: {t['num_prompts_sampled']} prompts sampled, {t['num_rollouts']} rollouts, "
                   f"{t['rollout_tokens']:,} rollout tokens, "
                   f"{t['generated_tokens'] or 0:,} generated ({'-' if rate is None else f'{rate:,.0f}'} tokens/s over "
                   f"the rollout phase, KV-reuse hit rate {'-' if hit is None else f'{hit:.3f}'}), "
                   f"{t['policy_tokens_trained']:,.0f} policy tokens in {result['num_trained_trees'] or 0:.0f} "
                   f"trained trees; peak GPU memory "
                   f"{'-' if peak is None else f'{peak:.2f} GiB'}; torch {result['versions']['torch']}")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=1) if args.json else to_markdown(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
