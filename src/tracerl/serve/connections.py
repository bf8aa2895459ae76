"""The HTTP/1.1 connections of `tracerl serve`: uvicorn's h11 protocol held to RFC 9112's framing, to the documented
limits on a request's head, to deadlines, and to a fair share of the connection cap for each client address.

- **Framing** (RFC 9112, section 6.3). A request with both Content-Length and Transfer-Encoding is refused with 400
  and its connection closed after the answer, so nothing behind it is read as another request (h11 alone frames it
  by its chunked coding and reads on). h11 refuses conflicting Content-Lengths (400) and codings other than chunked
  (501); every refusal closes the connection.
- **Heads.** While a connection waits for a request head, the bytes it holds are measured before h11 parses them: a
  head over `max_head_bytes` (request line to empty line, both included) or with more than `max_header_fields` lines
  after the request line gets 431 and its connection closed, however the head arrives (h11's own bound covers only a
  head that arrives in pieces: one read of the event loop, up to 256 KiB, was parsed whole). The measure reads only
  what the connection holds, which the bound keeps to `max_head_bytes` plus one read.
- **Deadlines.** A head must arrive within `header_timeout_s` of the connection waiting for it (new, or kept alive
  after an answer); an idle kept-alive connection closes after `keep_alive_s` (uvicorn's); the body's deadline is the
  app's (`tracerl.serve.app`).
- **Sharing the cap.** At most `max_connections` are open. When a new connection would pass the cap, the client
  address holding the most connections (the newcomer counted with its own, and its own chosen on a tie) gives up its
  oldest connection that is not being served (one waiting for a head, new or kept alive, or still sending its
  body), or, if it serves all of them and holds more than the newcomer's address, its newest one being served. So a
  client holding a thousand connections, unfinished or busy, evicts its own, and every other client, and its own
  `/health`, gets in; only when the newcomer's address holds the most and serves all it holds is the new one closed
  at once.

What it does not do: tell clients apart behind one address (a proxy or a NAT is one client), limit how fast a client
opens connections (the kernel's listen queue bounds that), or close a connection whose answer its client does not
read.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ServeLimits

_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head: an empty line, with or without its CR


def head_problem(held: bytes, limits: ServeLimits) -> str:
    """'' while the request head at the start of `held` (what a connection waiting for a head holds) is, or can still
    become, one within `max_head_bytes` and `max_header_fields`; else what is over."""
    end = _HEAD_END.search(held, 0, limits.max_head_bytes)  # only a match ending within the bound can be a head
    if end is None and len(held) > limits.max_head_bytes:
        return f"the request head is over {limits.max_head_bytes} bytes (max_head_bytes)"
    # complete: each field line, and the request line, ends with a newline before the empty line's
    num_fields = held.count(b"\n", 0, end.start()) if end else held.count(b"\n") - 1
    if num_fields > limits.max_header_fields:
        return f"the request head has over {limits.max_header_fields} header fields (max_header_fields)"
    return ""


class FramedConnection(h11.Connection):
    """h11's server side, refusing what `head_problem` and RFC 9112's framing refuse; `refusal` is the status and
    message of the last refusal (h11's own included), for the answer."""

    def __init__(self, limits: ServeLimits):
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        self.limits = limits
        self.refusal: tuple[int, str] | None = None

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:  # all it holds is the next head, or its start
            problem = head_problem(self.trailing_data[0], self.limits)
            if problem:
                self._refuse(431, problem)
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as err:
            self.refusal = (err.error_status_hint, str(err))
            raise
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}  # lower case
            if b"content-length" in names and b"transfer-encoding" in names:
                self._refuse(400, "a request with both Content-Length and Transfer-Encoding is refused (RFC 9112, "
                                  "section 6.3); send one")
        return event

    def _refuse(self, status: int, message: str) -> None:
        self.refusal = (status, message)
        raise h11.RemoteProtocolError(message, error_status_hint=status)


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with the framing, head limits, head deadline and fair connection cap of the module
    docstring.

    A watch runs every quarter of `header_timeout_s`: while no request is in progress on the connection (just
    opened, or kept alive after a response), the head of the next one must arrive within `header_timeout_s` of the
    connection waiting for it, or the connection is closed."""

    def __init__(self, *args: Any, limits: ServeLimits, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.conn = FramedConnection(limits)
        self._opened = 0.0
        self._waiting_since: float | None = None
        self._watch: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._opened = self._waiting_since = self.loop.time()
        if sum(not c.transport.is_closing() for c in self.connections) > self.limits.max_connections \
                and not self._make_room():
            transport.close()
            return
        self._watch = self.loop.call_later(self.limits.header_timeout_s / 4, self._check_head)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 (or `FramedConnection`) refused, with the refusal's own status and
        message; the connection is then closed."""
        status, message = self.conn.refusal or (400, msg)
        body = message.encode("ascii", "backslashreplace")
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:  # a status h11 hinted that HTTPStatus does not name
            reason = b""
        for event in (h11.Response(status_code=status, headers=headers, reason=reason), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    @property
    def unserved(self) -> bool:
        """Whether this connection is not being served: waiting for a head (new, or kept alive after an answer) or
        still sending its body. Only such a connection may be given up for another."""
        if self.cycle is None or self.cycle.response_complete:
            return True
        return self.conn.their_state is h11.SEND_BODY

    def _make_room(self) -> bool:
        """Close a connection of the address holding the most (module docstring): its oldest unserved one, or, when
        it holds more than this one's address (the newcomer counted) and serves all of them, its newest served one
        (the least work lost; its request is dropped as if its client had gone). False if there is none."""
        by_address: dict[Any, list[BoundedH11]] = {}
        for conn in self.connections:
            if conn is not self and not conn.transport.is_closing():
                by_address.setdefault(_address(conn), []).append(conn)
        mine = _address(self)
        held = {address: len(conns) + (address == mine) for address, conns in by_address.items()}
        held.setdefault(mine, 1)
        for address in sorted(held, key=lambda a: (held[a], a == mine), reverse=True):
            if held[address] < held[mine]:
                break
            conns = by_address.get(address, [])
            unserved = [c for c in conns if c.unserved]
            if unserved:
                min(unserved, key=lambda c: c._opened).transport.close()
                return True
            if conns and held[address] > held[mine]:
                max(conns, key=lambda c: c._opened).transport.close()
                return True
        return False

    def _check_head(self) -> None:
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self.cycle is not None and not self.cycle.response_complete:
            self._waiting_since = None  # a request is in progress: its head arrived
        elif self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since > self.limits.header_timeout_s:
            self.transport.close()
            return
        self._watch = self.loop.call_later(self.limits.header_timeout_s / 4, self._check_head)


def _address(conn: H11Protocol) -> Any:
    """The client's address without its port: what tells clients apart."""
    return conn.client[0] if conn.client else None
