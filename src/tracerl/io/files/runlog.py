"""A run's metrics: one JSON object per line in `metrics.jsonl`, optionally mirrored to TensorBoard.

Every row has `step` and `kind` ("train" for a training step, "eval" for a held-out evaluation), then
namespaced keys (`rollout/`, `alloc/`, `predictor/`, `train/`, `eval/`, `sys/`). Rows are flushed as they are
written, so a killed run keeps every finished step. On resume, `truncate_after(step)` drops rows of steps the
checkpoint does not cover, so the file reads as if the run had never stopped. NaN and infinities are written
as null (JSON has neither).

With `run.save_trees`, each step's pool and trees go to `trees/step-NNNNNN.json.gz` (`write_trees`): for every
pool prompt its id, predicted p and stage-1 grant (0 = filtered out), and every grown tree in `Tree.to_dict` form
(token ids, logprobs, masks, text, rewards, each node's p_pred, expand_reason and num_granted). Every step, trees
kept or not, its rollouts go to `rollouts/step-NNNNNN.json` in columns (`write_rollouts`; `tracerl.core.tally`): a
few kB that the stage-2 and grant tables read when the trees are not kept.

One process trains a run directory at a time: `run_lock(run_dir)` holds an exclusive lock on `<run>/.lock` while a
run trains, and a second process that asks for it gets `RunInUse` naming the holder, so two resumed copies of one
run (two overlapping `tracerl compare` invocations, a second `tracerl train --resume`) cannot interleave their
steps in one folder. The kernel drops the lock when its process ends, killed or not: no stale lock to clean up.

Every file here is named through `tracerl.io.files.run_folder.run_path` and written by its `replacing` (`write_atomic`)
or `open_append`: a metrics file, lock, trees folder or config that is a symlink is refused (`OutsideRun`, naming it),
never read or written through, so no run appends to, truncates or reports another's records.

Deliberately not here: plotting and tables (`tracerl.report`), wall-clock-free comparison (callers drop
`sys/` keys when comparing runs).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracerl.io.files import decode_utf8
from tracerl.io.files.run_folder import open_append, replacing, run_path, write_atomic

METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"  # <run>/.lock: held (flock) by the process training the run; it holds that process's pid
TREES_DIR = "trees"  # <run>/trees/step-000012.json.gz: one step's pool and trees (see write_trees)
ROLLOUTS_DIR = "rollouts"  # <run>/rollouts/step-000012.json: one step's rollouts in columns (see write_rollouts)
PROVENANCE_FILE = "provenance.json"  # <run>/provenance.json: starting weights, code, machine (policy.embedded)


def reached_stop(num_steps: int, total_token_budget: int, step: int, cum_tokens: float) -> bool:
    """Whether a run is done: `num_steps` steps trained, or (`total_token_budget` above 0) that many tokens sampled.
    The trainer's stop (`RunConfig.finished`) and the reports' reading of a finished run folder share it."""
    return step >= num_steps or (total_token_budget > 0 and cum_tokens >= total_token_budget)


def finished_run(run_dir: str | Path) -> bool | None:
    """Whether a run folder holds a finished run: its last training step was evaluated and, by its saved config
    (`config.json`, tracerl.train.checkpoint.CONFIG_FILE), it reached `run.num_steps` or `run.total_token_budget`
    sampled tokens (so methods under one token budget may end at different steps). False when its metrics are
    missing or its last step was not evaluated; None when it has no saved config (the caller decides, e.g. by
    comparing where runs end)."""
    try:
        rows = read_metrics(run_dir)
    except ValueError:
        return False
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not train or not evals or train[-1]["step"] != evals[-1]["step"]:
        return False
    try:
        path = run_path(run_dir, "config.json")
        if not path.exists():
            return None
        cfg = json.loads(decode_utf8(path.read_bytes(), str(path)))["run"]
        return reached_stop(cfg.get("num_steps", 0), cfg.get("total_token_budget", 0), train[-1]["step"],
                            train[-1].get("rollout/cum_tokens", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # a torn or foreign config
        return False


def finite(value: Any) -> Any:
    """`value` with every NaN and infinity, at any depth of dicts, lists and tuples, as None: they are not JSON."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of `run_dir/metrics.jsonl` (a torn last line, from a kill mid-write, is skipped)."""
    path = run_path(run_dir, METRICS_FILE)
    if not path.is_file():
        raise ValueError(f"{path} does not exist; is {run_dir} a tracerl run directory?")
    rows = []
    for line in decode_utf8(path.read_bytes(), str(path)).splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class RunLog:
    """Append-only metrics of one run directory (see the module docstring)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = False):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = run_path(self.dir, METRICS_FILE)
        self.writer = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise ValueError("run.tensorboard=true needs tensorboardX: pip install tensorboardX, or set "
                                 "run.tensorboard=false") from None
            self.writer = SummaryWriter(str(run_path(self.dir, "tensorboard")))

    def truncate_after(self, step: int) -> None:
        """Keep only rows with row["step"] <= step (and drop a torn last line)."""
        if not self.path.exists():
            return
        kept = [row for row in read_metrics(self.dir) if row["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept).encode())

    def write(self, kind: str, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": int(step), "kind": kind, **finite(metrics)}
        with open_append(self.path) as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()
        return row

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def write_trees(run_dir: str | Path, step: int, record: dict[str, Any]) -> Path:
    """`record` ({"step", "method", "pool": [...], "trees": [...]}) as gzipped JSON, written then renamed."""
    path = run_path(run_dir, TREES_DIR, f"step-{step:06d}.json.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, fsync=False) as raw, gzip.open(raw, "wt", encoding="utf-8") as f:
        json.dump(record, f, separators=(",", ":"))
    return path


def read_trees(run_dir: str | Path, step: int | None = None) -> dict[str, Any]:
    """The record `write_trees` wrote for `step` (default: the run's last step with trees)."""
    directory = run_path(run_dir, TREES_DIR)
    steps = sorted(int(p.name[5:11]) for p in directory.glob("step-*.json.gz")) if directory.is_dir() else []
    if not steps:
        raise ValueError(f"{run_dir} has no saved trees; train with run.save_trees=true")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"{run_dir} has no trees for step {step}; steps with trees: {steps}")
    with gzip.open(run_path(directory, f"step-{step:06d}.json.gz"), "rt", encoding="utf-8") as f:
        return json.load(f)


