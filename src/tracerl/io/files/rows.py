"""Prompt rows checked at load: verl's layout, with message shapes and types by allowlist.

A row is a JSON object: `data_source` (text or null), `prompt` (a list of chat messages, or a string: the user's
question), `reward_model` (an object with `ground_truth`, any JSON value, since the reward reads it) and
`extra_info` (an object or null). A message is exactly `{"role", "content"}`: the role one of `ROLES`, the content
a string or a list of OpenAI text parts `[{"type": "text", "text": ...}]`, joined by newlines (as vLLM's chat
utilities join text parts). The last message is the user's, and its text is not blank. A key whose value is null
counts as absent (parquet gives every struct of a column the union of their keys, the missing ones null). Anything
else is refused with a `ValueError` naming the row and the field (`data/train.jsonl row 3: prompt[0].content is
null; ...`), so no row trains on an empty question or on the Python repr of a value.

A ground truth holds no NaN or infinity at any depth (JSON's `NaN`, `Infinity` and `1e400` read as such floats):
none can be matched, and its text "nan" or "inf" would score an answer "nan" as right. `non_finite` is the one test,
used by the loaders here and by the scorers, which never take a non-finite value for a match. `check_ids` refuses
two rows of one load with one id (`prompt_id`, the id of a row's trees and histories; or the dataset's own
`extra_info.id`): the trees of two rows would be taken for one prompt's.

`read_row_file(path)` reads a rows file (parquet, or JSONL: one JSON object per line) into records, and
`parquet_records` a parquet file: an error names the file and what to fix, a file that is not UTF-8 the byte
offset of its first bad byte (`tracerl.io.files.read_utf8`), a parquet text value that is not UTF-8 its column.

Deliberately not here: what the text says (control tokens written in it are neutralised when the prompt is
rendered, by the function that neutralises tool observations: `tracerl.io.rollout.chat.neutralise`), images and other
non-text content parts, tool calls and tool messages inside a prompt.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.io.files import read_utf8
from tracerl.io.files.boundary import listing

ROLES = ("system", "user", "assistant")
MESSAGE = "{'role': 'user', 'content': '...'}"


def _kind(value: Any) -> str:
    """What a JSON value is, for a message: 'null', 'a number (5)', 'a list ([1])', ..."""
    if value is None:
        return "null"
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a string" if isinstance(value, str) else "a list" if isinstance(value, list)
            else "an object" if isinstance(value, dict) else f"a {type(value).__name__}")
    return f"{kind} ({value!r:.40})"


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` without the keys whose value is null."""
    return {k: v for k, v in fields.items() if v is not None}


def _content(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where} is {_kind(content)}; write the text as a string (or a list of OpenAI text parts "
                         "[{'type': 'text', 'text': '...'}])")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise ValueError(f"{at} is {_kind(part)}; a content part is {{'type': 'text', 'text': '...'}}")
        part = _present(part)
        if part.get("type") != "text":
            raise ValueError(f"{at}.type is {_kind(part.get('type'))}; only text parts are supported "
                             "({'type': 'text', 'text': '...'}): images and other parts cannot be trained on here")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{at}.text is {_kind(part.get('text'))}; write the text as a string")
        extra = set(part) - {"type", "text"}
        if extra:
            raise ValueError(f"{at} has key(s) {listing(extra)}; a text part holds only 'type' and 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def check_prompt(prompt: Any, where: str) -> list[dict[str, str]]:
    """`prompt` as a list of {"role", "content": str} ending with the user's non-blank question; ValueError naming
    `where` and the field otherwise."""
    head = f"{where} has no usable 'prompt':"
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{head} prompt is {_kind(prompt)}; write a list of chat messages [{MESSAGE}] ending "
                         "with the user's, or the question as a string")
    messages = []
    for i, message in enumerate(prompt):
        at = f"{head} prompt[{i}]"
        if not isinstance(message, dict):
            raise ValueError(f"{at} is {_kind(message)}, not a message {MESSAGE}")
        message = {"role": None, "content": None, **_present(message)}  # a missing one is named as null below
        extra = set(message) - {"role", "content"}
        if extra:
            raise ValueError(f"{at} has key(s) {listing(extra)}; a message holds only 'role' and 'content'")
        role = message["role"]
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(f"{at}.role is {_kind(role)}; use one of {', '.join(ROLES)}")
        messages.append({"role": role, "content": _content(message["content"], f"{at}.content")})
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise ValueError(f"{head} prompt[{last}] is the {messages[last]['role']}'s; a prompt ends with the user's "
                         "message, the question the model answers")
    if not messages[last]["content"].strip():
        raise ValueError(f"{head} prompt[{last}].content is blank; the user's message is the question the model "
                         "answers")
    return messages


