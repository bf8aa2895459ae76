"""Shared glue of the GPU benchmark scripts: naming the device, checking it, and a tiny random model for smoke runs.

The scripts in this folder measure real models on a GPU; with no `--model` they build a tiny random Qwen3 (2 layers,
hidden 64) and a byte-level BPE tokenizer trained on a few math questions, saved with `save_pretrained` so it loads
exactly like a downloaded model directory. That model's numbers say only that the scripts run, never how fast
anything is. Nothing here downloads.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def check_device(device: str) -> None:
    """Raise SystemExit with the fix when `device` is not usable here (cuda asked for but torch sees no GPU)."""
    import torch

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise SystemExit(f"--device {device!r}: use cpu or cuda (or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch {torch.__version__} sees no GPU (CUDA build: {torch.version.cuda});"
                         f" install a CUDA build of torch on a GPU machine, or run with --device cpu")


def device_name(device: str) -> str:
    """The device as a reader of the results needs it: the GPU's name, or the CPU's model and core count."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        return f"{torch.cuda.get_device_name(index)} ({props.total_memory / 2**30:.0f} GiB)"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU: {model}, {cores} cores"


def quiet_transformers() -> None:
    """No loading or saving progress bars from transformers: they would break the scripts' tables."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def software_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def build_tiny_model_dir(path: str | Path, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                         max_position_embeddings: int = 8192) -> Path:
    """Save a random tiny Qwen3 and a tokenizer with tracerl's chat template to `path`; returns the path.

    The tokenizer is trained on 64 math training questions and tool-call snippets (vocabulary ~600), so the math
    domain's prompts encode to a few hundred tokens; the model's vocabulary is the tokenizer's size."""
    from tracerl.engines.tiny import tiny_qwen3
    from tracerl.io.domains.math import SYSTEM_PROMPT, MathDomain
    from tracerl.io.tokenizer import train_tokenizer

    quiet_transformers()
    path = Path(path)
    rows = MathDomain().rows("train", 64, seed=seed)
    texts = [m["content"] for r in rows for m in r["prompt"]] + [SYSTEM_PROMPT] * 4
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(1 + 2)"}}</tool_call> <answer>3</answer>'
    texts += [call] * 20
    tokenizer = train_tokenizer(texts, vocab_size=600)
    model = tiny_qwen3(vocab_size=len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                       num_kv_heads=2, seed=seed, max_position_embeddings=max_position_embeddings)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


if __name__ == "__main__":  # save the tiny smoke model, e.g. to serve it with `tracerl serve`
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/gpu/gpu_bench_common.py DIR  (saves the tiny random Qwen3 there)")
    print(build_tiny_model_dir(sys.argv[1]))
