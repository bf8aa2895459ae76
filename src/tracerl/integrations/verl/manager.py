"""The TRACE agent-loop manager for verl V1 and the `tracerl_tree` advantage estimator.

Select it with
`+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.TraceAgentLoopManager`
(verl's `TaskRunnerV1` imports this module in the trainer's process, which also registers the estimator there).

Per training batch `generate_sequences`
1. flushes the coordinator: the predictor is scored on, then updated from, the previous batch's trees, and their
   spend and measures are computed (`alloc/units_root`, `alloc/units_prefix`, `alloc/tokens_*`,
   `alloc/effective_ratio`, ...: what the previous batch spent);
2. predicts each prompt's success (`V(prompt)`) and runs stage 1 over the batch (`config.plan_batch`, on an RNG
   seeded `[seed, 2]` as the trainer's `Sampler`), writing each row's rollout count into verl's `__rollout_n__`
   (0 filters the prompt out; never all zero) and its stage-2 budget into `__trace_prefix_budget__`; what it plans
   is logged as `alloc/planned_units_root` and `alloc/planned_units_prefix`;
3. hands the batch to verl's own dispatch (`AgentLoopManagerTQ.generate_sequences`: chunks over the workers,
   non-blocking), whose workers are `TraceAgentLoopWorker`s.

`tracerl_tree` is the identity estimator of route A: the workers store per-token tree advantages in `rm_scores`,
verl's `_compute_advantage` passes them in as `token_level_rewards` (with `use_kl_in_reward=false`), and this
returns them masked by `response_mask`, so verl's policy loss gets tracerl's advantages unchanged.

What it does not do: change verl's trainer, sampler or loss; run a reward model (rewards come from tracerl's
environments, so no colocated reward model may overwrite `rm_scores`).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

import numpy as np
import ray
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

from tracerl.core.history import History
from tracerl.core.methods import get_method
from tracerl.integrations.verl.config import (ESTIMATOR, BatchPlan, TraceVerlConfig, plan_batch, task_domain,
                                              task_settings)
from tracerl.integrations.verl.coordinator import TraceCoordinator
from tracerl.integrations.verl.rows import tracerl_row
from tracerl.integrations.verl.worker import TraceAgentLoopWorker
from tracerl.io.rollout.driver import prompt_id

logger = logging.getLogger(__name__)


@register_adv_est(ESTIMATOR)
def tracerl_tree_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None,
                           index: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Identity: the TRACE worker already put each token's tree advantage in `rm_scores` (= token_level_rewards
    here); A = returns = token_level_rewards * response_mask. Shapes (B, T)."""
    advantages = token_level_rewards * response_mask  # (B, T)
    return advantages, advantages


def check_verl_config(config: Any, trace: TraceVerlConfig) -> None:
    """Raise when verl's algorithm settings would not carry what the TRACE worker stores in `rm_scores`."""
    algo = config.algorithm
    estimator = str(getattr(algo.adv_estimator, "value", algo.adv_estimator))
    if trace.rm_scores == "advantages" and estimator != ESTIMATOR:
        raise ValueError(f"tracerl.rm_scores=advantages stores tree advantages in rm_scores, but "
                         f"algorithm.adv_estimator={estimator}; set algorithm.adv_estimator={ESTIMATOR} (or "
                         f"+tracerl.rm_scores=reward to use verl's {estimator} on the rewards)")
    if trace.rm_scores == "reward" and estimator == ESTIMATOR:
        raise ValueError(f"algorithm.adv_estimator={ESTIMATOR} expects advantages in rm_scores; drop "
                         "tracerl.rm_scores=reward or pick one of verl's estimators (e.g. grpo)")
    if estimator == ESTIMATOR and algo.get("use_kl_in_reward", False):
        raise ValueError(f"algorithm.use_kl_in_reward=true would add a KL penalty to the tree advantages that "
                         f"{ESTIMATOR} passes through; set algorithm.use_kl_in_reward=false (use the actor's "
                         "KL loss instead)")


