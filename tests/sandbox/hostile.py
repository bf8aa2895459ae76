"""Hostile programs for the hardening suite, shared by the root tests and the non-root run (`nonroot_probe.py`).

{dir} is a directory outside the sandbox that must stay untouched (modes included), {pid} a process outside it that
must survive, {sock} and {abstract} a pathname and an abstract unix socket of the host that must hear nothing, {key}
a SysV IPC key and /dev/shm name that must not exist after the call. A program prints "ESCAPED" when a step worked
that the sandbox should have stopped. `Host` sets these up and lists what a program changed; stdlib only."""

import ctypes
import os
import socket
import tempfile
import threading

HARDENING = {
    # a child in a new session: the process-group kill does not reach it; it would keep writing after the call
    "session_escape": (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    while True:\n"
        "        open('still-here-%d' % time.monotonic_ns(), 'w').close()\n"
        "        time.sleep(0.05)\n"
        "time.sleep(30)\n"
    ),
    "exec_shell": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo pwned-by-shell'])\n",
    "kill_host": "import os\nos.kill({pid}, 9)\n",
    "write_outside": "open({dir!r} + '/pwned.txt', 'w').write('pwned')\n",
    "read_outside": "print(open({dir!r} + '/secret.txt').read())\n",
    "deep_tree": (
        "import os\n"
        "while True:\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "    open('f', 'w').close()\n"
    ),
    "disk_fill": (
        "i = 0\n"
        "while True:\n"
        "    with open('big%d' % i, 'wb') as f:\n"
        "        f.write(b'x' * (7 << 20))\n"
        "    i += 1\n"
    ),
    "forked_memory": (
        "import os, time\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(400 << 20)\n"
        "        time.sleep(30)\n"
        "time.sleep(30)\n"
    ),
    # Landlock does not mediate chmod: without a uid drop the caller's own files would change mode
    "chmod_outside": (
        "import os\n"
        "for path, mode in (({dir!r} + '/secret.txt', 0o000), ({dir!r}, 0o700)):\n"
        "    try:\n"
        "        os.chmod(path, mode)\n"
        "        print('ESCAPED chmod', path)\n"
        "    except OSError as exc:\n"
        "        print('denied', exc)\n"
        "raise SystemExit(1)\n"
    ),
    # pathname sockets are files, not network: neither the network namespace nor Landlock covers connect()
    "unix_socket": (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect({sock!r})\n"
        "s.sendall(b'pwned')\n"
        "print('ESCAPED unix socket')\n"
    ),
    "abstract_socket": (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect('\\0' + {abstract!r})\n"
        "s.sendall(b'pwned')\n"
        "print('ESCAPED abstract socket')\n"
    ),
    # SysV objects outlive their creator: without an IPC namespace they pass data to the next rollout
    "sysv_ipc": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "made = [libc.shmget({key}, 4096, 0o1666), libc.msgget({key}, 0o1666), libc.semget({key}, 1, 0o1666)]\n"
        "print('made', made, ctypes.get_errno())\n"
        "raise SystemExit(1)  # judged by what is left on the host\n"
    ),
    # the host's process list: command lines carry paths, hosts and sometimes keys
    "host_processes": (
        "import os\n"
        "print('ESCAPED', open('/proc/{pid}/cmdline').read())\n"
    ),
    # leaving the call's cgroups, or raising their limits, would undo the per-call memory and process limits (only
    # a sandbox's own cgroup is aimed at, so that a regression cannot lift the limits of the test run's cgroup)
    "cgroup_escape": (
        "import os\n"
        "for line in open('/proc/self/cgroup').read().splitlines():\n"
        "    _, controllers, path = line.split(':', 2)\n"
        "    root = '/sys/fs/cgroup/' + (controllers.split(',')[0].replace('name=', '') or 'unified')\n"
        "    own = [(root + path + '/pids.max', 'max'), (root + path + '/memory.limit_in_bytes', '-1'),\n"
        "           (root + path + '/memory.max', 'max')] if 'tracerl-sandbox-' in path else []\n"
        "    for target, text in [(root + '/cgroup.procs', '0')] + own:\n"
        "        try:\n"
        "            with open(target, 'w') as f:\n"
        "                f.write(text)\n"
        "            print('ESCAPED', target)\n"
        "        except OSError as exc:\n"
        "            pass\n"
        "raise SystemExit(1)\n"
    ),
    # a 32-bit syscall (int 0x80) from 64-bit code is another architecture for seccomp: the filter must not let its
    # numbers through as if they were x86_64's
    "foreign_abi": (
        "import ctypes, mmap, os\n"
        "if os.uname().machine != 'x86_64':\n"
        "    raise SystemExit(1)\n"
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (getpid); int 0x80; ret\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
        "print('ESCAPED i386 getpid returned', ctypes.CFUNCTYPE(ctypes.c_int)(address)())\n"
    ),
    "dev_shm": "open('/dev/shm/tracerl-pwned-{key}', 'w').write('x' * 4096)\nprint('ESCAPED /dev/shm')\n",
    # memfd pages are charged to no rlimit (each file stays under RLIMIT_FSIZE): 420 MB held under a limit of
    # 256 MB (and 64 MB of disk)
    "memfd_memory": (
        "import os\n"
        "chunk = b'x' * (7 << 20)\n"
        "held = [os.memfd_create('held') for _ in range(60)]\n"
        "for fd in held:\n"
        "    os.write(fd, chunk)\n"
        "print('ESCAPED memfd held 420 MB')\n"
    ),
    "personality": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.personality(0x0040000) >= 0 and libc.personality(0xffffffff) & 0x0040000:\n"
        "    print('ESCAPED personality')\n"
        "raise SystemExit(1)\n"
    ),
    # raw syscalls by number (x86_64 and arm64 numbers); a result >= 0 means the kernel did it
    "kernel_interfaces": (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "arm = os.uname().machine == 'aarch64'\n"
        "params = ctypes.create_string_buffer(120)\n"
        "calls = {{\n"
        "    'io_uring_setup': (425, 8, params),\n"
        "    'userfaultfd': (282 if arm else 323, 0),\n"
        "    'add_key': (217 if arm else 248, b'user', b'tracerl', b'leak', 4, -4),\n"
        "    'ptrace_attach': (117 if arm else 101, 16, {pid}, 0, 0),\n"
        "    'process_vm_writev': (271 if arm else 311, {pid}, 0, 0, 0, 0, 0),\n"
        "    'unshare_user': (97 if arm else 272, 0x10000000),\n"
        "    'perf_event_open': (241 if arm else 298, params, 0, -1, -1, 0),\n"
        "    'mq_open': (180 if arm else 240, b'tracerl', 0o100 | 2, 0o666, 0),\n"
        "    'pidfd_open': (434, {pid}, 0),\n"
        "    'mount': (40 if arm else 165, b'none', b'/tmp', b'tmpfs', 0, 0),\n"
        "    'open_by_handle_at': (265 if arm else 304, -100, params, 0),\n"
        "    'clone_process': (220 if arm else 56, 17, 0, 0, 0, 0),  # a fork: both would print\n"
        "    'socketpair': (199 if arm else 53, 1, 1, 0, params),\n"
        "}}\n"
        "if not arm:\n"
        "    calls['x32_socket'] = (0x40000000 + 41, 1, 1, 0)\n"
        "for name, (nr, *args) in calls.items():\n"
        "    if libc.syscall(nr, *args) >= 0:\n"
        "        print('ESCAPED', name)\n"
        "raise SystemExit(1)\n"
    ),
}

