"""Programs that test the sandbox's boundaries, shared by the root tests and the non-root run
(`boundary_probe.py`); stdlib only.

Three classes, each a boundary that the docs promise:
- `descriptors`: every descriptor the call receives is bounded. A program attacks each open descriptor (stdout and
  stderr among them) with fallocate (FALLOC_FL_KEEP_SIZE reserves blocks without growing the size, which the
  file-size limit does not see), posix_fallocate, ftruncate and pwrite far past the limits, and through a reopen by
  /proc/self/fd; it then reports every regular file it holds. A descriptor on a host file larger or more allocated
  than BOUND_BYTES (the workdir quota of `LIMITS`) is an escape.
- `locks`: no lock on a file outside the workdir. A program takes a read lock (every kind: POSIX, OFD, lockf, flock,
  a lease) on a world-readable file of the host and holds it; a host process (`LockWatcher`) that tries to
  write-lock the same file meanwhile must never be refused.
- `reads`: the code reads only files that "other" may read: a private file owned by the caller, one readable by the
  caller's group only, and one in a directory only the caller may enter are all out of reach; a world-readable file
  beside them (the positive control) is read.

The targets live in a folder under /etc (a read root in every mode) made by `make_targets`. A program prints
"ESCAPED <what>" when a step worked that the sandbox should have stopped, and "DONE" when it finished its report."""

import json
import os
import subprocess
import sys
import tempfile
import time

LIMITS = dict(wall_seconds=20.0, cpu_seconds=10, memory_mb=256, max_file_mb=8, max_disk_mb=64)
BOUND_BYTES = 64 << 20  # the workdir quota above: no descriptor may hold more of the host's disk than this

_REPORT = (
    "import os, stat, sys\n"
    "def report(extra=()):\n"
    "    lines = []\n"
    "    for fd in fds():\n"
    "        try:\n"
    "            st = os.fstat(fd)\n"
    "        except OSError:\n"
    "            continue\n"
    "        kind = 'reg' if stat.S_ISREG(st.st_mode) else 'fifo' if stat.S_ISFIFO(st.st_mode) else 'other'\n"
    "        big = kind == 'reg' and max(st.st_size, st.st_blocks * 512) > {bound}\n"
    "        lines.append('%sFD %d %s size=%d alloc=%d' % ('ESCAPED ' if big else '', fd, kind, st.st_size,\n"
    "                                                  st.st_blocks * 512))\n"
    "    text = '\\n'.join(list(extra) + lines + ['DONE']) + '\\n'\n"
    "    for fd in (1, 2):\n"
    "        try:\n"
    "            os.write(fd, text.encode())\n"
    "        except OSError:\n"
    "            pass\n"
    "def fds():\n"
    "    try:\n"
    "        return sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
    "    except OSError:\n"
    "        return list(range(64))\n"
)

_ATTACK = _REPORT + (
    "def fallocate(fd, mode, offset, length):  # os.posix_fallocate has no mode\n"
    "    import ctypes\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
    "    if libc.fallocate(fd, mode, offset, length) != 0:\n"
    "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
    "def attack(fd):\n"
    "{body}"
    "log = []\n"
    "for fd in fds():\n"
    "    try:\n"
    "        log.append('fd %d: %s' % (fd, attack(fd)))\n"
    "    except OSError as exc:  # the audit hook's PermissionError included\n"
    "        log.append('fd %d: refused %s' % (fd, exc))\n"
    "report(log)\n"
)


def _attack(body: str) -> str:
    return _ATTACK.replace("{body}", body).replace("{bound}", str(BOUND_BYTES))


