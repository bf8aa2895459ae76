"""Ending a sandboxed call: killing its process group and waiting until no member of it runs, and removing its
workdir whatever the code left in it (any depth, any modes) without changing a mode outside it.

Nothing here decides when a call ends or reads what it printed; `sandbox.run_python` does. Cleanup that can wait
until a call has returned (its cgroups) is `pool`'s.
"""

from __future__ import annotations

import os
import signal
import stat
import time
import warnings

from tracerl.io.sandbox.view import scan


def kill_group(pgid: int) -> None:
    """SIGKILL every process in the group, then wait until none but the unreaped leader is alive: no fixed settle
    time, since a killed process on a loaded host can take any time to go. The code's PID namespace init is in
    the group (seccomp forbids leaving it), and it finishes dying only after the kernel has reaped every other
    process of its namespace; a member counts as gone when it is a zombie with no thread left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # no group yet: a launcher forked by the server before its setsid, alone so far
        try:
            os.kill(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    while live_members(pgid) - {pgid}:
        time.sleep(0.005)


def live_members(pgid: int) -> set[int]:
    """Pids of the processes in process group `pgid` that still run a thread, read from /proc."""
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, _ppid, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]  # after "pid (comm)"
                if int(pgrp) == pgid and (state not in (b"Z", b"X") or len(os.listdir(f"/proc/{entry}/task")) > 1):
                    members.add(int(entry))
            except (OSError, ValueError):
                continue
    return members


def remove_workdir(path: str) -> None:
    """Remove a finished call's workdir: one rmdir as a rule (the code's files were in its tmpfs, which ended with its
    mount namespace), `remove_tree` when the code wrote to the host's disk (no tmpfs)."""
    try:
        os.rmdir(path)
    except OSError:
        remove_tree(path)


def tree_bytes(path: str) -> int:
    """Bytes in regular files beneath `path` (size or allocated blocks, the larger: fallocate reserves blocks and
    leaves the size; no symlinks followed)."""
    return sum(max(st.st_size, st.st_blocks * 512) for _, st in scan([path]) if stat.S_ISREG(st.st_mode))


def remove_tree(path: str) -> None:
    """Delete the workdir, however deep (no recursion: each directory's subdirectories are first moved up to
    the top, so no path grows long) and whatever permissions the code left; modes are only ever changed beneath
    `path`, never on `path`'s parent. Warns instead of raising."""
    root = os.path.realpath(path)
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    todo, problems, done = [root], [], 0
    try:
        while done < len(todo):  # every directory ends up directly under root, emptied of files
            current = todo[done]
            done += 1
            os.chmod(current, 0o700)  # the workdir or a directory in it: the code may have locked it
            for entry in list(os.scandir(current)):
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
                elif current == root:
                    todo.append(entry.path)
                else:
                    flat = os.path.join(root, f".tracerl-flat-{len(todo)}")
                    while os.path.lexists(flat):
                        flat += "x"
                    os.chmod(entry.path, 0o700)  # moving a directory rewrites its "..": without root, needs w
                    os.rename(entry.path, flat)
                    todo.append(flat)
        for directory in reversed(todo):  # all empty now, root last
            os.rmdir(directory)
    except OSError as exc:
        problems.append(exc)
    if problems or os.path.lexists(root):
        warnings.warn(f"could not remove sandbox workdir {root}: {problems}", RuntimeWarning, stacklevel=3)
