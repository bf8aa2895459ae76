"""Checkpoints of a run directory: written whole or not at all, the newest named by an atomically replaced file.

Layout: `<run>/checkpoints/step-000012/` holds `model.pt` (state dict), `optimizer.pt`, `predictor.npz`
(`tracerl.io.state`) and `trainer.npz` (step, data cursor and order, cumulative ledger totals, the numpy
generators' states, torch's CPU RNG state and, for a model on a GPU, that GPU's). A checkpoint is written into a
temporary sibling folder, fsynced and renamed into place; then `<run>/checkpoints/latest` (a one-line file, replaced
atomically) is pointed at it, and checkpoints older than the newest `keep` are deleted. A kill at any moment leaves
`latest` naming a complete checkpoint (or no `latest` at all before the first one).

With LoRA the model's state dict holds the frozen base weights and the adapters under peft's names
(`...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight`); it loads into a model built from the same config.
Tensors load onto the device of the model they go into, so a checkpoint written on a GPU loads on a CPU.

Deliberately not here: sharded or distributed checkpoints, safetensors export for serving (use
`model.save_pretrained` on the loaded model).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracerl.core.predictor import Predictor
from tracerl.io.state import fsync_dir, load_state, save_state

CONFIG_FILE = "config.json"


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
    done = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: str | Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / "trainer.npz").is_file():
        raise ValueError(f"{pointer} names {path.name}, which is incomplete; delete {pointer} to start over")
    return path


def load(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         predictor: Predictor | None) -> dict[str, Any] | None:
    """Restore the newest checkpoint into `model`, `optimizer` and `predictor`; returns the trainer state (None if
    the run has no checkpoint yet)."""
    path = latest(run_dir)
    if path is None:
        return None
    device = next(model.parameters()).device
    model.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
    # the optimizer moves each state tensor to its parameter's device; map_location only has to make them loadable
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    if predictor is not None:
        predictor.load_state_dict(load_state(path / "predictor.npz")["state"])
    state = load_state(path / "trainer.npz")
    torch.set_rng_state(torch.from_numpy(np.asarray(state.pop("torch_rng"), dtype=np.uint8)))
    cuda_rng = state.pop("torch_cuda_rng", None)
    if cuda_rng is not None and device.type == "cuda":  # a GPU run resumed on a CPU has no use for it
        torch.cuda.set_rng_state(torch.from_numpy(np.asarray(cuda_rng, dtype=np.uint8)), device)
    return state
