"""Cgroups made ahead of the sandbox's calls, and removed after the calls have returned.

Making a call's cgroups (a folder per hierarchy, and its limits) and removing them depend only on the call's limits,
never on its code, so neither needs to sit between a caller and its result: `take(limits)` hands out cgroups made
before the call for exactly those limits (or makes them at once when none are ready), `release(cgroups)` notes a
finished call's cgroups, and `tend(limits)`, which `run_python` calls while its launcher applies the layers and the
code runs (the caller only waits then), removes the released ones and makes the next call's. Each cgroup is made
fresh, handed out once and removed after its call, never handed out again: a cgroup keeps counts of what ran in it
(OOM kills, limit hits, peak use), which another call would inherit. Ready and released cgroups sit empty under the
caller's cgroup, named as every call's are (`cgroups`): those of a caller killed before its exit are swept
by its successor's first call. A forked copy of the calling process starts with a pool of its own, empty.

Nothing here starts, limits or inspects a process; `cgroups` makes, checks and removes the folders.
"""

from __future__ import annotations

import atexit
import os
import threading

import tracerl.io.sandbox.cgroups as sandbox_cgroups

DEPTH = 2  # cgroups kept ready per set of limits: the next call's, and one for a second thread calling at once

Key = tuple[int, int, int]  # memory_mb, max_disk_mb, max_processes: what make_cgroups sets


class CgroupPool:
    """Cgroups ready for calls, by limits (`Key`), and those of finished calls, waiting for removal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: dict[Key, list[list[str]]] = {}
        self.released: list[list[str]] = []

    def take(self, key: Key) -> list[str]:
        """Fresh cgroups for one call with these limits, handed out to no other; [] where the host gives none."""
        with self.lock:
            ready = self.ready.get(key)
            if ready:
                return ready.pop(0)
        return sandbox_cgroups.make_cgroups(*key) if sandbox_cgroups.cgroup_parents() else []

    def release(self, cgroups: list[str]) -> None:
        """A finished call's cgroups (every process of the call is gone), for the next `tend` to remove."""
        if cgroups:
            with self.lock:
                self.released.append(cgroups)

    def tend(self, key: Key | None) -> None:
        """Remove the released cgroups, and make cgroups for calls with limits `key` (if any) until DEPTH are ready."""
        with self.lock:
            released, self.released = self.released, []
        for cgroups in released:
            sandbox_cgroups.remove_cgroups(cgroups)
        if key is None or not sandbox_cgroups.cgroup_parents():
            return
        while True:
            with self.lock:
                if len(self.ready.get(key, ())) >= DEPTH:
                    return
            made = sandbox_cgroups.make_cgroups(*key)
            if not made:
                return
            with self.lock:
                self.ready.setdefault(key, []).append(made)

    def close(self) -> None:
        """Remove every cgroup the pool holds, ready or released (at exit)."""
        with self.lock:
            left = self.released + [c for ready in self.ready.values() for c in ready]
            self.released, self.ready = [], {}
        for cgroups in left:
            sandbox_cgroups.remove_cgroups(cgroups)


POOL = CgroupPool()
atexit.register(lambda: POOL.close())


def _new_pool() -> None:
    """In a forked child: a pool of its own (the parent's cgroups are the parent's to hand out and remove)."""
    global POOL
    POOL = CgroupPool()


os.register_at_fork(after_in_child=_new_pool)
