"""Heavy-layer generation engines (torch): the transformers engine with KV reuse across branches, tiny models, and
`make_engine`, which builds the rollout engine a policy config names.

Importing this package imports no torch (a saved config parses anywhere, `tracerl.train.config` reads `ENGINES`):
each engine's module is imported when it is built."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

ENGINES = ("transformers", "vllm", "openai")  # the engines `make_engine` builds, by policy.engine


def make_engine(policy: Any, model: Any = None, *, device: Any = None, compute_dtype: Any = None,
                weights: Callable[[], Mapping[str, Any]] | None = None, seed: int | None = None,
                say: Callable[[str], None] = lambda message: None):
    """The rollout engine `policy.engine` names, from `policy` (a `tracerl.train.config.PolicyConfig`, or any object
    with its fields) and `model` (a transformers causal LM, the policy being trained):

    - "transformers": `TransformersEngine(model)` on `device`, decoding `policy.max_batch_size` rollouts together,
      sampling in `compute_dtype` (None: the model's own dtype);
    - "vllm": vLLM in this process with `model`'s architecture, loaded with `weights()` (default `model.state_dict()`;
      a LoRA trainer passes its merged weights), engine seed `seed`, and the `policy.vllm_*` settings;
    - "openai": a client of the server at `policy.base_url` (`served_model_name`, `n_mode`, `max_batch_size`
      requests in flight), refusing ids outside `model`'s vocabulary when a model is given.

    A name outside `ENGINES` raises ValueError naming the choices."""
    name = policy.engine
    if name == "transformers":
        from tracerl.engines.transformers_engine import TransformersEngine

        return TransformersEngine(model, device=device, max_batch_size=policy.max_batch_size,
                                  compute_dtype=compute_dtype)
    if name == "vllm":
        import torch

        from tracerl.engines.vllm_engine import VLLMEngine

        return VLLMEngine.from_model(
            model, None if weights is None else weights(), device=torch.device(device or "cpu").type, seed=seed,
            max_model_len=policy.vllm_max_model_len, max_num_seqs=policy.max_batch_size,
            kv_cache_gib=policy.vllm_kv_cache_gib, gpu_memory_utilization=policy.vllm_gpu_memory_utilization,
            enable_sleep_mode=policy.vllm_sleep)
    if name == "openai":
        from tracerl.engines.openai_engine import OpenAIEngine

        engine = OpenAIEngine(policy.base_url, policy.served_model_name or None, n_mode=policy.n_mode,
                              max_concurrency=policy.max_batch_size,
                              vocab_size=None if model is None else model.config.vocab_size)
        say(f"generating with the server at {policy.base_url}"
            + (", weights synced after each update" if policy.sync_weights else ""))
        return engine
    raise ValueError(f"policy.engine={name!r} is not an engine; choose one of {', '.join(ENGINES)}")


@contextmanager
def torch_threads(num_threads: int):
    """Run the block with `num_threads` torch CPU threads (0 = leave as is), then restore the old count.

    Tiny models on a busy 2-core machine run several times faster on one thread than on two (OpenMP)."""
    import torch

    before = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
