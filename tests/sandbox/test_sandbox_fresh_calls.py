"""No sandboxed call inherits anything from an earlier one: not its files, environment, threads, descriptors,
signal state, modules, limits, nor its cgroups or what the kernel counted in them. Whatever a call's workdir,
cgroups and launcher are prepared from, what it finds must be what the first call of a process finds."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from carryover import LEAVE, LOOK
from hostile import HARDENING

from tracerl.io import sandbox
from tracerl.io.sandbox import SandboxLimits, run_python

# these programs end by themselves (a loaded machine must not time them out) and print up to 20,000 characters
PATIENT = SandboxLimits(wall_seconds=30.0, max_output_chars=20_000)


def look(name: str, limits: SandboxLimits = PATIENT) -> tuple[object, tuple[str, ...]]:
    result = run_python(LOOK[name], limits)
    assert result.ok, f"{name}: {result.observation()}"
    return json.loads(result.stdout), result.layers


@pytest.mark.parametrize("name", sorted(LOOK))
def test_a_call_finds_nothing_an_earlier_call_left(name):
    before = look(name)
    left = run_python(LEAVE, PATIENT)
    assert left.exit_code == 0 and not left.timed_out, left.observation()
    after = look(name)
    assert after == before, f"{name}: a call found what an earlier call left behind:\n{after}\ninstead of\n{before}"


def test_files_an_earlier_call_left_on_the_host_are_not_found():
    """Without its tmpfs a call's files land in its workdir on the host's disk, where a reused workdir would keep
    them for the next call."""
    no_tmpfs = ("disk_quota",)
    before = run_python(LOOK["files"], PATIENT, _disable=no_tmpfs)
    left = run_python(LEAVE, PATIENT, _disable=no_tmpfs)
    after = run_python(LOOK["files"], PATIENT, _disable=no_tmpfs)
    assert before.ok and left.exit_code == 0 and "disk_quota" not in left.layers, (before, left.observation())
    assert after.stdout == before.stdout, f"a call found what an earlier call left behind:\n{after.observation()}"


def test_every_call_gets_a_workdir_no_call_had_before():
    code = "import os\nprint(os.getcwd())\nopen('mine', 'w').close()\n"
    seen = [run_python(code, PATIENT).stdout for _ in range(6)]
    assert len(set(seen)) == len(seen), f"a workdir was handed out twice: {seen}"


def test_a_call_gets_the_limits_it_was_given_whatever_ran_before():
    small = replace(PATIENT, memory_mb=128, cpu_seconds=2, max_processes=8, max_file_mb=1, max_open_files=16)
    default_first = look("limits")
    small_after_default = look("limits", small)
    run_python(LEAVE, small)
    default_after_small = look("limits")
    assert default_after_small == default_first, "a call got the limits of an earlier call with other limits"
    assert small_after_default[0]["RLIMIT_NOFILE"] == [16, 16], small_after_default
    assert small_after_default[0]["RLIMIT_AS"] == [128 << 20, 128 << 20], small_after_default


# --- cgroups: each call's own, fresh --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cgroups() -> None:
    if "cgroup" not in run_python("pass").layers:
        pytest.skip("this host gives the sandbox no cgroup of its own")


def cgroup_mounts() -> dict[str, str]:
    """Where each cgroup hierarchy is mounted: "v2", or the v1 controllers ("memory", "pids")."""
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("v2", fields[4])
        elif fstype == "cgroup":
            for controller in options:
                mounts.setdefault(controller, fields[4])
    return mounts


def sandbox_cgroups_of(pid: int) -> dict[str, str]:
    """The folders of the sandbox's cgroups that process `pid` is in, by hierarchy; {} until it has joined them."""
    found, mounts = {}, cgroup_mounts()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "tracerl-sandbox-" in path:
            for controller in controllers.split(",") if controllers else ["v2"]:
                if controller in mounts:
                    found[controller] = mounts[controller] + path
    return found


