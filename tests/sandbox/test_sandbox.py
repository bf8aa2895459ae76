"""The sandbox for model-written Python (docs/design.md, section 4, "Environment protocol").

Every hostile snippet in HOSTILE must come back as an error observation while this process carries
on, the host untouched (checked on files, sockets and processes), and nothing the snippet started
left running. The layer tests switch off all layers but one to show that each holds on its own.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.io import sandbox
from tracerl.io.sandbox import LAYERS, SandboxLimits, SandboxResult, run_python

# Hostile programs a policy might write, by name; {path} and {port} are filled in by the tests.
HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "subprocess_bomb": (
        "import subprocess, sys\n"
        "while True:\n"
        "    subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    ),
    "memory_bomb": "x = bytearray(10**10)\n",
    "memory_growth": "x = []\nwhile True:\n    x.append('x' * 10**6)\n",
    "write_outside": "with open({path!r}, 'w') as f:\n    f.write('pwned')\n",
    "delete_outside": "import os\nos.remove({path!r})\n",
    "read_outside": "print(open({path!r}).read())\n",
    "connect_localhost": (
        "import socket\n"
        "s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'pwned')\n"
    ),
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\n",
    "huge_output": "print('x' * 10**8)\n",
    "print_forever": "while True:\n    print('spam')\n",
    # disarming the audit hook: poison what it calls, or rewrite its helper found through a frame
    "poison_hook": (
        "import os, os.path, builtins\n"
        "os.lstat = os.stat = lambda *a, **k: None\n"
        "os.path.realpath = os.path.abspath = lambda p: os.getcwd() + '/x'\n"
        "builtins.PermissionError = KeyError\n"
        "open({path!r}, 'w').write('pwned')\n"
    ),
    "rewrite_hook": (
        "import sys\n"
        "helper = sys._getframe().f_back.f_globals['resolve']\n"
        "helper.__code__ = (lambda path: '/inside').__code__\n"
        "open({path!r}, 'w').write('pwned')\n"
    ),
    "dir_fd_escape": (
        "import os\n"
        "fd = os.open({dir!r}, os.O_RDONLY)\n"
        "os.close(os.open('pwned.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n"
    ),
    "symlink_escape": "import os\nos.symlink({dir!r}, 'out')\nopen('out/pwned.txt', 'w').write('pwned')\n",
}

QUICK = SandboxLimits(wall_seconds=2.0)  # hostile runs that end by the clock, or whose test takes either ending
# hostile runs that end by themselves at once and whose test reads how they ended: a loaded machine must not turn
# that ending into a timeout
PATIENT = SandboxLimits(wall_seconds=30.0)


def seconds_past_the_limit() -> float:
    """How long a run may go on after its wall-clock limit fired, on this machine now: 10 times the slowest of two
    trivial runs timed just before (start-up, kill and cleanup cost about what such a run costs), and at least 2 s.
    A call that waits for something it should have killed fails on any machine; a busy machine alone fails nothing."""
    return max(10 * max(run_python("pass").seconds for _ in range(2)), 2.0)


@pytest.fixture
def spawned(monkeypatch):
    """Record the pid and workdir of every sandbox started during the test."""
    started: list[tuple[int, str]] = []
    monkeypatch.setattr(sandbox, "_launched", lambda pid, workdir: started.append((pid, workdir)))
    return started


def leftovers(started: list[tuple[int, str]]) -> list[str]:
    """Live processes left in a sandbox's process group or session, or forked from it (its command
    line names its workdir), and sandbox workdirs that still exist. Zombies are dead: they only wait
    for init to reap them, which a container's init may take seconds to do."""
    pids = {pid for pid, _ in started}
    found = [f"workdir {wd} still exists" for _, wd in started if os.path.exists(wd)]
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                state, _ppid, pgrp, session = f.read().rsplit(b")", 1)[1].split()[:4]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if state == b"Z":
            continue
        if int(pgrp) in pids or int(session) in pids or any(wd in cmdline for _, wd in started):
            found.append(f"pid {entry} state {state.decode()} pgrp {int(pgrp)}: {cmdline[:80]!r}")
    return found


def assert_contained(result: SandboxResult, started: list[tuple[int, str]]) -> None:
    """The run was reported as an error observation, nothing it started survives, and the sandbox
    still runs a normal program."""
    assert isinstance(result, SandboxResult)
    assert not result.ok, f"hostile code reported ok: {result}"
    assert "error:" in result.observation(), f"no error in the observation: {result.observation()!r}"
    assert leftovers(started) == [], f"left behind: {leftovers(started)}"
    normal = run_python("print(sum(range(10)))")
    assert normal.ok and normal.stdout == "45\n", f"sandbox broken after a hostile run: {normal}"


