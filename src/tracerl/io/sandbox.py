"""Run model-written Python in a contained child process and turn the outcome into an observation.

`run_python(code)` starts a fresh interpreter (`-s -S`: no site, no user site, stdlib only) in its own
session and process group, in a new temporary working directory that is removed afterwards, with an
environment built from scratch (no inherited secrets; PATH=/usr/bin:/bin, HOME=TMPDIR=the workdir,
PYTHONHASHSEED=0 so that replaying the same code prints the same set order). A launcher (`_LAUNCHER`,
below) applies these layers before the model's code runs; each one that took effect is listed in
`SandboxResult.layers`:

- `rlimits` (always): CPU seconds (SIGXCPU, then SIGKILL one second later), address space, processes
  (per user), file size (SIGXFSZ ignored, so a write past the cap raises `OSError: File too large`),
  open files, no core dumps. The parent adds a wall-clock timeout that SIGKILLs the whole process
  group, and kills any member left in the group after the code exits (killed members that the code
  forked stay zombies, running nothing, until init reaps them).
- `netns`: `unshare(CLONE_NEWNET)` (as root; `CLONE_NEWUSER|CLONE_NEWNET` otherwise): the code sees only
  a loopback that is down, so no packet leaves and nothing on the host's 127.0.0.1 is reachable.
- `uid_drop` (only when the caller is root): setgid/setuid to `nobody` after chowning the workdir, so
  file permissions and signal rules protect the host, and RLIMIT_NPROC (per user; root ignores it)
  stops fork bombs. Interpreters under /root (pyenv) are unreadable by nobody, so the sandbox then
  runs a system python3 that nobody can read (probed once); if there is none it raises SandboxError
  rather than run model code as root.
- `landlock` (Linux >= 5.13, any user): the kernel lets the code write only beneath its workdir, read
  only the interpreter's prefixes, /usr, /lib*, /etc and a few /dev files, execute nothing, and (ABI 4)
  bind or connect no TCP socket and (ABI 6) signal no process outside the sandbox.
- `audit_hook` (always, Python >= 3.8): denies sockets, process creation, ctypes, kill() of other
  processes, and file writes outside the workdir and reads outside the allowed roots.

Guarantees, when all layers are on (root on a recent kernel): the code cannot modify files outside
its workdir, reach the network, signal or ptrace the trainer, outlive its wall-clock timeout, or take
more CPU, memory, disk or processes than its limits; the caller gets a SandboxResult, never an
exception, whatever the code does.

What it does not guarantee:
- It is not a VM or a container: the code shares the host kernel (a kernel exploit escapes it) and its
  CPU caches (side channels), and it can read world-readable system files (/etc, /usr).
- The audit hook is a tripwire, not a boundary: it runs inside the code's own process, and CPython
  says hooks are no sandbox (for instance importlib can rebuild a builtin module the hook bans, such
  as _posixsubprocess on Debian's python); the OS layers are the boundary.
- Concurrent sandboxes all run as `nobody`: they share RLIMIT_NPROC and, with landlock off, could
  read or signal each other.
- Without root there is no uid drop: RLIMIT_NPROC counts all of the caller's processes, and with
  landlock unavailable only the audit hook keeps the code from writing, reading or killing what the
  caller's user can; with CLONE_NEWUSER refused too, only the hook blocks the network.
- Landlock stops TCP only: UDP is stopped by the netns and the hook; unix sockets on the filesystem
  (e.g. /var/run/docker.sock) by file permissions after the uid drop and the hook, not by the netns.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import IO, Collection

LAYERS = ("netns", "uid_drop", "landlock", "audit_hook")  # the switchable layers (rlimits are always on)


class SandboxError(RuntimeError):
    """The sandbox itself could not run (bad host setup or limits too small to start Python); never
    raised for anything the model's code does."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0  # wall-clock timeout; the whole process group is SIGKILLed after it
    cpu_seconds: int = 5  # RLIMIT_CPU: SIGXCPU at this many CPU seconds, SIGKILL one second later
    memory_mb: int = 512  # RLIMIT_AS: address space; Python needs ~30 MB to start
    max_processes: int = 64  # RLIMIT_NPROC, per user (enforced after the uid drop; root ignores it)
    max_file_mb: int = 8  # RLIMIT_FSIZE: largest file the code may write, stdout and stderr included
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_chars: int = 4000  # chars of stdout and of stderr kept (head and tail), the rest cut

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "max_processes", "max_file_mb",
                     "max_open_files", "max_output_chars"):
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
               _disable: Collection[str] = ()) -> SandboxResult:
    """Run `code` as a script in the sandbox and report what it printed and how it ended.

    `_disable` switches off named layers (see LAYERS); it exists so the tests can show that each layer
    holds on its own, and must stay empty in real use.
    """
    assert isinstance(code, str), f"code must be str, got {type(code).__name__}"
    assert set(_disable) <= set(LAYERS), f"unknown layers in _disable: {set(_disable) - set(LAYERS)}"
    python, uid, gid = _interpreter(drop=os.geteuid() == 0 and "uid_drop" not in _disable)
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="tracerl-sandbox-"))
    files: list[IO[bytes]] = [tempfile.TemporaryFile() for _ in range(4)]
    source, out, err, status = files
    try:
        if uid is not None:
            os.chown(workdir, uid, gid)
        source.write(code.encode("utf-8", "surrogatepass"))
        source.seek(0)
        config = {"workdir": workdir, "uid": uid, "gid": gid, "status_fd": status.fileno(),
                  "disable": sorted(_disable), "cpu_seconds": limits.cpu_seconds,
                  "memory_bytes": limits.memory_mb << 20, "max_processes": limits.max_processes,
                  "max_file_bytes": limits.max_file_mb << 20, "max_open_files": limits.max_open_files}
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8",
               "PYTHONHASHSEED": "0"}
        start = time.monotonic()
        proc = subprocess.Popen([python, "-s", "-S", "-u", "-X", "utf8", "-c", _LAUNCHER, json.dumps(config)],
                                stdin=source, stdout=out, stderr=err, pass_fds=(status.fileno(),),
                                cwd=workdir, env=env, start_new_session=True)
        try:
            timed_out = not _wait_for_exit(proc.pid, limits.wall_seconds)
        finally:  # also on KeyboardInterrupt: nothing the code started outlives this call
            _kill_group(proc.pid)  # the leader is not reaped yet, so its pgid cannot have been reused
            returncode = proc.wait()
        seconds = time.monotonic() - start
        status.seek(0)
        report = json.loads(status.read() or b"{}")
        stdout = _read_capped(out, limits)
        stderr = _read_capped(err, limits)
    finally:
        for f in files:
            f.close()
        _remove_tree(workdir)
    if "setup_error" in report:
        raise SandboxError(f"sandbox launcher failed: {report['setup_error']}")
    if "layers" not in report and not timed_out:
        raise SandboxError(f"sandbox launcher died before running the code (exit {returncode}): {stderr[-2000:]}")
    layers = tuple(report.get("layers", ()))
    killed_by = signal.Signals(-returncode).name if returncode < 0 else None
    return SandboxResult(
        stdout=stdout, stderr=stderr, exit_code=None if returncode < 0 else returncode, timed_out=timed_out,
        killed_by=killed_by, seconds=seconds, network_isolated="netns" in layers, layers=layers,
        error=_limit_error(limits, timed_out, killed_by, returncode, stderr))


