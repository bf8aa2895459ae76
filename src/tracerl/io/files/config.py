"""Typed configs from files and `--set key=value` overrides: nested frozen dataclasses, checked at load.

`from_dict(cls, data)` builds a (nested) dataclass from plain data and raises `ValueError` naming the bad key
and what to write instead: unknown keys (with the known ones listed), wrong types (an int where a float is
expected is fine; a string where a number is expected is not), a float that is not finite (NaN, infinity, an
integer too large for a float) anywhere, tables included, a template that would fail when used, and whatever the
dataclass's own `__post_init__` rejects. A template is a str field whose default has `{name}` placeholders
(`run.out_dir = "runs/{method}-seed{seed}"`): its value may use those names only, with no attribute, index,
conversion or format spec, and braces balanced (`{{` for a literal one).

`load_file` reads TOML (presets in `configs/`) or JSON (a run's saved `config.json`): a regular file of at most
`MAX_FILE_BYTES`, UTF-8 (`tracerl.io.files.decode_utf8`: the message names the byte offset), and for JSON no
repeated key and no NaN or Infinity; any parse failure (an integer too long to convert) is a `ValueError` naming the
file. Data nests at most `tracerl.io.files.MAX_DEPTH` levels, checked where it comes in (a file, a `--set`, and the
data `from_dict` and `apply_overrides` are given), so the recursive walks here (`from_dict`, `to_dict`, the copy in
`apply_overrides`) never meet data deep enough to exhaust the stack: TOML's dotted keys and table headers nest any
depth without the parser recursing. `apply_overrides` sets dotted
keys (`optim.lr=3e-4`, `allocation.k_max=null`); a value is parsed as JSON when it can be (numbers, true/false,
null, lists) and taken as a string otherwise.

Deliberately not here: what the fields are (each config class documents its own), environment variables,
config inheritance beyond "preset file, then overrides".
"""

from __future__ import annotations

import dataclasses
import json
import math
import string
import tomllib
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Any

from tracerl.io.files import MAX_DEPTH, check_depth, decode_utf8, too_deep
from tracerl.io.files.boundary import listing


MAX_FILE_BYTES = 1 << 20  # a preset or a run's config.json is a few KB


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    repeated = [k for k, n in Counter(k for k, _ in pairs).items() if n > 1]
    if repeated:
        raise ValueError(f"key(s) {listing(repeated)} appear more than once (JSON would keep the last silently)")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; every config number must be finite")


def parse_json(text: str) -> Any:
    """JSON with no repeated key and no NaN or Infinity; ValueError (RecursionError for too deep nesting)."""
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def load_file(path: str | Path) -> dict[str, Any]:
    """A TOML or JSON file as a dict; ValueError naming the file when it cannot be one."""
    path = Path(path)
    if path.suffix not in (".toml", ".json"):
        raise ValueError(f"config file {path}: use a .toml or .json file")
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise ValueError(f"config file {path} {what}; pass a path to a .toml preset (see configs/) or a run's "
                         "config.json")
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"config file {path} is larger than {MAX_FILE_BYTES} bytes; a config is a few KB")
    text = decode_utf8(raw, f"config file {path}")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else parse_json(text)
    except RecursionError:  # deeper than the parser's stack: far deeper than the limit
        raise too_deep(f"config file {path}") from None
    except ValueError as err:  # TOMLDecodeError and JSONDecodeError included; an integer too long to convert
        raise ValueError(f"config file {path} does not parse: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} holds {type(data).__name__}, not a table of keys")
    check_depth(data, f"config file {path}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """'optim.lr=3e-4' -> (['optim', 'lr'], 0.0003); 'method=trace' -> (['method'], 'trace')."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {text!r}: write key=value, e.g. --set optim.lr=3e-4")
    keys = key.strip().split(".")
    where = f"--set {key.strip()[:80]}{'...' if len(key.strip()) > 80 else ''}=..."
    if len(keys) > MAX_DEPTH:
        raise too_deep(where)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    except RecursionError:
        raise too_deep(where) from None
    except ValueError as err:  # an integer too long to convert
        raise ValueError(f"{where}: {err}") from None
    check_depth(value, where, MAX_DEPTH - len(keys))  # the value sits len(keys) levels down
    return keys, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `data` with each 'a.b.c=value' set (sections created as needed)."""
    check_depth(data, "config")
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
        return _from_dict(hint, value, where)
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
            raise ValueError(f"{where}: expected a number, got {value!r:.80}")
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{where}={value!r:.40} must be a finite number") from None
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _check_finite(value: Any, where: str) -> None:
    """Every number inside `value` converts to a finite float (no NaN, no infinity, no int beyond a float)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            finite = math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError(f"{where}={value!r:.40} must be a finite number")


def template_names(text: Any) -> tuple[str, ...]:
    """The `{name}` placeholders of a str.format template (empty for plain text or a malformed template)."""
    try:
        return tuple(dict.fromkeys(f for _, f, _, _ in string.Formatter().parse(text) if f))
    except (TypeError, ValueError):
        return ()


def check_template(value: str, names: tuple[str, ...], where: str) -> None:
    """`value` fills with `names` only: plain `{name}` placeholders, braces balanced (`{{` is a literal one)."""
    allowed = ", ".join("{" + n + "}" for n in names)
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError as err:
        raise ValueError(f"{where}={value!r}: {err}; write {{{{ or }}}} for a literal brace") from None
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if field_name not in names:
            raise ValueError(f"{where}={value!r}: {{{field_name}}} is not a placeholder it knows; use {allowed}")
        if spec or conversion:
            raise ValueError(f"{where}={value!r}: a placeholder takes no conversion or format spec; write {allowed}")


def from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass `cls` from `data` (nested dataclass fields from nested dicts); missing keys keep defaults."""
    check_depth(data, where or "config")
    return _from_dict(cls, data, where)


def _from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where or 'config'}: unknown key(s) {listing(unknown)}; known keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _check_type(value, hints[name], key)
        if "rule" not in fields[name].metadata:  # a knob's rule says the same, with its range (tracerl.core.rules)
            _check_finite(kwargs[name], key)
        names = template_names(fields[name].default) if hints[name] is str else ()
        if names:
            check_template(kwargs[name], names, key)
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"{where}: {err}" if where else str(err)) from None


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as JSON-friendly data (tuples become lists); `from_dict` reads it back."""
    return json.loads(json.dumps(dataclasses.asdict(config)))