DESCRIPTORS = {
    # blocks reserved, size unchanged: RLIMIT_FSIZE never sees it
    "fallocate_keep_size": _attack(
        "    fallocate(fd, 1, 0, 1 << 30)\n"
        "    return 'fallocated'\n"),
    "posix_fallocate": _attack("    os.posix_fallocate(fd, 0, 1 << 30)\n    return 'fallocated'\n"),
    "ftruncate_far": _attack("    os.ftruncate(fd, 256 << 20)\n    return 'truncated'\n"),
    "pwrite_far": _attack("    os.pwrite(fd, b'x', 256 << 20)\n    return 'written'\n"),
    # a new open file description of the same file, maybe with more rights than the one handed in
    "reopen_and_fallocate": _attack(
        "    new = os.open('/proc/self/fd/%d' % fd, os.O_RDWR)\n"
        "    fallocate(new, 1, 0, 1 << 30)\n"
        "    return 'reopened as %d and fallocated' % new\n"),
    # plain output far past every cap: the call must still end, with its output capped
    "output_flood": _REPORT.replace("{bound}", str(BOUND_BYTES)) + (
        "chunk = b'y' * (1 << 20)\n"
        "written = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        written += os.write(1, chunk)\n"
        "    except OSError as exc:\n"
        "        break\n"
        "report(['flooded %d' % written])\n"),
}

_LOCK = (
    "import errno, fcntl, os, struct, time\n"
    "F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE = 37, 38, 1024\n"
    "fd = os.open({path!r}, os.O_RDONLY)\n"
    "read_lock = struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0)\n"
    "for attempt in range(200):\n"
    "    try:\n"
    "        {call}\n"
    "        print('ESCAPED locked', flush=True)\n"
    "        time.sleep(1.5)  # held while the host's writer tries\n"
    "        break\n"
    "    except OSError as exc:\n"
    "        if exc.errno not in (errno.EAGAIN, errno.EACCES) or attempt == 199:\n"
    "            print('refused', exc.errno, exc.strerror, flush=True)\n"
    "            break\n"
    "        time.sleep(0.01)  # the watcher held its probing lock for an instant\n"
    "print('DONE')\n"
)


def _lock(call: str, target: str = "shared.txt") -> str:
    return _LOCK.replace("{call}", call).replace("{path!r}", "{dir!r} + '/" + target + "'")


LOCKS = {
    "posix_setlk": _lock("fcntl.fcntl(fd, fcntl.F_SETLK, read_lock)"),
    "posix_setlkw": _lock("fcntl.fcntl(fd, fcntl.F_SETLKW, read_lock)"),
    "ofd_setlk": _lock("fcntl.fcntl(fd, F_OFD_SETLK, read_lock)"),
    "ofd_setlkw": _lock("fcntl.fcntl(fd, F_OFD_SETLKW, read_lock)"),
    "lockf": _lock("fcntl.lockf(fd, fcntl.LOCK_SH)"),
    "flock": _lock("fcntl.flock(fd, fcntl.LOCK_SH)"),
    # a read lease makes the kernel hold a writer's open() for up to lease-break-time (45 s); only the file's
    # owner may take one, so the target is the caller's own file
    "lease": _lock("fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)", target="owned.txt"),
}

_READ = (
    "import os\n"
    "for path in {paths}:\n"
    "    try:\n"
    "        with open({dir!r} + '/' + path) as f:\n"
    "            print('ESCAPED read', path, f.read().strip())\n"
    "    except OSError as exc:\n"
    "        print('refused', path, exc.strerror)\n"
    "try:\n"
    "    print('ESCAPED listed', os.listdir({dir!r} + '/closed'))\n"
    "except OSError as exc:\n"
    "    print('refused listing', exc.strerror)\n"
    "print('public:', open({dir!r} + '/public.txt').read().strip())\n"
    "print('DONE')\n"
)

READS = {
    "read_private_owned": _READ.replace("{paths}", "['private.txt']"),
    "read_group_only": _READ.replace("{paths}", "['group.txt']"),
    "read_closed_dir": _READ.replace("{paths}", "['closed/inner.txt']"),
}

