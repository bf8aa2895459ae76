"""Reading the files a user or a run wrote: text is UTF-8, and data nests a bounded number of levels.

The files' room: beside this, typed configs (`config`), prompt rows (`rows`), a run's folder (`run_folder`), its
metrics log and trees (`runlog`), state files (`state`), and numbers and key listings from a peer (`boundary`).

`read_utf8(path)` (and `decode_utf8(data, where)` for bytes already read) is how every data, config and run file
becomes text: a file that is not UTF-8 (latin-1, UTF-16, a binary file renamed) is a `ValueError` naming the file,
the offset in the file of the first byte that does not decode, and the fix, instead of a bare `UnicodeDecodeError`
("'utf-8' codec can't decode byte 0xff in position 14") that names neither the file nor what to do.

`check_depth(value, where)` bounds how deep parsed data nests before anything walks it. Parsers accept more than a
walk can take: TOML's dotted keys and table headers (`a.b.c... = 1`) nest at any depth without recursing, JSON nests
to about a thousand levels, and every recursive walk over the result (building a dataclass, copying, listing keys,
comparing two configs) then ends in `RecursionError` somewhere far from the file. A config nests a few levels, so
`MAX_DEPTH` refuses what no config needs, at the boundary, naming the file; the walk itself is a loop, so it measures
any depth safely.

Deliberately not here: other encodings (one encoding for every file: the fix is to save the file as UTF-8), a byte
order mark (a UTF-8 one decodes; the parser then names it), size limits (each reader caps its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_DEPTH = 32  # levels of tables and lists a config may nest (the deepest built-in one nests 5)
_BOMS = {b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def decode_utf8(data: bytes, where: str) -> str:
    """`data` decoded as UTF-8, else ValueError naming `where` (the file), the byte offset of the first byte that
    does not decode, and the fix."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        hint = next((f"; it starts with a {name} byte order mark" for bom, name in _BOMS.items()
                     if data.startswith(bom)), "")
        raise ValueError(f"{where} is not UTF-8 text: byte {err.start} (0x{data[err.start]:02x}) is {err.reason}"
                         f"{hint}; save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def read_utf8(path: str | Path) -> str:
    """The text of file `path`, decoded by `decode_utf8` (the message names the path)."""
    return decode_utf8(Path(path).read_bytes(), str(path))


def nesting(value: Any, limit: int = MAX_DEPTH) -> int:
    """How many levels of dicts and lists `value` nests ({"a": [1]} nests 2, a number 0), counted without recursion
    and only up to `limit + 1` (a deeper value reads as `limit + 1`)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return limit + 1
        stack.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(where: str, limit: int = MAX_DEPTH) -> ValueError:
    """The error for data at `where` nesting deeper than `limit` levels (also for a parser whose stack ran out)."""
    return ValueError(f"{where} nests deeper than the {limit} levels of tables and lists a config may have; "
                      "write it flatter")


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """`too_deep(where)` raised when `value` nests deeper than `limit` levels (see the module docstring)."""
    if nesting(value, limit) > limit:
        raise too_deep(where, limit)
