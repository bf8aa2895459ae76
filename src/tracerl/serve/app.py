"""The FastAPI app of `tracerl serve`: `/v1/completions` on token ids over a `TransformersEngine`.

Request: `prompt` is a list of token ids (or a list of such lists), with `n`, `seed`, `max_tokens`, `temperature`,
`top_p`, `stop_token_ids` and `logprobs` (None or 0: the sampled token's logprob). Response: vLLM's shape for
token-id output, so `tracerl.engines.openai_engine.OpenAIEngine` reads it like vLLM's: one choice per sample
(index = prompt index * n + sample index) with `token_ids`, `logprobs.tokens` as `"token_id:123"` strings (decoded
strings when the model has a tokenizer and `return_tokens_as_token_ids` is false), `logprobs.token_logprobs` and
`finish_reason` "stop" or "length". Logprobs are `log_softmax(logits / T)` of each sampled token (the engine's).

Every bad request (not JSON, a text prompt, ids outside the vocabulary, a prompt too long, unsupported options such
as `stream`, `echo`, `stop` strings or top-k logprobs, a temperature that is NaN or negative, top_p outside (0, 1],
a seed outside [0, 2^63)) gets HTTP 400 with a message; so does a request over one of `ServeLimits` (n, prompts x n,
max_tokens, body bytes), the message naming the limit and the flag that raises it; a model error gets HTTP 500;
the server keeps serving. Requests run one at a time on the engine (it is not thread-safe); a request with several
prompts or n > 1 is batched inside the engine.

What it does not do: text prompts, chat completions, streaming, EOS handling (only `stop_token_ids` end a sample,
as if `ignore_eos` were set), authentication (it binds to 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.engine import SamplingParams


@dataclass(frozen=True)
class ServeLimits:
    """Per-request bounds, so one request cannot take the server's memory (each sample holds a KV cache)."""

    max_n: int = 64  # samples per prompt (`n`); raise with --max-n for large best-of-n sweeps
    max_samples: int = 512  # prompts x n in one request; bounds the batch the engine builds
    max_tokens: int = 4096  # `max_tokens` per sample; raise for long generations (memory grows with it)
    max_body_bytes: int = 16 << 20  # request body size; a prompt of 1M ids is about 8 MB of JSON

    def __post_init__(self) -> None:
        for name in ("max_n", "max_samples", "max_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeLimits.{name}={getattr(self, name)} must be >= 1")


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # a state dict written with torch.save, readable by the server


