"""The sandbox's hardening layers: no descendant outlives the call (PID namespace, seccomp), no new sessions,
signals or programs (seccomp), a disk quota (a tmpfs over the workdir, else a size check), a cleanup that survives
any tree and touches nothing outside the workdir, and the host's temporary directory left as it was. Each hostile
program runs with every layer on, then with only one of the layers that should stop it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hostile import HARDENING
from test_sandbox import QUICK, assert_contained, leftovers, spawned  # noqa: F401 (spawned is a fixture)

from tracerl.io import sandbox
from tracerl.io.sandbox import LAYERS, SandboxLimits, run_python


def snapshot(path: str) -> dict[str, tuple[int, int]]:
    """Mode and owner of `path` and of every entry directly in it."""
    out = {".": (os.stat(path).st_mode, os.stat(path).st_uid)}
    for name in os.listdir(path):
        try:
            st = os.lstat(os.path.join(path, name))
        except FileNotFoundError:
            continue
        out[name] = (st.st_mode, st.st_uid)
    return out


@pytest.fixture(scope="module", autouse=True)
def host_tmp(tmp_path_factory):
    """A stand-in for the host's /tmp (mode 1777) that every sandbox of this module works under; its mode and
    contents (the sandbox's private parent included) must be the same after every test. The real /tmp's mode too."""
    fake = Path(tempfile.mkdtemp(prefix="tracerl-test-host-tmp-", dir="/tmp"))  # searchable by the sandbox user
    os.chmod(fake, 0o1777)
    real_mode = os.stat("/tmp").st_mode
    old = tempfile.tempdir
    tempfile.tempdir = str(fake)
    sandbox._private_parent.cache_clear()
    parent = sandbox._private_parent()
    yield fake, parent
    tempfile.tempdir = old
    sandbox._private_parent.cache_clear()
    sandbox._remove_tree(parent)
    os.rmdir(fake)
    assert os.stat("/tmp").st_mode == real_mode, "the host's /tmp changed mode"


@pytest.fixture(autouse=True)
def tmp_untouched(host_tmp):
    fake, parent = host_tmp
    before, inside = snapshot(str(fake)), snapshot(parent)
    yield
    assert snapshot(str(fake)) == before, "the host's temporary directory changed"
    assert snapshot(parent) == inside, "a workdir or its mode was left behind in the private parent"


@pytest.fixture
def outside(tmp_path):
    (tmp_path / "secret.txt").write_text("the answer is 42")
    os.chmod(tmp_path, 0o777)  # nothing but the sandbox's layers may keep the code out
    os.chmod(tmp_path / "secret.txt", 0o666)
    victim = subprocess.Popen(["sleep", "60"])
    yield tmp_path, victim
    victim.kill()
    victim.wait()


def run(name: str, outside_dir: Path, victim, disable=(), limits=QUICK):
    code = HARDENING[name].format(dir=str(outside_dir), pid=victim.pid)
    return run_python(code, limits, _disable=disable)


def check_host(name, result, outside_dir, victim):
    assert sorted(p.name for p in outside_dir.iterdir()) == ["secret.txt"], f"{name} wrote outside"
    assert "42" not in result.stdout and "pwned-by-shell" not in result.stdout, f"{name} got through"
    assert victim.poll() is None, f"{name} killed a process outside the sandbox"


@pytest.mark.parametrize("name", sorted(HARDENING))
def test_hostile_program_is_contained_with_every_layer(name, outside, spawned):  # noqa: F811
    outside_dir, victim = outside
    limits = SandboxLimits(wall_seconds=2.0, memory_mb=256)
    result = run(name, outside_dir, victim, limits=limits)
    check_host(name, result, outside_dir, victim)
    assert "seccomp" in result.layers and result.seconds < limits.wall_seconds + 2
    assert_contained(result, spawned)


BLOCKED_BY = {  # which layers alone (besides the always-on rlimits) stop which program
    "session_escape": ("pidns", "seccomp"),
    "forked_memory": ("pidns", "seccomp"),
    "exec_shell": ("seccomp", "landlock", "audit_hook"),
    "kill_host": ("pidns", "seccomp", "uid_drop", "audit_hook"),
    "disk_fill": ("disk_quota",),
    "deep_tree": ("disk_quota",),
}


@pytest.mark.parametrize("name,layer", [(n, layer) for n, layers in BLOCKED_BY.items() for layer in layers])
def test_each_layer_alone_contains(name, layer, outside, spawned):  # noqa: F811
    outside_dir, victim = outside
    active = run_python("pass").layers
    if layer not in active:
        pytest.skip(f"layer {layer} is not available on this host")
    result = run(name, outside_dir, victim, disable=[x for x in LAYERS if x != layer])
    assert result.layers == ("rlimits", layer), result.layers
    check_host(name, result, outside_dir, victim)
    if name == "disk_fill":
        assert "disk quota of 64 MB" in (result.error or ""), result
    assert_contained(result, spawned)


def test_without_tmpfs_the_disk_quota_is_checked_after_the_run(outside, spawned):  # noqa: F811
    outside_dir, victim = outside
    result = run("disk_fill", outside_dir, victim, disable=("disk_quota",))
    assert result.error and "disk quota of 64 MB" in result.error, (result.error, result.stderr)
    assert_contained(result, spawned)


def test_cleanup_removes_a_deep_locked_tree_and_never_touches_the_parent(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    work = parent / "work"
    here = os.getcwd()
    os.makedirs(work)
    os.chdir(work)
    try:
        for _ in range(3000):  # deeper than rmtree's recursion limit and than PATH_MAX
            os.mkdir("d")
            os.chdir("d")
        Path("f").write_text("x")
        os.chmod(".", 0o500)
    finally:
        os.chdir(here)
    os.chmod(work, 0o000)
    sandbox._remove_tree(str(work))
    assert not work.exists(), "the deep tree was left behind"
    assert stat.S_IMODE(os.stat(parent).st_mode) == 0o1777, "cleanup changed the parent's mode"


def test_seccomp_program_denies_by_argument():
    child = sys.modules.get("tracerl_sandbox_child")
    if child is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location("tracerl_sandbox_child",
                                                      Path(sandbox.__file__).with_name("sandbox_child.py"))
        child = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(child)
    for machine in child.SYSCALLS:
        prog = child.seccomp_program(machine, 1)
        assert len(prog) < 256 and prog[-1] == (0x06, 0, 0, 0x7FFF0000), "the filter must end in ALLOW"
        for code, jt, jf, _ in prog:
            assert code != 0x15 or (jt, jf) in ((0, 1), (1, 0), (0, 4)), "jump offsets out of the blocks"


def test_a_sandbox_still_starts_fast():
    started = time.monotonic()
    result = run_python("print(6 * 7)")
    assert result.ok and result.stdout == "42\n" and time.monotonic() - started < 5
