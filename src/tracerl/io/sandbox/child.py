"""The child side of `tracerl.io.sandbox`: run as a script (`python -s -S -c <this file's text> <config>`, or forked
from the warm server, `serve`), it applies the isolation layers to itself, then runs the model's code read
from stdin and ends as a Python script ends, without the interpreter's teardown (`exit`).

It runs as root until the uid drop, must stay valid Python 3.8 and imports nothing outside the stdlib and its two
sibling modules (it may run under a system python that cannot see tracerl: `tracerl.io.sandbox` registers their text
under their names first). Setup errors go through the status fd and fail the run closed. The status fd also carries the
time each layer was in place (`clock`), and, from the launcher outside the PID namespace, the code's exit status
once its namespace is gone (`reaped`). Importing it as a module (for the tests of `seccomp_program`) runs nothing.
The layers a test switches off come in the config and are applied before the code runs; the code cannot switch
one off afterwards, except the audit hook, which lives in its own memory and is therefore only a tripwire.
"""

import builtins, ctypes, json, linecache, os, re, resource, signal, sys, time, traceback, types
import _posixsubprocess, _signal
from tracerl.io.sandbox.exit import end_process, exit_status
from tracerl.io.sandbox.serve import serve

LAUNCHER_MODULES = frozenset(sys.modules)  # what a launcher has loaded before it runs anything
LIBC = ctypes.CDLL(None, use_errno=True)  # loaded once, by the server, for every launcher it forks
LIBC.syscall.restype = ctypes.c_long

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x40000000, 0x00020000, 0x20000000
CLONE_NEWIPC = 0x08000000
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 1, 22, 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
KEPT_MOUNT_FLAGS = 2 | 4 | 8 | 1024 | 2048 | 4096  # nosuid, nodev, noexec, atime flags: statvfs and MS_ agree
MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1  # x86_64 and arm64

SIGNAL_CALLS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: the target's tgid
# isatty (TCGETS), terminal size, bytes readable, close-on-exec and non-blocking flags; never TIOCSTI and the like
IOCTL_REQUESTS = (0x5401, 0x5413, 0x541B, 0x5451, 0x5450, 0x5421)
# F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_GETLK, F_OFD_GETLK, F_DUPFD_CLOEXEC. Not F_SETOWN/F_SETSIG (SIGIO to
# another process), nor F_SETLK(W), F_OFD_SETLK(W), F_SETLEASE: a read lock on a readable host file holds up its
# writers, and in the workdir, which this one process alone uses, a lock protects nothing
FCNTL_COMMANDS = (0, 1, 2, 3, 4, 5, 36, 1030)
FALLOCATE_MODES = (0,)  # mode 0 grows the file, which RLIMIT_FSIZE bounds; KEEP_SIZE would reserve blocks past it
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_THREAD = 0x00010000
LANDLOCK_CREATE, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT = 444, 445, 446  # syscall numbers, x86_64 and arm64
READ_DIR = 1 << 3
FS_READ = (1 << 2) | READ_DIR  # READ_FILE | READ_DIR
EXTRA_READS = ("/dev/urandom", "/dev/random", "/dev/zero", "/proc/self", "/sys/devices/system/cpu")  # beyond roots
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


def readable_rules(view):
    """(path, rights) for Landlock from the parent's `view` (`tracerl.io.sandbox.view.read_view`): each read root
    whole, unless it is among `descend` (folders with a `hidden` entry beneath, what others may not read); then each
    of its entries on its own, granted only if others may read it now (symlinks: their target is checked instead),
    and itself listable unless among `unlisted` (a hidden folder lies beneath: rights on a folder extend below)."""
    descend, unlisted, hidden = set(view["descend"]), set(view["unlisted"]), set(view["hidden"])
    rules, todo = [], [r for r in view["read_roots"] if r not in hidden]
    while todo:
        path = todo.pop()
        if path not in descend:
            rules.append((path, FS_READ))
            continue
        if path not in unlisted:
            rules.append((path, READ_DIR))
        for name in os.listdir(path):  # fails the run closed if the folder cannot be listed
            child = path + "/" + name
            try:
                mode = os.lstat(child).st_mode
            except OSError:
                continue
            if child in descend:
                todo.append(child)
            elif child not in hidden and (mode & 0o170005 == 0o040005 or mode & 0o170004 == 0o100004):
                rules.append((child, FS_READ))
    return rules


