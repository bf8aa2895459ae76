"""One `/v1/completions` body, from bytes to prompts and sampling params, bounded in time and memory.

Two steps, both run off the event loop by the app:
1. `structure_problem` counts brackets, braces and commas in the raw bytes (C-speed `bytes.count`) and refuses a body
   whose JSON would hold more arrays, objects or elements than the limits allow a real request, before `json.loads`
   builds anything: 300,000 empty objects, 100,000 nested lists or a million strings never become Python objects.
   String contents are counted too, so the check over-counts, never under.
2. `parse_completion` reads each field by hand and stops at the first bad element (a validator that reports every
   bad element of a 300,000-element list is itself the attack), then applies the limits: n, prompts x n, max_tokens,
   the token budget prompts x n x max_tokens, ids in the vocabulary, prompt + max_tokens within the positions.

Every string of a body, field names included and whether this server reads the field or not, must be Unicode text:
the body is read as UTF-8 (bytes that are not become lone surrogates), and `load_json` refuses any string holding a
lone surrogate (which JSON can also write as an escape, "\\ud800") with a 400 naming the field, so no codec error
reaches a message, a log or a file name later.

Temperatures in (0, MIN_TEMPERATURE) are refused (HTTP 400), not served as greedy: logits / T overflows float32
below about 1e-38, and between that and the floor a trainer recomputing log_softmax(logits / T) would disagree with
a greedy logprob. Send 0 for greedy.

What it does not do: text prompts, `stream`, `echo`, `stop` strings, top-k logprobs (each a 400 with the fix).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tracerl.io.rollout.engine import MIN_TEMPERATURE, SamplingParams

from .limits import ServeLimits

MAX_STOP_TOKEN_IDS = 1024  # stop ids one request may send
_MAX_OBJECTS = 16  # JSON objects in a body: the body itself, plus a few for fields other servers take
_EXTRA_ELEMENTS = 256 + MAX_STOP_TOKEN_IDS  # JSON elements beyond the prompt ids: fields and stop ids
_EXAMPLE = 'Send JSON like {"prompt": [1, 2, 3], "max_tokens": 16}'


class BadRequest(ValueError):
    """A request this server cannot answer as asked (HTTP 400)."""


@dataclass(frozen=True)
class CompletionRequest:
    """What `/v1/completions` serves: checked prompts (lists of ids), n samples each, the sampling params."""

    model: str | None
    prompts: list[list[int]]
    n: int
    params: SamplingParams
    logprobs: bool  # return the sampled token's logprob (logprobs=0)
    return_tokens_as_token_ids: bool


def structure_problem(body: bytes, limits: ServeLimits) -> str:
    """'' when the JSON in `body` can hold no more arrays, objects and elements than a request within `limits`
    needs, else what is over. Counts bytes only; `json.loads` has not run."""
    max_arrays = limits.max_samples + 4  # a list per prompt, the list of prompts, stop_token_ids
    max_elements = limits.max_prompt_tokens + limits.max_samples + _EXTRA_ELEMENTS
    arrays, objects, commas = body.count(b"["), body.count(b"{"), body.count(b",")
    if objects > _MAX_OBJECTS:
        return f"the body holds {objects} JSON objects; a request needs 1"
    if arrays > max_arrays:
        return (f"the body holds {arrays} JSON arrays; a request within max_samples={limits.max_samples} needs at "
                f"most {max_arrays}")
    if commas + 1 > max_elements:
        return (f"the body holds about {commas + 1} JSON elements; max_prompt_tokens={limits.max_prompt_tokens} "
                f"allows {max_elements}")
    return ""


def parse_completion(body: bytes, limits: ServeLimits, vocab_size: int | None = None,
                     max_positions: int | None = None) -> CompletionRequest:
    """The request in `body`, or BadRequest naming the field and the fix (see the module docstring)."""
    problem = structure_problem(body, limits)
    if problem:
        raise BadRequest(f"bad request: {problem}. {_EXAMPLE}")
    data = load_json(body)
    if not isinstance(data, dict):
        raise BadRequest(f"bad request: the body is a JSON {type(data).__name__}, not an object. {_EXAMPLE}")
    for name, allowed in (("stream", "stream=false"), ("echo", "echo=false (the prompt is the ids you sent)")):
        if data.get(name) not in (None, False):
            raise BadRequest(f"{name}={data[name]!r} is not supported; send {allowed}")
    if data.get("stop"):
        raise BadRequest(f"stop strings {str(data['stop'])[:100]!r} are not supported; send stop_token_ids instead")
    logprobs = data.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or logprobs != 0):
        raise BadRequest(f"logprobs={str(logprobs)[:40]} is not supported; send logprobs=0 (the sampled token's "
                         "logprob) or leave it out")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string, not {type(model).__name__}")

    n = _integer(data, "n", 1)
    max_tokens = _integer(data, "max_tokens", 16)
    seed = _integer(data, "seed", None)
    temperature = _number(data, "temperature", 1.0)
    top_p = _number(data, "top_p", 1.0)
    if n < 1:
        raise BadRequest(f"n={n} must be >= 1")
    if n > limits.max_n:
        raise BadRequest(f"n={n} exceeds the limit max_n={limits.max_n}; send fewer samples per request or restart "
                         "the server with a larger --max-n")
    if max_tokens < 1:
        raise BadRequest(f"max_tokens={max_tokens}: need max_tokens >= 1")
    if max_tokens > limits.max_tokens:
        raise BadRequest(f"max_tokens={max_tokens} exceeds the limit max_tokens={limits.max_tokens}; lower it or "
                         "restart the server with a larger --max-tokens")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise BadRequest(f"temperature={temperature}: need a finite temperature >= 0 (0 = greedy)")
    if 0 < temperature < MIN_TEMPERATURE:
        raise BadRequest(f"temperature={temperature} is below the floor {MIN_TEMPERATURE} (logits / T would overflow "
                         "or disagree with the trainer's recomputation); send 0 for greedy")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise BadRequest(f"top_p={top_p} must lie in (0, 1]")
    if seed is not None and not 0 <= seed < 2**63:
        raise BadRequest(f"seed={seed} must lie in [0, 2^63)")

    prompts = _prompts(data.get("prompt", _MISSING), vocab_size)
    if len(prompts) * n > limits.max_samples:
        raise BadRequest(f"{len(prompts)} prompts x n={n} = {len(prompts) * n} samples exceeds the limit max_samples="
                         f"{limits.max_samples}; split the request or restart the server with a larger --max-samples")
    if len(prompts) * n * max_tokens > limits.max_request_tokens:
        raise BadRequest(f"{len(prompts)} prompts x n={n} x max_tokens={max_tokens} = "
                         f"{len(prompts) * n * max_tokens} tokens exceeds the limit max_request_tokens="
                         f"{limits.max_request_tokens}; split the request or raise ServeLimits.max_request_tokens")
    num_prompt_tokens = sum(map(len, prompts))
    if num_prompt_tokens > limits.max_prompt_tokens:
        raise BadRequest(f"the prompts hold {num_prompt_tokens} ids, over the limit max_prompt_tokens="
                         f"{limits.max_prompt_tokens}; split the request")
    longest = max(map(len, prompts))
    if max_positions and longest + max_tokens > max_positions:
        raise BadRequest(f"a prompt of {longest} tokens + max_tokens={max_tokens} > the model's {max_positions} "
                         "positions; shorten the prompt or lower max_tokens")
    stops = data.get("stop_token_ids") or []
    if not isinstance(stops, list) or len(stops) > MAX_STOP_TOKEN_IDS:
        raise BadRequest(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
    _check_ids("stop_token_ids", stops, vocab_size)
    params = SamplingParams(temperature=float(temperature), top_p=float(top_p), max_tokens=max_tokens,
                            stop_token_ids=tuple(stops), seed=seed)
    return CompletionRequest(model, prompts, n, params, logprobs is not None,
                             bool(data.get("return_tokens_as_token_ids")))


_MISSING = object()
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSON escape in U+D800..U+DFFF (maybe half a pair)


def load_json(body: bytes) -> Any:
    """The JSON value in `body` (UTF-8, a leading BOM ignored), every string of it Unicode text; else BadRequest
    naming the field (module docstring). Bodies with neither bytes that are not UTF-8 nor a surrogate escape, the
    usual case, are not walked: they cannot hold a lone surrogate."""
    try:
        text, clean = body.decode("utf-8-sig"), not _SURROGATE_ESCAPE.search(body)
    except UnicodeDecodeError:
        text, clean = body.decode("utf-8-sig", "surrogateescape"), False
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # not JSON, a number too long to convert
        raise BadRequest(f"bad request: the body is not JSON ({type(err).__name__}: {str(err)[:100]}). "
                         f"{_EXAMPLE}") from None
    problem = "" if clean else text_problem(data)
    if problem:
        raise BadRequest(f"{problem}: not Unicode text (a lone surrogate such as \\ud800, or bytes that are not "
                         "UTF-8); send UTF-8 text")
    return data


def text_problem(data: Any) -> str:
    """'' when every string in `data`, keys included, is Unicode text, else the field that holds one that is not:
    "model", "extra.nested[1].deeper", "a field name in logit_bias". Iterative: the depth is the client's."""
    todo: list[tuple[Any, tuple]] = [(data, ())]
    while todo:
        value, path = todo.pop()
        if isinstance(value, str):
            if not _is_text(value):
                return _field(path) or "the body"
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    return f"a field name in {_field(path) or 'the body'}"
                todo.append((item, (*path, key)))
        elif isinstance(value, list):
            todo.extend((item, (*path, i)) for i, item in enumerate(value) if isinstance(item, (str, list, dict)))
    return ""


