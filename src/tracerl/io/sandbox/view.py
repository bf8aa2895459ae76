"""What a sandboxed call may read besides its workdir, decided by the parent: the read roots (the system directories
and the prefixes of the interpreter the call runs) and, for a call without root, the entries beneath them that other
users may not read. The launcher grants the roots to Landlock minus those entries (`child.readable_rules`).

As root a call runs as a uid of its own with no groups, so file permissions already give it what "other" may read,
and no walk is needed (`read_view(roots, walk=False)`). Without root it keeps the caller's uid and groups, which may
read more (a file of the caller's own, or of one of its groups, under /etc or /usr): `hidden_entries` walks the
roots once per process to find what others may not read. It does not follow every later change: the folders that
held such an entry are listed again at each call (a new private file there stays hidden, a new folder there is
granted whole, unwalked), and an entry made private after the walk inside a folder that was public then stays
readable to a non-root call until the process restarts.
Nothing here runs model code.
"""

from __future__ import annotations

import functools
import os
import stat
from typing import Callable, Iterable, Iterator

SYSTEM_ROOTS = ("/usr", "/lib", "/lib64", "/etc")  # /bin and /sbin live in /usr, or are links to it


def other_accessible(path: str) -> bool:
    """Whether a user who is neither `path`'s owner nor in its group may reach it (every folder above it searchable
    by others) and read it (a folder: list and enter it)."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
        above = [os.stat(p) for p in _ancestors(path)]
    except OSError:
        return False
    need = 0o5 if stat.S_ISDIR(st.st_mode) else 0o4
    return st.st_mode & need == need and all(s.st_mode & 0o1 for s in above)


def read_roots(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """The folders a call may read beneath: the system directories and the interpreter's `prefixes`, resolved,
    none inside another, sorted."""
    resolved = sorted({os.path.realpath(p) for p in SYSTEM_ROOTS + tuple(prefixes) if os.path.isdir(p)})
    return tuple(p for p in resolved if not any(p.startswith(q.rstrip("/") + "/") for q in resolved if q != p))


@functools.cache
def read_view(roots: tuple[str, ...], walk: bool) -> dict[str, list[str]]:
    """What the launcher grants (`child.readable_rules`): the `read_roots`; the `hidden` entries beneath them
    (when `walk`: a call without root); the folders with a hidden entry beneath, which it grants entry by entry
    (`descend`); and those with a hidden folder beneath, which it may not list (`unlisted`)."""
    hidden = hidden_entries(roots) if walk else ()
    descend, unlisted = set(), set()
    for path in hidden:
        try:
            folder, parent = stat.S_ISDIR(os.lstat(path).st_mode), path
        except OSError:  # gone since the walk: take the stricter case
            folder, parent = True, path
        while parent not in roots and parent != "/":
            parent = os.path.dirname(parent)
            descend.add(parent)
            if folder:
                unlisted.add(parent)
    return {"read_roots": list(roots), "hidden": list(hidden), "descend": sorted(descend),
            "unlisted": sorted(unlisted)}


@functools.cache
def hidden_entries(roots: tuple[str, ...]) -> tuple[str, ...]:
    """Entries beneath `roots` that others may not read, found once per process (about 2 s per 200,000 files):
    folders others may not list or enter (nothing beneath them is visited), files others may not read, and files
    that are neither regular files, folders nor symlinks (a FIFO or socket would be a channel to the host). A
    symlink is not an entry of its own: Landlock checks the path it resolves to."""
    hidden = []
    for entry, st in scan(roots, enter=lambda st: st.st_mode & 0o5 == 0o5):
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if mode & 0o5 != 0o5:
                hidden.append(entry.path)
        elif stat.S_ISREG(mode):
            if not mode & 0o4:
                hidden.append(entry.path)
        elif not stat.S_ISLNK(mode):
            hidden.append(entry.path)
    return tuple(sorted(hidden))


def scan(roots: Iterable[str], enter: Callable[[os.stat_result], bool] = lambda st: True
         ) -> Iterator[tuple[os.DirEntry, os.stat_result]]:
    """Every entry beneath `roots` with its own stat (symlinks not followed), without recursion, so any depth is
    walked; a folder is entered when `enter(its stat)` says so; entries that vanish or cannot be read are skipped."""
    todo = list(roots)
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and enter(st):
                todo.append(entry.path)
            yield entry, st


def _ancestors(path: str) -> list[str]:
    parts = path.rstrip("/").split("/")[1:-1]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]
