"""Task domains: rows in verl layout, tool-using environments, scripted experts; and their registry.

`make_domain(name, **options)` builds a domain by name (`DOMAINS`) with its constructor's options (a run's
`data.options`, checked against the constructor by `check_options`); each domain's module is imported only when it is
asked for (bfcl imports bfcl-eval). The registry lives here, in `io`, so every layer above (the
trainer, the Ray rollout workers, the verl worker) builds domains the same way without importing the trainer.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from tracerl.io.files.boundary import listing

# name -> (module, class): the built-in domains
_BUILT_IN = {
    "multihop": ("tracerl.io.domains.multihop", "MultiHopDomain"),
    "math": ("tracerl.io.domains.math", "MathDomain"),
    "funcall": ("tracerl.io.domains.funcall", "FuncallDomain"),
    "bfcl": ("tracerl.io.domains.bfcl", "BfclDomain"),
}
DOMAINS = tuple(_BUILT_IN)


def domain_class(name: str) -> type:
    """The class of a built-in domain: multihop, math, funcall or bfcl."""
    if name not in _BUILT_IN:
        raise ValueError(f"unknown domain {name!r}; use one of {', '.join(DOMAINS)}")
    module, cls = _BUILT_IN[name]
    return getattr(importlib.import_module(module), cls)


def check_options(name: str, options: dict[str, Any]) -> None:
    """Every key of `options` is a constructor parameter of domain `name` (the message lists those it takes)."""
    known = sorted(set(inspect.signature(domain_class(name)).parameters) - {"self"})
    unknown = set(options) - set(known)
    if unknown:
        raise ValueError(f"data.options has {listing(unknown)}, which domain {name!r} does not take; its options: "
                         f"{known or 'none'}")


def make_domain(name: str, **options: Any) -> Any:
    """A built-in domain by name, with its constructor's `options` (none: its defaults)."""
    return domain_class(name)(**options)