def batch_rows(batch: TensorDict) -> list[dict[str, Any]]:
    """Each row of a verl batch as a dict, the way verl's worker splits it (tensors and NonTensorStack per row)."""
    rows = [dict() for _ in range(len(batch))]
    for key, value in batch.items():
        for i, row in enumerate(rows):
            if isinstance(value, torch.Tensor):
                row[key] = value[i]
            elif isinstance(value, NonTensorStack):
                row[key] = value[i].data
            elif isinstance(value, NonTensorData):
                row[key] = value.data
    return rows


class TraceAgentLoopManager(AgentLoopManagerTQ):
    """verl V1 agent-loop manager running TRACE's stage 1 per batch; its workers grow and store the trees."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        trace = TraceVerlConfig.from_verl(config)  # a bad section fails here, at start
        check_verl_config(config, trace)
        trace.predictor.check_machine()
        task = task_settings(config)
        task_domain(task, trace.domain, trace.domain_options)  # so does a bad tool config or reward
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        # set after super().__init__: AgentLoopManagerTQ.__init__ assigns its own worker class
        self.agent_loop_workers_class = ray.remote(TraceAgentLoopWorker)
        self.trace_config = trace
        self.method = get_method(trace.method)
        self.coordinator_name = f"tracerl_coordinator_{uuid4().hex[:8]}"
        self.coordinator = ray.remote(TraceCoordinator).options(name=self.coordinator_name, num_cpus=0).remote(
            trace, task)
        self.rng = np.random.default_rng([trace.seed, 2])  # stage 1's draws, seeded as the trainer's Sampler
        self.num_batches = 0
        self.last_plan: BatchPlan | None = None
        self.last_metrics: dict[str, float] = {}

    def plan(self, batch: TensorDict) -> BatchPlan:
        """Stage 1 for a training batch (predictor, then the method's root policy); see `config.plan_batch`."""
        rows = [tracerl_row(values) for values in batch_rows(batch)]
        histories = [History(text=row["prompt"][-1]["content"], prompt_id=prompt_id(row)) for row in rows]
        if self.method.predictor == "none":
            p = np.full(len(rows), 0.5)
        else:
            p = ray.get(self.coordinator.predict.remote(histories))
        return plan_batch(p, [h.prompt_id for h in histories], self.trace_config, self.rng)

    def generate_sequences(self, prompts: TensorDict) -> None:
        validate = "validate" in prompts.keys() and bool(getattr(prompts["validate"], "data", prompts["validate"]))
        if not validate:
            metrics = ray.get(self.coordinator.flush.remote())
            plan = self.plan(prompts)
            num = len(prompts)
            prompts["__rollout_n__"] = torch.as_tensor(plan.counts, dtype=torch.int64)
            prompts["__trace_prefix_budget__"] = torch.as_tensor(plan.prefix_budget, dtype=torch.float64)
            prompts["__trace_p__"] = torch.tensor(np.array(plan.p), dtype=torch.float64)
            seeds = np.random.default_rng([self.trace_config.seed, 4, self.num_batches]).integers(2**31 - 1, size=num)
            prompts["__trace_seed__"] = torch.as_tensor(seeds, dtype=torch.int64)
            self.num_batches += 1
            self.last_plan = plan
            self.last_metrics = {**metrics, "alloc/num_prompts": float((plan.counts > 0).sum()),
                                 "alloc/num_filtered": float((plan.counts == 0).sum()),
                                 "alloc/planned_units_root": float(plan.counts.sum()),
                                 "alloc/planned_units_prefix": float(plan.prefix_budget.sum()),
                                 "alloc/forced_prompts": float(plan.forced)}
            logger.info("TRACE batch %d: %s", self.num_batches, self.last_metrics)
        prompts["__trace_coordinator__"] = NonTensorData(self.coordinator_name)
        super().generate_sequences(prompts)