BOUNDARIES = {"descriptors": DESCRIPTORS, "locks": LOCKS, "reads": READS}
PROGRAMS = {name: code for programs in BOUNDARIES.values() for name, code in programs.items()}
CLASS_OF = {name: kind for kind, programs in BOUNDARIES.items() for name in programs}


def program(name: str, folder: str) -> str:
    """The program `name`, aimed at the targets in `folder`."""
    return PROGRAMS[name].replace("{dir!r}", repr(folder))


def make_targets(uid: int, gid: int) -> str:
    """A folder under /etc holding the targets, for a caller running as `uid`:`gid` (made by root)."""
    folder = tempfile.mkdtemp(prefix="tracerl-boundary-", dir="/etc")
    os.chmod(folder, 0o755)
    files = {"shared.txt": (0, 0, 0o644), "public.txt": (0, 0, 0o644), "owned.txt": (uid, gid, 0o644),
             "private.txt": (uid, gid, 0o600), "group.txt": (0, gid, 0o640), "closed/inner.txt": (0, 0, 0o644)}
    os.mkdir(os.path.join(folder, "closed"))
    for name, (owner, group, mode) in files.items():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write("secret of %s\n" % name if name != "public.txt" else "readable by all\n")
        os.chown(path, owner, group)
        os.chmod(path, mode)
    os.chown(os.path.join(folder, "closed"), uid, gid)
    os.chmod(os.path.join(folder, "closed"), 0o700)
    return folder


def remove_targets(folder: str) -> None:
    for name in ("closed/inner.txt", "shared.txt", "public.txt", "owned.txt", "private.txt", "group.txt"):
        os.remove(os.path.join(folder, name))
    os.rmdir(os.path.join(folder, "closed"))
    os.rmdir(folder)


def problems(name: str, stdout: str, stderr: str) -> list:
    """What the program `name` got through, judged from its own report; [] when contained."""
    text = stdout + stderr
    found = [line for line in text.splitlines() if line.startswith("ESCAPED")]
    if "DONE" not in text:
        found.append("no report (the program did not finish): %r" % text[-300:])
    if CLASS_OF[name] == "reads" and "public: readable by all" not in text:
        found.append("the world-readable control file was not read: %r" % text[-300:])
    return found


# A host process that write-locks the targets over and over (OFD locks, never blocking) until its stdin closes, and
# prints, per file, its attempts and the times (time.time()) at which a lock of the call refused it.
_WATCHER = (
    "import fcntl, json, os, struct, sys, threading, time\n"
    "paths = sys.argv[1:]\n"
    "fds = [os.open(p, os.O_RDWR) for p in paths]\n"
    "done = threading.Event()\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()\n"
    "seen = {p: {'attempts': 0, 'refused_at': []} for p in paths}\n"
    "print('ready', flush=True)\n"
    "while not done.is_set():\n"
    "    for path, fd in zip(paths, fds):\n"
    "        seen[path]['attempts'] += 1\n"
    "        try:\n"
    "            fcntl.fcntl(fd, 37, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))\n"
    "            fcntl.fcntl(fd, 37, struct.pack('hhqqi4x', fcntl.F_UNLCK, 0, 0, 0, 0))\n"
    "        except OSError:\n"
    "            seen[path]['refused_at'].append(time.time())\n"
    "    time.sleep(0.005)\n"
    "print(json.dumps(seen), flush=True)\n"
)


class LockWatcher:
    """Runs `_WATCHER` on `paths` (as the current user, normally root, so it can open them for writing)."""

    def __init__(self, paths):
        self.process = subprocess.Popen([sys.executable, "-c", _WATCHER, *paths], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def stop(self) -> dict:
        out, _ = self.process.communicate("", timeout=120)
        return json.loads(out.strip().splitlines()[-1])


def refused_between(seen: dict, start: float, end: float) -> list:
    """The paths whose writer was refused between `start` and `end`."""
    return [p for p, s in seen.items() if any(start <= t <= end for t in s["refused_at"])]


def now() -> float:
    return time.time()
