"""TRACE on verl's V1 trainer (verl 0.9.1): an agent-loop manager, its worker and a tree-advantage estimator.

Select the manager in verl's config and the estimator that carries tree advantages to verl's loss:

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.TraceAgentLoopManager
    algorithm.adv_estimator=tracerl_tree  algorithm.use_kl_in_reward=false

plus an optional `tracerl:` section (`TraceVerlConfig`), whose `allocation` and `predictor` sections are tracerl's
own (`tracerl train`'s, with its checks and defaults; the step's size is verl's). A task named by verl's own
settings (the multi-turn tool config file, `custom_reward_function`) runs in place of a built-in domain
(`config.task_domain`). `docs/verl.md` has the GPU recipe and what the CPU test covers. This package imports verl,
Ray, torch and TransferQueue: install the `verl` extra in its own environment (verl pins transformers below 5.11);
the rest of tracerl never imports it.
"""

from tracerl.integrations.verl.config import ESTIMATOR, BatchPlan, TraceVerlConfig, plan_batch
from tracerl.integrations.verl.coordinator import TraceCoordinator
from tracerl.integrations.verl.engine import EngineLLMClient, RolloutFailed, RolloutTimeout, VerlEngine
from tracerl.integrations.verl.manager import (TraceAgentLoopManager, batch_rows, check_verl_config,
                                               tracerl_tree_advantage)
from tracerl.integrations.verl.rows import LeafRow, leaf_rows
from tracerl.integrations.verl.worker import FailSafeRunner, TraceAgentLoopWorker, grow_tree

__all__ = ["ESTIMATOR", "BatchPlan", "TraceVerlConfig", "plan_batch", "TraceCoordinator", "EngineLLMClient",
           "RolloutFailed", "RolloutTimeout", "VerlEngine", "TraceAgentLoopManager", "batch_rows",
           "check_verl_config", "tracerl_tree_advantage", "LeafRow", "leaf_rows", "FailSafeRunner",
           "TraceAgentLoopWorker", "grow_tree"]
