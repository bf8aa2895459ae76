"""One rule per config parameter, declared beside the field and checked once when the config is built.

`knob(default, ge=..., gt=..., le=..., lt=..., choices=...)` is a dataclass `field` whose metadata carries the
field's `Rule`; `check_fields(config, "section.")` checks every field of a config against its rule and rejects
any float that is not finite (inf, nan), returning one message per bad field that names the key and the allowed
range (`"optim.lr=inf must be a finite number > 0"`). `describe_fields` lists fields, types, defaults, rules and
their one-line docs (the `# ...` comment on the field's line) for `tracerl config`.

Only schema rules live here: what a value may be on any machine. Whether this machine can run it (Ray, CUDA,
peft, a model directory) is checked elsewhere (`TrainConfig.check_machine`), so a saved config parses anywhere.
Stdlib only.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if self.ge is not None else "> ") + low[1:]
        if high:
            return ("<= " if self.le is not None else "< ") + high[:-1]
        return "any value"

    def allows(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))


def knob(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **rule: Any):
    """A dataclass field with its rule: `lr: float = knob(5e-4, gt=0)  # doc`."""
    if "choices" in rule:
        rule["choices"] = tuple(rule["choices"])
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"rule": Rule(**rule)})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fields(config: Any, prefix: str = "") -> list[str]:
    """One message per field of `config` that breaks its rule or holds a non-finite number (None is allowed
    where the field's type allows it; a tuple is checked element by element)."""
    problems = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        rule: Rule | None = f.metadata.get("rule")
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if item is None or not (_is_number(item) or (rule and rule.choices is not None)):
                continue
            if _is_number(item) and not math.isfinite(item):
                problems.append(f"{prefix}{f.name}={value!r} must be a finite number"
                                + (f" {rule.describe()}" if rule and rule.choices is None else ""))
                break
            if rule is not None and not rule.allows(item):
                problems.append(f"{prefix}{f.name}={value!r} must be {rule.describe()}")
                break
    return problems


def raise_problems(problems: list[str], what: str = "") -> None:
    if problems:
        raise ValueError((f"{what}: " if what else "") + "; ".join(problems))


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*?#\s?(.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the `# ...` comment on its line in the class's source ('' when there is none)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    docs = {}
    for line in source.splitlines():
        match = _FIELD_LINE.match(line)
        if match and match.group(1) not in docs:
            docs[match.group(1)] = match.group(2).strip()
    return docs


def describe_fields(cls: type, prefix: str = "", defaults: Any = None) -> list[dict[str, str]]:
    """Every field of dataclass `cls`, nested sections flattened to dotted keys: key, type, default, rule, doc.
    `defaults`: an instance whose values are the defaults (a section's own default may differ from its class's)."""
    import typing

    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    defaults = cls() if defaults is None else defaults
    rows = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        default = getattr(defaults, f.name)
        if dataclasses.is_dataclass(hint):
            rows.extend(describe_fields(hint, f"{prefix}{f.name}.", default))
            continue
        rule = f.metadata.get("rule")
        rows.append({"key": f"{prefix}{f.name}", "type": _type_name(hint), "default": repr(default),
                     "rule": rule.describe() if rule else "", "doc": docs.get(f.name, "")})
    return rows


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if not getattr(hint, "__args__", None) else \
        str(hint).replace("typing.", "").replace("NoneType", "None")