@pytest.fixture(scope="module")
def active_layers() -> tuple[str, ...]:
    return run_python("pass").layers


def landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(int(libc.syscall(444, None, 0, 1)), 0)  # landlock_create_ruleset(NULL, 0, VERSION)


# --- normal programs -------------------------------------------------------------------------------


def test_stdout_is_captured():
    result = run_python("print(sum(range(10)))")
    assert (result.stdout, result.stderr, result.exit_code) == ("45\n", "", 0)
    assert result.ok and not result.timed_out and result.killed_by is None and result.error is None
    assert result.observation() == "45"


def test_exception_traceback_is_the_observation_without_launcher_frames():
    result = run_python("def f(x):\n    return 1 / x\n\nprint('before')\nf(0)\n")
    assert result.exit_code == 1 and not result.ok
    obs = result.observation()
    assert obs.startswith("before\nerror: Traceback (most recent call last):"), obs
    assert 'File "<model>", line 2, in f' in obs and "return 1 / x" in obs, obs
    assert obs.rstrip().endswith("ZeroDivisionError: division by zero"), obs
    assert '"<string>"' not in result.stderr, f"launcher frame leaked into the traceback: {result.stderr}"


def test_syntax_error_is_reported():
    result = run_python("x = (\n")
    assert result.exit_code == 1 and "SyntaxError" in result.observation()


def test_exit_code_is_reported():
    failed = run_python("import sys\nsys.exit(3)")
    assert failed.exit_code == 3 and not failed.ok and failed.observation() == "error: exit code 3"
    assert run_python("import sys\nprint('done')\nsys.exit(0)").ok


def test_unicode_and_invalid_bytes_are_decoded():
    assert run_python("print('héllo ✓ 你好 🙂')").stdout == "héllo ✓ 你好 🙂\n"
    assert run_python("import sys\nsys.stdout.buffer.write(b'a\\xffb\\n')").stdout == "a\ufffdb\n"


def test_silent_program_observation_is_never_empty():
    assert run_python("x = 1").observation() == "(no output)"


def test_stderr_of_a_successful_program_is_not_an_error():
    result = run_python("import sys\nprint('warn', file=sys.stderr)\nprint(2)")
    assert result.ok and result.observation() == "2\nstderr: warn"


def test_fresh_workdir_is_home_and_removed_and_env_is_stripped(monkeypatch):
    monkeypatch.setenv("TRACERL_TEST_SECRET", "s3cret")
    code = ("import os, tempfile\n"
            "open('f.txt', 'w').write('x')\n"
            "print(os.getcwd(), os.listdir('.'), os.environ['HOME'] == os.getcwd(), tempfile.gettempdir())\n"
            "print(sorted(os.environ))")
    first, second = run_python(code), run_python(code)
    workdir, listing, home_is_workdir, tmp = first.stdout.splitlines()[0].split(" ", 3)
    assert listing == "['f.txt']" and home_is_workdir == "True" and tmp == workdir, first.stdout
    assert not os.path.exists(workdir), f"workdir {workdir} was not removed"
    assert second.stdout.split()[0] != workdir, "two runs shared a workdir"
    assert "s3cret" not in first.stdout and "TRACERL_TEST_SECRET" not in first.stdout
    assert first.stdout.splitlines()[1] == "['HOME', 'LC_ALL', 'PATH', 'PYTHONHASHSEED', 'TMPDIR']"


def test_stdlib_is_usable():
    code = ("import collections, dataclasses, datetime, decimal, fractions, itertools, json, math, random,"
            " re, statistics, tempfile, threading\n"
            "P = collections.namedtuple('P', 'x y', defaults=(0,))\n"
            "@dataclasses.dataclass\nclass Q:\n    a: int = 1\n"
            "with tempfile.NamedTemporaryFile('w') as f:\n    f.write('ok')\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "print(P(1), Q(), fractions.Fraction(1, 3) * 3, statistics.mean([1, 2, 3]), json.dumps({'a': 1}))")
    result = run_python(code)
    assert result.stdout == 'P(x=1, y=0) Q(a=1) 1 2 {"a": 1}\n', result.observation()


def test_same_code_prints_the_same_set_order():
    code = "print(set('w%d' % i for i in range(30)))"
    assert run_python(code).stdout == run_python(code).stdout, "string hashing is not seeded"


def test_limits_reject_bad_values_with_the_field_name():
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=16)


