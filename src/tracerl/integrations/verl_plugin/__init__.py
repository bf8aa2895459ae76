"""tracerl's hooks into verl's own trainer (`python -m verl.trainer.main_ppo`), through verl's extension points.

Set `VERL_USE_EXTERNAL_MODULES=tracerl.integrations.verl_plugin` and `verl/__init__.py` imports this package in
every process verl starts (the driver, the task runner, each Ray worker) before it runs anything, so what it
registers is in place wherever verl looks (this is a sibling of `tracerl.integrations.verl`, not inside it, because
verl imports it halfway through its own `__init__`, where that package's imports of verl's trainer would be
circular). It registers:
- `trainer.v1.trainer_mode=tracerl_sync` (`trainer.py`): verl's synchronous trainer, with TRACE's step metrics
  (`alloc/*`, `predictor/*`, `rollout/*`) in the metrics verl's trackers receive;
- `actor_rollout_ref.rollout.name=tracerl_hf` (`rollout.py`): a transformers rollout server, for CPU runs and small
  models;
- the platform `tracerl_cpu` (`cpu.py`), selected with `VERL_PLATFORM=tracerl_cpu`, and only then one patch of a
  verl line that is wrong on a CPU and verl's own engine-device setting; where the vLLM installed is its CPU build,
  two more, for verl's own vLLM rollout (`vllm_cpu.py`).
verl 0.9.1 only: another version raises `VerlMoved` at import, naming the version to install.

`environment()` and `cpu_overrides()` give what a CPU run needs; `docs/verl.md` ("verl's own trainer") has the
command.
"""

from __future__ import annotations

import json
import os

from tracerl.integrations.verl_plugin.checks import VERL_VERSION, VerlMoved, check_version

PLATFORM = "tracerl_cpu"
ROLLOUT = "tracerl_hf"
TRAINER_MODE = "tracerl_sync"

__all__ = ["VERL_VERSION", "VerlMoved", "PLATFORM", "ROLLOUT", "TRAINER_MODE", "install", "environment",
           "cpu_overrides", "domain_overrides"]


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    # by name: verl imports the rollout module only in the processes that serve or sync a rollout
    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.rollout.ServerAdapter"

    def load() -> type:
        from tracerl.integrations.verl_plugin.rollout import TransformersReplica
        return TransformersReplica

    RolloutReplicaRegistry.register(ROLLOUT, load)


def install() -> None:
    """Register the trainer mode, the rollout and the platform; on `VERL_PLATFORM=tracerl_cpu` apply the CPU
    patches. Idempotent."""
    check_version()
    from tracerl.integrations.verl_plugin import cpu

    # in this order: importing verl's trainer imports its engines, which ask for the platform at import, and
    # binds `initialize_global_process_group_ray` by name, so both must be in place first
    cpu.register_platform()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
        cpu.patch_process_group()
        cpu.select_fsdp_engine()
        from tracerl.integrations.verl_plugin import vllm_cpu

        vllm_cpu.install()  # verl's own vLLM rollout on vLLM's CPU build, where that is the vLLM installed
    _register_rollout()
    from tracerl.integrations.verl_plugin.trainer import register as register_trainer

    register_trainer()


def environment(*, on_cpu: bool = True) -> dict[str, str]:
    """The environment variables that load these hooks in every verl process (and select the CPU platform)."""
    env = {"VERL_USE_EXTERNAL_MODULES": __name__, "TOKENIZERS_PARALLELISM": "false"}
    return {**env, "VERL_PLATFORM": PLATFORM} if on_cpu else env


def cpu_overrides(rollout: str = ROLLOUT) -> list[str]:
    """verl's Hydra settings a CPU run needs, on top of the run's own: Ray told of one accelerator (the platform's
    device slot, so verl's placement groups form), FSDP2 with sdpa attention, no remove-padding and no torch.compile
    (none of them has a CPU kernel), and a rollout served on the CPU with the in-process (`naive`) weight sync:
    `tracerl_hf` (the transformers server), or `vllm` (verl's own vLLM rollout, on vLLM's CPU build: no sleep mode,
    which frees GPU memory, eager mode, no CUDA graphs, float32, and 10% of the machine's memory reserved for its
    KV cache, which is what `gpu_memory_utilization` means on that build: verl's 0.5 took half of a 24 GiB machine
    and Ray killed the run for memory; `vllm_cpu.py` for what verl needs beside). Ray's CPUs
    are reservations: the task runner, TransferQueue's controller and each storage unit hold one for life, so 6 of
    them and one storage unit (verl's default of 8 would wait for CPUs forever on a small machine)."""
    if rollout not in (ROLLOUT, "vllm"):
        raise ValueError(f"cpu_overrides: rollout {rollout!r} has no CPU settings here; use {ROLLOUT!r} or 'vllm'")
    served = ["+actor_rollout_ref.rollout.enable_sleep_mode=False", "actor_rollout_ref.rollout.enforce_eager=True",
              "actor_rollout_ref.rollout.dtype=float32",
              "actor_rollout_ref.rollout.gpu_memory_utilization=0.1"] if rollout == "vllm" else []
    return ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "+ray_kwargs.ray_init.num_gpus=1",
            "+ray_kwargs.ray_init.num_cpus=6", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            f"trainer.v1.trainer_mode={TRAINER_MODE}",
            f"actor_rollout_ref.rollout.name={rollout}", "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
            "actor_rollout_ref.rollout.free_cache_engine=False", *served,
            "actor_rollout_ref.model.use_remove_padding=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2",
            "actor_rollout_ref.actor.use_torch_compile=False", "actor_rollout_ref.ref.use_torch_compile=False"]


def domain_overrides(options: dict) -> list[str]:
    """`+tracerl.domain_options.<name>=<value>` for each of a built-in domain's options (e.g. an embedded policy's
    world, `EmbeddedConfig.domain_options()`), values as JSON without spaces so Hydra reads lists and numbers."""
    return [f"+tracerl.domain_options.{name}={json.dumps(list(v) if isinstance(v, tuple) else v).replace(' ', '')}"
            for name, v in options.items()]


if __name__ in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(","):
    install()