class PathBeneath(ctypes.Structure):  # struct landlock_path_beneath_attr
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class Filter(ctypes.Structure):  # struct sock_filter
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class Program(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]


def landlock(libc, workdir_fd, rules):
    abi = libc.syscall(LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return False
    fs_all = (1 << 13) - 1 - 1  # ABI 1 rights except EXECUTE (bit 0): nothing may be executed
    fs_all |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    handled = (ctypes.c_uint64 * 3)(fs_all | 1, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    ruleset = libc.syscall(LANDLOCK_CREATE, ctypes.byref(handled), 24 if abi >= 6 else 16 if abi >= 4 else 8, 0)
    if ruleset < 0:
        return False

    def allow(path, access):
        try:  # the workdir comes as an fd opened before the uid drop: its ancestors may not be searchable then
            fd = os.dup(path) if type(path) is int else os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if type(path) is not int and not os.path.isdir(path):
                access &= FS_FILE_RIGHTS
            rule = PathBeneath(access & fs_all, fd)
            if libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule(%s)" % path)
        finally:
            os.close(fd)

    try:  # best effort: a rule that cannot be added leaves landlock off, the other layers still hold
        allow(workdir_fd, fs_all)
        for path, access in rules:
            allow(path, access)
        allow("/dev/null", FS_READ | (1 << 1))
        return libc.syscall(LANDLOCK_RESTRICT, ruleset, 0) == 0
    except OSError:
        return False
    finally:
        os.close(ruleset)


def seccomp_program(table, own_pid):
    """The classic-BPF seccomp filter, as (code, jt, jf, k) tuples, from `table`
    (`tracerl.io.sandbox.syscalls.seccomp_table`): kill the process on a foreign architecture; the table's allowed
    syscalls pass; clone only for threads in the same namespaces; signals only to `own_pid` (itself); ioctl and
    fcntl only with the requests above (no file locks), fallocate only in mode 0; prlimit64 only on itself; clone3
    answers ENOSYS so that libc falls back to clone, whose flags the filter can read; everything else (x32 numbers
    included) answers EPERM. Arguments are compared on their low 32 bits, all the kernel reads of these (int, uint)."""
    nr_of, arch = table["by_argument"], table["arch"]
    LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
    ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
    EPERM, ENOSYS = 1, 38
    DENY = (RET, 0, 0, ERRNO | EPERM)

    def when(nr, body):  # run `body` (which ends in a return) for syscall `nr`, else go on after it
        return [(JEQ, 0, len(body), nr)] + body

    def arg_in(index, values):
        body = [(LD, 0, 0, 16 + 8 * index)]
        for value in values:
            body += [(JEQ, 0, 1, value), (RET, 0, 0, ALLOW)]
        return body + [DENY]

    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    # the hot path first: the most frequent syscalls pass after a few comparisons
    for nr in table["allowed"]:
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, ALLOW)]
    prog += when(nr_of["clone3"], [(RET, 0, 0, ERRNO | ENOSYS)])
    prog += when(nr_of["clone"], [(LD, 0, 0, 16), (JSET, 2, 0, NAMESPACE_FLAGS), (JSET, 0, 1, CLONE_THREAD),
                                  (RET, 0, 0, ALLOW), DENY])
    for name in SIGNAL_CALLS:
        prog += when(nr_of[name], arg_in(0, [own_pid]))
    prog += when(nr_of["ioctl"], arg_in(1, IOCTL_REQUESTS))
    prog += when(nr_of["fcntl"], arg_in(1, FCNTL_COMMANDS))
    prog += when(nr_of["fallocate"], arg_in(1, FALLOCATE_MODES))
    prog += when(nr_of["prlimit64"], arg_in(0, [0, own_pid]))
    return prog + [DENY]


