"""The verl these hooks were written against, and the check that a line they work around is still there."""

from __future__ import annotations

import inspect
from typing import Any

VERL_VERSION = "0.9.1"


class VerlMoved(RuntimeError):
    """The verl installed is not the one tracerl's hooks into it were written against."""


def check_version() -> None:
    import verl

    found = getattr(verl, "__version__", "unknown")
    if found != VERL_VERSION:
        raise VerlMoved(f"tracerl.integrations.verl_plugin hooks into verl {VERL_VERSION}; this is verl {found}: "
                        f"pip install 'verl[verl-core]=={VERL_VERSION}' (the `verl` extra), or leave "
                        "VERL_USE_EXTERNAL_MODULES unset")


def check_source(function: Any, needle: str, where: str) -> None:
    """Raise `VerlMoved` unless `function`'s source still holds `needle`, the code a patch works around."""
    check_text(inspect.getsource(function), needle, where)


def check_text(source: str, needle: str, where: str) -> None:
    """`check_source` on source text (a module's, read before it runs)."""
    if needle not in source:
        raise VerlMoved(f"tracerl's patch for {where} expects {needle!r} in verl's source, which this verl does "
                        f"not have; it was written for verl {VERL_VERSION}: pip install "
                        f"'verl[verl-core]=={VERL_VERSION}', or run without VERL_PLATFORM=tracerl_cpu")
