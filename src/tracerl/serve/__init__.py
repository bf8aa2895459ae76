"""`tracerl serve`: an OpenAI-compatible completions server (token ids in, token ids + logprobs out).

It loads a causal LM from a local directory (or the embedded policy, built once and cached by
`tracerl.policy.embedded.build_embedded`) into a `TransformersEngine` and serves it with uvicorn; the app itself
is `tracerl.serve.app.create_app`. Point `tracerl.engines.openai_engine.OpenAIEngine` at it, exactly as at vLLM.

Every request and connection is bounded (`ServeLimits`): the app bounds bodies, validation and generation
(`tracerl.serve.app`); `server_config` serves every connection with `tracerl.serve.connections.BoundedH11`, which
frames requests as RFC 9112 requires (both Content-Length and Transfer-Encoding: 400, connection closed), refuses a
head over `max_head_bytes` (16 KiB) or `max_header_fields` (100) with 431, closes a connection whose head does not
arrive within `header_timeout_s` or that idles kept-alive past `keep_alive_s`, and shares `max_connections` fairly
between client addresses (past the cap, the address holding the most gives up its oldest connection not being
served), so neither idle sockets nor one client's thousand unfinished heads lock other clients, or `/health`, out.

It does not download models (pass a directory), shard them across devices, or batch across concurrent requests:
it is the small, exact reference server for tests and single-machine runs; use vLLM or SGLang for throughput.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.engines.transformers_engine import TransformersEngine

from .app import create_app
from .connections import BoundedH11
from .limits import ServeLimits

__all__ = ["ServeLimits", "create_app", "load_model", "run_server", "server_config"]


def load_model(model: str, *, device: str = "cpu",
               say: Callable[[str], None] = lambda message: None) -> tuple[TransformersEngine, Any, str]:
    """(engine, tokenizer or None, served name) for `model`: a local directory saved with `save_pretrained`, or
    "embedded" (the embedded policy, built on first use and then loaded from its cache)."""
    if model == "embedded":
        from tracerl.policy.embedded import build_embedded

        policy = build_embedded(progress=say)
        return TransformersEngine(policy.model, device=device), policy.tokenizer, "embedded"
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"--model {model!r} is neither 'embedded' nor a local model directory with a config.json; "
                         f"save one with model.save_pretrained(dir) (tracerl serve loads local files only)")
    engine = TransformersEngine.from_pretrained(str(path), device=device)
    tokenizer = None
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return engine, tokenizer, model


def run_server(model: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu",
               served_model_name: str | None = None, num_threads: int = 0, log_level: str = "info",
               say: Callable[[str], None] = lambda message: None, limits: ServeLimits | None = None) -> None:
    """Load `model` (see `load_model`) and serve it until interrupted. num_threads: torch CPU threads (0 = leave)."""
    import uvicorn

    from tracerl.engines import torch_threads

    with torch_threads(num_threads):
        engine, tokenizer, name = load_model(model, device=device, say=say)
        name = served_model_name or name
        say(f"serving {name!r} on http://{host}:{port}/v1/completions")
        limits = limits or ServeLimits()
        app = create_app(engine, name, tokenizer, limits)
        uvicorn.Server(server_config(app, host=host, port=port, limits=limits, log_level=log_level)).run()


def server_config(app: Any, *, host: str, port: int, limits: ServeLimits, log_level: str = "info"):
    """uvicorn's config for `app` with the connection bounds of `limits` (module docstring)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_keep_alive=limits.keep_alive_s,
                          http=functools.partial(BoundedH11, limits=limits), ws="none", lifespan="on")