def seccomp_filter(table, own_pid):
    """`seccomp_program` as the kernel reads it: (struct sock_fprog, the array it points to, kept alive with it)."""
    prog = seccomp_program(table, own_pid)
    filters = (Filter * len(prog))(*[Filter(*f) for f in prog])
    return Program(len(prog), filters), filters


# what the warm server built for the call whose launcher it forks next (`prepare`): (the call's table, its filter)
READY = {}
FILTERS = {}  # in the server: the filters built so far, by table, for pid 1


def prepare(cfg):
    """In the warm server, before it forks the launcher of the call `cfg`: that call's seccomp filter for the pid its
    code will have (1: the init of its PID namespace), built once per table, so that the fork inherits it ready."""
    table = cfg["seccomp"]
    if table and "pidns" not in cfg["disable"]:
        key = (table["arch"], tuple(table["allowed"]), tuple(sorted(table["by_argument"].items())))
        if key not in FILTERS:
            FILTERS[key] = seccomp_filter(table, 1)
        READY["seccomp"] = (table, FILTERS[key])


def install_seccomp(libc, table):
    if not table:
        raise RuntimeError("no seccomp table for this machine (%s); the sandbox's filter covers x86_64 and arm64"
                           % os.uname().machine)
    ready, own_pid = READY.get("seccomp"), os.getpid()
    built = ready[1] if ready is not None and ready[0] is table and own_pid == 1 else seccomp_filter(table, own_pid)
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(built[0]), 0, 0) == 0


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def namespaces(libc, cfg, off, layers):
    """Network, IPC, mount (a size-capped tmpfs over the workdir) and PID namespaces, each where the kernel allows.
    Without root they live in a new user namespace that maps only the caller's own uid and gid; it also gives the
    call a process count of its own (RLIMIT_NPROC is counted per user namespace since Linux 5.14)."""
    if os.geteuid() != 0 and not {"netns", "ipcns", "readonly_fs", "disk_quota", "pidns"} <= off:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(CLONE_NEWUSER) != 0:
            return
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", "%d %d 1" % (uid, uid))
        write_file("/proc/self/gid_map", "%d %d 1" % (gid, gid))
        layers.append("userns")
    if "netns" not in off and libc.unshare(CLONE_NEWNET) == 0:
        layers.append("netns")
    if "ipcns" not in off and libc.unshare(CLONE_NEWIPC) == 0:  # SysV objects and mqueues die with the call
        layers.append("ipcns")
    stamp("namespaces")
    if {"readonly_fs", "disk_quota"} - off and libc.unshare(CLONE_NEWNS) == 0:
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "could not make the mount namespace private")
        mounts(libc, cfg, off, layers)
    stamp("mounts")
    if "pidns" not in off and libc.unshare(CLONE_NEWPID) == 0:
        layers.append("pidns")


def mounts(libc, cfg, off, layers):
    """In the call's own mount namespace: every mount read-only (no file outside the workdir can be written,
    chmod-ed or made, whatever the uid and whether or not Landlock exists), then the workdir writable again: a
    tmpfs of max_disk_bytes and max_inodes (vanishing with the namespace), else a bind mount of itself."""
    workdir = cfg["workdir"].encode()
    if "readonly_fs" not in off and read_only_mounts(libc):
        layers.append("readonly_fs")
    owner = cfg["uid"] if cfg["uid"] is not None else os.geteuid()
    group = cfg["uid"] if cfg["uid"] is not None else os.getegid()
    options = "size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d" % (cfg["max_disk_bytes"], cfg["max_inodes"],
                                                                 owner, group)
    if "disk_quota" not in off and libc.mount(b"tmpfs", workdir, b"tmpfs", MS_NOSUID | MS_NODEV,
                                              options.encode()) == 0:
        layers.append("disk_quota")
    elif "readonly_fs" in layers:
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | os.statvfs(workdir).f_flag & KEPT_MOUNT_FLAGS
        if libc.mount(workdir, workdir, None, MS_BIND, None) != 0 or libc.mount(None, workdir, None, flags, None):
            raise OSError(ctypes.get_errno(), "could not keep the workdir writable under a read-only root")
    os.chdir(cfg["workdir"])  # the cwd still pointed at the directory under the new mount


