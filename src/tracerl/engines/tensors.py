"""What a tensor of a state dict must be before it is copied into a model: dense, with data, of a real floating dtype,
of the model's shape, finite. One check for every weight load (`tracerl serve`'s `load_weights`, `VLLMEngine`), so
the engines refuse the same things with the same words.
"""

from __future__ import annotations

from typing import Any

import torch


def tensor_problem(tensor: Any, like: torch.Tensor | None) -> str:
    """'' when `tensor` can be loaded where `like` (the model's tensor, or a meta one; None: shape unknown) goes,
    else why not."""
    if not isinstance(tensor, torch.Tensor):
        return f"a {type(tensor).__name__}, not a tensor"
    if tensor.layout != torch.strided:
        return f"layout {tensor.layout} (sparse or other); send dense tensors"
    if tensor.is_meta:
        return "a meta tensor (no data)"
    if not tensor.is_floating_point():
        return f"dtype {tensor.dtype}; need a real floating dtype" + (f" like {like.dtype}" if like is not None else "")
    if like is not None and tensor.shape != like.shape:
        return f"shape {tuple(tensor.shape)}, the model's is {tuple(like.shape)}"
    if not bool(torch.isfinite(tensor).all()):
        return "holds NaN or inf values (not finite)"
    return ""
