"""Checkpoints of a run directory: written whole or not at all, the newest named by an atomically replaced file.

Layout: `<run>/checkpoints/step-000012/` holds `model.pt` (state dict), `optimizer.pt`, `predictor.npz`
(`tracerl.io.state`) and `trainer.npz` (step, data cursor and order, cumulative ledger totals, the numpy
generators' states, torch's CPU RNG state and, for a model on a GPU, that GPU's). A checkpoint is written into a
temporary sibling folder, fsynced and renamed into place; then `<run>/checkpoints/latest` (a one-line file, replaced
atomically) is pointed at it, and checkpoints older than the newest `keep` are deleted (never the one just written).
A kill at any moment leaves `latest` naming a complete checkpoint (or no `latest` at all before the first one).

Integrity: `manifest.json` (the SHA-256 and size of every other file) is written last, before the rename. `load`
verifies it; a checkpoint with a missing manifest, a missing file or a changed byte is skipped with a warning naming
the file, and the newest older intact checkpoint is loaded instead; if none is intact, the error names each file and
the fix. Temporary folders (`.step-*`) left by a killed save are removed by the next save.

With LoRA the model's state dict holds the frozen base weights and the adapters under peft's names
(`...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight`); it loads into a model built from the same config.
Tensors load onto the device of the model they go into, so a checkpoint written on a GPU loads on a CPU.

Deliberately not here: sharded or distributed checkpoints, safetensors export for serving (use
`model.save_pretrained` on the loaded model).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracerl.core.predictor import Predictor
from tracerl.io.state import fsync_dir, load_state, save_state

CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"


class CheckpointError(ValueError):
    """No checkpoint of a run could be loaded; the message names the files and the fix."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """`<folder>/manifest.json`: {file name: {"sha256", "bytes"}} of every other file, fsynced."""
    files = {p.name: {"sha256": _digest(p), "bytes": p.stat().st_size}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST_FILE}
    with open(folder / MANIFEST_FILE, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify(folder: Path) -> str:
    """'' when every file listed in the folder's manifest is there with its size and SHA-256, else the problem."""
    manifest = folder / MANIFEST_FILE
    try:
        files = json.loads(manifest.read_text())["files"]
        assert isinstance(files, dict)
    except FileNotFoundError:
        return f"{manifest} is missing (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        return f"{manifest} is unreadable ({type(err).__name__}: {err})"
    for name, entry in files.items():
        path = folder / name
        try:
            if path.stat().st_size != entry["bytes"] or _digest(path) != entry["sha256"]:
                return f"{path} does not match its checksum in {manifest} (the file was changed or corrupted)"
        except OSError as err:
            return f"{path} is listed in {manifest} but cannot be read ({err.strerror})"
        except (KeyError, TypeError):
            return f"{manifest} has a malformed entry for {name}"
    return ""


def save_config(run_dir: str | Path, config: dict[str, Any]) -> Path:
    """The resolved config as `<run>/config.json` (atomic replace)."""
    path = Path(run_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=1))
    os.replace(tmp, path)
    return path


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         predictor: Predictor | None, state: dict[str, Any], keep: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*"):  # left by a save that was killed; no save runs concurrently in one run
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if predictor is not None:
            save_state(tmp / "predictor.npz", {"state": predictor.state_dict()})
        rng = {"torch_rng": torch.get_rng_state().numpy()}
        device = next(model.parameters()).device
        if device.type == "cuda":  # the model's GPU has a generator of its own (LoRA dropout there draws from it)
            rng["torch_cuda_rng"] = torch.cuda.get_rng_state(device).numpy()
        save_state(tmp / "trainer.npz", {**state, **rng})
        for name in ("model.pt", "optimizer.pt"):
            _fsync_file(tmp / name)
        write_manifest(tmp)  # last: a folder with a manifest is a complete one
        if final.exists():  # a step re-run after a resume: replace its old checkpoint
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(root)
    pointer = root / "latest.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / "latest")
    fsync_dir(root)
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and p != final)
    for old in done[:max(len(done) - max(keep - 1, 0), 0)]:  # the one just written is always kept
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: str | Path) -> Path | None:
    """The newest intact checkpoint: the one `latest` names, else (with a warning saying why) the newest older
    one whose manifest verifies. None before the first save; CheckpointError when none is intact."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    named = root / pointer.read_text().strip()
    candidates = [named] + sorted((p for p in root.glob("step-*") if p.is_dir() and p.name < named.name),
                                  reverse=True)
    problems = []
    for path in candidates:
        problem = verify(path) if path.is_dir() else f"{path} does not exist"
        if not problem:
            if problems:
                warnings.warn(f"resuming from {path.name}, the newest intact checkpoint; skipped: "
                              + "; ".join(problems), RuntimeWarning, stacklevel=3)
            return path
        problems.append(problem)
    raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(problems)
                          + f". Restore the files from a backup, or delete {pointer} to start the run over")


def load(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         predictor: Predictor | None) -> dict[str, Any] | None:
    """Restore the newest checkpoint into `model`, `optimizer` and `predictor`; returns the trainer state (None if
    the run has no checkpoint yet)."""
    path = latest(run_dir)
    if path is None:
        return None
    try:
        return _load_from(path, model, optimizer, predictor)
    except CheckpointError:
        raise
    except Exception as err:  # verified bytes that still do not load: the model or config changed since the save
        raise CheckpointError(f"checkpoint {path} does not load into this run ({type(err).__name__}: "
                              f"{str(err)[:300]}); resume with the config it was saved with "
                              f"({Path(run_dir) / CONFIG_FILE}) or start a new run directory") from err


def _load_from(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               predictor: Predictor | None) -> dict[str, Any]:
    device = next(model.parameters()).device
    model.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
    # the optimizer moves each state tensor to its parameter's device; map_location only has to make them loadable
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    if predictor is not None:
        if not (path / "predictor.npz").is_file():
            raise CheckpointError(f"{path / 'predictor.npz'} is missing: the checkpoint was saved without a predictor; "
                                  "resume with the config it was saved with")
        predictor.load_state_dict(load_state(path / "predictor.npz")["state"])
    state = load_state(path / "trainer.npz")
    torch.set_rng_state(torch.from_numpy(np.asarray(state.pop("torch_rng"), dtype=np.uint8)))
    cuda_rng = state.pop("torch_cuda_rng", None)
    if cuda_rng is not None and device.type == "cuda":  # a GPU run resumed on a CPU has no use for it
        torch.cuda.set_rng_state(torch.from_numpy(np.asarray(cuda_rng, dtype=np.uint8)), device)
    return state