def read_only_mounts(libc):
    """Make every mount of this namespace read-only: mount_setattr on / recursively (Linux >= 5.12), else a
    read-only bind remount of each mount point, keeping the flags a user namespace may not clear."""
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr: set, clear, propagation, userns
    if libc.syscall(MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), 32) == 0:
        return True
    with open("/proc/self/mountinfo", "rb") as f:
        points = [line.split()[4] for line in f]
    for point in points:  # mountinfo escapes spaces and the like as \ooo
        path = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), point)
        try:
            flags = os.statvfs(path).f_flag & KEPT_MOUNT_FLAGS
        except OSError:
            return False
        if libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None) != 0:
            return False
    return True


def join_cgroups(cfg, layers):
    """Move the launcher (and so everything it starts) into the call's own cgroups, made by the parent with its
    memory and process limits; all of them or the layer is off."""
    joined = 0
    for directory in cfg["cgroups"]:
        try:
            write_file(directory + "/cgroup.procs", "%d" % os.getpid())
            joined += 1
        except OSError:
            break
    if cfg["cgroups"] and joined == len(cfg["cgroups"]):
        layers.append("cgroup")


def reap_and_mirror(child, cfg):
    """In the launcher after the PID namespace's fork: wait for the code (the namespace's init; when it ends the
    kernel kills every process left inside, and only then can it be reaped), say so on the status fd, which the
    code does not hold, with the code's return code (`reaped`: the caller then knows that no process of the call is
    left but this one), and end the same way. As init it ignores SIGXCPU, so a SIGKILL after its CPU limit is
    reported as SIGXCPU."""
    _, status, usage = os.wait4(child, 0)
    reaped = time.monotonic()
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    if sig == signal.SIGKILL and usage.ru_utime + usage.ru_stime >= cfg["cpu_seconds"] - 0.05:
        sig = signal.SIGXCPU
    record = {"reaped": -sig if sig else os.WEXITSTATUS(status), "clock": [["reaped", reaped]]}
    os.write(cfg["status_fd"], (json.dumps(record) + "\n").encode())
    if not sig:
        os._exit(os.WEXITSTATUS(status))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sig != signal.SIGKILL:  # which has no handler to reset (signal() refuses it): the OOM killer's signal
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def drop_capabilities(libc):
    """No capabilities left in the user namespace (the code could otherwise act as root inside it)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    return libc.capset(ctypes.byref(header), ctypes.byref(data)) == 0


def own_process_count(layers):
    """Whether RLIMIT_NPROC (or pids.max) counts this call's processes alone."""
    if "cgroup" in layers or "uid_drop" in layers:
        return True
    try:
        release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return "userns" in layers and release >= (5, 14)  # ucounts: RLIMIT_NPROC per user namespace


def set_limit(which, value, hard=None):
    _, current_hard = resource.getrlimit(which)
    hard = value if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        value, hard = min(value, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (value, hard))


# when each layer was in place: [name, time.monotonic()] (one clock for every process of the host), for the status
CLOCK = []


def stamp(name):
    CLOCK.append([name, time.monotonic()])


