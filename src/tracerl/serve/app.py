"""The FastAPI app of `tracerl serve`: `/v1/completions` on token ids over a `TransformersEngine`.

Request: `prompt` is a list of token ids (or a list of such lists), with `n`, `seed`, `max_tokens`, `temperature`,
`top_p`, `stop_token_ids` and `logprobs` (None or 0: the sampled token's logprob). Response: vLLM's shape for
token-id output, so `tracerl.engines.openai_engine.OpenAIEngine` reads it like vLLM's: one choice per sample
(index = prompt index * n + sample index) with `token_ids`, `logprobs.tokens` as `"token_id:123"` strings (decoded
strings when the model has a tokenizer and `return_tokens_as_token_ids` is false), `logprobs.token_logprobs` and
`finish_reason` "stop" or "length". Logprobs are `log_softmax(logits / T)` of each sampled token (the engine's).

Bounded in memory and time (`ServeLimits`):
- the body is read under `max_body_bytes` and `body_timeout_s` (HTTP 400 / 408), then checked and parsed off the
  event loop (`tracerl.serve.request`: a structural count before `json.loads`, then field by field), so `/health`
  answers while a costly body is refused;
- every bad request gets HTTP 400 with a message naming the field or the limit (and the flag that raises it),
  every string of a body included (`tracerl.serve.request.load_json`);
- admitted requests share the engine through `tracerl.serve.scheduler` (round-robin slices, at most
  `max_queued_requests`, then HTTP 503); a request whose client disconnects is dropped at its next turn;
- `/v1/load_weights` checks the whole file before writing a parameter (`tracerl.serve.weights`);
- the room for bodies is shared fairly between client addresses (`_BodyLimit`), and `/health` answers on the event
  loop, never waiting for a worker thread;
- a model error gets HTTP 500; the server keeps serving. Connection bounds (framing, head limits, timeouts, the
  fairly shared cap on open connections) are `tracerl.serve.connections`', set by `tracerl.serve.server_config`.

What it does not do: text prompts, chat completions, streaming, EOS handling (only `stop_token_ids` end a sample,
as if `ignore_eos` were set), authentication (it binds to 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.files.boundary import listing, parse_int

from .limits import ServeLimits
from .request import BadRequest, CompletionRequest, load_json, parse_completion
from .scheduler import Busy, Job, Scheduler
from .weights import WeightsError, read_checked

__all__ = ["BadRequest", "ServeLimits", "create_app"]


def create_app(engine: TransformersEngine, model_name: str, tokenizer: Any = None,
               limits: ServeLimits = ServeLimits()) -> FastAPI:
    """The app serving `engine` as `model_name`; `tokenizer` (optional) only fills the `text` fields."""
    scheduler: Scheduler | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal scheduler
        scheduler = Scheduler(engine, limits)
        try:
            yield
        finally:
            await run_in_threadpool(scheduler.stop)

    app = FastAPI(title="tracerl serve", description=__doc__, lifespan=lifespan)
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s,
                       max_buffered=4 * limits.max_body_bytes)
    vocab_size, max_positions = getattr(engine, "vocab_size", None), getattr(engine, "max_positions", None)

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, err: ValueError) -> JSONResponse:
        return _error(400, str(err))

    @app.exception_handler(Exception)
    async def _failed(request: Request, err: Exception) -> JSONResponse:
        return _error(500, f"generation failed: {type(err).__name__}: {err}")

    # /health and /v1/models answer on the event loop (they take a lock for a moment): the worker threads may all
    # be busy checking bodies, and /health must answer then
    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "requests_in_progress": scheduler.num_jobs if scheduler else 0}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "tracerl", "max_model_len": max_positions}]}

    @app.post("/v1/load_weights")
    async def load_weights(request: Request) -> JSONResponse:
        """Replace the served weights with a state dict saved by the trainer (`torch.save`) at `path` on this
        machine: how a training run keeps its server generating with the latest policy. Checked whole, then
        swapped in between two slices of generation (`tracerl.serve.weights`)."""
        raw = await request.body()
        try:  # a path needs no more than 64 KiB: nothing costly is parsed on the event loop
            path = _weights_path(_json_object(raw) if len(raw) <= 65536 else None)
            return JSONResponse({"status": "ok", "num_tensors": await run_in_threadpool(swap, path)})
        except (BadRequest, WeightsError) as err:
            return _error(400, str(err))

    def swap(path: Path) -> int:
        state = read_checked(path, engine.model.state_dict())
        with scheduler.engine_lock:
            engine.model.load_state_dict(state, strict=True)
        return len(state)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        raw = await request.body()  # read whole by _BodyLimit, under its size and time bounds
        body = await run_in_threadpool(parse_completion, raw, limits, vocab_size, max_positions)
        if body.model is not None and body.model != model_name:
            return _error(404, f"model {body.model[:200]!r} is not served here; this server serves {model_name!r}")
        try:
            job = scheduler.submit(body.prompts, body.params, body.n)
        except Busy as err:
            return _error(503, str(err))
        results = await _unless_gone(request, job, scheduler)
        if results is None:  # the client went away: nobody reads an answer
            return JSONResponse({}, status_code=499)
        # built and serialised off the event loop: a request's answer may hold max_request_tokens tokens
        return await run_in_threadpool(lambda: JSONResponse(_answer(body, results, model_name, tokenizer)))

    return app


async def _unless_gone(request: Request, job: Job, scheduler: Scheduler) -> list | None:
    """The job's results, or None after cancelling it if the client disconnects first."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        scheduler.cancel(job)
        answer.cancel()
        return None
    return answer.result()  # raises the engine's error (ValueError: 400, other: 500)


