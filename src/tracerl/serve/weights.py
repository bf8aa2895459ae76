"""`POST /v1/load_weights` for `tracerl serve`: read a state dict from a file, check every tensor, then swap it in.

All or nothing: the file is checked (a regular file no larger than the served model could justify: every element
as float64, plus overhead per tensor), loaded memory-mapped, and every tensor checked against the served model's
state dict (key set, `torch.Tensor`, dense strided layout, not on the meta device, a real floating dtype, the same
shape, finite values) and converted to the served dtype and device *before* the first parameter is written. Only
then are the parameters overwritten, by copies that cannot fail. A file that does not fit changes nothing.

What it does not do: load adapters (send merged weights), change the architecture, or read files the server's
user cannot read.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tracerl.engines.tensors import tensor_problem
from tracerl.io.boundary import listing


class WeightsError(ValueError):
    """A weights file that cannot be loaded into the served model (HTTP 400); nothing was changed."""


def max_file_bytes(expected: dict[str, torch.Tensor]) -> int:
    """The largest file a state dict of `expected`'s tensors can justify: float64 elements, 4 KiB per tensor, 1 MiB."""
    return sum(t.numel() for t in expected.values()) * 8 + 4096 * len(expected) + (1 << 20)


def read_checked(path: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict at `path`, each tensor converted to its counterpart in `expected` (dtype, device, contiguous),
    or WeightsError naming the file and the first problems."""
    if not path.is_file():  # also refuses devices, FIFOs and directories, which could block or never end
        raise WeightsError(f"no weights file at {path}; save the state dict with torch.save on a path the server can "
                           "read")
    size, bound = path.stat().st_size, max_file_bytes(expected)
    if size > bound:
        raise WeightsError(f"{path} has {size} bytes, more than the served model's weights can take up ({bound} bytes "
                           "as float64); save only the model's state dict")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # not a torch file, truncated, or pickled objects weights_only refuses
        raise WeightsError(f"{path} is not a readable state dict ({type(err).__name__}: {str(err)[:200]}); save it "
                           "with torch.save(model.state_dict(), path)") from None
    problem = misfit(expected, state)
    if problem:
        raise WeightsError(f"the weights do not fit the served model, nothing was loaded: {problem}")
    return {k: state[k].to(device=v.device, dtype=v.dtype).contiguous() for k, v in expected.items()}


def misfit(expected: dict[str, torch.Tensor], state: object) -> str:
    """'' when `state` has exactly `expected`'s keys, each a dense, finite, real floating tensor of the same shape."""
    if not isinstance(state, dict):
        return f"the file holds a {type(state).__name__}, not a state dict"
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        return f"missing {listing(missing)}, unexpected {listing(unexpected)}"
    problems = [f"{k}: {p}" for k, v in expected.items() if (p := tensor_problem(state[k], v))]
    return f"{len(problems)} tensors do not fit: {problems[:5]}" if problems else ""
