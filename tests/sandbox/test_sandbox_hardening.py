"""The sandbox's hardening layers: no descendant outlives the call (PID namespace, seccomp), no new sessions,
signals or programs (seccomp), a disk quota (a tmpfs over the workdir, else a size check), a cleanup that survives
any tree and touches nothing outside the workdir, and the host's temporary directory left as it was. Each hostile
program runs with every layer on, then with only one of the layers that should stop it."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hostile import HARDENING, NEEDS_THREADS, THREAD_HOG, Host
from test_sandbox import PATIENT, assert_contained, leftovers, seconds_past_the_limit, spawned  # noqa: F401 (fixture)

from tracerl.io import sandbox
from tracerl.io.sandbox import LAYERS, SandboxLimits, run_python
import tracerl.io.sandbox.cgroups as sandbox_cgroups
from tracerl.io.sandbox.syscalls import ALLOWED, AUDIT_ARCH, BY_ARGUMENT, seccomp_table


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
    tmp_path_factory.getbasetemp()  # pytest's own folder stays in the real /tmp
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
    host = Host(str(tmp_path), victim.pid)
    yield tmp_path, victim, host
    host.close()
    victim.kill()
    victim.wait()


def run(name: str, outside, disable=(), limits=None):
    _, _, host = outside
    return run_python(HARDENING[name].format(**host.fields()), limits or limits_for(name), _disable=disable)


def check_host(name, result, outside):
    _, victim, host = outside
    problems = host.problems(result.stdout)
    host.reset()
    assert not problems, f"{name}: {problems}"
    assert victim.poll() is None, f"{name} killed a process outside the sandbox"


HOSTILE_LIMITS = SandboxLimits(wall_seconds=2.0, memory_mb=256)  # memfd_memory holds 420 MB: above 256 + 64 of disk
# the programs that may run until the clock stops them (some layers let them sleep, or make each step slow); the
# others end by themselves at once, and get a wall clock no loaded machine comes near (hook_bypass alone takes
# 0.6 s on a quiet machine), so that their ending, which the tests read, is never a timeout
CLOCK_ENDED = {"session_escape", "forked_memory", "deep_tree"}
HOOK_OFF = ("audit_hook",)  # as if the code had switched the hook off: no guarantee may rest on it


def limits_for(name: str) -> SandboxLimits:
    return HOSTILE_LIMITS if name in CLOCK_ENDED else replace(HOSTILE_LIMITS, wall_seconds=PATIENT.wall_seconds)


@pytest.mark.parametrize("disable", [(), HOOK_OFF], ids=["all_layers", "hook_off"])
@pytest.mark.parametrize("name", sorted(HARDENING))
def test_hostile_program_is_contained_with_every_layer(name, disable, outside, spawned):  # noqa: F811
    past = seconds_past_the_limit()
    result = run(name, outside, disable)
    check_host(name, result, outside)
    assert "seccomp" in result.layers, result.layers
    assert result.seconds < limits_for(name).wall_seconds + past, f"took {result.seconds:.1f}s"
    assert_contained(result, spawned)


def test_the_host_process_list_is_hidden_without_landlock(outside, spawned):  # noqa: F811
    """A /proc of the call's own PID namespace: the host's command lines are not there to read."""
    result = run("host_processes", outside, disable=("audit_hook", "landlock"))
    if "procfs" not in result.layers:
        pytest.skip("this host does not let the sandbox mount a /proc of its own")
    check_host("host_processes", result, outside)
    assert "FileNotFoundError" in result.stderr, result.observation()
    assert_contained(result, spawned)


def test_the_hook_switched_off_by_the_code_leaves_every_guarantee(outside, spawned):  # noqa: F811
    """The code itself switches the audit hook off (HOOK_BYPASS, pure Python), then tries everything."""
    result = run("hook_bypass", outside)
    assert not result.timed_out, result.observation()  # a timeout is no reason to skip
    if "hook off: True" not in result.stdout:
        pytest.skip(f"the bypass does not work on this interpreter: {result.observation()[-300:]}")
    denied = [line for line in result.stdout.splitlines() if line.startswith("denied ")]
    assert "audit_hook" in result.layers and len(denied) == 10, result.stdout
    check_host("hook_bypass", result, outside)
    assert_contained(result, spawned)


@pytest.mark.parametrize("alone", [None, "cgroup", "uid_drop"])
def test_threads_of_one_sandbox_leave_the_others_their_process_limit(alone, outside, spawned):  # noqa: F811
    """Two sandboxes side by side: one holds every thread it can get, the other still starts its eight; with
    every layer on but the hook, and with only the cgroup's or only the per-call uid's process limit."""
    disable = HOOK_OFF if alone is None else [x for x in LAYERS if x != alone]
    if alone and alone not in run_python("pass").layers:
        pytest.skip(f"layer {alone} is not available on this host")
    hog_done, first = [], len(spawned)
    limits = SandboxLimits(wall_seconds=60.0, max_processes=64)  # the hog sleeps 30 s on its threads; ended below
    hog = threading.Thread(target=lambda: hog_done.append(run_python(THREAD_HOG, limits, _disable=disable)))
    hog.start()
    try:  # the other starts once the hog says it holds its threads (an order, not a guess at how long that takes)
        deadline = time.monotonic() + 60
        while not (len(spawned) > first and printed_so_far(spawned[first][0]).startswith("threads ")):
            assert hog.is_alive(), hog_done
            assert time.monotonic() < deadline, "timeout: the hog did not report its threads within 60 s"
            time.sleep(0.05)
        other = run_python(NEEDS_THREADS, PATIENT, _disable=disable)
    finally:
        if len(spawned) > first and not hog_done:  # its launcher's group: the hog, still holding its threads
            try:
                os.killpg(spawned[first][0], signal.SIGKILL)
            except ProcessLookupError:  # it ended on its own just now
                pass
        hog.join()
    assert hog_done[0].stdout.startswith("threads "), hog_done[0]
    assert other.ok and other.stdout == "threads ok\n", (other, hog_done[0].stdout)
    assert int(hog_done[0].stdout.split()[1]) < 64, "the hog got more threads than its process limit"


def printed_so_far(pid: int) -> str:
    """What the sandbox whose launcher is `pid` has written to its stdout so far (what the parent drained of it)."""
    capture = sandbox._running.get(pid)
    return bytes(capture.data).decode(errors="replace") if capture is not None else ""


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.mark.skipif(not (FREEZER / "cgroup.procs").exists() or not os.access(FREEZER, os.W_OK),
                    reason="needs a writable cgroup v1 freezer (its frozen tasks do not die of SIGKILL until thawed)")
def test_the_call_waits_for_a_process_that_is_slow_to_die(spawned):  # noqa: F811
    """The code's process (not its launcher) is frozen, so the kill at the timeout takes effect only when a thread
    here thaws it, 3 s after it saw the kill pending: the call must return after that, with nothing left, not after
    a fixed settle. Each step waits for the one before (no guess at how long a loaded machine takes)."""
    frozen = FREEZER / f"tracerl-test-{os.getpid()}"
    frozen.mkdir()
    thawed_at = []

    def the_code() -> str | None:
        """The launcher's child, the PID namespace's init, once it has started."""
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1]) == spawned[0][0]:
                    return entry
            except (OSError, IndexError):
                continue
        return None

    def kill_pending(pid: str) -> bool:
        """SIGKILL (signal 9: bit 8) waits in the process's own or shared pending set: frozen, it cannot act on it."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return any(int(fields[key], 16) >> 8 & 1 for key in ("SigPnd", "ShdPnd"))

    killed_pending = []

    limits = SandboxLimits(wall_seconds=5.0)  # the code must be found and frozen before the clock kills it
    started = time.monotonic()

    def freeze_then_thaw():
        while not (spawned and the_code()) and time.monotonic() < started + limits.wall_seconds - 1.0:
            time.sleep(0.01)
        code = spawned and the_code()
        if not code:
            return
        (frozen / "cgroup.procs").write_text(code)
        (frozen / "freezer.state").write_text("FROZEN")
        try:
            deadline = time.monotonic() + 60
            while not kill_pending(code) and time.monotonic() < deadline:  # the call's kill at its timeout
                time.sleep(0.01)
            killed_pending.append(kill_pending(code))
            time.sleep(3.0)  # longer than any fixed settle a call could use instead of waiting for the process
            thawed_at.append(time.monotonic())
        finally:  # whatever happened here, the call must not wait for ever on a frozen process
            (frozen / "freezer.state").write_text("THAWED")

    helper = threading.Thread(target=freeze_then_thaw)
    helper.start()
    try:
        result = run_python("while True:\n    pass\n", limits, _disable=HOOK_OFF)
        returned_at = time.monotonic()
        assert leftovers(spawned) == [], leftovers(spawned)
    finally:
        helper.join()
        (frozen / "freezer.state").write_text("THAWED")
        for _ in range(500):  # the processes leave the cgroup as they die
            try:
                frozen.rmdir()
                break
            except OSError:
                time.sleep(0.01)
    assert thawed_at, "the code's process was not found in time to freeze it"
    assert killed_pending == [True], "timeout: the call did not kill the frozen code within 60 s of freezing it"
    assert result.timed_out and returned_at > thawed_at[0], "returned while the code was alive"


