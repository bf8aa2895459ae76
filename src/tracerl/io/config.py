"""Typed configs from files and `--set key=value` overrides: nested frozen dataclasses, checked at load.

`from_dict(cls, data)` builds a (nested) dataclass from plain data and raises `ValueError` naming the bad key
and what to write instead: unknown keys (with the known ones listed), wrong types (an int where a float is
expected is fine; a string where a number is expected is not), and whatever the dataclass's own
`__post_init__` rejects. `load_file` reads TOML (presets in `configs/`) or JSON (a run's saved `config.json`).
`apply_overrides` sets dotted keys (`optim.lr=3e-4`, `allocation.k_max=null`); a value is parsed as JSON
when it can be (numbers, true/false, null, lists) and taken as a string otherwise.

Deliberately not here: what the fields are (each config class documents its own), environment variables,
config inheritance beyond "preset file, then overrides".
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any


def load_file(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON file as a dict."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist; pass a path to a .toml preset (see configs/) or a "
                         "run's config.json")
    try:
        if path.suffix == ".toml":
            return tomllib.loads(path.read_text())
        if path.suffix == ".json":
            return json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"config file {path} does not parse: {err}") from None
    raise ValueError(f"config file {path}: use a .toml or .json file")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'optim.lr=3e-4' -> (['optim', 'lr'], 0.0003); 'method=trace' -> (['method'], 'trace')."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {text!r}: write key=value, e.g. --set optim.lr=3e-4")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `data` with each 'a.b.c=value' set (sections created as needed)."""
    data = json.loads(json.dumps(data))
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {text!r}: {key!r} is a value, not a section")
        node[keys[-1]] = value
    return data


def _check_type(value: Any, hint: Any, where: str) -> Any:
    """`value` converted to the annotation `hint`, or a ValueError saying what was expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"{where}: got {value!r}")
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is a section; give it as a table of keys, not {value!r}")
        return from_dict(hint, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_check_type(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} values, got {len(value)} ({value!r})")
        return tuple(_check_type(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a table of keys, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass `cls` from `data` (nested dataclass fields from nested dicts); missing keys keep defaults."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where or 'config'}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _check_type(value, hints[name], f"{where}.{name}" if where else name)
              for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"{where}: {err}" if where else str(err)) from None


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as JSON-friendly data (tuples become lists); `from_dict` reads it back."""
    return json.loads(json.dumps(dataclasses.asdict(config)))
