"""`ServeLimits`: every bound `tracerl serve` puts on one request and one connection, in one frozen dataclass.

A bound on memory or time that a client's request could otherwise choose lives here, with the reason to change it.
The request bounds are checked in `tracerl.serve.request`; the connection bounds by the uvicorn protocol of
`tracerl.serve.connections`; the scheduling slice by `tracerl.serve.scheduler`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ServeLimits:
    """Per-request and per-connection bounds, so one client cannot take the server's memory, time or sockets."""

    max_n: int = 64  # samples per prompt (`n`); raise with --max-n for large best-of-n sweeps
    max_samples: int = 512  # prompts x n in one request; bounds the batch the engine builds
    max_tokens: int = 4096  # `max_tokens` per sample; raise for long generations (memory grows with it)
    max_body_bytes: int = 16 << 20  # request body size; the element count below binds first for token ids
    max_request_tokens: int = 262_144  # prompts x n x max_tokens: the most work one request may ask for
    max_prompt_tokens: int = 1 << 20  # token ids over all prompts of a request (and JSON elements, about)
    max_queued_requests: int = 64  # requests admitted to the engine's queue; more get HTTP 503 (retried)
    slice_tokens: int = 2048  # prompt tokens prefilled + tokens generated in one slice, then the next request's turn
    slice_steps: int = 64  # decoding steps of one slice (a long sample is continued in later slices)
    max_connections: int = 256  # open connections, shared fairly by client address (keep it below the file limit)
    max_head_bytes: int = 16 * 1024  # a request's head, request line to empty line; more gets HTTP 431
    max_header_fields: int = 100  # header lines of one request; more gets HTTP 431
    header_timeout_s: float = 10.0  # a request's head must arrive within this, or its connection is closed
    body_timeout_s: float = 30.0  # the whole body must arrive within this after the head, or HTTP 408
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"ServeLimits.{f.name}={getattr(self, f.name)} must be > 0")
        for name in ("max_n", "max_samples", "max_tokens", "max_body_bytes", "max_request_tokens",
                     "max_prompt_tokens", "max_queued_requests", "slice_tokens", "slice_steps", "max_connections",
                     "max_head_bytes", "max_header_fields"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"ServeLimits.{name}={getattr(self, name)!r} must be an int")