def setup(cfg):
    layers, off, workdir, libc = ["rlimits"], set(cfg["disable"]), cfg["workdir"], LIBC
    join_cgroups(cfg, layers)
    stamp("cgroup")
    if cfg["drop_uid"]:  # a uid of its own: no other call shares its process count, files or signals
        cfg["uid"] = cfg["uid_base"] + os.getpid()
        os.chown(workdir, cfg["uid"], cfg["uid"])
    namespaces(libc, cfg, off, layers)
    if "pidns" in layers:
        child = os.fork()  # the child is the namespace's init (pid 1); this process only waits for it
        if child:
            reap_and_mirror(child, cfg)
        if {"readonly_fs", "disk_quota"} & set(layers) and libc.mount(
                b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0:
            layers.append("procfs")  # /proc shows the namespace's processes only, not the host's command lines
    stamp("pidns")
    set_limit(resource.RLIMIT_CPU, cfg["cpu_seconds"], cfg["cpu_seconds"] + 1)
    set_limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    set_limit(resource.RLIMIT_NPROC, cfg["max_processes"])
    set_limit(resource.RLIMIT_FSIZE, cfg["max_file_bytes"])
    set_limit(resource.RLIMIT_NOFILE, cfg["max_open_files"])
    set_limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE raises instead of killing
    stamp("rlimits")
    workdir_fd = os.open(workdir, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        try:
            os.setuid(0)
        except PermissionError:
            layers.append("uid_drop")
        else:
            raise RuntimeError("could regain root after dropping privileges")
    elif os.geteuid() != 0 and not drop_capabilities(libc):
        raise RuntimeError("could not drop the capabilities of the user namespace")
    if "pidns" in layers:  # after the uid change, which clears it: the code dies with the launcher
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != 0:  # 0: the launcher, outside the namespace, is still there
            os._exit(112)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    stamp("uid")
    rules = readable_rules(cfg["read_view"]) + [(path, FS_READ) for path in EXTRA_READS]
    if "landlock" not in off and landlock(libc, workdir_fd, rules):
        layers.append("landlock")
    os.close(workdir_fd)
    stamp("landlock")
    if "seccomp" not in off:
        if not install_seccomp(libc, cfg["seccomp"]):
            raise RuntimeError("seccomp filters are unavailable (errno %d); the sandbox needs a kernel with "
                               "CONFIG_SECCOMP_FILTER on x86_64 or arm64" % ctypes.get_errno())
        layers.append("seccomp")
    stamp("seccomp")
    if not cfg["allow_unconfined_files"] and "uid_drop" not in layers and "landlock" not in layers:
        raise RuntimeError("neither a uid drop (run as root) nor Landlock (Linux >= 5.13 with lsm=landlock) is "
                           "available, so the code could read every file this user can; enable one of them")
    if not (cfg["allow_shared_process_count"] or own_process_count(layers)):
        raise RuntimeError("the process limit would be shared with every process of this user (no writable cgroup, "
                           "no uid drop, no user namespace on Linux >= 5.14); run as root, enable unprivileged user "
                           "namespaces (sysctl user.max_user_namespaces > 0) or delegate a cgroup with memory and pids")
    os.umask(0o077)
    # close the paths around the hook: no fork_exec without an audit event, no pidfd signals
    _posixsubprocess.fork_exec = _denied_fork_exec
    for module in (signal, _signal):
        if hasattr(module, "pidfd_send_signal"):
            delattr(module, "pidfd_send_signal")
    if "audit_hook" not in off:
        install_hook(workdir, [os.path.realpath(r) for r in cfg["read_view"]["read_roots"] + list(EXTRA_READS)])
        layers.append("audit_hook")
    return layers


def _denied_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")


def main(cfg):
    CLOCK[:0] = cfg.pop("clock", None) or [["launcher", time.monotonic()]]
    code = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        status = {"layers": setup(cfg)}
    except BaseException as exc:
        status = {"setup_error": "%s: %s" % (type(exc).__name__, exc)}
    stamp("program")
    status["clock"] = CLOCK
    os.write(cfg["status_fd"], (json.dumps(status) + "\n").encode())
    os.close(cfg["status_fd"])
    if "setup_error" in status:
        os._exit(111)
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"], sys.argv = module, ["<model>"]
    linecache.cache["<model>"] = (len(code), None, code.splitlines(True), "<model>")
    finish, status_of, print_exception = end_process, exit_status, traceback.print_exception  # the code may patch them
    try:
        exec(compile(code, "<model>", "exec"), module.__dict__)
        status = 0
    except SystemExit as exc:
        status = status_of(exc)
    except BaseException as exc:  # print the traceback without the launcher's frame
        print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    finish(status, module.__dict__)


if __name__ == "__main__":
    main(serve(int(sys.argv[-1]), LAUNCHER_MODULES, prepare) if sys.argv[-2:-1] == ["--serve"]
         else json.loads(sys.argv[-1]))
