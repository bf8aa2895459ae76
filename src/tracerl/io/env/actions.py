"""Parse one policy turn into a tool call, a final answer, or a format error (Qwen3 / Hermes style).

A turn is free text (the thought) followed by either

    <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>

or a final answer `<answer>...</answer>`. Anything else is a format error, returned as data so the
environment can show it to the model as an observation. Nothing here raises on model output: arguments that nest
deeper than `MAX_ARGUMENT_DEPTH` are a format error too, so nothing downstream (a deep copy for a snapshot, pickling
to a tool's process, JSON for a replay) walks a structure the model made as deep as it likes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from tracerl.io.env.user_code import CallFailed
from tracerl.io.files.boundary import listing

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
MAX_ACTION_CHARS = 20_000  # longer turns are cut before parsing; a 100 KB reply cannot stall a regex
MAX_INT_DIGITS = 64  # integers in tool-call JSON longer than this are a format error (int() is quadratic in digits)
MAX_ARGUMENT_DEPTH = 32  # tool-call arguments nesting deeper (lists and objects) are a format error
_TOO_DEEP = f"tool call arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels of lists and objects"


def nesting_depth(value: Any, limit: int) -> int:
    """How deep `value` nests lists, tuples and dicts (a scalar is 0, [] is 1), counted without recursion and
    without looking further than `limit + 1` levels: any result above `limit` means "too deep"."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            deepest = max(deepest, depth)
            if depth <= limit:
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS} are accepted)")
    return int(digits)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


@dataclass
class Action:
    kind: str  # "tool_call", "answer" or "invalid"
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str = ""
    error: str = ""  # why the turn is invalid, phrased for the model


def parse_action(text: str) -> Action:
    """The first tool call or answer in `text`; a tool call wins if it comes first."""
    text = text[:MAX_ACTION_CHARS]
    call, answer = TOOL_CALL.search(text), ANSWER.search(text)
    if answer and (not call or answer.start() < call.start()):
        return Action("answer", answer=answer.group(1).strip())
    if not call:
        return Action("invalid", error="no <tool_call> or <answer> found; call a tool or give <answer>...</answer>")
    try:
        payload = json.loads(call.group(1).strip(), parse_int=_bounded_int, parse_constant=_no_constant)
    except RecursionError:  # deeper than Python's JSON parser goes
        return Action("invalid", error=_TOO_DEEP)
    except ValueError as err:  # JSONDecodeError is a ValueError; so is an over-long integer
        return Action("invalid", error=f"tool call is not valid JSON ({err.__class__.__name__}: {str(err)[:80]})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return Action("invalid", error='tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models send arguments as a JSON string
        try:
            arguments = json.loads(arguments, parse_int=_bounded_int, parse_constant=_no_constant)
        except RecursionError:
            return Action("invalid", error=_TOO_DEEP)
        except ValueError:
            return Action("invalid", error="tool call arguments are a string that is not JSON")
    if not isinstance(arguments, dict):
        return Action("invalid", error="tool call arguments must be a JSON object")
    if nesting_depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
        return Action("invalid", error=_TOO_DEEP)
    return Action("tool_call", name=payload["name"], arguments=arguments)


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its schema (OpenAI function format) and the function that runs it."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments: {"type": "object", "properties": ..., "required": [...]}
    fn: Callable[..., str]

    def schema(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict,
               "null": type(None)}


def _fits(value: Any, kind: str) -> bool:
    expected = _JSON_TYPES.get(kind, object) if isinstance(kind, str) else object
    return isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int, float)))


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> str:
    """'' if `arguments` fit the tool's schema (required keys, no unknown keys, basic types), else the problem."""
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    if missing:
        return f"{tool.name}: missing required argument(s) {missing}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"{tool.name}: unknown argument(s) {listing(unknown)}; expected {listing(props, limit=20)}"
    for key, value in arguments.items():
        kinds = props[key].get("type", "")  # one JSON type, a list of them (a union), or none (anyOf, Any)
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if value is None and (props[key].get("nullable") or "null" in kinds):
            continue
        if not any(_fits(value, kind) for kind in kinds):
            return f"{tool.name}: argument {key!r} must be of type {props[key].get('type')}"
    return ""


def call_tool(tools: dict[str, Tool], action: Action) -> tuple[str, bool]:
    """Run a parsed tool call; returns (observation text, tool_error). Never raises on model input."""
    tool = tools.get(action.name)
    if tool is None:
        return f"error: unknown tool {action.name[:80]!r}; available: {sorted(tools)}", True
    problem = check_arguments(tool, action.arguments)
    if problem:
        return f"error: {problem}", True
    try:
        return str(tool.fn(**action.arguments)), False
    except CallFailed as err:  # the runner of user code: the tool raised ("Type: text"), timed out or died
        return f"error: {tool.name} failed: {err}", True
    except Exception as err:  # a tool failing on model-chosen arguments is data for the model
        return f"error: {tool.name} failed: {err.__class__.__name__}: {str(err)[:200]}", True
