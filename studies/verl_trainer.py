"""verl's trainer and tracerl's on the same start, the same questions and the same budget: does TRACE learn through
verl's `main_ppo` as it does through `tracerl train`?

Run in `.venv-verl` (verl 0.9.1 with the `verl` extra): `python studies/verl_trainer.py OUT [--steps 24]`. It
1. builds (or loads from the cache) the embedded multihop policy of the main job (`EmbeddedConfig()`), saves it in
   Hugging Face format with its tokenizer, and writes the training rows and the held-out rows `tracerl train` uses
   (`rows("train", 4000, seed=0)`, `rows("test", 256, seed=0)`) as verl parquet files;
2. runs `tracerl train` with the main job's settings (`trace`, 16 prompts x 8 rollouts, 24 steps, lr 5e-4);
3. runs verl's `main_ppo` on the CPU platform (`tracerl.integrations.verl_plugin`) with TRACE's manager, the same
   batch, steps, learning rate and allocation defaults, one update per step, saving the actor in Hugging Face
   format at the end;
4. evaluates the start, tracerl's final model and verl's final model with tracerl's evaluator on the same 256
   held-out questions x 4 samples, coupled (the same random numbers for every policy), and writes `result.json`
   and `result.md`: each trainer's gain with a paired 95% t interval over questions, and the difference.
Each part is skipped when its output exists, so a killed run resumes. What differs between the trainers is listed
in `result.md` (and docs/verl.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tracerl.core.stats import t_half_width
from tracerl.integrations.verl_plugin import cpu_overrides, domain_overrides
from tracerl.integrations.verl_plugin.launch import run_main_ppo
from tracerl.policy.embedded import build_embedded
from tracerl.policy.embedded_config import EmbeddedConfig
from tracerl.policy.evaluation import evaluate_rows

PROMPTS, ROLLOUTS, LR, EVAL_PROMPTS, EVAL_SAMPLES = 16, 8, 5e-4, 256, 4
VERL_LIMIT_S = 4 * 3600  # verl's run (24 steps took about 11 minutes) is killed with its Ray processes past this
DIFFERENCES = [
    "stage 1's candidate pool: tracerl draws a pool of prompts larger than the batch (allocation.pool_factor); "
    "verl's batch is the pool (pool_factor 1)",
    "the loss and its precision: verl's PPO loss (token-mean aggregation, clip 0.2, gradient clip 1.0) on its FSDP2 "
    "actor, which computes in bfloat16 (fsdp mixed precision param_dtype bf16) over float32 master weights; "
    "tracerl's loss (train/loss.py: token-mean, clip 0.2 / 0.28, gradient clip 1.0) in float32; one AdamW update "
    "per step in both",
    "data order: verl shuffles its dataset with its own seed; tracerl draws its pools from the same rows in its "
    "own order",
    "generation: verl's rollouts come from the tracerl_hf server, one request at a time; tracerl batches its "
    "rollouts (the same engine code)",
]


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def prepare(out: Path, cache: Path) -> tuple[EmbeddedConfig, list[dict]]:
    import pandas as pd

    config = EmbeddedConfig()
    policy = build_embedded(config, cache, progress=say)
    test_rows = policy.domain.rows("test", EVAL_PROMPTS, seed=0)
    if not (out / "model" / "config.json").exists():
        policy.model.save_pretrained(out / "model")
        policy.tokenizer.save_pretrained(out / "model")
        pd.DataFrame(policy.domain.rows("train", 4000, seed=0)).to_parquet(out / "train.parquet")
        pd.DataFrame(test_rows).to_parquet(out / "test.parquet")
    return config, test_rows


def run_tracerl(out: Path, cache: Path, steps: int) -> Path:
    run = out / "tracerl"
    final = run / "checkpoints" / f"step-{steps:06d}" / "model.pt"
    if not final.exists():
        say(f"tracerl train: {steps} steps")
        subprocess.run([sys.executable, "-m", "tracerl.cli", "train", "--set", f"run.out_dir={run}",
                        "--set", f"policy.cache_dir={cache}", "--set", f"run.num_steps={steps}",
                        "--set", f"optim.lr={LR}", "--set", "run.tensorboard=false"], check=True)
    return final


def run_verl(out: Path, config: EmbeddedConfig, steps: int) -> Path:
    hf = out / "verl" / f"global_step_{steps}" / "actor" / "huggingface"
    if (hf / "config.json").exists():
        return hf
    limits = config.limits()
    world = domain_overrides(config.domain_options())
    args = [f"data.train_files={out}/train.parquet", f"data.val_files={out}/test.parquet",
            f"data.train_batch_size={PROMPTS}", "data.max_prompt_length=1024", "data.max_response_length=2048",
            "data.return_raw_chat=True", "data.dataloader_num_workers=0",
            f"actor_rollout_ref.model.path={out}/model", f"actor_rollout_ref.actor.optim.lr={LR}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
            f"actor_rollout_ref.rollout.n={ROLLOUTS}", "actor_rollout_ref.rollout.prompt_length=1024",
            "actor_rollout_ref.rollout.response_length=2048", "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.TraceAgentLoopManager",
            "algorithm.adv_estimator=tracerl_tree", "algorithm.use_kl_in_reward=False",
            "+tracerl.method=trace", "+tracerl.domain=multihop", f"+tracerl.max_turns={limits.max_turns}",
            f"+tracerl.max_tokens_per_turn={limits.max_tokens_per_turn}",
            f"+tracerl.max_tokens_per_rollout={limits.max_tokens_per_rollout}", *world,
            *cpu_overrides(),
            f"trainer.total_training_steps={steps}", f"trainer.save_freq={steps}", "trainer.test_freq=-1",
            "trainer.val_before_train=False", 'trainer.logger=["console"]', "trainer.project_name=tracerl",
            "trainer.experiment_name=verl-trainer", f"trainer.default_local_dir={out}/verl"]
    say(f"verl main_ppo: {steps} steps")
    code = run_main_ppo(args, out / "verl.log", cwd=out, limit_s=VERL_LIMIT_S)
    if code != 0:
        raise SystemExit(f"verl main_ppo failed (exit {code}); its output: {out / 'verl.log'}")
    return hf


def evaluate(model: torch.nn.Module, config: EmbeddedConfig, policy, rows: list[dict]) -> np.ndarray:
    result = evaluate_rows(model, policy.renderer, policy.domain, config.limits(), rows, EVAL_SAMPLES, 1.0, seed=0,
                           coupled=True)
    return np.asarray(result["eval/per_prompt"], dtype=float)


def paired_interval(differences: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the paired 95% t interval over questions."""
    mean, half = float(differences.mean()), t_half_width(list(differences))
    return mean, mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    config, rows = prepare(out, cache)
    tracerl_final = run_tracerl(out, cache, args.steps)
    verl_final = run_verl(out, config, args.steps)
    from transformers import AutoModelForCausalLM

    policy = build_embedded(config, cache)
    say("evaluating the start, tracerl's final model and verl's final model")
    start = evaluate(policy.model, config, policy, rows)
    tracerl_model = build_embedded(config, cache).model
    tracerl_model.load_state_dict(torch.load(tracerl_final, map_location="cpu", weights_only=True))
    after_tracerl = evaluate(tracerl_model, config, policy, rows)
    after_verl = evaluate(AutoModelForCausalLM.from_pretrained(verl_final, dtype=torch.float32).eval(), config,
                          policy, rows)
    rows_out = {"start": float(start.mean()), "tracerl": float(after_tracerl.mean()), "verl": float(after_verl.mean())}
    gains = {"tracerl train - start": paired_interval(after_tracerl - start),
             "verl main_ppo - start": paired_interval(after_verl - start),
             "verl - tracerl": paired_interval(after_verl - after_tracerl)}
    result = {"success": rows_out, "intervals": {k: list(v) for k, v in gains.items()}, "steps": args.steps,
              "questions": len(rows), "samples": EVAL_SAMPLES, "differences": DIFFERENCES}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    lines = [f"# TRACE through verl's main_ppo and through tracerl train ({args.steps} steps, {PROMPTS} x {ROLLOUTS}, "
             f"lr {LR})", "", f"Held-out success on {len(rows)} questions x {EVAL_SAMPLES} (coupled): start "
             f"{100 * rows_out['start']:.1f}%, tracerl {100 * rows_out['tracerl']:.1f}%, verl "
             f"{100 * rows_out['verl']:.1f}%.", "", "| difference | points [95% paired t interval over questions] |",
             "|---|---|"]
    lines += [f"| {k} | {100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] |" for k, (m, lo, hi) in gains.items()]
    lines += ["", "What differs between the two trainers:", ""] + [f"- {d}" for d in DIFFERENCES]
    (out / "result.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
