"""The designs behind the sandbox's boundaries, piece by piece (test_sandbox_boundaries.py runs the attacks): the
call's output goes through pipes that the parent drains and caps, so the code holds no descriptor on a host file;
fallocate can only grow a file, which the file-size limit bounds; no fcntl command that takes a lock or lease passes
the filter; and the read rules of a non-root call leave out what other users may not read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_sandbox_hardening import ALLOW, EPERM, run_filter, sandbox_child

from tracerl.io import sandbox
from tracerl.io.sandbox import SandboxLimits, run_python
from tracerl.io.sandbox.output import Capture, wait_and_drain
from tracerl.io.sandbox.syscalls import AUDIT_ARCH, BY_ARGUMENT, seccomp_table
from tracerl.io.sandbox.view import hidden_entries, other_accessible, read_view

PATIENT = SandboxLimits(wall_seconds=60.0)  # calls that end by themselves: no loaded machine nears this clock


def test_the_code_holds_no_descriptor_on_a_file():
    code = ("import os, stat\n"
            "for fd in sorted(int(n) for n in os.listdir('/proc/self/fd')):\n"
            "    try:\n"
            "        mode = os.fstat(fd).st_mode\n"
            "    except OSError:\n"
            "        continue  # the listing's own descriptor\n"
            "    kind = 'fifo' if stat.S_ISFIFO(mode) else 'chr' if stat.S_ISCHR(mode) else oct(mode)\n"
            "    print(fd, kind, os.readlink('/proc/self/fd/%d' % fd) if kind == 'chr' else '')\n")
    result = run_python(code, PATIENT, _disable=("audit_hook",))
    assert result.stdout.split("\n") == ["0 chr /dev/null", "1 fifo ", "2 fifo ", ""], result.observation()


def test_a_pipe_is_cut_one_byte_past_its_cap(tmp_path):
    capture = Capture(str(tmp_path), cap_bytes=100_000)
    writer = capture.writer()
    code = ("import os, sys\n"
            "try:\n"
            "    for _ in range(100):\n"
            "        os.write(1, b'x' * 65536)\n"
            "except BrokenPipeError:\n"
            "    sys.stderr.write('broken pipe')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=writer, stderr=subprocess.PIPE)
    os.close(writer)
    try:
        assert wait_and_drain(proc.pid, 120, [capture]), "the writer did not end: its pipe was not closed"
        assert capture.cut and bytes(capture.data) == b"x" * 100_000 and capture.fd is None
        assert proc.stderr.read() == b"broken pipe", "the writer's next write must fail once its pipe is cut"
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        capture.close()
        os.unlink(capture.path)


def test_a_call_past_its_output_cap_says_so_and_one_under_it_does_not():
    limits = SandboxLimits(wall_seconds=60.0, max_file_mb=1)
    over = run_python("import os\nfor _ in range(48):\n    os.write(1, b'x' * 65536)\n", limits)  # 3 MB
    assert over.error == "output limit of 1 MB per stream exceeded", over
    assert "BrokenPipeError" in over.stderr and "chars truncated]" in over.stdout, over.observation()
    under = run_python("import sys\nsys.stdout.write('y' * 900_000)\nprint('end')\n", limits)
    assert under.ok and under.stdout.endswith("yyend\n") and "chars truncated]" in under.stdout, under


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_lets_fallocate_only_grow_a_file_and_takes_no_lock(machine):
    prog = sandbox_child().seccomp_program(seccomp_table(machine), 1)
    arch, nr = AUDIT_ARCH[machine], BY_ARGUMENT[machine]
    assert run_filter(prog, arch, nr["fallocate"], (3, 0, 0, 4096)) == ALLOW
    for mode in (1, 2, 3, 0x8, 0x10, 0x20, 0x40):  # KEEP_SIZE, PUNCH_HOLE, COLLAPSE/ZERO/INSERT/UNSHARE_RANGE, ...
        assert run_filter(prog, arch, nr["fallocate"], (3, mode, 0, 4096)) == EPERM, f"fallocate mode {mode:#x}"
    for command, name in ((6, "F_SETLK"), (7, "F_SETLKW"), (37, "F_OFD_SETLK"), (38, "F_OFD_SETLKW"),
                          (1024, "F_SETLEASE"), (1026, "F_NOTIFY")):
        assert run_filter(prog, arch, nr["fcntl"], (3, command)) == EPERM, f"{name} must be denied"
    for command in (5, 36):  # F_GETLK, F_OFD_GETLK: a question holds nobody up
        assert run_filter(prog, arch, nr["fcntl"], (3, command)) == ALLOW


def test_fallocate_past_the_file_limit_is_refused_without_the_tmpfs():
    """Without the workdir's tmpfs the workdir is on the host's disk, where KEEP_SIZE would reserve blocks that
    RLIMIT_FSIZE never sees; the filter refuses it, and the size check after the run counts blocks too."""
    code = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
            "fd = os.open('f', os.O_WRONLY | os.O_CREAT)\n"
            "print('keep_size', libc.fallocate(fd, 1, 0, 1 << 30), os.strerror(ctypes.get_errno()))\n"
            "try:\n"
            "    os.posix_fallocate(fd, 0, 1 << 30)\n"
            "    print('ESCAPED grown')\n"
            "except OSError as exc:\n"
            "    print('grow', exc.strerror)\n")
    result = run_python(code, PATIENT, _disable=("audit_hook", "disk_quota"))
    assert result.stdout == "keep_size -1 Operation not permitted\ngrow File too large\n", result.observation()


def test_the_size_check_counts_reserved_blocks(tmp_path):
    with open(tmp_path / "g", "wb") as f:
        libc_fallocate_keep_size(f.fileno(), 1 << 20)
    assert os.stat(tmp_path / "g").st_size == 0
    assert sandbox._tree_bytes(str(tmp_path)) >= 1 << 20, "a file of size 0 holding 1 MB of blocks was not counted"


def libc_fallocate_keep_size(fd: int, length: int) -> None:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if libc.fallocate(fd, 1, 0, length) != 0:
        pytest.skip(f"this file system cannot fallocate with KEEP_SIZE: {os.strerror(ctypes.get_errno())}")


def test_a_lock_is_refused_in_the_workdir_too_and_sqlite_has_a_way_round():
    code = ("import fcntl, sqlite3\n"
            "f = open('x', 'w')\n"
            "try:\n"
            "    fcntl.lockf(f, fcntl.LOCK_EX)\n"
            "    print('locked')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.strerror)\n"
            "db = sqlite3.connect('file:db.sqlite?nolock=1', uri=True)\n"
            "db.execute('create table t (a)')\n"
            "db.execute('insert into t values (42)')\n"
            "db.commit()\n"
            "print(db.execute('select a from t').fetchall())\n")
    result = run_python(code, PATIENT)
    assert result.stdout == "refused Operation not permitted\n[(42,)]\n", result.observation()


def make_tree(root) -> dict[str, str]:
    """A folder like /etc on a host where the caller owns a few private entries: what others may read and not."""
    spec = {"public/a.txt": 0o644, "public/sub/b.txt": 0o644, "mixed/ok.txt": 0o644, "mixed/private.txt": 0o600,
            "mixed/group.txt": 0o640, "mixed/deep/closed/inner.txt": 0o644, "mixed/deep/c.txt": 0o644,
            "entered/d.txt": 0o644}
    for name, mode in spec.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(name)
        os.chmod(path, mode)
    os.mkfifo(os.path.join(root, "mixed", "channel"), 0o666)
    os.symlink("private.txt", os.path.join(root, "mixed", "link"))
    os.chmod(os.path.join(root, "mixed", "deep", "closed"), 0o700)
    os.chmod(os.path.join(root, "entered"), 0o711)  # others may enter it, not list it
    for folder in ("", "public", "public/sub", "mixed", "mixed/deep"):
        os.chmod(os.path.join(root, folder), 0o755)
    return {name: os.path.join(str(root), name) for name in list(spec) + ["mixed/channel", "mixed/deep/closed",
                                                                          "entered", "mixed", "mixed/deep"]}


def test_hidden_entries_are_what_others_may_not_read(tmp_path):
    paths = make_tree(tmp_path)
    hidden = hidden_entries.__wrapped__((str(tmp_path),))
    assert set(hidden) == {paths[n] for n in ("mixed/private.txt", "mixed/group.txt", "mixed/channel",
                                              "mixed/deep/closed", "entered")}, hidden


def test_read_rules_leave_out_hidden_entries_and_recheck_their_folders(tmp_path):
    child = sandbox_child()
    root = str(tmp_path)
    paths = make_tree(tmp_path)
    hidden = hidden_entries((root,))  # the walk read_view makes, before the late entries below
    late = {os.path.join(root, "mixed", "late_private.txt"): 0o600,  # made after the walk, in a folder it flagged
            os.path.join(root, "mixed", "late_public.txt"): 0o644}
    for path, mode in late.items():
        with open(path, "w") as f:
            f.write("late")
        os.chmod(path, mode)
    os.mkfifo(os.path.join(root, "mixed", "late_channel"), 0o666)
    rules = dict(child.readable_rules(read_view.__wrapped__((root,), True)))
    read_file = 1 << 2

    def covered(path: str, right: int) -> bool:
        return any((path == p or path.startswith(p + "/")) and r & right for p, r in rules.items())

    for path in list(hidden) + [os.path.join(root, "mixed", n) for n in ("late_private.txt", "late_channel", "link")] \
            + [paths["mixed/deep/closed"] + "/inner.txt"]:
        assert not covered(path, read_file) and not covered(path, child.READ_DIR), f"{path} is granted"
    for name in ("public/a.txt", "public/sub/b.txt", "mixed/ok.txt", "mixed/deep/c.txt"):
        assert covered(paths[name], read_file), f"{name}, which others may read, is not granted"
    assert covered(os.path.join(root, "mixed", "late_public.txt"), read_file)
    assert rules[paths["public/a.txt"].rsplit("/", 1)[0]] == child.FS_READ, "a folder with nothing hidden is whole"
    for folder in (root, paths["mixed"], paths["mixed/deep"]):  # each holds a hidden folder beneath
        assert folder not in rules, f"{folder} may be listed, and with it the hidden folder beneath"


def test_other_accessible_needs_every_folder_above_searchable():
    top = Path(tempfile.mkdtemp(prefix="tracerl-test-other-", dir="/tmp"))  # /tmp: searchable by all
    try:
        inner = top / "home" / "file.txt"
        inner.parent.mkdir()
        inner.write_text("x")
        for path, mode in ((top, 0o755), (inner.parent, 0o755), (inner, 0o644)):
            os.chmod(path, mode)
        assert other_accessible(str(inner)) and other_accessible(str(inner.parent))
        os.chmod(inner.parent, 0o750)
        assert not other_accessible(str(inner)) and not other_accessible(str(inner.parent))
        os.chmod(inner.parent, 0o755)
        os.chmod(inner, 0o640)
        assert not other_accessible(str(inner))
    finally:
        shutil.rmtree(top)


def test_a_non_root_call_runs_a_python_whose_prefixes_others_may_read():
    python = sandbox._interpreter(drop=False)
    prefixes = sandbox._prefixes(python, False)
    assert prefixes and all(map(other_accessible, prefixes)), (python, prefixes)
    own = sandbox._prefixes(sys.executable, False)
    assert (python == sys.executable) == all(map(other_accessible, own)), (python, sys.executable, own)

