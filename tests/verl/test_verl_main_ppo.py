"""verl's own trainer with TRACE, end to end on CPU: `python -m verl.trainer.main_ppo` as a user runs it.

Real, all of it: verl's entry point and its V1 synchronous trainer (through `trainer_mode=tracerl_sync`, which adds
TRACE's metrics to verl's), Ray (loopback), TransferQueue, verl's FSDP2 actor on gloo (old log-probs and the update),
its checkpoint save and resume, `TraceAgentLoopManager` with `algorithm.adv_estimator=tracerl_tree`, and the
`tracerl_hf` rollout server with verl's weight sync into it; the policy is the tests' tiny embedded multihop policy
(warm-started, so its trees are mixed), saved in Hugging Face format with its tokenizer.

A slow machine: each run has a hard limit (`LIMIT_S`, about four times what the quiet 2-core machine needs) after
which its whole process group and every Ray process of its own temporary folder are killed, so a hung worker fails
the test instead of hanging CI.
"""

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

from helpers import TINY_POLICY  # noqa: E402

from tracerl.integrations.verl_plugin import cpu_overrides, domain_overrides  # noqa: E402
from tracerl.integrations.verl_plugin.launch import console_metrics, metric_value, run_main_ppo  # noqa: E402
from tracerl.policy.embedded import build_embedded, weights_hash  # noqa: E402
from tracerl.policy.embedded_config import EmbeddedConfig  # noqa: E402

LIMIT_S = 420
SYNC = re.compile(r"tracerl_hf: replica 0 sync \d+ at step (\d+): weights ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The tiny embedded policy as a model folder verl loads, its world's rows as verl parquet files, and the
    `tracerl.domain_options` that give the workers the same world."""
    import pandas as pd

    root = tmp_path_factory.mktemp("main-ppo")
    config = EmbeddedConfig(**TINY_POLICY)
    policy = build_embedded(config, root / "cache")
    policy.model.save_pretrained(root / "model")
    policy.tokenizer.save_pretrained(root / "model")
    pd.DataFrame(policy.domain.rows("train", 16, seed=1)).to_parquet(root / "train.parquet")
    pd.DataFrame(policy.domain.rows("test", 8, seed=1)).to_parquet(root / "test.parquet")
    world = domain_overrides(config.domain_options())
    return {"root": root, "world": world, "config": config}


def main_ppo(task, steps: int, log: Path) -> tuple[int, str]:
    """verl's entry point (`run_main_ppo`: its own process group, killed with its Ray processes past LIMIT_S),
    `steps` training steps, a checkpoint every 2; (exit code, output)."""
    root = task["root"]
    args = [f"data.train_files={root}/train.parquet", f"data.val_files={root}/test.parquet",
            "data.train_batch_size=8", "data.max_prompt_length=512", "data.max_response_length=512",
            "data.return_raw_chat=True", "data.dataloader_num_workers=0",
            f"actor_rollout_ref.model.path={root}/model", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=512", "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.TraceAgentLoopManager",
            "algorithm.adv_estimator=tracerl_tree", "algorithm.use_kl_in_reward=False",
            "+tracerl.method=trace", "+tracerl.domain=multihop", "+tracerl.max_turns=4",
            "+tracerl.max_tokens_per_turn=40", "+tracerl.max_tokens_per_rollout=400",
            "+tracerl.allocation.m_min=2", "+tracerl.allocation.m_max=6", *task["world"],
            *cpu_overrides(),
            f"trainer.total_training_steps={steps}", "trainer.save_freq=2", "trainer.test_freq=-1",
            "trainer.val_before_train=False", 'trainer.logger=["console"]', "trainer.project_name=tracerl",
            "trainer.experiment_name=main-ppo", f"trainer.default_local_dir={root}/checkpoints"]
    env = {"TRACERL_ROLLOUT_WEIGHTS_HASH": "1", "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    code = run_main_ppo(args, log, cwd=root, limit_s=LIMIT_S, env=env)
    return code, log.read_text(errors="replace")


@pytest.fixture(scope="module")
def runs(task):
    """Two steps with a checkpoint at step 2, then verl resumes from it for a third."""
    first = main_ppo(task, 2, task["root"] / "first.log")
    assert first[0] == 0, f"main_ppo failed (exit {first[0]}); the end of its output:\n{first[1][-6000:]}"
    second = main_ppo(task, 3, task["root"] / "resumed.log")
    assert second[0] == 0, f"the resumed main_ppo failed (exit {second[0]}):\n{second[1][-6000:]}"
    return {"first": first[1], "resumed": second[1]}


def test_two_steps_train_through_verls_actor_with_tree_advantages(runs):
    logged = console_metrics(runs["first"])
    assert sorted(logged) == [1, 2]
    advantages = [max(abs(metric_value(m["critic/advantages/max"])),
                      abs(metric_value(m["critic/advantages/min"])))
                  for m in logged.values()]
    assert max(advantages) > 0, "every tree advantage was zero: no step had a mixed tree"
    moved = [metric_value(m["actor/grad_norm"]) for m, a in zip(logged.values(), advantages) if a > 0]
    assert all(g > 0 for g in moved), f"a step with nonzero advantages had no gradient: {moved}"


def test_traces_metrics_reach_verls_logged_metrics(runs):
    """What stage 1 planned and what the trees spent, in the dict verl's trackers receive (its console logger)."""
    for metrics in console_metrics(runs["first"]).values():
        assert metric_value(metrics["alloc/planned_units_root"]) > 0
        assert metric_value(metrics["alloc/num_prompts"]) >= 1
    assert "alloc/units_root" in console_metrics(runs["first"])[2], \
        "the first batch's spend is logged at the next step"


def test_the_rollout_server_serves_the_actors_weights(runs, task):
    """After each step's update verl syncs the actor into the rollout server: what the server holds after step 2
    is the actor's step-2 checkpoint bit for bit, the weights moved, and the resumed run loads that same state."""
    syncs = SYNC.findall(runs["first"])
    assert [int(s) for s, _ in syncs] == [0, 1, 2], syncs
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(task["root"] / "checkpoints" / "global_step_2" / "actor" /
                                                 "huggingface", dtype="float32")
    assert syncs[2][1] == weights_hash(saved), "the server's weights after step 2 differ from the actor's"
    assert syncs[0][1] != syncs[2][1], "two updates at lr 1e-3 left the weights unchanged"
    resumed = SYNC.findall(runs["resumed"])
    assert resumed[0] == ("2", syncs[2][1]), "the resumed run did not start from the step-2 checkpoint"


def test_verl_resumes_from_its_checkpoint(runs):
    logged = console_metrics(runs["resumed"])
    assert sorted(logged) == [3], f"the resumed run trained steps {sorted(logged)}, not only step 3"
    assert (metric_value(logged[3]["training/global_step"])) == 3
