"""Policies that tracerl builds itself (heavy layer: torch). `embedded`: the tiny default, no download."""

from tracerl.policy.embedded import EmbeddedConfig, EmbeddedPolicy, build_embedded, evaluate, load_embedded

__all__ = ["EmbeddedConfig", "EmbeddedPolicy", "build_embedded", "evaluate", "load_embedded"]
