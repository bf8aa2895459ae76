"""What a run folder holds is the run's own: every path code reads or writes in it stays inside it.

A run folder (`runs/trace-seed0/`) holds `config.json`, `metrics.jsonl`, `.lock`, `checkpoints/` (step folders and
the `latest` pointer), `trees/`, `provenance.json` and the report. Any of them could be a symlink (planted, or left
by copying runs around): followed, a step folder linked to another run's would resume that run's weights, a linked
`metrics.jsonl` would take this run's rows, a linked `.lock` would be overwritten with a pid, and a save replacing a
linked step folder would delete what it leads to. So:

- `run_path(run_dir, *names)` is how code names what a run folder holds: each name a plain name (no `/`, no `.` or
  `..`, no NUL), no component below the run folder a symlink, and the resolved path inside the resolved run folder;
  else `OutsideRun` names the path and the fix. The run folder itself may be a symlink (a comparison's runs gathered
  under one name): only what it holds must not lead out of it.
- `replacing(path)` (and `write_atomic(path, data)`) writes a new temporary (`O_EXCL`: a planted temporary or
  symlink is never written through) and renames it over `path` (a rename replaces a symlink, it does not follow
  it); `open_append` opens with `O_NOFOLLOW`; `remove` unlinks a symlink and deletes only real folders.

Deliberately not here: a defence against a process that swaps a folder for a symlink between the check and the use
(one process trains a run folder, `tracerl.io.files.runlog.run_lock`), and what the files hold (their readers check it).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO


class OutsideRun(ValueError):
    """A path of a run folder is a symlink or not a plain name: it could lead outside the run folder."""


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _refuse(path: Path) -> OutsideRun:
    target = os.readlink(path)
    return OutsideRun(f"{path} is a symlink (to {target[:200]}); what a run folder holds is the run's own and no "
                      "symlink in it is followed: replace the link with a copy of what it leads to if that belongs "
                      "to this run, remove it, or give another --out")


def run_path(run_dir: str | Path, *names: str) -> Path:
    """`run_dir/names[0]/names[1]/...`, checked to stay inside `run_dir` (see the module docstring). The path need
    not exist; a component that exists must not be a symlink."""
    root = Path(run_dir)
    path = root
    for name in names:
        if not _plain(name):
            raise OutsideRun(f"{name[:80]!r} in {root} is not a plain file name; a run folder's files are named "
                             "by tracerl (step-NNNNNN, metrics.jsonl, ...)")
        path = path / name
        if os.path.islink(path):
            raise _refuse(path)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:  # cannot happen after the checks above
        raise OutsideRun(f"{path} resolves outside the run folder {root}")
    return path


@contextmanager
def replacing(path: Path, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block ends, whole or not at all: a new temporary in the same
    folder (created exclusively, so a planted temporary or symlink is never written through), fsynced unless
    `fsync` is false, renamed over `path` (which may be a symlink: the rename replaces the link, never the file it
    leads to). An exception in the block leaves `path` as it was and removes the temporary."""
    while True:  # a fresh name, created exclusively (O_EXCL fails on anything there, a symlink included)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """`data` as file `path`, through `replacing`."""
    with replacing(path) as f:
        f.write(data)


def open_append(path: Path) -> TextIO:
    """`path` opened to append UTF-8 text (created if need be), never through a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refuse(path) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def remove(path: Path) -> None:
    """Delete `path` if it exists: a symlink or file is unlinked (never followed), a folder deleted with what it
    holds (`shutil.rmtree` does not follow symlinks inside it)."""
    if os.path.islink(path) or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
