"""verl's device interface on the CPU, and what of verl 0.9.1 is wrong there.

`PlatformCPU` is registered with verl's `PlatformRegistry` as `tracerl_cpu` and selected with `VERL_PLATFORM`. Two
places of verl need more, each checked against the source it works around (`check_source`: a verl that moved
raises `VerlMoved` at import instead of failing inside a Ray worker):
1. `verl/utils/distributed.py`, `initialize_global_process_group_ray`, builds the backend
   `f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`, on CPU `cpu:gloo,cpu:gloo`, which torch rejects: patched,
   the default becomes `cpu:gloo`;
2. `verl/workers/engine/base.py`, `EngineRegistry.get_engine_cls`, looks engines up by device, and FSDP registers
   only `cuda` and `npu`: verl's own `VERL_ENGINE_DEVICE` is set to `cuda` (FSDP's engine itself runs on any
   device), no code patched.
verl's `auto_set_device` needs nothing: with this platform it keeps `trainer.device=cpu`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Iterator, Optional

import torch

from tracerl.integrations.verl_plugin.checks import check_source

PLATFORM = "tracerl_cpu"
DEVICE_MODULE: ModuleType | None = None  # what verl's `get_torch_device()` returns on this platform


def _device_module() -> ModuleType:
    """`torch.cpu` plus what verl calls on a device module and the CPU has no counterpart for: the caching
    allocator's statistics (0: there is no device allocator to report), `empty_cache` and `ipc_collect` (nothing
    to free), `mem_get_info` (the machine's free and total memory) and the RNG state (torch's global one)."""
    module = ModuleType("tracerl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def mem_get_info(*args: Any) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, zero)
    for name in ("empty_cache", "ipc_collect", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                 "set_per_process_memory_fraction"):
        setattr(module, name, nothing)
    module.mem_get_info = mem_get_info
    module.get_rng_state = lambda *args: torch.get_rng_state()
    module.set_rng_state = lambda state, *args: torch.set_rng_state(state)
    module.get_device_name = lambda *args: "cpu"
    return module


def register_platform() -> type:
    """Register `PlatformCPU` as `tracerl_cpu` (idempotent: verl's registry takes a name again)."""
    global DEVICE_MODULE
    DEVICE_MODULE = _device_module()
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl's device interface on the CPU: collectives on gloo, Ray's `GPU` resource as the device slot (Ray is
        told of one with `ray_init.num_gpus`), no IPC, no CUDA runtime."""

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> ModuleType:
            return DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return True

        def current_device(self) -> Any:
            # verl moves tensors with `.to(get_device_id())`: an int there means an accelerator, so the CPU's
            # index is torch's own answer for the CPU, the string "cpu"
            return torch.cpu.current_device()

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def patch_process_group() -> None:
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_tracerl_cpu", False):
        return
    check_source(original, 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
                  "verl/utils/distributed.py initialize_global_process_group_ray")

    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._tracerl_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def select_fsdp_engine() -> None:
    """FSDP's engine registers under `cuda` and `npu` only; verl looks engines up by device unless
    `VERL_ENGINE_DEVICE` names one. Set it to `cuda` for this process (the plugin runs in every verl process), unless
    the user set it: FSDP's engine itself runs on any device."""
    from verl.workers.engine.base import EngineRegistry

    check_source(EngineRegistry.get_engine_cls.__func__, 'os.getenv("VERL_ENGINE_DEVICE")',
                 "verl/workers/engine/base.py get_engine_cls")
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
