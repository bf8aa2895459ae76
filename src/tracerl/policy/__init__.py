"""Policies that tracerl builds itself (heavy layer: torch). `embedded`: the tiny default, no download; `evaluation`:
held-out avg@k of any policy through the rollout driver; `embedded_config`: the build's typed config (no torch).

The names below load on first use (PEP 562), so importing `tracerl.policy.embedded_config` (what the run's config
reads) does not import torch: the core install has numpy only."""

import importlib

_LAZY = {"EmbeddedConfig": "embedded_config", "EmbeddedPolicy": "embedded", "build_embedded": "embedded",
         "evaluate": "embedded", "load_embedded": "embedded"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tracerl.policy' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracerl.policy.{_LAZY[name]}"), name)
