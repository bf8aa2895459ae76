"""Run model-written Python in a contained child process and turn the outcome into an observation.

The sandbox's room: this module, and what it is made of: the launcher (`child`, with `serve` and `exit`, whose text
runs under the launcher's own Python), the seccomp table (`syscalls`), what a call may read (`view`), cgroups
(`cgroups`, made ahead by `pool`), output capture (`output`) and cleanup (`cleanup`). All of it is stdlib only and
imports nothing outside this folder, so a copy of the folder runs alone (the non-root tests run one as `nobody`).

`run_python(code)` runs a launcher (an interpreter started `-s -S`: no site, no user site, stdlib only; forked
for each call from this process's warm launcher server, `_LaunchServer`, in the state a freshly started one
would have) in its own session and process group, in a new temporary working directory that is removed
afterwards, with an environment built from scratch (no inherited secrets; PATH=/usr/bin:/bin, HOME=TMPDIR=the
workdir, PYTHONHASHSEED=0 so that replaying the same code prints the same set order). Workdirs live under a
private parent (0711, one per process, removed at exit). The code's stdin is /dev/null, its stdout and stderr the
write ends of two pipes that this process drains while it waits and caps at `max_file_mb` each (`output`):
no descriptor the code holds is a file of the host, so none can be fallocated, truncated or written far past the
limits. The launcher (`child.py`) applies these layers before the model's code runs; each one that took
effect is listed in `SandboxResult.layers`. No guarantee rests on the audit hook: the tests check each one with it
switched off. When the code is done, its process ends as a Python script ends, minus the interpreter's teardown
(`exit`: threads joined, atexit run, its globals finalized, streams flushed).

Nothing of one call reaches another: the launcher is forked from a server that never runs model code, so each
call starts from the same memory; the workdir, its tmpfs, the namespaces, the uid and the cgroups are made for the
call and end with it. What is made ahead (the cgroups, `pool`; the seccomp filter, built once by the
server) is made fresh for one call and never handed to a second; what can wait until a call has returned (removing
its cgroups, reaping its launcher) is done after it returns. `tests/sandbox/test_sandbox_fresh_calls.py` has a
call leave everything it can behind and the next one look for it.

- `seccomp` (required, else SandboxError): an allowlist BPF filter (x86_64, arm64). The code may make only
  the syscalls CPython needs to run stdlib code and use its workdir (traced; see `ALLOWED` in `syscalls`);
  every other one fails with EPERM: no socket or socketpair of any family, no SysV or POSIX IPC, no memfd,
  no chmod/chown/xattr/utime (Landlock does not mediate them), no fork/exec/setsid, no personality,
  namespaces, mounts, ptrace, process_vm_*, pidfd, io_uring, bpf, perf, keys or userfaultfd, and no file lock
  of any kind (flock; fcntl's lock and lease commands), so no host file's writers wait on the code. clone
  passes for threads only, signals only to itself, ioctl and fcntl only for a few requests, fallocate only in
  mode 0 (it grows the file, which RLIMIT_FSIZE bounds), prlimit64 only on itself. So the code is one process,
  and its limits bind the whole run.
- `pidns`: a new PID namespace whose init (pid 1) is the code; the launcher outside only waits for it, and
  the code gets SIGKILL when the launcher dies. When the init ends, the kernel kills every process left in
  the namespace, so no descendant outlives the call (a child in a new session included). `procfs`: with a
  mount namespace too, a /proc of that PID namespace, so the host's processes and command lines are not there.
- `netns`: only a loopback that is down: no packet leaves, nothing on the host's 127.0.0.1 and no abstract
  unix socket of the host is reachable. `ipcns`: SysV objects and POSIX message queues of its own, which
  die with the call, so nothing passes from one rollout to the next through them.
- `readonly_fs`: a new mount namespace in which every mount is read-only (mount_setattr, or a bind
  remount of each mount point before Linux 5.12) except the workdir: no file outside it can be written,
  made, removed or chmod-ed, /dev/shm and /tmp included, whatever the uid and without Landlock.
- `disk_quota`: a tmpfs over the workdir in that namespace, capped at `max_disk_mb` and `max_inodes`
  (ENOSPC past them); it vanishes with the namespace. Without it the workdir's size is checked after the
  run and reported as an error.
- `cgroup` (where the caller's cgroup lets it make children: v2 with memory and pids delegated, or v1
  memory and pids): the call's own cgroups, nested under the caller's, with memory.max = memory_mb +
  max_disk_mb (tmpfs pages are charged to their writer, so the workdir's files count) and pids.max =
  max_processes (threads and the launcher included). The code cannot leave them or raise their limits: the
  cgroup files are root's (uid drop), read-only (readonly_fs) and outside Landlock's write roots. They are made
  while an earlier call runs, for exactly the call's limits, and removed after the call (`pool`).
- `uid_drop` (only when the caller is root): the code runs as a uid of its own, UID_BASE + the launcher's
  pid, with no groups: file permissions and signal rules protect the host, and RLIMIT_NPROC (counted per
  uid) is the call's alone. Interpreters under /root (pyenv) are unreadable by it, so the sandbox then
  runs a system python3 that it can read (probed once), or raises SandboxError rather than run as root.
- `userns` (only without root): the namespaces live in a new user namespace mapping only the caller's uid
  (capabilities dropped); since Linux 5.14 it also counts RLIMIT_NPROC for the call alone. The process
  limit must be the call's own (`cgroup`, `uid_drop` or `userns` on Linux >= 5.14), else SandboxError.
  In either mode the interpreter's prefixes become read roots, so they must be readable by every user: this
  interpreter in a private home (a pyenv under a 0700 home) gives way to a system python3 (`_interpreter`).
- `landlock` (Linux >= 5.13, any user): the kernel lets the code write only beneath its workdir, read only
  beneath the read roots (`view`: /usr, /lib*, /etc and the prefixes of the interpreter, which every
  user must be able to read) and /dev/null, /dev/{u,}random, /dev/zero, /proc/self and /sys/devices/system/cpu,
  execute nothing, and (ABI 4) bind or connect no TCP socket and (ABI 6) signal no process outside the sandbox.
  Without root the code keeps the caller's uid and groups, so the roots are granted less every entry that other
  users may not read (found by one walk per process; see `view` for what it misses). A uid drop or
  Landlock is required (else SandboxError): without either the code could read the caller's files.
- `rlimits` (always): CPU seconds (SIGXCPU, then SIGKILL one second later), address space, processes,
  file size (SIGXFSZ ignored, so a write past the cap raises `OSError: File too large`), open files, no
  core dumps. Output is capped by its pipes instead: past `max_file_mb` of a stream the parent closes it, the
  code's next write to it fails (BrokenPipeError) and the result's error names the output limit. The parent
  adds a wall-clock timeout that SIGKILLs the whole process group (the PID namespace's init included: seccomp
  keeps it in the group).
- `audit_hook` (always, Python >= 3.8): a tripwire inside the code's process that denies sockets, process
  creation, ctypes, kill() of other processes, and file writes outside the workdir and reads outside the
  allowed roots, with readable errors. Code can switch it off (it lives in the code's own memory).

`run_python` returns only when every process of the call is gone: after the kill it polls /proc until no
member of the process group runs a thread, and the PID namespace's init is such a member until the kernel
has reaped every other process of its namespace. A launcher that ended by itself after reaping that init (it
says so on the status fd, which the code never holds) leaves nothing to kill or poll: the kernel ended every
other process of the namespace before the init could be reaped.

Guarantees, when all layers are on (root, or a user namespace, on a recent kernel): the code cannot
modify files outside its workdir, lock any file, reach the network or any unix socket, share IPC objects with
another call, signal or ptrace the trainer, outlive its wall-clock timeout, or take more CPU, memory (its files
included), disk (through its workdir or its output) or processes than its limits, nor take them from another call;
it reads only what any other user of the machine may read beneath the read roots; the caller gets a SandboxResult,
never an exception, whatever the code does.

What it does not guarantee:
- It is not a VM or a container: the code shares the host kernel (a kernel exploit escapes it, and every
  allowed syscall is attack surface) and its CPU caches (side channels), and it can read the world-readable
  files of /etc, /usr and the interpreter's prefix (as root without Landlock: of the whole host).
- Code that needs a denied syscall fails with PermissionError: subprocess, multiprocessing, asyncio (its
  event loop makes a socketpair), sockets, shutil.copy/copy2/copytree (they chmod), os.utime, file locks
  (sqlite3 on a file fails with "access permission denied"; ":memory:" or a `file:x.db?nolock=1` URI works).
- The per-call uid assumes no other program uses uids from UID_BASE on; concurrent calls in different PID
  namespaces of one host (two containers sharing the host's uids) could draw the same uid. Root in a user
  namespace that does not map those uids gets SandboxError.
- Without a cgroup, memory is bounded per process (RLIMIT_AS) plus the tmpfs (max_disk_mb) and kernel
  objects such as pipe buffers and thread stacks, not by one number.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Collection

from tracerl.io.sandbox.cgroups import cgroup_oom
from tracerl.io.sandbox.cleanup import kill_group as _kill_group, remove_tree as _remove_tree, \
    remove_workdir as _remove_workdir, tree_bytes as _tree_bytes
from tracerl.io.sandbox.output import Capture, capped_text, wait_and_drain
import tracerl.io.sandbox.pool as sandbox_pool
from tracerl.io.sandbox.serve import read_message, write_message
from tracerl.io.sandbox.syscalls import seccomp_table
from tracerl.io.sandbox.view import other_accessible, read_roots, read_view

# the switchable layers (rlimits are always on; `userns` is on exactly when a non-root caller gets namespaces)
LAYERS = ("netns", "ipcns", "pidns", "readonly_fs", "disk_quota", "seccomp", "uid_drop", "cgroup", "landlock",
          "audit_hook")
# as root, each call runs as a uid of its own: UID_BASE + the launcher's pid (a range no distribution hands out;
# pids of live launchers differ, and a call returns only when all of its processes are gone)
UID_BASE = 2_000_000_000


class SandboxError(RuntimeError):
    """The sandbox itself could not run (bad host setup or limits too small to start Python); never
    raised for anything the model's code does."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0  # wall-clock timeout; the whole process group is SIGKILLed after it
    cpu_seconds: int = 5  # RLIMIT_CPU: SIGXCPU at this many CPU seconds, SIGKILL one second later
    memory_mb: int = 512  # RLIMIT_AS: address space; Python needs ~30 MB to start (cgroup: this + max_disk_mb)
    max_processes: int = 64  # threads of the call (RLIMIT_NPROC of its own uid or user namespace; cgroup pids.max)
    max_file_mb: int = 8  # RLIMIT_FSIZE: largest file the code may write; also the most of stdout and of stderr read
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_chars: int = 4000  # chars of stdout and of stderr kept (head and tail), the rest cut
    max_disk_mb: int = 64  # all files the code writes together (a tmpfs of this size, or checked after the run)
    max_inodes: int = 4096  # files and directories the code may create (tmpfs nr_inodes)

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "max_processes", "max_file_mb",
                     "max_open_files", "max_output_chars", "max_disk_mb", "max_inodes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name}={getattr(self, name)!r} must be positive")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb={self.memory_mb} is too small for Python; use >= 64")


