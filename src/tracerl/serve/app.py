"""The FastAPI app of `tracerl serve`: `/v1/completions` on token ids over a `TransformersEngine`.

Request: `prompt` is a list of token ids (or a list of such lists), with `n`, `seed`, `max_tokens`, `temperature`,
`top_p`, `stop_token_ids` and `logprobs` (None or 0: the sampled token's logprob). Response: vLLM's shape for
token-id output, so `tracerl.engines.openai_engine.OpenAIEngine` reads it like vLLM's: one choice per sample
(index = prompt index * n + sample index) with `token_ids`, `logprobs.tokens` as `"token_id:123"` strings (decoded
strings when the model has a tokenizer and `return_tokens_as_token_ids` is false), `logprobs.token_logprobs` and
`finish_reason` "stop" or "length". Logprobs are `log_softmax(logits / T)` of each sampled token (the engine's).

Every bad request (not JSON, a text prompt, ids outside the vocabulary, a prompt too long, unsupported options such
as `stream`, `echo`, `stop` strings or top-k logprobs) gets HTTP 400 with a message; a model error gets HTTP 500;
the server keeps serving. Requests run one at a time on the engine (it is not thread-safe); a request with several
prompts or n > 1 is batched inside the engine.

What it does not do: text prompts, chat completions, streaming, EOS handling (only `stop_token_ids` end a sample,
as if `ignore_eos` were set), authentication (it binds to 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import threading
import time
import uuid
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


def create_app(engine: TransformersEngine, model_name: str, tokenizer: Any = None) -> FastAPI:
    """The app serving `engine` as `model_name`; `tokenizer` (optional) only fills the `text` fields."""
    app = FastAPI(title="tracerl serve", description=__doc__)
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
        state = torch.load(path, map_location=engine.device, weights_only=True)
        with lock:
            missing, unexpected = engine.model.load_state_dict(state, strict=False)
            if missing or unexpected:
                return _error(400, f"the weights do not fit the served model: missing {sorted(missing)[:5]}, "
                                   f"unexpected {sorted(unexpected)[:5]}")
        return JSONResponse({"status": "ok", "num_tensors": len(state)})

    @app.post("/v1/completions")
    def completions(body: CompletionRequest) -> JSONResponse:  # sync: FastAPI runs it in a worker thread
        if body.model is not None and body.model != model_name:
            return _error(404, f"model {body.model!r} is not served here; this server serves {model_name!r}")
        prompts, params = _check(body)
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


def _check(body: CompletionRequest) -> tuple[list[list[int]], SamplingParams]:
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
    prompts = [body.prompt] if not body.prompt or isinstance(body.prompt[0], int) else body.prompt
    if not prompts:
        raise BadRequest("prompt is empty; send at least one token id")
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