def test_the_call_returns_only_when_every_process_is_gone(spawned):  # noqa: F811
    """Killed by the clock while many threads run and much memory is mapped: nothing of it may still run when
    run_python returns (a fixed settle time after the kill is not enough on a loaded host)."""
    # The threads spin without allocating: a thread that grew a list raced the clock to the memory limit, and
    # on some hosts the memory limit ended the program first.
    code = ("import threading\nthreading.stack_size(1 << 16)\nx = bytearray(200 << 20)\n"
            "def spin():\n    while True:\n        pass\n"
            "for _ in range(40):\n    threading.Thread(target=spin).start()\n"
            "while True:\n    pass\n")
    for _ in range(3):
        result = run_python(code, SandboxLimits(wall_seconds=1.0, memory_mb=512), _disable=HOOK_OFF)
        assert result.timed_out and leftovers(spawned) == [], leftovers(spawned)


BLOCKED_BY = {  # which layers alone (besides the always-on rlimits) stop which program
    "session_escape": ("pidns", "seccomp"),
    "forked_memory": ("pidns", "seccomp"),
    "exec_shell": ("seccomp", "landlock", "audit_hook"),
    "kill_host": ("pidns", "seccomp", "uid_drop", "audit_hook"),
    "disk_fill": ("disk_quota",),
    "deep_tree": ("disk_quota",),
    "chmod_outside": ("seccomp", "readonly_fs", "uid_drop"),
    "unix_socket": ("seccomp",),
    "abstract_socket": ("seccomp", "netns"),
    "sysv_ipc": ("seccomp", "ipcns"),
    "dev_shm": ("readonly_fs", "landlock"),
    "memfd_memory": ("seccomp", "cgroup"),
    "personality": ("seccomp",),
    "kernel_interfaces": ("seccomp",),
    "foreign_abi": ("seccomp",),
    "cgroup_escape": ("readonly_fs", "uid_drop", "landlock"),
}