# Switches the audit hook off from pure Python (CPython 3.11-3.12 layouts): a code object built with code.replace
# reads past its constants (LOAD_CONST does not check the index) to a fake bytearray spanning all memory; with it
# the interpreter's list of audit hooks, found in the binary's data beside None, is emptied. Prints "hook off".
HOOK_BYPASS = (
    "import sys\n"
    "def memory():\n"
    "    fake = ((2**40).to_bytes(8, 'little') + id(bytearray).to_bytes(8, 'little')\n"
    "            + (2**62).to_bytes(8, 'little') * 2 + bytes(24))\n"
    "    consts = ()\n"
    "    for _ in range(1000):\n"
    "        slot = (id(fake) + 32).to_bytes(8, 'little') * 64\n"
    "        index = (id(slot) + 32 - id(consts) - 24) // 8\n"
    "        if index > 0:\n"
    "            break\n"
    "    code = (lambda: 0).__code__.replace(co_consts=consts, co_code=bytes([151, 0, 144, index >> 24 & 255, 144,\n"
    "        index >> 16 & 255, 144, index >> 8 & 255, 100, index & 255, 83, 0]))\n"
    "    return type(lambda: 0)(code, {{}})(), (fake, slot)\n"
    "def word(address):\n"
    "    return int.from_bytes(mem[address:address + 8], 'little')\n"
    "mem, keep = memory()\n"
    "maps = []\n"
    "for line in open('/proc/self/maps'):\n"
    "    fields = line.split()\n"
    "    start, end = (int(x, 16) for x in fields[0].split('-'))\n"
    "    if fields[1].startswith('r'):\n"
    "        maps.append((start, end, fields[1], fields[5] if len(fields) > 5 else ''))\n"
    "readable = lambda a: any(s <= a and a + 8 <= e for s, e, _, _ in maps)\n"
    "home = next(m for m in maps if m[0] <= id(None) < m[1])\n"
    "regions = [m for m in maps if m[3] == home[3] and 'w' in m[2]] + [m for m in maps if not m[3] and 'w' in m[2]]\n"
    "hooks, name = None, id(sys.intern('hook'))\n"
    "for start, end, _, _ in regions[:4]:\n"
    "    for address in range(start, end - 8, 8):\n"
    "        w = word(address)\n"
    "        if w & 7 or not readable(w + 24) or word(w + 8) != id(list) or word(w + 16) != 1:\n"
    "            continue\n"
    "        func = word(word(w + 24)) if readable(word(w + 24)) else 0\n"
    "        if readable(func + 40) and word(func + 8) == id(type(memory)) and word(func + 32) == name:\n"
    "            hooks = w\n"
    "            break\n"
    "    if hooks:\n"
    "        break\n"
    "if hooks:\n"
    "    mem[hooks + 16:hooks + 24] = bytes(8)\n"
    "import ctypes\n"
    "print('hook off:', ctypes.CDLL(None).getpid() > 0, flush=True)\n"
)
HARDENING["hook_bypass"] = HOOK_BYPASS + (  # then everything the other programs try, the hook gone
    "import os, socket\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def attempt(what, action):\n"
    "    try:\n"
    "        action()\n"
    "        print('ESCAPED', what)\n"
    "    except Exception as exc:\n"
    "        print('denied', what, exc)\n"
    "attempt('write', lambda: open({dir!r} + '/pwned.txt', 'w').write('pwned'))\n"
    "attempt('read', lambda: print(open({dir!r} + '/secret.txt').read()))\n"
    "attempt('chmod', lambda: os.chmod({dir!r} + '/secret.txt', 0))\n"
    "attempt('unix socket', lambda: socket.socket(socket.AF_UNIX).connect({sock!r}))\n"
    "attempt('abstract socket', lambda: socket.socket(socket.AF_UNIX).connect('\\0' + {abstract!r}))\n"
    "attempt('kill', lambda: os.kill({pid}, 9))\n"
    "attempt('fork', os.fork)\n"
    "attempt('memfd', lambda: os.memfd_create('x'))\n"
    "attempt('shm', lambda: libc.shmget({key}, 4096, 0o1666) < 0 and 1 / 0)\n"
    "attempt('/dev/shm', lambda: open('/dev/shm/tracerl-pwned-{key}', 'w'))\n"
    "raise SystemExit(1)\n"
)


