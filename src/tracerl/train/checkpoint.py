"""Checkpoints of a run directory: written whole or not at all, the newest named by an atomically replaced file.

Layout: `<run>/checkpoints/step-000012/` holds `model.pt` (state dict), `optimizer.pt`, `predictor.npz`
(`tracerl.io.files.state`; only for a method with a predictor), `trainer.npz` (step, data cursor and order, cumulative
ledger totals, the numpy generators' states, torch's CPU RNG state and, for a model on a GPU, that GPU's) and
`config.json` (the resolved config the run was saved with). A checkpoint is written into a temporary sibling folder,
fsynced and renamed into place; then `<run>/checkpoints/latest` (a one-line file, replaced atomically) is pointed
at it, and checkpoints older than the newest `keep` are deleted (never the one just written). A kill at any moment
leaves `latest` naming a complete checkpoint (or no `latest` at all before the first one).

Integrity: `manifest.json` (the SHA-256 and size of each file) is written last, before the rename. The loader
defines what is verified: the manifest must list exactly the files `load` reads (`loaded_files`), so a manifest
that leaves one out, or lists anything else (an absolute path, `..`, a name that is not a file of the folder), is
refused without opening it. Every file is checked with lstat before it is opened and again on the open descriptor:
a symlink, FIFO, device or folder in place of a file is refused, never read. The manifest and `latest` are read
with a size cap, the manifest parsed strictly (no repeated key, no NaN). A checkpoint that does not verify is
skipped with a warning naming the file, and the newest older intact checkpoint is loaded instead; if none is
intact, the error names each file and the fix. `latest` must name a step folder of this run (a real folder, not a
symlink); anything else is skipped the same way. Temporary folders (`.step-*`) left by a killed save are removed
by the next save.

The run folder is the run's own (`tracerl.io.files.run_folder`): `checkpoints/` must not be a symlink (load and save
refuse it, naming the fix), `latest` holds only a step folder's name (`step-NNNNNN`, no path), and no save deletes
through a symlink: a step folder that is one is unlinked when that step is saved again, never `rmtree`d, and
retention and the clearing of temporaries leave what a link leads to alone. `config.json` and `latest` are written
by `write_atomic`, so a planted temporary or a linked target is never written through.

Config: a resume must run with the config the checkpoint was saved with, up to the keys the caller allows to
change (`tracerl.train.config.RESUMABLE_CHANGES`); `load` refuses any other difference, naming the keys (five, then
a count) and the fix. The resume's config is the one given to `load` (a training resume gives the config it trains
with, so a run whose `config.json` is gone is still held to what was trained), else the run's `config.json`; with
neither, the resume is refused, since nothing then says which config resumes.

The model's state dict must hold the model's dtypes: `load_state_dict` checks names and shapes but would copy a
float16 or float64 tensor into a float32 model silently, so another dtype is refused naming the key.

With LoRA the model's state dict holds the frozen base weights and the adapters under peft's names
(`...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight`); it loads into a model built from the same config.
Tensors load onto the device of the model they go into, so a checkpoint written on a GPU loads on a CPU.

Deliberately not here: sharded or distributed checkpoints, safetensors export for serving (use
`model.save_pretrained` on the loaded model), protection against someone who rewrites a file and its manifest
entry together (the manifest is a checksum list, not a signature), checkpoints written before configs were part
of them (they are refused: their manifest does not list `config.json`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from tracerl.core.predictor import Predictor
from tracerl.io.files import check_depth, decode_utf8, too_deep
from tracerl.io.files.boundary import listing
from tracerl.io.files.config import parse_json
from tracerl.io.files.run_folder import OutsideRun, remove, run_path, write_atomic
from tracerl.io.files.state import fsync_dir, load_state, save_state
from tracerl.train.config import RESUMABLE_CHANGES, TrainConfig, as_saved_today, config_changes

MODEL_FILE, OPTIMIZER_FILE, PREDICTOR_FILE, TRAINER_FILE = "model.pt", "optimizer.pt", "predictor.npz", "trainer.npz"
CONFIG_FILE = "config.json"  # in a checkpoint, and the run's own resolved config (`save_config`)
MANIFEST_FILE = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20  # a real manifest lists five files in a few hundred bytes
MAX_CONFIG_BYTES = 1 << 20  # a resolved config is a few KB
MAX_POINTER_BYTES = 256
_STEP_NAME = re.compile(r"step-\d{6,}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ValueError):
    """No checkpoint of a run could be loaded; the message names the files and the fix."""


def loaded_files(with_predictor: bool) -> tuple[str, ...]:
    """The files `load` reads from a checkpoint folder, hence exactly the files its manifest must list."""
    return (MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE, CONFIG_FILE) + ((PREDICTOR_FILE,) if with_predictor else ())


# ---------------------------------------------------------------- reading files that may not be what they claim

class NotAFile(OSError):
    """A path that should be a regular file is a symlink, FIFO, device, socket or folder."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, only if it is a regular file: lstat before opening (a symlink, FIFO or device is
    never opened, so reading cannot block or leave the folder), then fstat on the descriptor (the same file)."""
    before = os.lstat(path)
    if not stat.S_ISREG(before.st_mode):
        raise NotAFile(f"{path} is not a regular file (a symlink, FIFO, device or folder)")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise NotAFile(f"{path} was replaced while it was opened")
    return os.fdopen(fd, "rb")


def _read_capped(path: Path, limit: int) -> bytes:
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"it is larger than {limit} bytes")
    return data


def read_json(path: Path, limit: int = MAX_CONFIG_BYTES) -> Any:
    """A small JSON file read strictly: a regular file, at most `limit` bytes, UTF-8, no repeated key, no NaN or
    Infinity, bounded nesting. ValueError (or OSError) says what is wrong."""
    text = decode_utf8(_read_capped(path, limit), str(path))
    try:
        data = parse_json(text)
    except RecursionError:  # deeper than the parser's stack: far deeper than the limit
        raise too_deep(str(path)) from None
    check_depth(data, str(path))
    return data


def _digest(f: BinaryIO) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- the manifest

def write_manifest(folder: Path) -> None:
    """`<folder>/manifest.json`: {file name: {"sha256", "bytes"}} of every other file, fsynced."""
    files = {}
    for p in sorted(folder.iterdir()):
        if p.name != MANIFEST_FILE:
            with open_regular(p) as f:
                files[p.name] = {"sha256": _digest(f), "bytes": os.fstat(f.fileno()).st_size}
    with open(folder / MANIFEST_FILE, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _manifest_files(manifest: Path) -> dict[str, dict[str, Any]]:
    """The manifest's {name: {"sha256", "bytes"}}, shape-checked; ValueError says what is malformed."""
    data = read_json(manifest, MAX_MANIFEST_BYTES)
    if not isinstance(data, dict) or set(data) != {"files"} or not isinstance(data["files"], dict):
        raise ValueError('it must be {"files": {name: {"sha256": ..., "bytes": ...}}}')
    for name, entry in data["files"].items():
        if (not isinstance(entry, dict) or set(entry) != {"sha256", "bytes"}
                or not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"])
                or type(entry["bytes"]) is not int or entry["bytes"] < 0):
            raise ValueError(f"the entry for {name!r} must be {{\"sha256\": 64 hex digits, \"bytes\": a count}}")
    return data["files"]


