"""A sandboxed call's stdout and stderr: named pipes (FIFOs) that the parent drains while it waits for the call, and
caps.

The code's descriptors 1 and 2 are the write ends of two FIFOs made in the sandbox's private parent. A pipe, unlike a
file, cannot be fallocated, truncated or written at an offset, so no descriptor the code receives can reserve any of
the host's disk; a pipe's buffer is a kernel object of at most a few pages. The parent reads each pipe as output
arrives and keeps at most `cap_bytes` of it (`SandboxLimits.max_file_mb`); one byte past that, it closes its end, so
the code's next write to that stream fails (EPIPE: BrokenPipeError) and the call reports an output limit. The
FIFOs go by path because the warm launcher server opens the call's files by path (`serve.serve`).

What it does not do: decode the output or cut it to `max_output_chars` (that is `capped_text`, after the call).
"""

from __future__ import annotations

import errno
import os
import select
import time

CHUNK = 1 << 16


class Capture:
    """One stream of the call: a FIFO in `directory` whose read end this process holds (non-blocking, opened first
    so that a writer's open does not wait), and the bytes read from it so far, at most `cap_bytes`."""

    def __init__(self, directory: str, cap_bytes: int) -> None:
        while True:
            self.path = os.path.join(directory, "pipe-" + os.urandom(8).hex())
            try:
                os.mkfifo(self.path, 0o600)
                break
            except FileExistsError:
                continue
        self.fd: int | None = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.cap_bytes = cap_bytes
        self.data = bytearray()
        self.cut = False  # the code wrote more than cap_bytes; its end was closed

    def writer(self) -> int:
        """A write end for a launcher started by this process (the server opens its own by path)."""
        return os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)

    def drain(self) -> None:
        """Read what is there now, without waiting; close at end of file or one byte past the cap."""
        while self.fd is not None:
            try:
                chunk = os.read(self.fd, min(CHUNK, self.cap_bytes + 1 - len(self.data)))
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                raise
            if not chunk:
                self.close()
                return
            self.data += chunk
            if len(self.data) > self.cap_bytes:
                del self.data[self.cap_bytes:]
                self.cut = True
                self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def wait_and_drain(pid: int, timeout: float, captures: list[Capture]) -> bool:
    """Drain `captures` until the process `pid` (a child, or a process a pidfd can watch) exits, without reaping
    it; False when `timeout` seconds pass first. Output still in the pipes at the end is for `Capture.drain`."""
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3 or Python < 3.9: poll the child every 5 ms
        pidfd = None
    poller = select.poll()
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    open_fds = {c.fd: c for c in captures if c.fd is not None}
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = poller.poll(max(1, int(1000 * (left if pidfd is not None else min(left, 0.005)))))
            for fd, _ in ready:
                if fd in open_fds:
                    capture = open_fds[fd]
                    capture.drain()
                    if capture.fd is None:
                        poller.unregister(fd)
                        del open_fds[fd]
            if pidfd is not None:
                if any(fd == pidfd for fd, _ in ready):
                    return True
            elif os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def capped_text(data: bytes, max_chars: int) -> str:
    """Decode captured output and keep its head and tail around a "[... N chars truncated]" marker."""
    text = bytes(data).decode("utf-8", errors="replace")
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    return f"{text[:head]}\n[... {len(text) - max_chars} chars truncated]\n{text[len(text) - (max_chars - head):]}"
