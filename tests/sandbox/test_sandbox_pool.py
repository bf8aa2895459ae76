"""The cgroups made ahead of the sandbox's calls (`sandbox_pool`): each is handed out once, with the limits it was
asked for, and removed after its call; nothing of a pool passes to a forked copy of the process. The cgroup folders
are plain folders here (a cgroup v2 parent in tmp_path), so these tests need neither root nor cgroups."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import tracerl.io.sandbox.cgroups as sandbox_cgroups
import tracerl.io.sandbox.pool as sandbox_pool
from tracerl.io.sandbox.pool import DEPTH, CgroupPool

SMALL, BIG = (100, 20, 12), (512, 64, 64)


@pytest.fixture
def parent(tmp_path, monkeypatch):
    """A cgroup v2 parent that is a plain folder; removal takes the control files with the folder, as in cgroupfs."""
    monkeypatch.setattr(sandbox_cgroups, "cgroup_parents", lambda: (("v2", str(tmp_path)),))
    monkeypatch.setattr(sandbox_cgroups, "remove_cgroups", lambda cgroups: [shutil.rmtree(c) for c in cgroups])
    return tmp_path


def limits_of(cgroups: list[str]) -> tuple[int, int]:
    folder = Path(cgroups[0])
    return int((folder / "memory.max").read_text()), int((folder / "pids.max").read_text())


def test_each_cgroup_is_handed_out_once(parent):
    pool, seen = CgroupPool(), []
    for _ in range(12):
        cgroups = pool.take(SMALL)
        assert cgroups and cgroups not in seen, f"{cgroups} was handed out twice"
        seen.append(cgroups)
        pool.tend(SMALL)
        pool.release(cgroups)
    assert len(pool.ready[SMALL]) == DEPTH


def test_a_call_gets_cgroups_made_for_its_own_limits(parent):
    pool = CgroupPool()
    pool.tend(BIG)  # ready for calls with other limits
    small = pool.take(SMALL)
    assert limits_of(small) == ((100 + 20) << 20, 12)
    assert all(limits_of(c) == ((512 + 64) << 20, 64) for c in pool.ready[BIG])
    assert small not in pool.ready[BIG]


def test_released_cgroups_are_removed_by_the_next_tend_and_everything_at_close(parent):
    pool = CgroupPool()
    first = pool.take(SMALL)
    pool.release(first)
    assert os.path.exists(first[0]), "removed before the call that released it had returned"
    pool.tend(SMALL)
    assert not os.path.exists(first[0]) and len(pool.ready[SMALL]) == DEPTH
    second = pool.take(SMALL)
    pool.release(second)
    pool.close()
    assert list(parent.iterdir()) == [], "cgroups outlived the pool's close"


def test_a_host_without_cgroups_gets_none(parent, monkeypatch):
    monkeypatch.setattr(sandbox_cgroups, "cgroup_parents", lambda: ())
    pool = CgroupPool()
    pool.tend(SMALL)
    assert pool.take(SMALL) == [] and not pool.ready and list(parent.iterdir()) == []


def test_a_forked_process_starts_with_an_empty_pool_of_its_own(parent, monkeypatch):
    ours = CgroupPool()
    monkeypatch.setattr(sandbox_pool, "POOL", ours)
    ours.tend(SMALL)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, whatever happens
            try:
                fresh = sandbox_pool.POOL is not ours and not sandbox_pool.POOL.ready
                os.write(write, b"empty" if fresh else b"inherited")
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 64) == b"empty", "a forked process could hand out its parent's cgroups"
        os.close(read)
        assert len(ours.ready[SMALL]) == DEPTH, "the fork took the parent's ready cgroups"
    finally:
        ours.close()