def _limit_error(limits: SandboxLimits, timed_out: bool, killed_by: str | None, returncode: int,
                 stderr: str) -> str | None:
    """Name the limit that stopped the code, if one did."""
    if timed_out:
        return f"timed out after {limits.wall_seconds}s"
    if killed_by == "SIGXCPU":
        return f"CPU time limit of {limits.cpu_seconds}s exceeded"
    if killed_by == "SIGXFSZ":
        return f"file size limit of {limits.max_file_mb} MB exceeded"
    if killed_by is not None:
        return f"killed by {killed_by}"
    last = stderr.rstrip().rsplit("\n", 1)[-1] if returncode != 0 else ""
    if last.startswith("MemoryError"):
        return f"memory limit of {limits.memory_mb} MB exceeded"
    if "[Errno 27]" in last:  # EFBIG: the output or a file hit RLIMIT_FSIZE
        return f"file size limit of {limits.max_file_mb} MB exceeded (output included)"
    return None


@functools.cache
def _interpreter(drop: bool) -> tuple[str, int | None, int | None]:
    """(python, uid, gid) for the child: this interpreter and no uid drop unless we are root; as root,
    the first interpreter that `nobody` can start and import the stdlib with (sys.executable first)."""
    if not drop:
        return sys.executable, None, None
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    probe = "import sys, ctypes, json, linecache, resource, traceback, types; assert sys.version_info >= (3, 8)"
    for python in dict.fromkeys(candidates):
        if not os.path.exists(python):
            continue
        try:
            done = subprocess.run([python, "-s", "-S", "-c", probe], user=uid, group=gid, extra_groups=[],
                                  env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python, uid, gid
    raise SandboxError(f"running as root, but no Python among {candidates} can be run by nobody (uid {uid}); "
                       "install a system python3 (apt-get install python3) or run as a non-root user")


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait until the child exits, without reaping it; False when `timeout` seconds pass first."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3 or Python < 3.9: poll
        deadline = time.monotonic() + timeout
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)


