"""Policies that tracerl builds itself (heavy layer: torch). `embedded`: the tiny default, no download; `evaluation`:
held-out avg@k of any policy through the rollout driver."""

from tracerl.policy.embedded import EmbeddedConfig, EmbeddedPolicy, build_embedded, evaluate, load_embedded

__all__ = ["EmbeddedConfig", "EmbeddedPolicy", "build_embedded", "evaluate", "load_embedded"]