def _answer(body: CompletionRequest, results: list, model_name: str, tokenizer: Any) -> dict:
    choices = [_choice(i * body.n + j, c, body, tokenizer) for i, samples in enumerate(results)
               for j, c in enumerate(samples)]
    num_generated = sum(len(c.token_ids) for s in results for c in s)
    num_prompt = sum(len(p) for p in body.prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": num_prompt, "completion_tokens": num_generated,
                      "total_tokens": num_prompt + num_generated}}


@dataclass(eq=False)
class _Body:
    """A request body `_BodyLimit` holds: its client's address, its bytes so far, whether it is still arriving (else
    the app handles it), and the event that tells its reader to give up its bytes for another client's."""

    address: Any
    size: int = 0
    arriving: bool = True
    preempted: asyncio.Event = field(default_factory=asyncio.Event)


class _BodyLimit:
    """ASGI middleware: the body must arrive whole within `timeout_s` (else HTTP 408) and under `max_bytes` (by
    Content-Length or as it streams in; else HTTP 400); it is then replayed to the app.

    The bodies of all requests being read or handled hold at most `max_buffered` bytes together, so `max_connections`
    clients cannot make the server hold `max_connections` x `max_bytes`; the room is shared fairly between client
    addresses: when a body would pass it, the address holding the most bytes, if it holds more than this body's,
    gives up its largest body still arriving (that request gets HTTP 503), else this request gets 503 (clients
    retry). So a client holding many unfinished bodies cannot keep another client's request out."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float, max_buffered: int) -> None:
        self.app, self.max_bytes, self.timeout_s, self.max_buffered = app, max_bytes, timeout_s, max_buffered
        self.buffered = 0  # bytes of bodies held now; only the event loop's thread touches it and `bodies`
        self.bodies: set[_Body] = set()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = (f"request body exceeds the limit of {self.max_bytes} bytes (max_body_bytes); send fewer or "
                   "shorter prompts, or restart the server with a larger --max-body-mb")
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:  # uvicorn's parsers check it too; another ASGI server might not
            try:
                announced = parse_int(length.decode("latin-1"), "header Content-Length", BadRequest)
            except BadRequest as err:
                return await _error(400, str(err))(scope, receive, send)
            if announced > self.max_bytes:
                return await _error(400, message)(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body = _Body((scope.get("client") or (None,))[0])
        self.bodies.add(body)
        chunks, more = [], True
        busy = _error(503, "the server holds too many request bodies at once; retry shortly")
        try:
            while more:  # read the whole body under the caps, then replay it to the app
                event = await _next_or_stop(receive, body.preempted, deadline - loop.time())
                if event is None:
                    if body.preempted.is_set():
                        return await busy(scope, receive, send)
                    return await _error(408, f"the request body did not arrive within {self.timeout_s} s "
                                             "(body_timeout_s)")(scope, receive, send)
                if event["type"] != "http.request":
                    return
                chunk = event.get("body", b"")
                chunks.append(chunk)
                body.size += len(chunk)
                self.buffered += len(chunk)
                if body.size > self.max_bytes:
                    return await _error(400, message)(scope, receive, send)
                while self.buffered > self.max_buffered:
                    if not self._preempt_for(body):
                        return await busy(scope, receive, send)
                more = event.get("more_body", False)
            body.arriving = False
            replayed = False

            async def replay() -> dict:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

            await self.app(scope, replay, send)
        finally:
            self.buffered -= body.size
            self.bodies.discard(body)

    def _preempt_for(self, body: _Body) -> bool:
        """Tell the largest arriving body of the address holding the most bytes, if that is more than `body`'s
        address holds, to give its bytes up (counted free now; its reader drops them at once); False if none can."""
        held: dict[Any, int] = {}
        for other in self.bodies:
            held[other.address] = held.get(other.address, 0) + other.size
        for address in sorted(held, key=held.__getitem__, reverse=True):
            if held[address] <= held[body.address]:
                return False
            arriving = [b for b in self.bodies if b.address == address and b.arriving and not b.preempted.is_set()]
            if arriving:
                victim = max(arriving, key=lambda b: b.size)
                victim.preempted.set()
                self.buffered -= victim.size
                victim.size = 0
                return True
        return False


async def _next_or_stop(receive: Any, stop: asyncio.Event, timeout_s: float) -> dict | None:
    """The next ASGI message, or None if `stop` is set or `timeout_s` passes first."""
    get, stopped = asyncio.ensure_future(receive()), asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({get, stopped}, timeout=max(timeout_s, 0), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if get in done and not stop.is_set():
        return get.result()
    get.cancel()
    return None


def _json_object(raw: bytes) -> dict:
    """The JSON object in `raw`, its text checked (`load_json`), or BadRequest."""
    value = load_json(raw)
    if not isinstance(value, dict):
        raise BadRequest(f"the body is a JSON {type(value).__name__}, not an object")
    return value


def _weights_path(body: dict | None) -> Path:
    """The file `/v1/load_weights` names, or BadRequest naming what is wrong with the body or its `path`."""
    usage = 'send {"path": "<a torch.save file the server can read>"} and nothing else'
    if body is None:
        raise BadRequest(f"the body is over 64 KiB; {usage}")
    unexpected = set(body) - {"path"}
    if unexpected:
        raise BadRequest(f"unexpected fields {listing(unexpected)}; {usage}")
    if "path" not in body:
        raise BadRequest(f"path: missing; {usage}")
    path = body["path"]
    if not isinstance(path, str) or not path or "\x00" in path:
        raise BadRequest(f"path: must be a non-empty file name without NUL characters, not {str(path)[:100]!r}; "
                         f"{usage}")
    return Path(path)


def _choice(index: int, completion, body: CompletionRequest, tokenizer: Any) -> dict:
    ids = completion.token_ids
    pieces = [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [""] * len(ids)
    tokens = pieces if tokenizer is not None and not body.return_tokens_as_token_ids else [f"token_id:{t}" for t in ids]
    offsets = list(accumulate(map(len, pieces), initial=0))[: len(ids)]  # where each token's text starts
    logprobs = None if not body.logprobs else {
        "tokens": tokens, "token_logprobs": completion.logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, completion.logprobs)], "text_offset": offsets,
    }
    stop_reason = ids[-1] if completion.finish_reason == "stop" else None
    return {"index": index, "text": tokenizer.decode(ids) if tokenizer is not None else "", "token_ids": ids,
            "logprobs": logprobs, "finish_reason": completion.finish_reason, "stop_reason": stop_reason}


def _error(status: int, message: str) -> JSONResponse:
    """The error answer; a message quoting what a client sent cannot fail to encode (a lone surrogate is escaped)."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    kind = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeoutError",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)
