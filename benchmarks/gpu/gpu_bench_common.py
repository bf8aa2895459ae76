"""Shared glue of the GPU benchmark scripts: naming the device, checking it, and a tiny random model for smoke runs.

The scripts in this folder measure real models on a GPU; with no `--model` they build a tiny random Qwen3 (2 layers,
hidden 64) and a byte-level BPE tokenizer trained on a few math questions, saved with `save_pretrained` so it loads
exactly like a downloaded model directory. That model's numbers say only that the scripts run, never how fast
anything is. Nothing here downloads.
"""

from __future__ import annotations

import contextlib
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


def smoke_tokenizer(seed: int = 0):
    """A byte-level BPE tokenizer with tracerl's chat template, trained on 64 math training questions and tool-call
    snippets (vocabulary ~600), so the math domain's prompts encode to a few hundred tokens."""
    from tracerl.io.domains.math import SYSTEM_PROMPT, MathDomain
    from tracerl.io.rollout.tokenizer import train_tokenizer

    rows = MathDomain().rows("train", 64, seed=seed)
    texts = [m["content"] for r in rows for m in r["prompt"]] + [SYSTEM_PROMPT] * 4
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(1 + 2)"}}</tool_call> <answer>3</answer>'
    texts += [call] * 20
    return train_tokenizer(texts, vocab_size=600)


def save_model_dir(path: str | Path, model, tokenizer) -> Path:
    """Save `model` and `tokenizer` to `path` as a downloaded model directory is laid out; returns the path."""
    quiet_transformers()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_model_dir(path: str | Path, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                         max_position_embeddings: int = 8192) -> Path:
    """Save a random tiny Qwen3 and the smoke tokenizer to `path`; returns the path. The model's vocabulary is the
    tokenizer's size."""
    from tracerl.engines.tiny import tiny_qwen3

    tokenizer = smoke_tokenizer(seed)
    model = tiny_qwen3(vocab_size=len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                       num_kv_heads=2, seed=seed, max_position_embeddings=max_position_embeddings)
    return save_model_dir(path, model, tokenizer)


# Qwen3-0.6B's architecture as its published config.json gives it (596M parameters with tied embeddings)
QWEN3_0_6B = {"vocab_size": 151_936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40_960,
              "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
SIZES = {"qwen3-0.6b": QWEN3_0_6B}


def build_sized_model_dir(path: str | Path, size: str, *, seed: int = 0, **override) -> Path:
    """Save a random-weight model of a real model's architecture (`SIZES`, e.g. qwen3-0.6b) with the smoke
    tokenizer to `path`; returns the path. `override` changes config fields (tests shrink the layers).

    Its compute and memory per token are the real model's (same shapes, vocabulary 151,936 included); its text is
    noise: it rarely samples an end-of-turn token, so every turn runs to its token limit (the worst case of a step's
    length), and ids beyond the tokenizer's ~600 decode to nothing. Nothing is downloaded."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise SystemExit(f"--random-model {size!r}: choose one of {sorted(SIZES)}")
    fields = {**SIZES[size], **override}
    config = Qwen3Config(**fields, use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return save_model_dir(path, model, smoke_tokenizer(seed))


def add_random_model_arg(parser) -> None:
    """--random-model SIZE: the scripts' alternative to --model on a machine with no model files."""
    parser.add_argument("--random-model", choices=sorted(SIZES),
                        help="instead of --model: random weights in that model's architecture, built from its config "
                             "(no download; real compute and memory per token, meaningless text)")


def model_dir_for(args, tmp: str | Path) -> str:
    """The model directory a script measures: --model, a --random-model built under `tmp`, or the tiny smoke model."""
    if args.model and args.random_model:
        raise SystemExit("give --model or --random-model, not both")
    if args.random_model:
        return str(build_sized_model_dir(Path(tmp) / args.random_model, args.random_model))
    return args.model or str(build_tiny_model_dir(Path(tmp) / "tiny-qwen3"))


def model_label(args) -> str:
    if args.random_model:
        return f"{args.random_model} architecture, random weights (built from its config)"
    return args.model or "tiny random Qwen3 (smoke run)"


if __name__ == "__main__":  # save the tiny smoke model, e.g. to serve it with `tracerl serve`
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/gpu/gpu_bench_common.py DIR  (saves the tiny random Qwen3 there)")
    print(build_tiny_model_dir(sys.argv[1]))


@contextlib.contextmanager
def profiled(path: str | None, cuda: bool):
    """torch.profiler around the block when `path` is given; its operator tables go to `path`."""
    if not path:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
    table = prof.key_averages()
    by_device = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    Path(path).write_text(f"sorted by {by_device}\n{table.table(sort_by=by_device, row_limit=30)}\n\n"
                          f"sorted by cpu_time_total\n{table.table(sort_by='cpu_time_total', row_limit=30)}\n")


@contextlib.contextmanager
def host_profiled(path: str | None, rows: int = 40):
    """cProfile around the block when `path` is given: the Python functions by their own time and by cumulative
    time go to `path`. For a host-bound phase (decoding launches one small kernel at a time) this says where the
    host's seconds go: the model's forward, the engine's key/value bookkeeping, the driver, tokenizing, the tool."""
    if not path:
        yield
        return
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        out = io.StringIO()
        for order in ("tottime", "cumulative"):
            out.write(f"sorted by {order}\n")
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(rows)
        Path(path).write_text(out.getvalue())
