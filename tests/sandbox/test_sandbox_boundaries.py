"""The sandbox's boundaries (`boundaries.py`): every descriptor a call receives is bounded, no call locks a host
file, and a call reads only what "other" may read. Each program runs as root and, through a standalone copy of the
sandbox under setpriv, as `nobody`; each with every layer on and with the audit hook off. While a lock program
runs, a host process keeps trying to write-lock the file it aims at and must never be refused."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from as_nobody import PYTHON, nobody_copy, run_as_nobody
from boundaries import CLASS_OF, LIMITS, PROGRAMS, LockWatcher, make_targets, now, problems, program, \
    refused_between, remove_targets

from tracerl.io.sandbox import SandboxLimits, run_python
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the targets live under /etc, which only root can write")


def lock_paths(folder: str) -> list[str]:
    return [os.path.join(folder, "shared.txt"), os.path.join(folder, "owned.txt")]


def judged(name: str, stdout: str, stderr: str, seen: dict | None, start: float, end: float) -> list[str]:
    found = problems(name, stdout, stderr)
    if CLASS_OF[name] == "locks":
        assert all(s["attempts"] > 0 for s in seen.values()), seen
        found += ["a host writer was refused a lock on %s during the call" % p
                  for p in refused_between(seen, start, end)]
    return found


@pytest.fixture(scope="module")
def targets():
    folder = make_targets(0, 0)  # the caller is root: its own files are root's
    yield folder
    remove_targets(folder)


@ROOT_ONLY
@pytest.mark.parametrize("disable", [(), ("audit_hook",)], ids=["all_layers", "hook_off"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_boundary_holds_as_root(name, disable, targets):
    watcher = LockWatcher(lock_paths(targets)) if CLASS_OF[name] == "locks" else None
    start = now()
    result = run_python(program(name, targets), SandboxLimits(**LIMITS), _disable=disable)
    end = now()
    seen = watcher.stop() if watcher else None
    found = judged(name, result.stdout, result.stderr, seen, start, end)
    assert not found, "%s got through as root: %s\nstdout %r\nstderr %r\nerror %r" % (
        name, found, result.stdout[-800:], result.stderr[-800:], result.error)


@ROOT_ONLY
@pytest.mark.skipif(not (PYTHON and shutil.which("setpriv")), reason="needs /usr/bin/python3 and setpriv")
def test_boundaries_hold_as_a_non_root_user():
    folder = make_targets(65534, 65534)
    try:
        with nobody_copy(["boundaries.py", "boundary_probe.py"], "tracerl-boundary") as (code, host_tmp):
            watcher = LockWatcher(lock_paths(folder))
            done = run_as_nobody(code, host_tmp, "boundary_probe.py", folder, timeout=600)
            seen = watcher.stop()
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        print("non-root layers:", report["layers"])
        assert "uid_drop" not in report["layers"] and "seccomp" in report["layers"], report["layers"]
        failed = {}
        for key, r in sorted(report["results"].items()):
            found = judged(key.split("/")[0], r["stdout"], r["stderr"], seen, r["start"], r["end"])
            if found:
                failed[key] = found
        print("non-root: %d of %d runs contained" % (len(report["results"]) - len(failed), len(report["results"])))
        assert len(report["results"]) == 2 * len(PROGRAMS)
        assert not failed, "\n".join("%s: %s" % item for item in failed.items())
    finally:
        remove_targets(folder)