# a program that holds as many threads as it can, and one that needs a few: run side by side, the second must
# not notice the first (RLIMIT_NPROC counts every process of a user, so one pool per user would be shared)
THREAD_HOG = (
    "import threading, time\n"
    "threading.stack_size(1 << 16)  # small stacks: the process limit binds before the address-space limit\n"
    "stop = threading.Event()\n"
    "n = 0\n"
    "try:\n"
    "    while n < 5000:\n"
    "        threading.Thread(target=stop.wait, daemon=True).start()\n"
    "        n += 1\n"
    "except RuntimeError:\n"
    "    pass\n"
    "print('threads', n, flush=True)\n"
    "time.sleep(30)\n"
)
NEEDS_THREADS = (
    "import threading\n"
    "ts = [threading.Thread(target=lambda: None) for _ in range(8)]\n"
    "for t in ts:\n"
    "    t.start()\n"
    "for t in ts:\n"
    "    t.join()\n"
    "print('threads ok')\n"
)


class Host:
    """What the hostile programs aim at: a directory holding a secret, a victim process, a listening pathname and
    abstract unix socket (world-writable, like a daemon's), a SysV key and a /dev/shm name. `problems` lists every
    trace a program left; `close` stops the listeners and removes what a program left behind."""

    def __init__(self, outside: str, victim_pid: int):
        self.outside, self.victim_pid = outside, victim_pid
        self.key = 0x7ACE0000 + os.getpid() % 0xFFFF
        self.sock_dir = tempfile.mkdtemp(prefix="tracerl-host-sock-", dir="/tmp")
        os.chmod(self.sock_dir, 0o755)
        self.sock = os.path.join(self.sock_dir, "daemon.sock")
        self.abstract = "tracerl-host-%d-%d" % (os.getpid(), id(self))
        self.heard = []
        self.servers = []
        for address in (self.sock, "\0" + self.abstract):
            server = socket.socket(socket.AF_UNIX)
            server.bind(address)
            server.listen(8)
            self.servers.append(server)
            threading.Thread(target=self._listen, args=(server,), daemon=True).start()
        os.chmod(self.sock, 0o666)
        self.modes = self._modes()

    def _listen(self, server):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self.heard.append(conn.recv(64))
            conn.close()

    def _modes(self):
        return {name: os.lstat(os.path.join(self.outside, name)).st_mode for name in os.listdir(self.outside)} | {
            ".": os.stat(self.outside).st_mode}

    def fields(self) -> dict:
        return {"dir": self.outside, "pid": self.victim_pid, "sock": self.sock, "abstract": self.abstract,
                "key": self.key}

    def sysv_left(self) -> list:
        left = []
        for kind in ("shm", "msg", "sem"):
            try:
                with open("/proc/sysvipc/" + kind) as f:
                    rows = [line.split() for line in f.readlines()[1:]]
            except OSError:
                continue
            left += [(kind, int(row[1])) for row in rows if int(row[0]) == self.key]
        return left

    def problems(self, stdout: str) -> list:
        found = []
        if "ESCAPED" in stdout or "the answer is 42" in stdout or "pwned-by-shell" in stdout:
            found.append("got through: " + stdout[:200])
        if sorted(os.listdir(self.outside)) != ["secret.txt"]:
            found.append("wrote outside: %s" % sorted(os.listdir(self.outside)))
        if self._modes() != self.modes:
            found.append("changed a mode outside: %s -> %s" % (self.modes, self._modes()))
        if self.heard:
            found.append("a host socket heard %s" % self.heard)
        if self.sysv_left():
            found.append("SysV objects outlived the call: %s" % self.sysv_left())
        if os.path.exists("/dev/shm/tracerl-pwned-%d" % self.key):
            found.append("a /dev/shm file outlived the call")
        queue = _syscall("mq_open", b"tracerl", os.O_RDONLY, 0, 0)
        if queue >= 0:
            os.close(queue)
            found.append("a POSIX message queue outlived the call")
        return found

    def reset(self) -> None:
        """Undo what a program did, so that the next one is judged on its own."""
        del self.heard[:]
        for kind, ident in self.sysv_left():
            os.system("ipcrm -%s %d >/dev/null 2>&1" % ({"shm": "m", "msg": "q", "sem": "s"}[kind], ident))
        for name in os.listdir(self.outside):
            if name != "secret.txt":
                os.remove(os.path.join(self.outside, name))
        for name, mode in self.modes.items():
            os.chmod(self.outside if name == "." else os.path.join(self.outside, name), mode & 0o7777)
        _syscall("mq_unlink", b"tracerl")
        try:
            os.remove("/dev/shm/tracerl-pwned-%d" % self.key)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.reset()
        for server in self.servers:
            server.shutdown(socket.SHUT_RDWR)  # wakes the listening thread, which holds the socket open
            server.close()
        os.remove(self.sock)
        os.rmdir(self.sock_dir)


def _syscall(name, *args):
    numbers = {"mq_open": (240, 180), "mq_unlink": (241, 181)}[name]
    libc = ctypes.CDLL(None)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(numbers[os.uname().machine == "aarch64"], *args)