def check_row(row: Any, where: str) -> dict[str, Any]:
    """`row` checked field by field, with its prompt normalised by `check_prompt`; ValueError naming `where` (the
    file and row) and the field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where} is {_kind(row)}, not an object with data_source, prompt, reward_model, "
                         "extra_info")
    data_source = row.get("data_source")
    if data_source is not None and not isinstance(data_source, str):
        raise ValueError(f"{where}: data_source is {_kind(data_source)}; write a string (it names the dataset the "
                         "reward scores by)")
    prompt = check_prompt(row.get("prompt"), where)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise ValueError(f"{where} has no 'reward_model.ground_truth'; add "
                         "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": ...}")
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        raise ValueError(f"{where}: extra_info is {_kind(extra_info)}; write an object (or leave it out)")
    bad = _first_non_finite(reward_model["ground_truth"], "reward_model.ground_truth")
    if bad is not None:
        raise ValueError(f"{where}: {bad[0]} is {bad[1]}; a ground truth must be a finite number (NaN and infinity "
                         "match no answer, and as text 'nan' would match an answer 'nan'): fix the value or drop "
                         "the row")
    return {**row, "prompt": prompt}


def non_finite(value: Any, *, text: bool = False) -> bool:
    """True for a float that is NaN or infinite; with `text`, also for a string `float()` reads as one ("nan",
    "-Infinity", "1e400"). Scorers call it on a ground truth (and on what they parse from an answer) so that no
    non-finite value ever counts as a match."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if text and isinstance(value, str) and len(value) < 1000:
        try:
            return not math.isfinite(float(value))
        except ValueError:
            return False
    return False


def _first_non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """(path, value) of the first non-finite float in a JSON value, walked without recursion (any depth)."""
    stack = [(path, value)]
    while stack:
        at, item = stack.pop()
        if non_finite(item):
            return at, item
        if isinstance(item, dict):
            stack += [(f"{at}.{k}", v) for k, v in reversed(item.items())]
        elif isinstance(item, list):
            stack += [(f"{at}[{i}]", v) for i, v in reversed(list(enumerate(item)))]
    return None


def prompt_id(row: dict[str, Any]) -> str:
    """A row's id in trees and histories, "<data_source>:<split>:<index>" (shared with the Ray rollout workers)."""
    extra = row.get("extra_info") or {}
    return f"{row.get('data_source', '')}:{extra.get('split', '')}:{extra.get('index', '')}"


def check_ids(rows: Sequence[dict[str, Any]], wheres: Sequence[str]) -> None:
    """ValueError naming both rows when two of `rows` share a `prompt_id` or a dataset id (`extra_info.id`, where
    present); `wheres[i]` names row i (file and row)."""
    seen: dict[tuple[str, str], str] = {}
    for row, where in zip(rows, wheres):
        extra = row.get("extra_info") or {}
        keys = [("id", repr(prompt_id(row)))] + ([("extra_info.id", repr(extra["id"]))] if extra.get("id") is not None
                                           else [])
        for key in keys:
            if key in seen:
                raise ValueError(f"{where} has the {key[0]} {key[1][:80]} of {seen[key]}; every row needs its own "
                                 "(its trees and histories are keyed by it): drop the repeated row, or give it "
                                 "another extra_info.index" + (" or extra_info.id" if key[0] != "id" else ""))
            seen[key] = where


def parquet_records(path: Path) -> list[dict[str, Any]]:
    """The rows of parquet file `path` as dicts; ValueError naming the file when pyarrow is missing, the file does
    not read as parquet, or a text value is not UTF-8 (pyarrow's own errors name neither the file nor the column)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow: pip install pyarrow (or write the rows as JSONL)") from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # ArrowInvalid, OSError: pyarrow's errors do not name the file
        raise ValueError(f"{path}: not a readable parquet file ({str(err)[:300]})") from None
    try:
        return table.to_pylist()
    except UnicodeDecodeError as err:
        column = next((name for name in table.column_names if not _decodes(table.column(name))), "?")
        raise ValueError(f"{path}: column {column!r} holds text that is not UTF-8 (byte {err.start} of a value is "
                         f"{err.reason}); save it as UTF-8 (write its strings as UTF-8 text)") from None


def _decodes(column: Any) -> bool:
    try:
        column.to_pylist()
    except UnicodeDecodeError:
        return False
    return True


def read_row_file(path: Path) -> list[Any]:
    """The records of a rows file: parquet, or JSONL (`.jsonl`, and `.json` read the same way); ValueError naming
    the file, and the line or byte, for anything that cannot be read (see the module docstring)."""
    if path.suffix == ".parquet":
        return parquet_records(path)
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; use .parquet or .jsonl")
    records = []
    for number, line in enumerate(read_utf8(path).splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not JSON ({err.msg}); write one JSON object per line") from None
            except RecursionError:
                raise ValueError(f"{path}:{number} nests deeper than Python's JSON parser can read; write one "
                                 "JSON object per line") from None
    return records