@pytest.mark.parametrize("name,layer", [(n, layer) for n, layers in BLOCKED_BY.items() for layer in layers])
def test_each_layer_alone_contains(name, layer, outside, spawned):  # noqa: F811
    active = run_python("pass").layers
    if layer not in active:
        pytest.skip(f"layer {layer} is not available on this host")
    result = run(name, outside, disable=[x for x in LAYERS if x != layer])
    assert tuple(x for x in result.layers if x != "userns") == ("rlimits", layer), result.layers
    check_host(name, result, outside)
    if name == "disk_fill":
        assert "disk quota of 64 MB" in (result.error or ""), result
    assert_contained(result, spawned)


def test_without_tmpfs_the_disk_quota_is_checked_after_the_run(outside, spawned):  # noqa: F811
    """70 MB written to the host's disk, then the program ends by itself: the size check after the run reports it.
    (disk_fill itself would write until the clock stops it, as much as the machine's speed allows.)"""
    code = HARDENING["disk_fill"].replace("while True:", "while i < 10:")
    result = run_python(code, PATIENT, _disable=("disk_quota",))
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


def sandbox_child():
    child = sys.modules.get("tracerl_sandbox_child")
    if child is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location("tracerl_sandbox_child",
                                                      Path(sandbox.__file__).with_name("child.py"))
        child = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(child)
        sys.modules["tracerl_sandbox_child"] = child
    return child


