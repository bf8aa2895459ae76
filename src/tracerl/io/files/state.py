"""Atomic save and load of state dicts (numpy arrays + JSON-friendly values), and of predictors.

One file per state: an uncompressed .npz archive whose numpy arrays are the state's arrays and whose
`__json__` entry holds the rest of the state as UTF-8 JSON, with each array replaced by
`{"__ndarray__": "<array key>"}`. It is loaded with `allow_pickle=False`, so a file cannot run code.
Writes go to a temporary file in the target's directory, are fsynced, then `os.replace`d over the
target: a crash leaves either the old file or the new one, never a torn one.

Round trip: arrays come back bit-identical (dtype, shape, bytes); dicts, lists, str, int (any size),
float (NaN and inf included), bool and None come back equal. Tuples come back as lists and numpy
scalars as Python scalars.

Deliberately not here: torch tensors (the heavy layer converts them to numpy first), object arrays,
pickles, compression, versioned migrations of old formats.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.core.predictor import Predictor, make_predictor
from tracerl.io.files.run_folder import replacing

_JSON_KEY = "__json__"
_ARRAY_TAG = "__ndarray__"
PREDICTOR_FORMAT = "tracerl.predictor/1"


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """JSON-ready copy of `value` with arrays moved into `arrays` (keys a0, a1, ...)."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise ValueError(f"{where} is an object array; store numeric/bool/str arrays or lists instead")
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {_ARRAY_TAG: key}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has key {k!r} of type {type(k).__name__}; JSON needs str keys")
            if k == _ARRAY_TAG:
                raise ValueError(f"{where} uses the reserved key {_ARRAY_TAG!r}; rename it")
            out[k] = _encode(v, arrays, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"{where} has type {type(value).__name__}, which a state file cannot hold; "
                     "use numpy arrays, dicts, lists, str, int, float, bool or None")


def _decode(value: Any, arrays) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY_TAG}:
            return arrays[value[_ARRAY_TAG]]
        return {k: _decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    return value


def save_state(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write `state` to `path` atomically (temp file in the same directory, fsync, os.replace); returns the path.

    The path is used as given (no suffix is added); `.npz` is the natural one.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict, got {type(state).__name__}")
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(state, arrays, "state")
    text = json.dumps(tree, allow_nan=True, separators=(",", ":"))
    arrays[_JSON_KEY] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:  # whole or not at all, fsynced
        np.savez(f, **arrays)
    fsync_dir(path.parent)
    return path


def fsync_dir(directory: Path) -> None:
    """Make the rename itself durable where the OS allows it (POSIX); a no-op elsewhere."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the file itself is already synced
    finally:
        os.close(fd)


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a state written by `save_state`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no state file at {path}; check the path (save_state writes it as given)")
    with np.load(path, allow_pickle=False) as data:
        if _JSON_KEY not in data.files:
            raise ValueError(f"{path} is an .npz file but not a tracerl state (no {_JSON_KEY!r} entry)")
        arrays = {k: data[k] for k in data.files if k != _JSON_KEY}
        tree = json.loads(data[_JSON_KEY].tobytes().decode("utf-8"))
    return _decode(tree, arrays)


def save_predictor(path: str | os.PathLike, predictor: Predictor) -> Path:
    """Save a registered predictor: its registry name, constructor config and state dict, in one state file."""
    config = predictor.config()  # raises ValueError for predictors that cannot be rebuilt (the oracle)
    return save_state(path, {"format": PREDICTOR_FORMAT, "name": predictor.name, "config": config,
                             "state": predictor.state_dict()})


def load_predictor(path: str | os.PathLike) -> Predictor:
    """Rebuild a predictor saved by `save_predictor`: `make_predictor(name, **config)`, then its state."""
    saved = load_state(path)
    if saved.get("format") != PREDICTOR_FORMAT:
        raise ValueError(f"{path} holds no predictor (format {saved.get('format')!r}, expected "
                         f"{PREDICTOR_FORMAT!r}); write it with save_predictor")
    predictor = make_predictor(saved["name"], **saved["config"])
    predictor.load_state_dict(saved["state"])
    return predictor
