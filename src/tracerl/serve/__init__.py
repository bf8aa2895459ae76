"""`tracerl serve`: an OpenAI-compatible completions server (token ids in, token ids + logprobs out).

It loads a causal LM from a local directory (or the embedded policy, built once and cached by
`tracerl.policy.embedded.build_embedded`) into a `TransformersEngine` and serves it with uvicorn; the app itself
is `tracerl.serve.app.create_app`. Point `tracerl.engines.openai_engine.OpenAIEngine` at it, exactly as at vLLM.

It does not download models (pass a directory), shard them across devices, or batch across concurrent requests:
it is the small, exact reference server for tests and single-machine runs; use vLLM or SGLang for throughput.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.engines.transformers_engine import TransformersEngine

from .app import ServeLimits, create_app

__all__ = ["ServeLimits", "create_app", "load_model", "run_server"]


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
        uvicorn.run(create_app(engine, name, tokenizer, limits or ServeLimits()), host=host, port=port, log_level=log_level)