@dataclass
class SandboxResult:
    stdout: str  # decoded with errors="replace", cut to max_output_chars around a truncation marker
    stderr: str  # same; the traceback when the code raised
    exit_code: int | None  # None when the process was killed by a signal
    timed_out: bool  # the wall-clock timeout fired
    killed_by: str | None  # signal name ("SIGKILL", "SIGXCPU") or None
    seconds: float  # wall-clock time of the whole run, start-up included
    network_isolated: bool  # a network namespace was in effect
    layers: tuple[str, ...] = ()  # isolation layers that took effect (rlimits, netns, uid_drop, ...)
    error: str | None = None  # a limit that stopped the code, in words ("timed out after 5.0s")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    def observation(self, max_error_lines: int = 20) -> str:
        """The text shown to the model: stdout, then the tail of stderr (the traceback) prefixed
        "error: " (or "stderr: " when the code succeeded), then the limit that stopped it; never empty."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        lines = self.stderr.rstrip("\n").splitlines()
        if len(lines) > max_error_lines:
            lines = [f"[... {len(lines) - max_error_lines} lines cut]"] + lines[-max_error_lines:]
        if lines:
            parts.append(("stderr: " if self.ok else "error: ") + "\n".join(lines))
        if self.error:
            parts.append(f"error: {self.error}")
        elif not self.ok and not lines:
            parts.append(f"error: exit code {self.exit_code}")
        return "\n".join(parts) if parts else "(no output)"


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), *,
               _disable: Collection[str] = (), _fresh: bool = False) -> SandboxResult:
    """Run `code` as a script in the sandbox and report what it printed and how it ended.

    The launcher is forked from this process's warm launcher server (`_LaunchServer`), which saves starting an
    interpreter per call; `_fresh` starts one instead (the benchmark's baseline; also the fallback on a kernel
    without pidfds, which waiting on a process that is not our child needs). Both give the same launcher state.
    `_disable` switches off named layers (see LAYERS); it exists so the tests can show that each layer
    holds on its own, and must stay empty in real use.
    """
    assert isinstance(code, str), f"code must be str, got {type(code).__name__}"
    assert set(_disable) <= set(LAYERS), f"unknown layers in _disable: {set(_disable) - set(LAYERS)}"
    clock = [["call", time.monotonic()]]
    drop_uid = os.geteuid() == 0 and "uid_drop" not in _disable
    python = _interpreter(drop=drop_uid)
    view = _read_view(python, drop_uid)
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="run-", dir=_private_parent()))
    files: list[IO[bytes]] = []
    captures: list[Capture] = []
    paths: list[str] = []
    cgroup_key = None if "cgroup" in _disable else (limits.memory_mb, limits.max_disk_mb, limits.max_processes)
    cgroups = [] if cgroup_key is None else sandbox_pool.POOL.take(cgroup_key)
    report, disk_error = {}, None
    try:
        for _ in range(2):  # source, status: named until the launcher has opened them
            fd, path = tempfile.mkstemp(dir=_private_parent())
            files.append(os.fdopen(fd, "w+b"))
            paths.append(path)
        for _ in range(2):  # stdout, stderr: pipes, in the launcher's order source, stdout, stderr, status
            captures.append(Capture(_private_parent(), limits.max_file_mb << 20))
            paths.insert(len(captures), captures[-1].path)
        source, status = files
        source.write(code.encode("utf-8", "surrogatepass"))
        source.flush()
        source.seek(0)
        config = {"workdir": workdir, "uid": None, "drop_uid": drop_uid, "uid_base": UID_BASE, "cgroups": cgroups,
                  "seccomp": _SECCOMP, "read_view": view,
                  "status_fd": status.fileno(),
                  "disable": sorted(_disable), "cpu_seconds": limits.cpu_seconds,
                  "memory_bytes": limits.memory_mb << 20, "max_processes": limits.max_processes,
                  "max_file_bytes": limits.max_file_mb << 20, "max_open_files": limits.max_open_files,
                  "max_disk_bytes": limits.max_disk_mb << 20, "max_inodes": limits.max_inodes,
                  # the tests switch layers off one by one; real use needs a uid drop or Landlock for files
                  "allow_unconfined_files": bool({"uid_drop", "landlock"} & set(_disable)),
                  "allow_shared_process_count": bool({"cgroup", "uid_drop"} & set(_disable))}
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8",
               "PYTHONHASHSEED": "0"}
        clock.append(["prepared", time.monotonic()])
        start = time.monotonic()
        server = None if _fresh or not _pidfds() else _LaunchServer.get(python)
        if server is not None:
            pid = server.launch(config, env, paths)
            if pid is None:  # the server was gone: a new one, once
                server = _LaunchServer.get(python)
                pid = server.launch(config, env, paths)
            if pid is None:
                raise SandboxError("the sandbox's launcher server ended twice in a row on one call")
        else:
            out, err = (c.writer() for c in captures)
            try:
                proc = subprocess.Popen([python, "-s", "-S", "-u", "-X", "utf8", "-c", _LAUNCHER, json.dumps(config)],
                                        stdin=source, stdout=out, stderr=err, pass_fds=(status.fileno(),),
                                        cwd=workdir, env=env, start_new_session=True)
            finally:  # this process keeps no write end: the pipes end when the call's processes are gone
                os.close(out)
                os.close(err)
            pid = proc.pid
        clock.append(["launched", time.monotonic()])
        gone = False
        try:  # from here on, whatever happens (^C included), nothing the code started outlives this call
            for path in paths:  # the launcher has opened them (uid drop or Landlock kept the code off them)
                os.unlink(path)
            paths.clear()
            if _launched is not None:
                _launched(pid, workdir)
            _running[pid] = captures[0]
            deadline = time.monotonic() + limits.wall_seconds
            sandbox_pool.POOL.tend(cgroup_key)  # while the launcher works: next calls' cgroups, finished ones' removal
            timed_out = not wait_and_drain(pid, deadline - time.monotonic(), captures)
            clock.append(["exited", time.monotonic()])
            report = _status_records(status)
            # the launcher ended by itself after it had reaped its PID namespace's init, so the kernel had ended every
            # other process of the namespace first: none of the call is left to kill or to look for
            gone = not timed_out and "reaped" in report
        finally:
            _running.pop(pid, None)
            if not gone:
                _kill_group(pid)  # the leader is not reaped yet, so its pgid cannot have been reused
            if server is None:
                returncode = proc.wait()
            elif gone:
                returncode = report["reaped"]
                server.forget(pid)
            else:
                returncode = server.reap(pid)
        seconds = time.monotonic() - start
        clock.append(["gone", time.monotonic()])
        for capture in captures:  # what is left in the pipes; no writer waits, every process of the call is gone
            capture.drain()
        out_of_memory = cgroup_oom(cgroups)
        if not gone:
            report = _status_records(status)
        stdout, stderr = (capped_text(c.data, limits.max_output_chars) for c in captures)
        if "disk_quota" not in report.get("layers", ()) and _tree_bytes(workdir) > limits.max_disk_mb << 20:
            disk_error = f"disk quota of {limits.max_disk_mb} MB exceeded"
        clock.append(["collected", time.monotonic()])
    finally:
        for f in files:
            f.close()
        for capture in captures:
            capture.close()
        for path in paths:
            os.unlink(path)
        _remove_workdir(workdir)
        sandbox_pool.POOL.release(cgroups)  # removed by a later call's `tend`, or at exit
    if "setup_error" in report:
        raise SandboxError(f"sandbox launcher failed: {report['setup_error']}")
    if "layers" not in report and not timed_out:
        raise SandboxError(f"sandbox launcher died before running the code (exit {returncode}): {stderr[-2000:]}")
    layers = tuple(report.get("layers", ()))
    killed_by = signal.Signals(-returncode).name if returncode < 0 else None
    if _clocked is not None:
        _clocked(clock + report.get("clock", []) + [["returned", time.monotonic()]])
    return SandboxResult(
        stdout=stdout, stderr=stderr, exit_code=None if returncode < 0 else returncode, timed_out=timed_out,
        killed_by=killed_by, seconds=seconds, network_isolated="netns" in layers, layers=layers,
        error=disk_error or _limit_error(limits, timed_out, killed_by, returncode, stderr, out_of_memory,
                                         output_cut=any(c.cut for c in captures)))


def _status_records(status: IO[bytes]) -> dict:
    """The launcher's records on the status file, merged: "layers" (or "setup_error") from the code's process before
    the code ran, "reaped" (the code's return code) from the launcher outside its PID namespace once the namespace is
    gone, and both one "clock". A record cut short can only be one the timeout's kill interrupted, and the timeout
    is then the outcome."""
    status.seek(0)
    merged, clock = {}, []
    for line in status.read().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        clock += record.pop("clock", [])
        merged.update(record)
    return dict(merged, clock=clock)


def _limit_error(limits: SandboxLimits, timed_out: bool, killed_by: str | None, returncode: int,
                 stderr: str, out_of_memory: bool = False, output_cut: bool = False) -> str | None:
    """Name the limit that stopped the code, if one did."""
    if timed_out:
        return f"timed out after {limits.wall_seconds}s"
    if output_cut:  # the parent closed the pipe: the code's next write failed (or SIGPIPE killed it)
        return f"output limit of {limits.max_file_mb} MB per stream exceeded"
    if out_of_memory and killed_by == "SIGKILL":  # the cgroup's OOM killer
        return f"memory limit of {limits.memory_mb} MB (files in the workdir included) exceeded"
    if killed_by == "SIGXCPU":
        return f"CPU time limit of {limits.cpu_seconds}s exceeded"
    if killed_by == "SIGXFSZ":
        return f"file size limit of {limits.max_file_mb} MB exceeded"
    if killed_by is not None:
        return f"killed by {killed_by}"
    last = stderr.rstrip().rsplit("\n", 1)[-1] if returncode != 0 else ""
    if "[Errno 28]" in last:  # ENOSPC: the workdir's tmpfs is full
        return f"disk quota of {limits.max_disk_mb} MB (or {limits.max_inodes} files) exceeded"
    if last.startswith("MemoryError"):
        return f"memory limit of {limits.memory_mb} MB exceeded"
    if "[Errno 27]" in last:  # EFBIG: the output or a file hit RLIMIT_FSIZE
        return f"file size limit of {limits.max_file_mb} MB exceeded (output included)"
    return None


@functools.cache
def _interpreter(drop: bool) -> str:
    """The Python for the child: the first of this interpreter and the system's that the call's user can start and
    import the stdlib with, and whose prefixes any user may read (they become read roots: `view`). As root
    that user is a uid of the sandbox's range (no home, no groups), which Pythons under /root (pyenv) fail; without
    root a Python in a private home fails the second test. Either way a system python3 is the usual fallback."""
    if drop:
        _check_uid_range()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    for python in dict.fromkeys(candidates):
        prefixes = _prefixes(python, drop) if os.path.exists(python) else None
        if prefixes is not None and all(map(other_accessible, prefixes)):
            return python
    user = f"an unprivileged uid ({UID_BASE})" if drop else "this user"
    raise SandboxError(f"no Python among {candidates} can be run by {user} from prefixes that every user may read; "
                       "install a system python3 (apt-get install python3)")


@functools.cache
def _prefixes(python: str, drop: bool) -> tuple[str, ...] | None:
    """`python`'s prefixes (sys.prefix, exec_prefix and their base_ versions) when the call's user (a uid of the
    sandbox's range if `drop`) can start it and import what the launcher needs; else None."""
    probe = ("import sys, ctypes, json, linecache, resource, traceback, types; assert sys.version_info >= (3, 8); "
             "print(json.dumps([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))")
    user = dict(user=UID_BASE, group=UID_BASE, extra_groups=[]) if drop else {}
    try:
        done = subprocess.run([python, "-s", "-S", "-c", probe], **user, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                              capture_output=True, timeout=30)
        return tuple(json.loads(done.stdout)) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _check_uid_range() -> None:
    """Every per-call uid (UID_BASE + any pid) must exist in this user namespace, else SandboxError: a root
    inside a container whose user namespace maps fewer uids (rootless, userns-remap) cannot switch to them."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            last = UID_BASE + int(f.read())
        with open("/proc/self/uid_map") as f:
            spans = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        return  # no /proc to read: the uid switch itself will fail the run if the uid does not exist
    if not any(inside <= UID_BASE and last < inside + count for inside, _, count in spans):
        raise SandboxError(f"running as root in a user namespace that does not map uids {UID_BASE}-{last}, which "
                           "the sandbox gives its calls; map them (e.g. a full uid_map), or run as a non-root user")


@functools.cache
def _private_parent() -> str:
    """A directory only this process's user can list (0711: the sandbox user may only pass through it to its
    workdir), created once per process and removed at exit; workdirs and captured output live in it."""
    parent = tempfile.mkdtemp(prefix="tracerl-sandboxes-")
    os.chmod(parent, 0o711)
    atexit.register(_remove_tree, parent)
    return parent


@functools.cache
def _read_view(python: str, drop_uid: bool) -> dict[str, list[str]]:
    """What a call may read (`view`), once per interpreter and mode: a uid of its own reads as "other"."""
    return read_view(read_roots(_prefixes(python, drop_uid)), walk=not drop_uid)


# the tests' view of every launcher started: (its pid, the call's workdir)
_launched: Callable[[int, str], None] | None = None
# the benchmark's view of each call's stages: [stage, time.monotonic()] from this process and from the launcher
_clocked: Callable[[list[list]], None] | None = None
# the tests' view of what running calls have printed so far: their stdout's capture, by launcher pid
_running: dict[int, Capture] = {}


@functools.cache
def _pidfds() -> bool:
    """Whether this kernel and Python give pidfds: waiting on a launcher that the server, not this process, forked
    needs one (Linux >= 5.3, Python >= 3.9)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class _LaunchServer:
    """A warm launcher (`serve.serve`) per calling process and interpreter: it forks the launcher of each
    call, which then applies every layer itself exactly as a freshly started one does, so a call pays a fork instead
    of an interpreter's start, imports and the launcher's compilation. The server runs no model code, holds nothing
    but the stdlib, the launcher and the seccomp filters it built, and is started with the environment all calls
    share; it ends with this process. Calls from several threads take turns on its pipe (a launch and a reap each
    take a fork or a wait; a `forget` takes no reply). A forked launcher inherits the server's memory: the stdlib,
    the launcher, and the requests of earlier calls (workdir and cgroup paths, limits), never their code or output,
    which only the calls' own files hold."""

    _servers: dict[tuple[int, str], "_LaunchServer"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, python: str) -> None:
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([python, "-s", "-S", "-u", "-X", "utf8", "-c", _LAUNCHER, "--serve",
                                      str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd="/", start_new_session=True,
                                     env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"})

    @classmethod
    def get(cls, python: str) -> "_LaunchServer":
        """This process's server for `python`, started on first use and again if it has died."""
        key = (os.getpid(), python)  # a forked copy of this process starts its own
        with cls._registry_lock:
            server = cls._servers.get(key)
            if server is None or server.proc.poll() is not None:
                server = cls._servers[key] = cls(python)
            return server

    def _ask(self, message: dict) -> dict | None:
        """The server's reply, or None when it is gone (it died, or was killed)."""
        with self.lock:
            try:
                write_message(self.proc.stdin.fileno(), message)
                return read_message(self.proc.stdout.fileno())
            except (OSError, ValueError):
                return None

    def launch(self, config: dict, env: dict[str, str], paths: list[str]) -> int | None:
        """Fork a launcher for one call (its files by path: source, stdout, stderr, status); its pid, or None when
        the server is gone (then killed for good, so that `get` starts another)."""
        reply = self._ask({"op": "launch", "cfg": config, "env": env, "files": paths})
        if reply is None:
            self._end()
            return None
        if "error" in reply:
            raise SandboxError(f"sandbox launcher server: {reply['error']}")
        return int(reply["pid"])

    def forget(self, pid: int) -> None:
        """Have the server reap a launcher that has ended and whose call is over, without waiting for it: nothing of
        the call will be signalled again. A server that is gone has nothing to reap (`get` replaces it)."""
        with self.lock:
            try:
                write_message(self.proc.stdin.fileno(), {"op": "forget", "pid": pid})
            except OSError:
                pass

    def reap(self, pid: int) -> int:
        """Wait for a launcher that has ended (and whose group was killed); its return code as Popen gives it
        (-signal when a signal ended it). A server that is gone cannot say: reported as killed."""
        reply = self._ask({"op": "reap", "pid": pid})
        if reply is None:
            self._end()
            return -signal.SIGKILL
        return os.waitstatus_to_exitcode(reply["status"])

    def _end(self) -> None:
        """Kill a server that stopped answering, and close its pipes; `get` starts another."""
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def _forget_servers() -> None:
    """In a child forked from this process (os.fork, multiprocessing): its own servers, and a registry lock no
    thread of the parent holds (one may have held it at the fork)."""
    _LaunchServer._servers = {}
    _LaunchServer._registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_servers)


def _launcher_text() -> str:
    """The launcher's script (`python -c <it>`): child.py, after the text of its sibling modules is run and
    registered under their names, since the launcher's Python may not see tracerl."""
    here = Path(__file__).resolve().parent
    lines = ["import sys, types"]
    for name in ("serve", "exit"):
        text = (here / f"{name}.py").read_text(encoding="utf-8")
        lines += [f"_module = sys.modules['tracerl.io.sandbox.{name}'] = types.ModuleType('tracerl.io.sandbox.{name}')",
                  f"exec(compile({text!r}, '<string>', 'exec'), _module.__dict__)"]
    return "\n".join(lines + ["del _module", (here / "child.py").read_text(encoding="utf-8")])


# The child's side (layers, then the code) lives in its own files and runs as `python -c <their text>`.
_LAUNCHER = _launcher_text()
_SECCOMP = seccomp_table(os.uname().machine)  # the launcher runs on this machine
