"""Task domains: rows in verl layout, tool-using environments, scripted experts; and their registry.

`make_domain(name)` builds a domain with its default options by name (`DOMAINS`); each domain's module is imported
only when it is asked for (bfcl imports bfcl-eval). The registry lives here, in `io`, so every layer above (the
trainer, the Ray rollout workers, the verl worker) builds domains the same way without importing the trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, class): the built-in domains
_BUILT_IN = {
    "multihop": ("tracerl.io.domains.multihop", "MultiHopDomain"),
    "math": ("tracerl.io.domains.math", "MathDomain"),
    "funcall": ("tracerl.io.domains.funcall", "FuncallDomain"),
    "bfcl": ("tracerl.io.domains.bfcl", "BfclDomain"),
}
DOMAINS = tuple(_BUILT_IN)


def make_domain(name: str) -> Any:
    """A domain with its default options: multihop, math, funcall or bfcl."""
    if name not in _BUILT_IN:
        raise ValueError(f"unknown domain {name!r}; use one of {', '.join(DOMAINS)}")
    module, cls = _BUILT_IN[name]
    return getattr(importlib.import_module(module), cls)()
