"""Raw HTTP/1.1 over sockets, for the serve tests that send what httpx will not (two framings at once, heads over
the size limit, unfinished heads held open by the thousand) and read exactly what the server answers, in order, and
whether it then closes the connection. Sockets can be bound to any 127.x.y.z address, so one test can play several
clients (on Linux every 127.0.0.0/8 address is the loopback)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

HANG_S = 60.0  # a deadline that only keeps a wait from hanging for ever: generous for a loaded machine

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def connect(port: int, source: str = "127.0.0.1", timeout: float = HANG_S) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    return sock


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]  # lower-case names
    body: bytes


@dataclass
class Exchange:
    answers: list[Answer]  # every complete answer the server sent, in order
    closed: bool  # the server closed the connection (EOF or reset) after them

    @property
    def statuses(self) -> list[int]:
        return [a.status for a in self.answers]


def _one_answer(buf: bytes) -> tuple[Answer, bytes] | None:
    """The first complete answer in `buf` and what follows it; None while it is incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    rest = buf[end + 4:]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, pos = b"", 0
        while True:
            line_end = rest.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size = int(rest[pos:line_end].split(b";")[0], 16)
            if len(rest) < line_end + 2 + size + 2:
                return None
            body += rest[line_end + 2: line_end + 2 + size]
            pos = line_end + 2 + size + 2
            if size == 0:
                return Answer(status, headers, body), rest[pos:]
    length = int(headers.get(b"content-length", b"0"))
    if len(rest) < length:
        return None
    return Answer(status, headers, rest[:length]), rest[length:]


def read_answers(sock: socket.socket, count: int, wait_s: float = HANG_S) -> Exchange:
    """Read until `count` answers are complete, the server closes, or `wait_s` passes (a hang-stopper)."""
    sock.settimeout(0.2)
    deadline, buf, answers, closed = time.monotonic() + wait_s, b"", [], False
    while len(answers) < count and time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
        if not data:
            closed = True
            break
        buf += data
        while (parsed := _one_answer(buf)) is not None:
            answer, buf = parsed
            answers.append(answer)
    return Exchange(answers, closed)


def send(sock: socket.socket, data: bytes) -> bool:
    """Send `data`; False if the server closed the connection first (it may refuse a head before reading it all)."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def exchange_then_probe(port: int, data: bytes, source: str = "127.0.0.1") -> Exchange:
    """Send `data`, read one answer, then send a `GET /health` on the same connection: `closed` says whether the
    server closed the connection after its first answer (it does not answer the probe) rather than keeping it. An
    order, not a wait: a server that keeps the connection answers the probe at once."""
    with connect(port, source) as sock:
        send(sock, data)
        first = read_answers(sock, 1)
        if first.closed or not first.answers:
            return first
        send(sock, HEALTH)
        more = read_answers(sock, 1)
        return Exchange(first.answers + more.answers, more.closed)


def server_closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), without waiting: data in the buffer counts as open."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def head_of_size(size: int, path: bytes = b"/health", method: bytes = b"GET") -> bytes:
    """A complete request head of exactly `size` bytes (request line to the blank line), padded in one header."""
    start = method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nX-Pad: "
    end = b"\r\n\r\n"
    assert size >= len(start) + len(end) + 1, size
    return start + b"a" * (size - len(start) - len(end)) + end