def verify(folder: Path) -> str:
    """'' when `folder` is a checkpoint whose manifest lists exactly the files loading reads, each a regular file
    with the listed size and SHA-256; else the problem."""
    manifest = folder / MANIFEST_FILE
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return f"{folder} is not a folder of this run (a symlink or a file)"
        files = _manifest_files(manifest)
    except FileNotFoundError:
        return f"{manifest} is missing (the save did not finish)"
    except (OSError, ValueError) as err:
        return f"{manifest} is unreadable ({err})"
    expected = loaded_files(PREDICTOR_FILE in files)
    missing = [name for name in expected if name not in files]
    if missing:
        return f"{manifest} does not list {missing}, which loading reads (a checkpoint lists {list(expected)})"
    unread = set(files) - set(expected)
    if unread:
        return f"{manifest} lists {listing(unread)}, which loading never reads (a checkpoint lists {list(expected)})"
    for name in expected:
        path = folder / name
        try:
            with open_regular(path) as f:
                if os.fstat(f.fileno()).st_size != files[name]["bytes"] or _digest(f) != files[name]["sha256"]:
                    return f"{path} does not match its checksum in {manifest} (the file was changed or corrupted)"
        except NotAFile as err:
            return str(err)
        except OSError as err:
            return f"{path} is listed in {manifest} but cannot be read ({err.strerror})"
    return ""


