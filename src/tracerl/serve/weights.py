"""`POST /v1/load_weights` for `tracerl serve`: read a state dict from a file, check every tensor, then swap it in.

All or nothing: the file is checked (a regular file no larger than the served model could justify: every element
as float64, plus overhead per tensor), loaded memory-mapped, and every tensor checked against the served model's
state dict (key set, `torch.Tensor`, dense strided layout, not on the meta device, a real floating dtype, the same
shape, finite values) and converted to the served dtype and device *before* the first parameter is written. Only
then are the parameters overwritten, by copies that cannot fail. A file that does not fit changes nothing.

A torch file is a zip, and a zip under that bound can inflate to gigabytes (a deflated entry grows up to about
1,000 times). So before torch reads it, `archive_problem` reads the zip's central directory and refuses a file whose
entries declare more bytes in all than the same bound, or use a method other than stored or deflated, and inflates
each deflated entry as a stream, 1 MiB at a time and thrown away, refusing it as soon as it grows past what it
declared (a zip may lie). torch then reads at most the declared sizes. `torch.save` writes stored entries, which
cost nothing here.

What it does not do: load adapters (send merged weights), change the architecture, or read files the server's
user cannot read.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import torch

from tracerl.engines.tensors import tensor_problem
from tracerl.io.files.boundary import listing


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
    problem = archive_problem(path, bound)
    if problem:
        raise WeightsError(f"{path} was not loaded: {problem}; save the state dict with torch.save(model.state_dict(), "
                           "path)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # not a torch file, truncated, or pickled objects weights_only refuses
        raise WeightsError(f"{path} is not a readable state dict ({type(err).__name__}: {str(err)[:200]}); save it "
                           "with torch.save(model.state_dict(), path)") from None
    problem = misfit(expected, state)
    if problem:
        raise WeightsError(f"the weights do not fit the served model, nothing was loaded: {problem}")
    return {k: state[k].to(device=v.device, dtype=v.dtype).contiguous() for k, v in expected.items()}


_INFLATE_CHUNK = 1 << 20  # bytes inflated at a time while checking a deflated entry
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip entry's local header: signature ... name and extra lengths


def archive_problem(path: Path, bound: int) -> str:
    """'' when the zip at `path` cannot make a reader hold more than `bound` bytes, else why (module docstring).

    Its central directory must end the file (no archive comment, as `torch.save` writes it), so that every zip
    reader finds the same one; its entries' declared sizes must sum to at most `bound`; and each deflated entry must
    inflate to exactly its declared size, which is checked with a running count before anything keeps its bytes."""
    try:
        with path.open("rb") as f, zipfile.ZipFile(f) as archive:
            f.seek(-22, 2)
            if f.read(4) != b"PK\x05\x06":
                return "the zip's central directory does not end the file (torch.save writes no archive comment)"
            entries = archive.infolist()
            declared = sum(e.file_size for e in entries)
            if declared > bound:
                return (f"its {len(entries)} zip entries declare {declared} bytes, more than the served model's "
                        f"weights can take up ({bound} bytes as float64)")
            for entry in entries:
                problem = _entry_problem(f, entry)
                if problem:
                    return f"zip entry {entry.filename!r}: {problem}"
    except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, ValueError, struct.error,
            zlib.error) as err:
        return f"it is not a zip that torch.save writes ({type(err).__name__}: {str(err)[:200]})"
    return ""


def _entry_problem(f, entry: zipfile.ZipInfo) -> str:
    """'' when `entry` holds exactly the bytes it declares: stored, the same size as it declares; deflated, a stream
    that inflates to exactly `entry.file_size` bytes, counted as it inflates."""
    if entry.compress_type == zipfile.ZIP_STORED:
        return "" if entry.compress_size == entry.file_size else \
            f"stored, but {entry.compress_size} bytes are said to hold {entry.file_size}"
    if entry.compress_type != zipfile.ZIP_DEFLATED:
        return f"compression method {entry.compress_type} (only stored and deflated entries are read)"
    f.seek(entry.header_offset)
    header = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if header[0] != 0x04034B50:
        return "no local header where the central directory says"
    f.seek(header[9] + header[10], 1)  # past the name and the extra field: the deflated stream starts here
    inflater, left, inflated = zlib.decompressobj(-15), entry.compress_size, 0
    while not inflater.eof:
        data = inflater.unconsumed_tail
        if not data and left:
            data = f.read(min(_INFLATE_CHUNK, left))
            left -= len(data)
        out = inflater.decompress(data, _INFLATE_CHUNK)  # at most 1 MiB comes out; the rest of `data` waits
        inflated += len(out)
        if inflated > entry.file_size:
            return f"declares {entry.file_size} bytes but inflates to more (stopped at {inflated})"
        if not data and not out:  # the file's bytes of this entry are spent and nothing more comes out
            break
    if not inflater.eof or inflated != entry.file_size:
        return f"declares {entry.file_size} bytes but inflates to {inflated}"
    return ""


def misfit(expected: dict[str, torch.Tensor], state: object) -> str:
    """'' when `state` has exactly `expected`'s keys, each a dense, finite, real floating tensor of the same shape."""
    if not isinstance(state, dict):
        return f"the file holds a {type(state).__name__}, not a state dict"
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        return f"missing {listing(missing)}, unexpected {listing(unexpected)}"
    problems = [f"{k}: {p}" for k, v in expected.items() if (p := tensor_problem(state[k], v))]
    return f"{len(problems)} tensors do not fit: {problems[:5]}" if problems else ""