def namespace_available(flag: int) -> bool:
    probe = ("import ctypes, sys\nlibc = ctypes.CDLL(None)\n"
             f"sys.exit(0 if 0 in (libc.unshare({flag}), libc.unshare({flag} | 0x10000000)) else 1)")
    return subprocess.run([sys.executable, "-c", probe]).returncode == 0


def netns_available() -> bool:
    return namespace_available(0x40000000)


def seccomp_available() -> bool:
    with open("/proc/self/status") as f:
        return any(line.startswith("Seccomp:") for line in f)


def cgroups_writable() -> bool:
    """A child cgroup with memory and pids limits can be made under this process's own (probed by making one)."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["v2"]:
            own[controller] = path
    v2 = Path("/sys/fs/cgroup") / own.get("v2", "/").lstrip("/")
    if (v2 / "cgroup.subtree_control").exists() and {"memory", "pids"} <= set(
            (v2 / "cgroup.subtree_control").read_text().split()):
        candidates = [v2]
    else:
        candidates = [Path("/sys/fs/cgroup") / c / own.get(c, "/nowhere").lstrip("/") for c in ("memory", "pids")]
    for parent in candidates:
        probe = parent / f"tracerl-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            return False
    return True


def test_every_layer_the_host_supports_is_active(active_layers):
    """Each layer is on exactly when the host allows it (probed here independently of the sandbox)."""
    supported = {"rlimits": True, "audit_hook": True, "uid_drop": os.geteuid() == 0,
                 "userns": os.geteuid() != 0 and namespace_available(0x40000000),
                 "landlock": landlock_abi() >= 1, "netns": netns_available(), "ipcns": namespace_available(0x08000000),
                 "pidns": namespace_available(0x20000000), "disk_quota": namespace_available(0x00020000),
                 "readonly_fs": namespace_available(0x00020000),
                 "procfs": namespace_available(0x20000000) and namespace_available(0x00020000),
                 "seccomp": seccomp_available(), "cgroup": cgroups_writable()}
    assert set(active_layers) == {layer for layer, ok in supported.items() if ok}


# --- hostile programs, all layers on ------------------------------------------------------------


def test_infinite_loop_is_stopped_by_the_default_limits(spawned):
    past = seconds_past_the_limit()
    result = run_python(HOSTILE["infinite_loop"])
    assert result.timed_out or result.killed_by == "SIGXCPU", result
    assert result.seconds < SandboxLimits().wall_seconds + past, f"took {result.seconds:.1f}s"
    assert "error: timed out after 5.0s" in result.observation() or "CPU time limit" in result.observation()
    assert_contained(result, spawned)


@pytest.mark.parametrize("name", ["fork_bomb", "subprocess_bomb"])
def test_process_bombs_are_contained(name, spawned):
    past = seconds_past_the_limit()
    result = run_python(HOSTILE[name], QUICK)
    assert result.seconds < QUICK.wall_seconds + past, f"took {result.seconds:.1f}s"
    assert_contained(result, spawned)


def test_memory_bomb_is_a_memory_error(spawned):
    result = run_python(HOSTILE["memory_bomb"], PATIENT)
    assert result.error == "memory limit of 512 MB exceeded", result
    assert "MemoryError" in result.observation() and "error: memory limit" in result.observation()
    assert_contained(result, spawned)


def test_growing_list_hits_the_memory_limit(spawned):
    limits = SandboxLimits(wall_seconds=PATIENT.wall_seconds, memory_mb=256)
    result = run_python(HOSTILE["memory_growth"], limits)
    assert result.error == "memory limit of 256 MB exceeded", result
    assert_contained(result, spawned)


def test_writing_outside_the_workdir_creates_nothing(tmp_path, spawned):
    target = tmp_path / "pwned.txt"
    result = run_python(HOSTILE["write_outside"].format(path=str(target)), PATIENT)
    assert not target.exists(), "the sandbox wrote outside its workdir"
    assert "PermissionError" in result.observation()
    assert_contained(result, spawned)


def test_deleting_outside_the_workdir_removes_nothing(tmp_path, spawned):
    target = tmp_path / "keep.txt"
    target.write_text("keep")
    result = run_python(HOSTILE["delete_outside"].format(path=str(target)), QUICK)
    assert target.read_text() == "keep", "the sandbox deleted a file outside its workdir"
    assert_contained(result, spawned)


def test_reading_outside_the_allowed_roots_fails(tmp_path, spawned):
    secret = tmp_path / "answers.txt"
    secret.write_text("the answer is 42")
    result = run_python(HOSTILE["read_outside"].format(path=str(secret)), QUICK)
    assert "the answer is 42" not in result.stdout
    assert_contained(result, spawned)


@pytest.fixture
def server():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(0.1)  # a connection that got through would already wait in the backlog
        yield srv


def test_socket_to_a_local_server_never_connects(server, spawned):
    result = run_python(HOSTILE["connect_localhost"].format(port=server.getsockname()[1]), QUICK)
    with pytest.raises(socket.timeout):
        server.accept()
    assert_contained(result, spawned)


def test_killing_the_parent_fails_and_the_parent_survives(spawned):
    result = run_python(HOSTILE["kill_parent"], PATIENT)  # if this worked, pytest itself would die here
    assert result.exit_code == 1 and "PermissionError" in result.observation(), result
    assert_contained(result, spawned)


@pytest.mark.parametrize("name", ["huge_output", "print_forever"])
def test_huge_output_is_truncated_in_time(name, spawned):
    past = seconds_past_the_limit()
    result = run_python(HOSTILE[name], QUICK)
    assert result.seconds < QUICK.wall_seconds + past, f"took {result.seconds:.1f}s"
    assert "chars truncated]" in result.stdout, result.stdout[:200]
    marker = len(result.stdout.split("\n[...")[1].split("]\n")[0]) + 8
    assert len(result.stdout) <= QUICK.max_output_chars + marker, len(result.stdout)
    assert_contained(result, spawned)


@pytest.mark.parametrize("name", ["poison_hook", "rewrite_hook", "dir_fd_escape", "symlink_escape"])
def test_the_audit_hook_cannot_be_disarmed(name, tmp_path, spawned):
    """Only the hook is on, so nothing else would stop these."""
    code = HOSTILE[name].format(path=str(tmp_path / "pwned.txt"), dir=str(tmp_path))
    result = run_python(code, PATIENT, _disable=("netns", "uid_drop", "landlock"))
    assert list(tmp_path.iterdir()) == [], "the hook was bypassed"
    assert "PermissionError" in result.stderr and "not allowed" in result.stderr, result.observation()
    assert_contained(result, spawned)


# --- each OS layer on its own -------------------------------------------------------------------

BLOCKED_BY = {  # which layers alone stop which snippet
    "write_outside": ("audit_hook", "uid_drop", "landlock", "readonly_fs"),
    "delete_outside": ("audit_hook", "uid_drop", "landlock", "readonly_fs"),
    "read_outside": ("audit_hook", "uid_drop", "landlock"),
    "connect_localhost": ("audit_hook", "netns", "landlock"),
    "kill_parent": ("audit_hook", "uid_drop", "landlock"),
}


@pytest.mark.parametrize("name,layer", [(n, layer) for n, layers in BLOCKED_BY.items() for layer in layers])
def test_each_layer_alone_blocks(name, layer, tmp_path, server, active_layers, spawned):
    if layer not in active_layers:
        pytest.skip(f"layer {layer} is not available on this host")
    if layer == "landlock" and name == "kill_parent" and landlock_abi() < 6:
        pytest.skip("landlock signal scoping needs ABI 6 (Linux 6.12)")
    target = tmp_path / "file.txt"
    target.write_text("keep")
    code = HOSTILE[name].format(path=str(tmp_path / "pwned.txt") if name == "write_outside" else str(target),
                                port=server.getsockname()[1])
    result = run_python(code, QUICK, _disable=[x for x in LAYERS if x != layer])
    assert tuple(x for x in result.layers if x != "userns") == ("rlimits", layer), result.layers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"] and target.read_text() == "keep"
    assert "keep" not in result.stdout
    if name == "connect_localhost":
        with pytest.raises(socket.timeout):
            server.accept()
    assert_contained(result, spawned)


def test_nproc_alone_contains_a_fork_bomb(active_layers, spawned):
    if "uid_drop" not in active_layers:
        pytest.skip("RLIMIT_NPROC only binds after the uid drop (root ignores it)")
    past = seconds_past_the_limit()
    result = run_python(HOSTILE["fork_bomb"], QUICK, _disable=("audit_hook", "landlock", "netns", "seccomp", "pidns",
                                                               "disk_quota"))
    assert "Resource temporarily unavailable" in result.stderr or result.timed_out, result.observation()
    assert result.seconds < QUICK.wall_seconds + past, f"took {result.seconds:.1f}s"
    assert_contained(result, spawned)