# ---------------------------------------------------------------- the config a checkpoint was saved with

def _trainer_rules() -> tuple[Sequence[str], dict[str, Any]]:
    """The trainer's resume rules: the keys a resume may change, and the defaults of keys added since a save."""
    return RESUMABLE_CHANGES, TrainConfig().to_dict()


def _check_config(path: Path, run_dir: Path, config: Mapping[str, Any] | None, may_change: Sequence[str] | None,
                  defaults: Mapping[str, Any] | None) -> None:
    """Refuse a resume whose config differs from the one checkpoint `path` was saved with (see `load`)."""
    saved = read_json(path / CONFIG_FILE)
    if may_change is None or defaults is None:
        rules = _trainer_rules()
        may_change = rules[0] if may_change is None else may_change
        defaults = rules[1] if defaults is None else defaults
    if config is None:
        source = run_dir / CONFIG_FILE
        try:
            config = read_json(source)
        except FileNotFoundError:
            if not saved:  # saved outside a training run, which records no config: nothing to compare
                return
            raise CheckpointError(f"{source} is missing, so nothing says this resume runs with the config checkpoint "
                                  f"{path.name} was saved with; copy {path / CONFIG_FILE} to {source} to resume "
                                  "with that config, or start a new run directory") from None
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{source} is unreadable ({err}); copy {path / CONFIG_FILE} over it to resume "
                                  "with the config the checkpoint was saved with") from None
    if not isinstance(saved, dict) or not isinstance(config, Mapping):
        raise CheckpointError(f"{path / CONFIG_FILE} or this run's config is not a JSON object")
    changed = config_changes(as_saved_today(saved), as_saved_today(config), may_change, defaults)
    if changed:
        raise CheckpointError(f"checkpoint {path} was saved with a config that differs from this run's in "
                              f"{listing(changed)}; resume with the config it was saved with (--config "
                              f"{path / CONFIG_FILE}), or start a new run with another --out"
                              + (f" (only {', '.join(may_change)} may change)" if may_change else ""))


def save_config(run_dir: str | Path, config: dict[str, Any]) -> Path:
    """The resolved config as `<run>/config.json` (atomic replace)."""
    path = _inside(run_dir, CONFIG_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(config, indent=1).encode())
    return path


def _inside(run_dir: str | Path, name: str) -> Path:
    """`run_dir/name` (`tracerl.io.files.run_folder.run_path`); CheckpointError when it is a symlink."""
    try:
        return run_path(run_dir, name)
    except OutsideRun as err:
        raise CheckpointError(str(err)) from None


# ---------------------------------------------------------------- save

