"""What every boundary where outside data comes in uses: one strict integer parser for numbers a peer writes, and
one bounded listing for errors that name keys a file, a row, a peer or the model chose.

`parse_int(text, field, error)` is the only way a number written by a server, a client or a file header becomes an
int: exactly `[0-9]{1,max_digits}` in ASCII (a leading `-` where the caller allows negatives), else the caller's own
error class (`EngineError`, `BadRequest`, ...) with a message naming the field. `str.isdigit` then `int` is not that:
`isdigit` accepts superscripts, which `int` then refuses with a bare ValueError ("²"), and Arabic-Indic or fullwidth
digits, which `int` silently reads ("١٢" is 12); `int` also takes signs, underscores and blanks, and a 5,000-digit
run raises ValueError past Python's conversion limit.

`listing(keys)` is how an error names keys it did not expect: the first few, sorted, each cut short, then
"and N more", so a file with a million unknown keys gives a message of a line, not a megabyte.

Deliberately not here: floats (JSON numbers arrive parsed; each field checks its own range), hexadecimal (HTTP
chunk sizes are read by `http.client` and uvicorn, not by tracerl).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from typing import Any

MAX_DIGITS = 18  # every count, id and byte length a peer may send fits 18 digits (and int64)
LISTED = 5  # keys a listing names before "and N more"
KEY_CHARS = 60  # characters of one key a listing shows

_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_int(text: Any, field: str, error: type[Exception] = ValueError, *, negative: bool = False,
              max_digits: int = MAX_DIGITS) -> int:
    """The integer `text` spells in ASCII digits (`-?[0-9]{1,max_digits}`, the sign only when `negative`), else
    `error(message)`, the message naming `field` and showing at most 20 characters of what was sent."""
    if isinstance(text, str):
        digits = text[1:] if negative and text.startswith("-") else text
        if _DIGITS.fullmatch(digits) and len(digits) <= max_digits:
            return int(text)
        sign = "an optional '-' and " if negative else ""
        problem = (f"{len(digits)} digits, more than {max_digits}" if _DIGITS.fullmatch(digits)
                   else f"not {sign}ASCII digits 0-9")
        raise error(f"{field} is {text[:20]!r}{'...' if len(text) > 20 else ''}: {problem}")
    raise error(f"{field} is a {type(text).__name__}, not a string of ASCII digits")


def listing(keys: Iterable[Any], limit: int = LISTED) -> str:
    """`keys` as a bounded list for an error message: "['a', 'b']", or the first `limit` (sorted by their repr) and
    "and N more"; each key is cut to `KEY_CHARS` characters. For the keys a file or a peer chose; the keys a
    config knows are the code's own and are listed whole."""
    items = list(keys)
    first = heapq.nsmallest(limit, items, key=repr)  # sorted; O(n) for a million keys
    head = "[" + ", ".join(_short(k) for k in first) + "]"
    return head if len(items) <= limit else f"{head} and {len(items) - limit} more"


def _short(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= KEY_CHARS else text[:KEY_CHARS - 3] + "..."
