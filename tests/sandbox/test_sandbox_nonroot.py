"""The hostile programs as a non-root user (nobody, via setpriv), through a standalone copy of the sandbox run by the
system python: every program is contained, and the host's temporary directory keeps its mode and contents."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from as_nobody import PYTHON, nobody_copy, run_as_nobody
from carryover import LOOK
from hostile import HARDENING


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.lstat().st_mode, p.lstat().st_uid) for p in path.iterdir()} | {
        ".": (path.stat().st_mode, path.stat().st_uid)}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root; as non-root the other "
                                               "sandbox tests already run as a non-root user")
@pytest.mark.skipif(not (PYTHON and shutil.which("setpriv")), reason="needs /usr/bin/python3 and setpriv")
def test_hostile_programs_are_contained_as_a_non_root_user():
    with nobody_copy(["hostile.py", "nonroot_probe.py"], "tracerl-nonroot") as (code, host_tmp):
        before, tmp_mode = snapshot(host_tmp), os.stat("/tmp").st_mode
        done = run_as_nobody(code, host_tmp, "nonroot_probe.py", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        print("non-root layers:", report["layers"])
        assert "uid_drop" not in report["layers"] and "seccomp" in report["layers"], report["layers"]
        assert {"landlock", "pidns"} & set(report["layers"]), report["layers"]
        failed = {name: r for name, r in report["results"].items() if r["problems"]}
        assert not failed, "\n".join(f"{name}: {r['problems']} {r['error']} {r['stderr'][-200:]!r}"
                                      for name, r in sorted(failed.items()))
        assert len(report["results"]) == 2 * len(HARDENING) and report["normal"] == "45\n"
        assert report["threads"]["other"] == "threads ok\n", report["threads"]
        assert report["results"]["hook_bypass"]["stdout"].startswith("hook off: True"), \
            "the code could not switch the hook off, so the run proves nothing about the other layers"
        after = {k: v for k, v in snapshot(host_tmp).items() if not k.startswith(("tracerl-sandboxes-", "outside-"))}
        assert after == before and os.stat("/tmp").st_mode == tmp_mode, "the host's temporary directory changed"
        assert not [p for p in host_tmp.iterdir() if p.name.startswith("tracerl-sandboxes-")], \
            "the private parent outlived the process"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root; as non-root the other "
                                               "sandbox tests already run as a non-root user")
@pytest.mark.skipif(not (PYTHON and shutil.which("setpriv")), reason="needs /usr/bin/python3 and setpriv")
def test_a_call_finds_nothing_an_earlier_call_left_as_a_non_root_user():
    with nobody_copy(["carryover.py", "carryover_probe.py"], "tracerl-carryover") as (code, host_tmp):
        done = run_as_nobody(code, host_tmp, "carryover_probe.py", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report) == sorted(LOOK)
    for name, seen in sorted(report.items()):
        assert seen["leave_ok"], f"{name}: the program that leaves things behind failed: {seen['leave']}"
        assert seen["before"]["error"] is None, f"{name}: {seen['before']['error']}"
        assert "uid_drop" not in seen["before"]["layers"] and "seccomp" in seen["before"]["layers"], seen["before"]
        assert seen["after"] == seen["before"], f"{name}: a call found what an earlier call left behind:\n" \
                                                f"{seen['after']}\ninstead of\n{seen['before']}"
