"""`trainer.v1.trainer_mode=tracerl_sync`: verl's synchronous trainer with TRACE's step metrics in verl's log.

verl's trainer logs the metrics it computes itself; what an agent-loop manager knows about the step (for TRACE:
what stage 1 planned and what the previous batch's trees spent, `alloc/*`, `predictor/*`, `rollout/*`) has no
path into that dict. This subclass adds the manager's `last_metrics` to the step's metrics before verl's trackers
(console, TensorBoard, wandb) receive them; with any other manager it is verl's `PPOTrainerSync` unchanged.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

MODE = "tracerl_sync"


class TraceTrainerSync(PPOTrainerSync):
    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> Any:
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        manager_metrics = getattr(getattr(self, "agent_loop_manager", None), "last_metrics", None) or {}
        metrics.update({key: float(value) for key, value in manager_metrics.items()})
        return out


def register() -> None:
    if TRAINER_REGISTRY.get(MODE) is not TraceTrainerSync:
        register_trainer(MODE)(TraceTrainerSync)