def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         predictor: Predictor | None, state: dict[str, Any], keep: int = 2,
         config: Mapping[str, Any] | None = None) -> Path:
    """Write checkpoint `step`; returns its folder. `config`: the run's resolved config (None: the run's
    `config.json`, which `run_training` writes before the first step; `{}` when there is none)."""
    run_dir = Path(run_dir)
    root = _inside(run_dir, "checkpoints")
    if config is None:
        try:
            config = read_json(run_dir / CONFIG_FILE)
        except FileNotFoundError:
            config = {}
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{run_dir / CONFIG_FILE} is unreadable ({err}); a checkpoint records the "
                                  "run's config") from None
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*"):  # left by a save that was killed; no save runs concurrently in one run
        with contextlib.suppress(OSError):
            remove(stale)  # a symlink is unlinked, what it leads to left alone
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        torch.save(model.state_dict(), tmp / MODEL_FILE)
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if predictor is not None:
            save_state(tmp / PREDICTOR_FILE, {"state": predictor.state_dict()})
        rng = {"torch_rng": torch.get_rng_state().numpy()}
        device = next(model.parameters()).device
        if device.type == "cuda":  # the model's GPU has a generator of its own (LoRA dropout there draws from it)
            rng["torch_cuda_rng"] = torch.cuda.get_rng_state(device).numpy()
        save_state(tmp / TRAINER_FILE, {**state, **rng})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        for name in (MODEL_FILE, OPTIMIZER_FILE, CONFIG_FILE):
            _fsync_file(tmp / name)
        write_manifest(tmp)  # last: a folder with a manifest is a complete one
        remove(final)  # a step re-run after a resume replaces its old checkpoint (a symlink there: only the link)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(root)
    write_atomic(root / "latest", (final.name + "\n").encode())
    fsync_dir(root)
    done = sorted(p for p in root.glob("step-*")  # real folders only: a symlink is not this run's checkpoint
                  if _STEP_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink() and p != final)
    for old in done[:max(len(done) - max(keep - 1, 0), 0)]:  # the one just written is always kept
        shutil.rmtree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------- load

def _pointed(root: Path) -> tuple[str | None, str]:
    """(the step folder name `latest` names, '') or (None, why it names none usable). FileNotFoundError when there
    is no `latest` (no checkpoint yet)."""
    pointer = root / "latest"
    try:
        name = _read_capped(pointer, MAX_POINTER_BYTES).decode("utf-8").strip()
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:
        return None, f"{pointer} is unreadable ({err})"
    if not _STEP_NAME.fullmatch(name):
        return None, f"{pointer} names {name[:80]!r}, not a step folder of this run"
    return name, ""


def latest(run_dir: str | Path) -> Path | None:
    """The newest intact checkpoint: the one `latest` names, else (with a warning saying why) the newest older
    one that verifies. None before the first save; CheckpointError when none is intact."""
    root = _inside(run_dir, "checkpoints")
    try:
        named, problem = _pointed(root)
    except FileNotFoundError:
        return None
    problems = [problem] if problem else []
    folders = sorted((p for p in root.glob("step-*") if _STEP_NAME.fullmatch(p.name)), reverse=True)
    candidates = [p for p in folders if named is None or p.name < named]
    if named is not None:
        candidates.insert(0, root / named)
    for path in candidates:
        problem = verify(path) if os.path.lexists(path) else f"{path} does not exist"
        if not problem:
            if problems:
                warnings.warn(f"resuming from {path.name}, the newest intact checkpoint; skipped: "
                              + "; ".join(problems), RuntimeWarning, stacklevel=3)
            return path
        problems.append(problem)
    raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(problems)
                          + f". Restore the files from a backup, or delete {root / 'latest'} to start the run over")


def saved_config(run_dir: str | Path, needed: bool) -> str | None:
    """The run's own config (`run_dir/config.json`, what `tracerl train` saved), or None when there is none and
    `needed` is False (the caller's defaults then). With `needed` (a checkpoint is to be loaded, and loads only beside
    the run's config) a missing one raises ValueError naming the fix."""
    saved = run_path(run_dir, CONFIG_FILE)  # a symlink there is refused, not read as this run's
    if saved.is_file():
        return str(saved)
    if not needed:
        return None
    if not run_path(run_dir, "checkpoints").is_dir():
        raise ValueError(f"{run_dir} holds neither a {CONFIG_FILE} nor checkpoints, so it is no run folder of tracerl "
                         "train; give --out the folder the run was trained in")
    raise ValueError(f"{run_dir} holds no {CONFIG_FILE} (tracerl train saves it there), so nothing says which policy "
                     f"and task its checkpoint belongs to; copy the {CONFIG_FILE} of its latest checkpoint "
                     f"({Path(run_dir) / 'checkpoints' / 'step-NNNNNN' / CONFIG_FILE}) to {saved}")


