"""Weight sync for a `vllm serve` server: a worker extension vLLM loads, and the client call the trainer makes.

A served run stays on-policy when the server loads the trainer's weights after every update. vLLM (0.32) has no
endpoint that loads a state dict from a file, but in dev mode (`VLLM_SERVER_DEV_MODE=1`) it exposes
`POST /collective_rpc`, which calls a method on every worker with string arguments, and `POST /reset_prefix_cache`.
So the server is started with this module's extension mixed into its workers:

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --host 127.0.0.1 --port 8000 --dtype float32 \\
        --logprobs-mode processed_logprobs --worker-extension-cls tracerl.engines.vllm_worker.WeightSyncExtension

and `load_served_weights` (which `OpenAIEngine.load_weights` calls when the server is not `tracerl serve`) asks every
worker to read the trainer's `torch.save` file and reload its weights in place (vLLM's `reload_weights`, the
layerwise reload its RLHF weight-transfer engines run on checkpoint-format weights: Hugging Face names, mapped onto
vLLM's fused layers, sharded by vLLM's loaders under tensor parallelism, which has not been tested), then resets the
prefix cache so no key/value of the old weights is reused.

The file travels by path: the server must read the trainer's run directory (same machine or a shared file system).
Dev mode exposes more than this (sleep, arbitrary worker methods by name, cache resets): bind such a server to
loopback or a private network only. The trainer syncs between steps, when no request is running; a sync while
requests run would mix weights within a sample.

What it does not do: stream weights over NCCL or CUDA IPC (vLLM's weight-transfer engines do that on GPUs, without
the file), or load LoRA adapters (the trainer sends merged weights).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from tracerl.engines.errors import EngineError

EXTENSION = "tracerl.engines.vllm_worker.WeightSyncExtension"
START_HINT = (f"start vLLM with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {EXTENSION} (docs/engines.md, "
              "\"vLLM with weight sync\")")

# POST a JSON body (or none) to a URL: (HTTP status, answer bytes), or EngineError; `OpenAIEngine.post_small` is one,
# bounded in time and size
Post = Callable[[str, "dict | None"], "tuple[int, bytes]"]


class WeightSyncExtension:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; its methods run on every worker through
    `collective_rpc`. The name is prefixed so it cannot clash with a worker attribute."""

    def tracerl_load_weights(self, path: str) -> dict:
        """Load the state dict saved at `path` (`torch.save`, Hugging Face names) into this worker's model."""
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
        return {"num_tensors": len(state)}


def load_served_weights(post: Post, base_url: str, path: str, *, reset_attempts: int = 5) -> int:
    """Make the vLLM server at `base_url` load the weights at `path` on every worker and reset its prefix cache;
    returns the number of tensors each worker loaded. `post` sends each request (`OpenAIEngine.post_small`). Raises
    EngineError naming the fix when the server lacks dev mode or the extension, answers in another shape, or cannot
    reset its cache."""
    url = f"{base_url}/collective_rpc"
    status, data = post(url, {"method": "tracerl_load_weights", "args": [str(path)]})
    if status == 404:
        raise EngineError(f"{base_url} has neither tracerl serve's /v1/load_weights nor vLLM's /collective_rpc; "
                          f"{START_HINT}, or set policy.sync_weights=false")
    if status != 200:
        raise EngineError(f"POST {url} answered HTTP {status}: {data[:300].decode(errors='replace')}; {START_HINT}")
    results = _json(data).get("results") if isinstance(_json(data), dict) else None
    if not isinstance(results, list) or not results or not all(
            isinstance(r, dict) and type(r.get("num_tensors")) is int and r["num_tensors"] > 0 for r in results):
        raise EngineError(f"POST {url} loaded no weights: field 'results' must list one {{\"num_tensors\": N > 0}} "
                          f"per worker (answer {data[:200].decode(errors='replace')}); {START_HINT}")
    last = ""
    for attempt in range(reset_attempts):  # fails while requests still hold cache blocks: wait for them
        status, data = post(f"{base_url}/reset_prefix_cache", None)
        answer = _json(data)
        if status == 200 and isinstance(answer, dict) and answer.get("success") is True:
            return results[0]["num_tensors"]
        last = f"HTTP {status}: {data[:200].decode(errors='replace')}"
        time.sleep(0.5 * 2 ** attempt)
    raise EngineError(f"{base_url} loaded the new weights but could not reset its prefix cache ({last}); sync only "
                      "when no request is running")


def _json(data: bytes) -> object:
    """The JSON in `data`, or None when it is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