def run_filter(prog, arch: int, nr: int, args=(0,) * 6) -> int:
    """Evaluate a classic-BPF seccomp program on one syscall, as the kernel would (the instructions it uses)."""
    data = {0: nr & 0xFFFFFFFF, 4: arch} | {16 + 8 * i: a & 0xFFFFFFFF for i, a in enumerate(args)}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # LD word at offset k
            acc, pc = data.get(k, 0), pc + 1
        elif code in (0x15, 0x45):  # JEQ, JSET
            taken = acc == k if code == 0x15 else bool(acc & k)
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x} at {pc}")


ALLOW, EPERM, ENOSYS, KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_is_an_allowlist(machine):
    child = sandbox_child()
    prog = child.seccomp_program(seccomp_table(machine), 1)
    arch, allowed, by_arg = AUDIT_ARCH[machine], ALLOWED[machine], BY_ARGUMENT[machine]
    assert len(prog) <= 4096 and prog[-1] == (0x06, 0, 0, EPERM), "the filter must end in EPERM"
    for pc, (code, jt, jf, _) in enumerate(prog):
        assert code not in (0x15, 0x45) or pc + 1 + max(jt, jf) < len(prog), f"jump out of the program at {pc}"
    for name, nr in allowed.items():
        assert run_filter(prog, arch, nr) == ALLOW, name
    known = set(allowed.values()) | set(by_arg.values())
    denied = [nr for nr in range(0, 460) if nr not in known]
    assert all(run_filter(prog, arch, nr) == EPERM for nr in denied)
    assert run_filter(prog, arch, allowed["read"] | 0x40000000) == EPERM, "x32 numbers must not pass"
    assert run_filter(prog, 0x40000003, allowed["read"]) == KILL, "a foreign architecture must be killed"
    assert run_filter(prog, arch, by_arg["clone3"]) == ENOSYS
    thread = 0x003D0F00  # glibc's pthread_create flags
    assert run_filter(prog, arch, by_arg["clone"], (thread,)) == ALLOW
    assert run_filter(prog, arch, by_arg["clone"], (0x11,)) == EPERM, "fork through clone must be denied"
    assert run_filter(prog, arch, by_arg["clone"], (thread | 0x40000000,)) == EPERM, "a thread in a new netns"
    for name in child.SIGNAL_CALLS:
        assert run_filter(prog, arch, by_arg[name], (1, 9)) == ALLOW
        assert run_filter(prog, arch, by_arg[name], (2, 9)) == EPERM
        assert run_filter(prog, arch, by_arg[name], (-1, 9)) == EPERM
    assert run_filter(prog, arch, by_arg["ioctl"], (1, 0x5401)) == ALLOW
    assert run_filter(prog, arch, by_arg["ioctl"], (0, 0x5412)) == EPERM, "TIOCSTI must be denied"
    assert run_filter(prog, arch, by_arg["fcntl"], (3, 1030)) == ALLOW
    assert run_filter(prog, arch, by_arg["fcntl"], (3, 8)) == EPERM, "F_SETOWN must be denied"
    assert run_filter(prog, arch, by_arg["prlimit64"], (0, 7)) == ALLOW
    assert run_filter(prog, arch, by_arg["prlimit64"], (5, 7)) == EPERM


def test_seccomp_tables_match_the_kernel_headers():
    """The syscall numbers are typed in (the launcher imports nothing outside the stdlib and is handed them); check
    them against this machine's headers when it has them."""
    headers = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
               "aarch64": "/usr/include/asm-generic/unistd.h"}
    checked = 0
    for machine, path in headers.items():
        if not os.path.exists(path):
            continue
        text = Path(path).read_text()
        numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+) (\d+)", text)}
        numbers.setdefault("newfstatat", numbers.get("fstatat"))
        for name, nr in (ALLOWED[machine] | BY_ARGUMENT[machine]).items():
            assert numbers.get(name) == nr, f"{machine} {name}: {nr} in the table, {numbers.get(name)} in {path}"
            checked += 1
    if not checked:
        pytest.skip("no kernel headers on this machine")