def load(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         predictor: Predictor | None, *, config: Mapping[str, Any] | None = None,
         may_change: Sequence[str] | None = None, defaults: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Restore the newest checkpoint into `model`, `optimizer` and `predictor`; returns the trainer state (None if
    the run has no checkpoint yet).

    The checkpoint's config must equal the resume's, `config` (None: the run's `config.json`), except for the keys
    in `may_change`; a key added to the config since the save takes its value in `defaults`. None for either
    means the trainer's rules (`tracerl.train.config.RESUMABLE_CHANGES`, `TrainConfig`'s defaults)."""
    run_dir = Path(run_dir)
    path = latest(run_dir)
    if path is None:
        return None
    try:
        _check_config(path, run_dir, config, may_change, defaults)
        return _load_from(path, model, optimizer, predictor)
    except CheckpointError:
        raise
    except Exception as err:  # verified bytes that still do not load: the model or config changed since the save
        raise CheckpointError(f"checkpoint {path} does not load into this run ({type(err).__name__}: "
                              f"{str(err)[:300]}); resume with the config it was saved with "
                              f"({run_dir / CONFIG_FILE}) or start a new run directory") from err


def _check_dtypes(file: Path, saved: Any, expected: Mapping[str, torch.Tensor]) -> None:
    """CheckpointError naming the first tensor of `saved` whose dtype is not the model's (names and shapes are
    `load_state_dict`'s to check: it refuses those, but copies a float16 tensor into a float32 model silently)."""
    if not isinstance(saved, Mapping):
        raise CheckpointError(f"{file} holds a {type(saved).__name__}, not a state dict")
    wrong = [(k, v.dtype, expected[k].dtype) for k, v in saved.items()
             if k in expected and isinstance(v, torch.Tensor) and v.dtype != expected[k].dtype]
    if wrong:
        key, found, want = wrong[0]
        raise CheckpointError(f"{file} holds {key!r} as {found}, the model's is {want} ({len(wrong)} of its tensors "
                              f"differ in dtype); the trainer keeps {want} weights (policy.precision sets only the "
                              f"dtype the forwards compute in), so this checkpoint was written elsewhere: convert "
                              f"its tensors to {want} and save it again, or start a new run directory")


def _load_from(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               predictor: Predictor | None) -> dict[str, Any]:
    """Read the files `loaded_files` names (verified by `latest`), each opened only as a regular file."""
    saved_predictor = PREDICTOR_FILE in _manifest_files(path / MANIFEST_FILE)
    if saved_predictor != (predictor is not None):
        raise CheckpointError(f"{path} was saved {'with' if saved_predictor else 'without'} a predictor and this "
                              f"run has {'none' if saved_predictor else 'one'}; resume with the config it was saved "
                              "with")
    device = next(model.parameters()).device
    with open_regular(path / MODEL_FILE) as f:
        saved = torch.load(f, map_location=device, weights_only=True)
    _check_dtypes(path / MODEL_FILE, saved, model.state_dict())  # load_state_dict would convert them silently
    model.load_state_dict(saved)
    # the optimizer moves each state tensor to its parameter's device; map_location only has to make them loadable
    with open_regular(path / OPTIMIZER_FILE) as f:
        optimizer.load_state_dict(torch.load(f, map_location=device, weights_only=True))
    if predictor is not None:
        open_regular(path / PREDICTOR_FILE).close()  # a regular file (load_state opens it by name)
        predictor.load_state_dict(load_state(path / PREDICTOR_FILE)["state"])
    open_regular(path / TRAINER_FILE).close()
    state = load_state(path / TRAINER_FILE)
    torch.set_rng_state(torch.from_numpy(np.asarray(state.pop("torch_rng"), dtype=np.uint8)))
    cuda_rng = state.pop("torch_cuda_rng", None)
    if cuda_rng is not None and device.type == "cuda":  # a GPU run resumed on a CPU has no use for it
        torch.cuda.set_rng_state(torch.from_numpy(np.asarray(cuda_rng, dtype=np.uint8)), device)
    return state