class CompletionRequest(BaseModel):
    """The fields `/v1/completions` reads; other fields (e.g. vLLM's `return_tokens_as_token_ids`) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: list[int] | list[list[int]]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool = False
    # accepted only with the values this server implements (checked in `_check`)
    stop: str | list[str] | None = None
    stream: bool = False
    echo: bool = False


class BadRequest(ValueError):
    """A request this server cannot answer as asked (HTTP 400)."""


def create_app(engine: TransformersEngine, model_name: str, tokenizer: Any = None,
               limits: ServeLimits = ServeLimits()) -> FastAPI:
    """The app serving `engine` as `model_name`; `tokenizer` (optional) only fills the `text` fields."""
    app = FastAPI(title="tracerl serve", description=__doc__)
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes)
    lock = threading.Lock()  # TransformersEngine keeps per-call state and a KV store: one call at a time

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        problems: dict[str, str] = {}  # field -> its first problem (a union type reports one per member)
        for e in err.errors():
            loc = [str(x) for x in e.get("loc", ()) if x != "body"]
            field = loc[0] if loc else "body"
            problems.setdefault(field, "must be a list of token ids or a list of such lists (text prompts are not "
                                       "supported: tokenize first)" if field == "prompt" and e.get("type") != "missing"
                                else str(e.get("msg")))
        listed = "; ".join(f"{field}: {msg}" for field, msg in problems.items())
        return _error(400, f"bad request: {listed}. Send JSON like {{\"prompt\": [1, 2, 3], \"max_tokens\": 16}}")

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, err: ValueError) -> JSONResponse:
        return _error(400, str(err))

    @app.exception_handler(Exception)
    async def _failed(request: Request, err: Exception) -> JSONResponse:
        return _error(500, f"generation failed: {type(err).__name__}: {err}")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "tracerl", "max_model_len": engine.max_positions}]}

    @app.post("/v1/load_weights")
    def load_weights(body: LoadWeightsRequest) -> JSONResponse:
        """Replace the served weights with a state dict saved by the trainer (`torch.save`) at `path` on this
        machine: how a training run keeps its server generating with the latest policy. The engine's KV store is
        invalidated by the in-place weight change."""
        path = Path(body.path)
        if not path.is_file():
            return _error(400, f"no weights file at {path}; save the state dict with torch.save on a path the "
                               "server can read")
        try:
            state = torch.load(path, map_location=engine.device, weights_only=True)
        except Exception as err:  # not a torch file, truncated, or pickled objects weights_only refuses
            return _error(400, f"{path} is not a readable state dict ({type(err).__name__}: {str(err)[:200]}); "
                               "save it with torch.save(model.state_dict(), path)")
        with lock:  # checked whole before any tensor is copied: a bad file changes nothing
            problem = _misfit(engine.model.state_dict(), state)
            if problem:
                return _error(400, f"the weights do not fit the served model, nothing was loaded: {problem}")
            engine.model.load_state_dict(state, strict=True)
        return JSONResponse({"status": "ok", "num_tensors": len(state)})

    @app.post("/v1/completions")
    def completions(body: CompletionRequest) -> JSONResponse:  # sync: FastAPI runs it in a worker thread
        if body.model is not None and body.model != model_name:
            return _error(404, f"model {body.model!r} is not served here; this server serves {model_name!r}")
        prompts, params = _check(body, limits, getattr(engine, "vocab_size", None))
        with lock:
            results = engine.generate(prompts, params, n=body.n)
        choices = [_choice(i * body.n + j, c, body, tokenizer) for i, samples in enumerate(results)
                   for j, c in enumerate(samples)]
        num_generated = sum(len(c.token_ids) for s in results for c in s)
        num_prompt = sum(len(p) for p in prompts)
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": num_prompt, "completion_tokens": num_generated,
                      "total_tokens": num_prompt + num_generated},
        })

    return app


class _BodyLimit:
    """ASGI middleware: a request body over `max_bytes` (by Content-Length or as it streams in) gets HTTP 400."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = (f"request body exceeds the limit of {self.max_bytes} bytes (max_body_bytes); send fewer or "
                   "shorter prompts, or restart the server with a larger --max-body-mb")
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await _error(400, message)(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:  # read the whole body under the cap, then replay it to the app
            event = await receive()
            if event["type"] != "http.request":
                return
            chunks.append(event.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await _error(400, message)(scope, receive, send)
            more = event.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


def _misfit(expected: dict, state: Any) -> str:
    """'' when `state` has exactly the served model's keys with the same shapes, else the first problems."""
    if not isinstance(state, dict):
        return f"the file holds a {type(state).__name__}, not a state dict"
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        return f"missing {missing[:5]}, unexpected {unexpected[:5]}"
    shapes = [f"{k}: {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
              if not isinstance(state[k], torch.Tensor) or state[k].shape != v.shape]
    return f"shape mismatch {shapes[:5]}" if shapes else ""


def _check(body: CompletionRequest, limits: ServeLimits = ServeLimits(),
           vocab_size: int | None = None) -> tuple[list[list[int]], SamplingParams]:
    """The prompts and sampling params of a request, or BadRequest naming what to change."""
    if body.stream:
        raise BadRequest("stream=true is not supported; send stream=false")
    if body.echo:
        raise BadRequest("echo=true is not supported; the prompt is the token ids you sent")
    if body.stop:
        raise BadRequest(f"stop strings {body.stop!r} are not supported; send stop_token_ids instead")
    if body.logprobs not in (None, 0):
        raise BadRequest(f"logprobs={body.logprobs} is not supported; send logprobs=0 (the sampled token's logprob)")
    if body.n < 1:
        raise BadRequest(f"n={body.n} must be >= 1")
    if body.n > limits.max_n:
        raise BadRequest(f"n={body.n} exceeds the limit max_n={limits.max_n}; send fewer samples per request or "
                         "restart the server with a larger --max-n")
    if body.max_tokens > limits.max_tokens:
        raise BadRequest(f"max_tokens={body.max_tokens} exceeds the limit max_tokens={limits.max_tokens}; lower it "
                         "or restart the server with a larger --max-tokens")
    if not (math.isfinite(body.temperature) and body.temperature >= 0):
        raise BadRequest(f"temperature={body.temperature}: need a finite temperature >= 0 (0 = greedy)")
    if not (math.isfinite(body.top_p) and 0 < body.top_p <= 1):
        raise BadRequest(f"top_p={body.top_p} must lie in (0, 1]")
    if body.seed is not None and not 0 <= body.seed < 2**63:
        raise BadRequest(f"seed={body.seed} must lie in [0, 2^63)")
    prompts = [body.prompt] if not body.prompt or isinstance(body.prompt[0], int) else body.prompt
    if not prompts:
        raise BadRequest("prompt is empty; send at least one token id")
    if len(prompts) * body.n > limits.max_samples:
        raise BadRequest(f"{len(prompts)} prompts x n={body.n} = {len(prompts) * body.n} samples exceeds the limit "
                         f"max_samples={limits.max_samples}; split the request or restart the server with a larger "
                         "--max-samples")
    bound = vocab_size if vocab_size is not None else 2**63
    for name, ids in [(f"prompt {i}", p) for i, p in enumerate(prompts)] + [("stop_token_ids", body.stop_token_ids or [])]:
        bad = [t for t in ids if not 0 <= t < bound]
        if bad:
            raise BadRequest(f"{name} has token ids outside [0, {bound}) (e.g. {str(bad[0])[:40]}); send ids from "
                             "the served model's vocabulary")
    params = SamplingParams(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_tokens,
                            stop_token_ids=tuple(body.stop_token_ids or ()), seed=body.seed)
    return prompts, params


def _choice(index: int, completion, body: CompletionRequest, tokenizer: Any) -> dict:
    ids = completion.token_ids
    pieces = [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [""] * len(ids)
    tokens = pieces if tokenizer is not None and not body.return_tokens_as_token_ids else [f"token_id:{t}" for t in ids]
    offsets = list(accumulate(map(len, pieces), initial=0))[: len(ids)]  # where each token's text starts
    logprobs = None if body.logprobs is None else {
        "tokens": tokens, "token_logprobs": completion.logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, completion.logprobs)], "text_offset": offsets,
    }
    stop_reason = ids[-1] if completion.finish_reason == "stop" else None
    return {"index": index, "text": tokenizer.decode(ids) if tokenizer is not None else "", "token_ids": ids,
            "logprobs": logprobs, "finish_reason": completion.finish_reason, "stop_reason": stop_reason}


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)