def _kill_group(pgid: int, settle_seconds: float = 1.0) -> None:
    """SIGKILL every process in the group, then wait (bounded) until none but the unreaped leader runs.
    Killed members that the code forked stay zombies until init reaps them; they run nothing."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + settle_seconds
    while _live_members(pgid) - {pgid} and time.monotonic() < deadline:
        time.sleep(0.01)


def _live_members(pgid: int) -> set[int]:
    """Pids of the processes in process group `pgid` that are not zombies, read from /proc."""
    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, _ppid, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]  # after "pid (comm)"
            except OSError:
                continue
            if int(pgrp) == pgid and state != b"Z":
                members.add(int(entry))
    return members


def _read_capped(f: IO[bytes], limits: SandboxLimits) -> str:
    """Decode a captured stream and keep its head and tail around a "[... N chars truncated]" marker."""
    f.seek(0)
    text = f.read((limits.max_file_mb << 20) + 1).decode("utf-8", errors="replace")
    keep = limits.max_output_chars
    if len(text) <= keep:
        return text
    head = keep // 2
    return f"{text[:head]}\n[... {len(text) - keep} chars truncated]\n{text[len(text) - (keep - head):]}"


def _remove_tree(path: str) -> None:
    """Delete the workdir even where the code removed permissions from its own files."""
    def make_writable_and_retry(func, target, _exc) -> None:  # type: ignore[no-untyped-def]
        os.chmod(os.path.dirname(target), 0o700)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, 0o700)
        func(target)

    handler = {"onexc" if sys.version_info >= (3, 12) else "onerror": make_writable_and_retry}
    try:
        shutil.rmtree(path, **handler)
    except OSError as exc:
        warnings.warn(f"could not remove sandbox workdir {path}: {exc}", RuntimeWarning, stacklevel=3)


# The launcher runs in the child, as root until the uid drop. It must stay valid Python 3.8 and import
# nothing outside the stdlib. Setup errors are reported through the status fd and fail the run closed.
_LAUNCHER = r'''
import builtins, ctypes, json, linecache, os, resource, signal, sys, traceback, types
import _posixsubprocess, _signal

CLONE_NEWUSER, CLONE_NEWNET, PR_SET_NO_NEW_PRIVS = 0x10000000, 0x40000000, 38
LANDLOCK_CREATE, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT = 444, 445, 446  # syscall numbers, x86_64 and arm64
FS_READ = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR
FS_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights a rule on a file may hold
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DENIED = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.killpg", "pty.spawn",
                    "sys.settrace", "sys.setprofile",  # a tracer could rewrite the hook's locals
                    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "webbrowser.open",
                    "sqlite3.enable_load_extension", "sqlite3.load_extension"})
DENIED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.posix_spawn", "os.spawn", "syslog.")
BANNED_IMPORTS = frozenset({"_posixsubprocess", "_signal", "_ctypes", "_testcapi", "_testinternalcapi",
                            "_xxsubinterpreters"})
WRITES_ARG0 = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                         "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.make_archive",
                         "sqlite3.connect"})
WRITES_ARG1 = frozenset({"shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
                         "shutil.unpack_archive"})
WRITES_BOTH = frozenset({"os.rename", "os.link", "shutil.move"})
READS_ARG0 = frozenset({"os.listdir", "os.scandir"})
PROTECTED_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})


def text(path, _fspath=os.fspath, _bytes=bytes, _type=type):
    path = _fspath(path)
    return path.decode("utf-8", "surrogateescape") if _type(path) is _bytes else path


def resolve(path, _lstat=os.lstat, _readlink=os.readlink, _getcwd=os.getcwd, _text=text, _int=int, _type=type):
    """Absolute path with symlinks resolved, built from C functions bound here so that code that
    monkeypatches os or builtins cannot change the answer."""
    path = _readlink("/proc/self/fd/%d" % path) if _type(path) is _int else _text(path)
    if not path.startswith("/"):
        path = _getcwd() + "/" + path
    todo, done, hops = path.split("/")[::-1], [], 0
    while todo:
        name = todo.pop()
        if name == "" or name == ".":
            continue
        if name == "..":
            done = done[:-1]
            continue
        current = "/" + "/".join(done + [name])
        try:
            link = _lstat(current).st_mode & 0o170000 == 0o120000
        except OSError:
            link = False
        if link and hops < 40:
            hops += 1
            target = _readlink(current)
            if target.startswith("/"):
                done = []
            todo.extend(target.split("/")[::-1])
        else:
            done.append(name)
    return "/" + "/".join(done)


def install_hook(workdir, read_roots):
    """Second layer: deny by audit event. Everything the hook uses is bound as a default argument
    (a tuple, which cannot be changed in place) so code cannot poison it through os or builtins."""
    def hook(event, args, _wd=workdir + "/", _reads=tuple(r.rstrip("/") + "/" for r in read_roots),
             _pid=os.getpid(), _resolve=resolve, _text=text, _denied=DENIED, _prefixes=DENIED_PREFIXES,
             _banned=BANNED_IMPORTS, _w0=WRITES_ARG0, _w1=WRITES_ARG1, _w2=WRITES_BOTH, _r0=READS_ARG0,
             _attrs=PROTECTED_ATTRS, _protected=(resolve, text), _wflags=WRITE_FLAGS,
             _dflags=os.O_DIRECTORY | getattr(os, "O_PATH", 0), _stat=os.stat, _int=int, _type=type,
             _error=PermissionError):
        if event in _denied or event.startswith(_prefixes):
            raise _error("sandbox: %s is not allowed" % event)
        if event == "import":
            if args[0] in _banned:
                raise _error("sandbox: importing %s is not allowed" % args[0])
            return
        if event == "object.__setattr__":  # the hook itself is unreachable: only gc (denied) holds it
            if args[1] in _attrs and (args[0] is _protected[0] or args[0] is _protected[1]):
                raise _error("sandbox: changing the sandbox's functions is not allowed")
            return
        if event == "os.kill":
            if args[0] != _pid:
                raise _error("sandbox: signalling other processes is not allowed")
            return
        writes = reads = ()
        if event == "open":
            path, flags = args[0], args[2]
            if _type(path) is _int:
                return  # an fd the process already holds
            if _type(flags) is not _int or flags & _wflags:
                writes = (path,)
            else:
                target = _resolve(path) + "/"
                if not target.startswith(_wd):
                    try:  # a directory fd outside would let dir_fd-relative calls escape the checks
                        is_dir = _stat(target[:-1]).st_mode & 0o170000 == 0o040000
                    except OSError:
                        is_dir = False
                    if flags & _dflags or is_dir:
                        raise _error("sandbox: opening directories outside the working directory is not allowed")
                    reads = (path,)
        elif event in _w0:
            writes = (args[0],)
        elif event in _w1:
            writes = (args[1],)
        elif event in _w2:
            writes = (args[0], args[1])
        elif event == "os.symlink":
            target = _text(args[0])
            if ".." in target.split("/") or target.startswith("/") and not (_resolve(target) + "/").startswith(_wd):
                raise _error("sandbox: symlinks pointing outside the working directory are not allowed")
            writes = (args[1],)
        elif event in _r0 and args[0] is not None:
            reads = (args[0],)
        for path in writes:
            if _type(path) is not _int:
                raw = _text(path)
                if raw == ":memory:" or raw == "":
                    continue
                if ".." in raw.split("/"):
                    raise _error("sandbox: '..' in a path the code writes to is not allowed")
            if not (_resolve(path) + "/").startswith(_wd):
                raise _error("sandbox: writing outside the working directory is not allowed: %s" % (path,))
        for path in reads:
            target = _resolve(path) + "/"
            if not target.startswith(_wd):
                for root in _reads:
                    if target.startswith(root):
                        break
                else:
                    raise _error("sandbox: reading outside the allowed directories is not allowed: %s" % (path,))
    sys.addaudithook(hook)


def landlock(libc, workdir, read_roots):
    abi = libc.syscall(LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return False
    fs_all = (1 << 13) - 1 - 1  # ABI 1 rights except EXECUTE (bit 0): nothing may be executed
    fs_all |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    handled = (ctypes.c_uint64 * 3)(fs_all | 1, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    ruleset = libc.syscall(LANDLOCK_CREATE, ctypes.byref(handled), 24 if abi >= 6 else 16 if abi >= 4 else 8, 0)
    if ruleset < 0:
        return False

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path, access):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                access &= FS_FILE_RIGHTS
            rule = PathBeneath(access & fs_all, fd)
            if libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule(%s)" % path)
        finally:
            os.close(fd)

    try:  # best effort: a rule that cannot be added leaves landlock off, the other layers still hold
        allow(workdir, fs_all)
        for root in read_roots:
            allow(root, FS_READ)
        allow("/dev/null", FS_READ | (1 << 1))
        return libc.syscall(LANDLOCK_RESTRICT, ruleset, 0) == 0
    except OSError:
        return False
    finally:
        os.close(ruleset)


def set_limit(which, value, hard=None):
    _, current_hard = resource.getrlimit(which)
    hard = value if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        value, hard = min(value, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (value, hard))


def setup(cfg):
    layers, off, workdir = ["rlimits"], set(cfg["disable"]), cfg["workdir"]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if "netns" not in off:
        for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
            if libc.unshare(flags) == 0:
                layers.append("netns")
                break
    set_limit(resource.RLIMIT_CPU, cfg["cpu_seconds"], cfg["cpu_seconds"] + 1)
    set_limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    set_limit(resource.RLIMIT_NPROC, cfg["max_processes"])
    set_limit(resource.RLIMIT_FSIZE, cfg["max_file_bytes"])
    set_limit(resource.RLIMIT_NOFILE, cfg["max_open_files"])
    set_limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE raises instead of killing
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
        try:
            os.setuid(0)
        except PermissionError:
            layers.append("uid_drop")
        else:
            raise RuntimeError("could regain root after dropping privileges")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    read_roots = sorted({sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, "/usr", "/lib",
                         "/lib64", "/etc", "/dev/urandom", "/dev/random", "/dev/zero", "/proc/self",
                         "/sys/devices/system/cpu"})
    if "landlock" not in off and landlock(libc, workdir, read_roots):
        layers.append("landlock")
    os.umask(0o077)
    # close the paths around the hook: no fork_exec without an audit event, no pidfd signals
    _posixsubprocess.fork_exec = _denied_fork_exec
    for module in (signal, _signal):
        if hasattr(module, "pidfd_send_signal"):
            delattr(module, "pidfd_send_signal")
    if "audit_hook" not in off:
        install_hook(workdir, [os.path.realpath(r) for r in read_roots])
        layers.append("audit_hook")
    return layers


def _denied_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")


def main():
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        status = {"layers": setup(cfg)}
    except BaseException as exc:
        status = {"setup_error": "%s: %s" % (type(exc).__name__, exc)}
    os.write(cfg["status_fd"], json.dumps(status).encode())
    os.close(cfg["status_fd"])
    if "setup_error" in status:
        os._exit(111)
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"], sys.argv = module, ["<model>"]
    linecache.cache["<model>"] = (len(code), None, code.splitlines(True), "<model>")
    try:
        exec(compile(code, "<model>", "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # print the traceback without the launcher's frame
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)


main()
'''
