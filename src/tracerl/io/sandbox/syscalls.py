"""The syscall tables of the sandbox's seccomp filter, per machine: the numbers the code may call freely and the
ones the filter checks by argument. The parent passes this machine's table to the launcher in its config
(`seccomp_table`); the filter itself, and which arguments pass, are the launcher's (`child.seccomp_program`).
Numbers only, no policy: a name missing here is a syscall the code cannot make.
"""

from __future__ import annotations

# seccomp is an allowlist: the code may make only the syscalls below, each other one fails with EPERM. The list is
# what `strace -f -c` saw CPython make while running a stdlib workload in its workdir (math, decimal, fractions,
# statistics, json, re, random, datetime, threading and a thread pool, tempfile, gzip/zipfile/tarfile, sqlite3 on a
# file, shutil.copyfile/move, mmap, select, signal.alarm, deep recursion, a MemoryError), plus the older and newer
# variants of the same calls (stat/newfstatat/statx, open/openat, ...) so that another libc finds its own. Left out
# on purpose, among others: every socket call, SysV and POSIX IPC, memfd, chmod/chown/xattr/utime (Landlock does not
# mediate them), personality, fork, exec, sessions, namespaces, mounts, ptrace, io_uring, bpf, keys, userfaultfd,
# perf, flock (a lock on a readable host file would hold up its writers). Some are checked by argument: clone
# (threads only), signals (only to itself), ioctl and fcntl (a few requests; no lock or lease, so sqlite3 needs
# ":memory:" or a `?nolock=1` URI), fallocate (mode 0 only, which RLIMIT_FSIZE bounds), prlimit64 (only its own).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOWED = {
    "x86_64": {"read": 0, "write": 1, "close": 3, "fstat": 5, "lseek": 8, "mmap": 9, "mprotect": 10, "munmap": 11,
               "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "pread64": 17,
               "pwrite64": 18, "readv": 19, "writev": 20, "futex": 202, "newfstatat": 262, "openat": 257,
               "getdents64": 217, "clock_gettime": 228, "clock_nanosleep": 230, "getrandom": 318, "madvise": 28,
               "mremap": 25, "getpid": 39, "gettid": 186, "exit": 60, "exit_group": 231, "open": 2, "stat": 4,
               "lstat": 6, "statx": 332, "access": 21, "faccessat": 269, "faccessat2": 439, "readlink": 89,
               "readlinkat": 267, "getcwd": 79, "chdir": 80, "fchdir": 81, "mkdir": 83, "mkdirat": 258,
               "rmdir": 84, "unlink": 87, "unlinkat": 263, "rename": 82, "renameat": 264, "renameat2": 316,
               "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "truncate": 76, "ftruncate": 77,
               "fsync": 74, "fdatasync": 75, "fadvise64": 221, "sendfile": 40,
               "copy_file_range": 326, "statfs": 137, "fstatfs": 138, "umask": 95, "dup": 32, "dup2": 33,
               "dup3": 292, "pipe": 22, "pipe2": 293, "close_range": 436, "preadv": 295, "pwritev": 296,
               "preadv2": 327, "pwritev2": 328, "msync": 26, "sigaltstack": 131, "rt_sigpending": 127,
               "rt_sigsuspend": 130, "rt_sigtimedwait": 128, "set_robust_list": 273, "get_robust_list": 274,
               "rseq": 334, "set_tid_address": 218, "getppid": 110, "getuid": 102, "geteuid": 107, "getgid": 104,
               "getegid": 108, "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgrp": 111,
               "getpgid": 121, "getsid": 124, "nanosleep": 35, "clock_getres": 229, "gettimeofday": 96,
               "time": 201, "select": 23, "pselect6": 270, "poll": 7, "ppoll": 271, "epoll_create1": 291,
               "epoll_ctl": 233, "epoll_wait": 232, "epoll_pwait": 281, "uname": 63, "sysinfo": 99, "times": 100,
               "getrusage": 98, "getrlimit": 97, "sched_getaffinity": 204, "sched_yield": 24, "getcpu": 309,
               "alarm": 37, "setitimer": 38, "getitimer": 36, "restart_syscall": 219},
    "aarch64": {"read": 63, "write": 64, "close": 57, "fstat": 80, "lseek": 62, "mmap": 222, "mprotect": 226,
                "munmap": 215, "brk": 214, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigreturn": 139,
                "pread64": 67, "pwrite64": 68, "readv": 65, "writev": 66, "futex": 98, "newfstatat": 79,
                "openat": 56, "getdents64": 61, "clock_gettime": 113, "clock_nanosleep": 115, "getrandom": 278,
                "madvise": 233, "mremap": 216, "getpid": 172, "gettid": 178, "exit": 93, "exit_group": 94,
                "statx": 291, "faccessat": 48, "faccessat2": 439, "readlinkat": 78, "getcwd": 17, "chdir": 49,
                "fchdir": 50, "mkdirat": 34, "unlinkat": 35, "renameat": 38, "renameat2": 276, "linkat": 37,
                "symlinkat": 36, "truncate": 45, "ftruncate": 46, "fsync": 82, "fdatasync": 83,
                "fadvise64": 223, "sendfile": 71, "copy_file_range": 285, "statfs": 43,
                "fstatfs": 44, "umask": 166, "dup": 23, "dup3": 24, "pipe2": 59, "close_range": 436, "preadv": 69,
                "pwritev": 70, "preadv2": 286, "pwritev2": 287, "msync": 227, "sigaltstack": 132,
                "rt_sigpending": 136, "rt_sigsuspend": 133, "rt_sigtimedwait": 137, "set_robust_list": 99,
                "get_robust_list": 100, "rseq": 293, "set_tid_address": 96, "getppid": 173, "getuid": 174,
                "geteuid": 175, "getgid": 176, "getegid": 177, "getgroups": 158, "getresuid": 148,
                "getresgid": 150, "getpgid": 155, "getsid": 156, "nanosleep": 101, "clock_getres": 114,
                "gettimeofday": 169, "pselect6": 72, "ppoll": 73, "epoll_create1": 20, "epoll_ctl": 21,
                "epoll_pwait": 22, "uname": 160, "sysinfo": 179, "times": 153, "getrusage": 165,
                "getrlimit": 163, "sched_getaffinity": 123, "sched_yield": 124, "getcpu": 168, "setitimer": 103,
                "getitimer": 102, "restart_syscall": 128},
}
# syscalls allowed only with some arguments, and clone3 (answered ENOSYS so that libc falls back to clone)
BY_ARGUMENT = {
    "x86_64": {"clone": 56, "clone3": 435, "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129,
               "rt_tgsigqueueinfo": 297, "ioctl": 16, "fcntl": 72, "prlimit64": 302, "fallocate": 285},
    "aarch64": {"clone": 220, "clone3": 435, "kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138,
                "rt_tgsigqueueinfo": 240, "ioctl": 29, "fcntl": 25, "prlimit64": 261, "fallocate": 47},
}


def seccomp_table(machine: str) -> dict | None:
    """This machine's table as the launcher reads it: the audit architecture, the freely allowed numbers (the most
    frequent first, which the filter tests first) and the by-argument numbers by name; None on another machine,
    where the launcher refuses to start with seccomp on."""
    if machine not in ALLOWED:
        return None
    return {"arch": AUDIT_ARCH[machine], "allowed": list(ALLOWED[machine].values()),
            "by_argument": dict(BY_ARGUMENT[machine])}