def _is_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field(path: tuple) -> str:
    """A JSON path as a field name: keys joined by dots, list indexes in brackets, cut to 120 characters."""
    name = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")
    return name if len(name) <= 120 else name[:117] + "..."


def _integer(data: dict, name: str, default: int | None) -> int | None:
    value = data.get(name, default)
    if value is None and default is None:
        return None
    if type(value) is not int:  # not a bool, not 2.0
        raise BadRequest(f"{name}: must be an integer, not {str(value)[:40]!r}")
    return value


def _number(data: dict, name: str, default: float) -> float:
    value = data.get(name, default)
    if type(value) not in (int, float):
        raise BadRequest(f"{name}: must be a number, not {str(value)[:40]!r}")
    return float(value)


def _prompts(prompt: Any, vocab_size: int | None) -> list[list[int]]:
    if prompt is _MISSING:
        raise BadRequest(f"bad request: prompt: Field required. {_EXAMPLE}")
    if not isinstance(prompt, list) or prompt and not isinstance(prompt[0], (int, list)) \
            or prompt and type(prompt[0]) is bool:
        raise BadRequest("bad request: prompt: must be a list of token ids or a list of such lists (text prompts are "
                         f"not supported: tokenize first). {_EXAMPLE}")
    prompts = [prompt] if not prompt or not isinstance(prompt[0], list) else prompt
    for i, ids in enumerate(prompts):
        if not isinstance(ids, list):
            raise BadRequest(f"prompt {i} is not a list of token ids")
        if not ids:
            raise BadRequest("prompt is empty; send at least one token id" if len(prompts) == 1 else
                             f"prompt {i} is empty; send at least one token id")
        _check_ids(f"prompt {i}", ids, vocab_size)
    return prompts


def _check_ids(name: str, ids: list, vocab_size: int | None) -> None:
    """BadRequest at the first element of `ids` that is not an int in [0, vocab_size) (2^63 when unknown)."""
    bound = vocab_size if vocab_size is not None else 2**63
    for t in ids:
        if type(t) is not int or not 0 <= t < bound:
            raise BadRequest(f"{name} has token ids outside [0, {bound}) (e.g. {str(t)[:40]}); send ids from the "
                             "served model's vocabulary")