def test_every_call_gets_cgroups_no_call_had_before(cgroups):
    code = "print(sorted(line for line in open('/proc/self/cgroup').read().splitlines() if 'tracerl-sandbox' in line))"
    seen = [run_python(code, PATIENT).stdout for _ in range(6)]
    assert all("tracerl-sandbox" in s for s in seen), seen
    assert len(set(seen)) == len(seen), f"a cgroup was handed out twice: {seen}"


def while_running(limits: SandboxLimits, inspect: Callable[[int], None]) -> None:
    """Run a call that waits for ever, call `inspect(launcher pid)` once the code runs, then kill the call."""
    launched = []
    sandbox._launched = lambda pid, workdir: launched.append(pid)
    code = "import time\nprint('running', flush=True)\nwhile True:\n    time.sleep(0.01)\n"
    run = threading.Thread(target=run_python, args=(code, limits))
    try:
        run.start()
        while run.is_alive() and not (launched and sandbox._running.get(launched[0]) is not None
                                      and sandbox._running[launched[0]].data):
            time.sleep(0.01)
        assert launched and run.is_alive(), "the call ended before it could be inspected"
        inspect(launched[0])
    finally:
        if launched:
            os.killpg(launched[0], signal.SIGKILL)
        run.join()
        sandbox._launched = None


def counters(folder: str) -> dict[str, int]:
    """What the kernel counted in a cgroup: memory and process limit hits, OOM kills (cgroup v1 and v2 files)."""
    found = {}
    for name in ("memory.events", "memory.oom_control", "pids.events"):
        path = Path(folder, name)
        if path.exists():
            found |= {f"{name}:{k}": int(v) for k, v in (line.split() for line in path.read_text().splitlines())
                      if k not in ("oom_kill_disable", "under_oom")}
    for name in ("memory.failcnt", "memory.memsw.failcnt"):
        if Path(folder, name).exists():
            found[name] = int(Path(folder, name).read_text())
    return found


def test_an_earlier_calls_limit_hits_are_not_counted_in_the_next_calls_cgroups(cgroups):
    """The kernel's counts stay in a cgroup after its processes are gone (OOM kills, times the memory or process
    limit was hit): a call that got an earlier call's cgroup would be told that the memory limit killed it."""
    limits = SandboxLimits(wall_seconds=30.0, memory_mb=256, max_processes=16)
    hog = run_python(HARDENING["memfd_memory"], limits, _disable=("seccomp", "audit_hook"))  # memfd: no rlimit binds
    assert hog.killed_by == "SIGKILL" and "memory limit" in (hog.error or ""), \
        f"the cgroup's OOM killer did not stop the memfd hog, so this test shows nothing: {hog}"
    # root's RLIMIT_NPROC does not bind, so the cgroup's pids.max stops the threads and counts the hit
    threads = run_python("import threading, time\nfor _ in range(64):\n    threading.Thread(target=time.sleep, "
                         "args=(1,), daemon=True).start()\n", limits, _disable=("uid_drop", "audit_hook"))
    assert "can't start new thread" in threads.stderr, threads.observation()
    found = {}
    while_running(limits, lambda pid: found.update({kind: counters(folder)
                                                    for kind, folder in sandbox_cgroups_of(pid).items()}))
    assert found and all(value == 0 for kind in found.values() for value in kind.values()), found


def test_each_call_runs_under_its_own_cgroup_limits(cgroups):
    """Read from the host while each call runs: a call's cgroups hold its own limits, whatever ran before with
    other limits."""
    files = {"v2": ("memory.max", "pids.max"), "memory": ("memory.limit_in_bytes",), "pids": ("pids.max",)}
    big = SandboxLimits(wall_seconds=60.0)
    small = replace(big, memory_mb=100, max_disk_mb=20, max_processes=12)
    for limits in (big, small, big, small):
        found = {}
        while_running(limits, lambda pid: found.update({name: Path(folder, name).read_text().strip()
                                                        for kind, folder in sandbox_cgroups_of(pid).items()
                                                        for name in files.get(kind, ())}))
        memory = str((limits.memory_mb + limits.max_disk_mb) << 20)
        expected = {"memory.max": memory, "memory.limit_in_bytes": memory, "pids.max": str(limits.max_processes)}
        assert found and all(expected[name] == value for name, value in found.items()), (limits, found)