def write_rollouts(run_dir: str | Path, step: int, columns: dict[str, list]) -> Path:
    """One step's rollouts as `tracerl.core.tally.to_columns` gives them, compact JSON, written then renamed (a
    resumed run that trains the step again replaces it)."""
    path = run_path(run_dir, ROLLOUTS_DIR, f"step-{step:06d}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, fsync=False) as f:
        f.write(json.dumps({"step": step, "rollouts": columns}, separators=(",", ":")).encode())
    return path


def read_rollouts(run_dir: str | Path) -> dict[int, dict[str, list]]:
    """Every step's rollout columns `write_rollouts` wrote, by step (empty when the run has none)."""
    directory = run_path(run_dir, ROLLOUTS_DIR)
    if not directory.is_dir():
        return {}
    out = {}
    for path in sorted(directory.glob("step-*.json")):
        path = run_path(directory, path.name)
        out[int(path.name[5:11])] = json.loads(decode_utf8(path.read_bytes(), str(path)))["rollouts"]
    return out


class RunInUse(RuntimeError):
    """Another process is training this run directory."""


@contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold `<run_dir>/.lock` exclusively for the block (made with the folder if need be); `RunInUse` if another
    process holds it. flock(2) locks belong to the open file, so a second holder in the same process is refused too."""
    path = run_path(run_dir, LOCK_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    # read and write, created if need be, never through a symlink (the file it leads to would get our pid)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "r+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise RunInUse(f"{run_dir} is being trained by another process (pid {holder}); wait for it to end, "
                           "or give another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
