"""The sandbox's cgroups: one memory and one process-count group per call, nested under the caller's own.

`make_cgroups(memory_mb, max_disk_mb, max_processes)` makes them where the caller's cgroup lets it (cgroup v2 with
memory and pids delegated to children, or v1's memory and pids hierarchies) and returns their folders, or [] where
the host offers none (the sandbox then bounds memory per process; see `tracerl.io.sandbox`); the launcher moves itself
into them before the code runs (`child.join_cgroups`). `cgroup_oom` says whether the kernel's OOM killer acted in
them, `remove_cgroups` removes them once every process of the call is gone; `pool` makes and removes them
off the caller's path. Groups left by a caller killed mid-call are swept on its successor's first call. Nothing here
applies a limit to a running process or reads its usage.
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings

SERIAL = itertools.count()


@functools.cache
def cgroup_parents() -> tuple[tuple[str, str], ...]:
    """Where this process may make child cgroups with memory and process limits: ("v2", dir) when its cgroup v2
    group delegates both controllers to children, else ("memory", dir) and ("pids", dir) of cgroup v1; () when
    neither is writable. The call's cgroups nest under the caller's own, so they stay inside its limits."""
    mounts, own = {}, {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
                if fstype == "cgroup2":
                    mounts.setdefault("v2", fields[4])
                elif fstype == "cgroup":
                    for controller in ("memory", "pids"):
                        if controller in options:
                            mounts.setdefault(controller, fields[4])
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else ["v2"]:
                    own[controller] = path
    except (OSError, ValueError):
        return ()
    if "v2" in mounts and "v2" in own:
        parent = mounts["v2"] + own["v2"].rstrip("/")
        try:
            with open(parent + "/cgroup.subtree_control") as f:
                delegated = set(f.read().split())
        except OSError:
            delegated = set()
        if {"memory", "pids"} <= delegated and os.access(parent, os.W_OK):
            return (("v2", parent),)
    parents = tuple((c, mounts[c] + own[c].rstrip("/")) for c in ("memory", "pids") if c in mounts and c in own)
    if len(parents) == 2 and all(os.access(d, os.W_OK) for _, d in parents):
        return parents
    return ()


def sweep_cgroups(parents: tuple[tuple[str, str], ...]) -> None:
    """Remove the empty cgroups of sandbox callers that died mid-call (killed before their cleanup ran)."""
    for _, parent in parents:
        for entry in os.scandir(parent):
            fields = entry.name.split("-")
            if fields[:2] == ["tracerl", "sandbox"] and len(fields) == 4 and fields[2].isdigit():
                if not os.path.exists(f"/proc/{fields[2]}"):
                    try:
                        os.rmdir(entry.path)
                    except OSError:
                        pass  # still has processes, or another sweeper got there first


def make_cgroups(memory_mb: int, max_disk_mb: int, max_processes: int) -> list[str]:
    """Make the call's cgroups and set their limits: memory (the code's own plus its tmpfs files, which are
    charged to it) and processes (threads and the launcher included); [] when the host offers none."""
    memory = (memory_mb + max_disk_mb) << 20
    settings = {"v2": {"memory.max": memory, "memory.swap.max": 0, "pids.max": max_processes},
                "memory": {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory},
                "pids": {"pids.max": max_processes}}
    made = []
    serial = next(SERIAL)
    if serial == 0:
        sweep_cgroups(cgroup_parents())
    name = f"tracerl-sandbox-{os.getpid()}-{serial}"
    try:
        for kind, parent in cgroup_parents():
            directory = os.path.join(parent, name)
            os.mkdir(directory)
            made.append(directory)
            for key, value in settings[kind].items():
                try:
                    with open(os.path.join(directory, key), "w") as f:
                        f.write(str(value))
                except FileNotFoundError:
                    if key not in ("memory.swap.max", "memory.memsw.limit_in_bytes"):  # no swap accounting
                        raise
    except OSError:
        remove_cgroups(made)
        return []
    return made


def cgroup_oom(cgroups: list[str]) -> bool:
    """Whether the kernel's OOM killer acted in the call's memory cgroup."""
    for directory in cgroups:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(directory, name)) as f:
                    counts = dict(line.split() for line in f if len(line.split()) == 2)
            except OSError:
                continue
            if int(counts.get("oom_kill", 0)) > 0:
                return True
    return False


def remove_cgroups(cgroups: list[str]) -> None:
    """Remove the call's cgroups; they are empty, since every process of the call is gone."""
    for directory in cgroups:
        try:
            os.rmdir(directory)
        except OSError as exc:
            warnings.warn(f"could not remove the sandbox's cgroup {directory}: {exc}", RuntimeWarning, stacklevel=3)