def test_a_machine_without_a_seccomp_table_is_refused(monkeypatch):
    monkeypatch.setattr(sandbox, "_SECCOMP", None)
    with pytest.raises(sandbox.SandboxError, match="no seccomp table for this machine"):
        run_python("print(6 * 7)")


def test_a_sandbox_still_starts_fast():
    """Fast: within 10 times what starting a bare interpreter takes on this machine now (and at least 5 s); a call
    through the warm launcher costs about as much as that start (benchmarks/sandbox_calls.py measures it)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
    bare = time.monotonic() - started
    started = time.monotonic()
    result = run_python("print(6 * 7)")
    took = time.monotonic() - started
    assert result.ok and result.stdout == "42\n", result
    assert took < max(10 * bare, 5.0), f"a call took {took:.2f} s, a bare interpreter {bare:.2f} s"


@pytest.mark.parametrize("uid_map,ok", [("0 0 4294967295\n", True), ("0 100000 65536\n", False),
                                        ("0 0 65536\n2000000000 3000000000 5000000\n", True)])
def test_root_in_a_user_namespace_without_the_per_call_uids_is_refused(uid_map, ok, monkeypatch):
    files = {"/proc/sys/kernel/pid_max": "4194304\n", "/proc/self/uid_map": uid_map}
    monkeypatch.setattr(sandbox, "open", lambda path, *a, **k: io.StringIO(files[path]), raising=False)
    if ok:
        sandbox._check_uid_range()
    else:
        with pytest.raises(sandbox.SandboxError, match="does not map uids 2000000000-2004194304"):
            sandbox._check_uid_range()


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory\n"
             "36 25 0:31 / /sys/fs/cgroup/pids rw,nosuid shared:16 - cgroup cgroup rw,pids\n")
SCOPE = "/sys/fs/cgroup/user.slice/session-1.scope"


@pytest.mark.parametrize("mountinfo,cgroup,delegated,expected", [
    (V2_MOUNT, "0::/user.slice/session-1.scope\n", "cpu memory pids", (("v2", SCOPE),)),
    (V2_MOUNT, "0::/user.slice/session-1.scope\n", "cpu", ()),  # memory and pids not delegated to children
    (V1_MOUNTS, "5:memory:/job\n4:pids:/\n0::/\n", "", (("memory", "/sys/fs/cgroup/memory/job"),
                                                        ("pids", "/sys/fs/cgroup/pids"))),
    (V1_MOUNTS.splitlines()[0] + "\n", "5:memory:/job\n0::/\n", "", ()),  # no pids controller
])
def test_cgroup_parents_are_found_under_the_callers_own(mountinfo, cgroup, delegated, expected, monkeypatch):
    files = {"/proc/self/mountinfo": mountinfo, "/proc/self/cgroup": cgroup,
             SCOPE + "/cgroup.subtree_control": delegated}

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(sandbox_cgroups, "open", fake_open, raising=False)
    monkeypatch.setattr(sandbox_cgroups.os, "access", lambda path, mode: True)
    sandbox_cgroups.cgroup_parents.cache_clear()
    try:
        assert sandbox_cgroups.cgroup_parents() == expected
    finally:
        sandbox_cgroups.cgroup_parents.cache_clear()


def test_a_v2_cgroup_gets_memory_with_the_disk_and_pids_with_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_cgroups, "cgroup_parents", lambda: (("v2", str(tmp_path)),))
    made = sandbox_cgroups.make_cgroups(memory_mb=256, max_disk_mb=64, max_processes=32)
    assert len(made) == 1 and os.path.dirname(made[0]) == str(tmp_path)
    values = {name: Path(made[0], name).read_text() for name in os.listdir(made[0])}
    assert values == {"memory.max": str(320 << 20), "memory.swap.max": "0", "pids.max": "32"}, values
