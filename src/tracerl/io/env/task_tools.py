"""The tools of a user's task: a function and its JSON schema, and how a stateful one branches.

`make_tool(fn)` gives a `UserTool`: the schema from the signature's type hints and the docstring (the first
paragraph describes the tool; `name: text` lines under `Args:` describe parameters), written as transformers'
`get_json_schema` writes it, which chat templates and verl's function tools use: `Optional[X]` / `X | None` add
`"nullable": true`, a union of plain types lists them and others become `anyOf`, `list[T]` has `items`,
`tuple[A, B]` `prefixItems`, `dict[str, T]` `additionalProperties`, a Literal or an Enum class is an `enum` of its
values (an Enum parameter receives the member). Or an explicit schema (`tool(fn, schema=...)`). A leading `state`
parameter is the episode's state, never shown to the model; `tool(state="copy" | "replay")` says how it branches
(`tracerl.io.env.task`). A tool may return a `ToolOutput` to leave a step reward on its turn. A schema nesting deeper
than `MAX_SCHEMA_DEPTH` fails at load (every walk over it is then bounded).

`ToolRunner` runs a task's tools and state factories in `tracerl.io.env.user_code.Runner`, the runner of all user code:
with `isolation="process"` (the default) in two worker processes forked from the trainer at the first call, which
hold the functions from that fork (closures work) and get the state and arguments pickled; a call past `timeout_s`
is killed with its worker and everything the worker started, and the worker replaced. With "thread" a call runs in
this process and is abandoned at the deadline. What a tool returns is cut to `max_output_chars` where it runs,
before it is sent back; a step reward that is not a finite number is a failed call. `counts` has the calls, errors
and timeouts.

Deliberately not here: checking arguments and phrasing errors (`tracerl.io.env.actions.call_tool`), episodes and
branching (`tracerl.io.env.task`).
"""

from __future__ import annotations

import enum
import functools
import inspect
import re
import threading
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from tracerl.io.env.actions import Tool, nesting_depth
from tracerl.io.env.user_code import CallFailed, CallTimeout, Runner, describe, finite_number

STATE_KINDS = ("copy", "replay")
ISOLATIONS = ("process", "thread")
MAX_SCHEMA_DEPTH = 64  # levels of objects and lists in a tool's schema
_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array",
              dict: "object", type(None): "null"}
_JSON_SCALAR = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


@dataclass(frozen=True)
class UserTool:
    """One tool of a task: its schema (as `Tool`), whether it takes the episode state, and how that state branches."""

    tool: Tool
    takes_state: bool = False  # the function's first parameter is the episode's state object
    state: str = ""  # "copy", "replay", or "" (stateless, or stateful without a declaration)


def tool(fn: Callable[..., Any] | None = None, *, state: str = "", schema: dict[str, Any] | None = None,
         name: str = "") -> Any:
    """Mark a function as a tool: `@tool`, `@tool(state="replay")`, or `tool(fn, schema={...})`.

    `state` says how a continuation resumes the state this tool changes ("copy" or "replay", see the module
    docstring); `schema` is an OpenAI-style function schema that replaces the derived one."""
    if state and state not in STATE_KINDS:
        raise ValueError(f"tool state={state!r}; use 'copy' (Python data, deep-copied) or 'replay' (outside state, "
                         "resumed by replaying the calls)")

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__tracerl_tool__ = {"state": state, "schema": schema, "name": name}
        return f
    return mark(fn) if fn is not None else mark


def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    head, _, rest = doc.partition("\nArgs:")
    described: dict[str, str] = {}
    for line in rest.splitlines():
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)", line)
        if match:
            described[match.group(1)] = match.group(2).strip()
        elif line.strip() and not line.startswith((" ", "\t")):
            break  # the next section (Returns:, Raises:)
    return " ".join(head.split("\n\n")[0].split()), described


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    if not values or any(type(v) not in _JSON_SCALAR for v in values):
        raise ValueError(f"{where}: the values {values!r} of its Literal or Enum must be str, int, float, bool or None")
    kinds = list(dict.fromkeys(_JSON_SCALAR[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema of a type hint, as transformers' `get_json_schema` (chat templates, verl's function tools)
    writes it: `X | None` and `Optional[X]` add `"nullable": true`, a union of plain types lists them, others
    become `anyOf`; `list[T]` has `items`, `tuple[A, B]` `prefixItems`, `dict[str, T]` `additionalProperties`;
    a Literal or an Enum class is an `enum` of its values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is None and isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_schema([member.value for member in annotation], where)
    if origin is typing.Union or origin is types.UnionType:
        options = [_json_type(a, where) for a in args if a is not type(None)]
        if len(options) == 1:
            out = options[0]
        elif all(o.keys() == {"type"} and isinstance(o["type"], str) for o in options):
            names = sorted({o["type"] for o in options})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": options}
        return {**out, "nullable": True} if type(None) in args else out
    if origin is typing.Literal:
        return _enum_schema(list(args), where)
    if origin is list and args:
        return {"type": "array", "items": _json_type(args[0], where)}
    if origin is tuple and args:
        if len(args) == 1 or ... in args:
            raise ValueError(f"{where} has type {annotation!r}; use list[T] for a sequence of any length, or a "
                             "tuple of two or more fixed types")
        return {"type": "array", "prefixItems": [_json_type(a, where) for a in args]}
    if origin is dict and len(args) == 2:
        return {"type": "object", "additionalProperties": _json_type(args[1], where)}
    if annotation is typing.Any:
        return {}
    base = origin or annotation
    if base not in _JSON_TYPE:
        raise ValueError(f"{where} has type {annotation!r}, which has no JSON schema type; annotate it with str, "
                         "int, float, bool, list[...], dict[str, ...], tuple[...], Optional[...], a union, a Literal "
                         "or an Enum, or pass schema={...} to tool()")
    return {"type": _JSON_TYPE[base]}


def schema_from_function(fn: Callable[..., Any], name: str = "") -> tuple[dict[str, Any], bool]:
    """(OpenAI function schema, takes_state) derived from `fn`'s signature and docstring.

    Every parameter except a leading `state` needs a type hint; parameters without a default are required."""
    label = f"tool {getattr(fn, '__qualname__', fn)!r}"
    try:
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError, NameError) as err:
        raise ValueError(f"{label}: cannot read its signature ({err}); pass schema={{...}} to tool()") from None
    takes_state = bool(params) and params[0].name == "state"
    description, described = _doc_parts(fn)
    if not description:
        raise ValueError(f"{label} has no docstring; its first paragraph is the description the model reads")
    properties, required = {}, []
    for p in params[takes_state:]:
        where = f"{label}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"{where}: *args/**kwargs have no schema; name each parameter or pass schema={{...}}")
        if p.name not in hints:
            raise ValueError(f"{where} has no type hint; add one (str, int, float, bool, list, dict)")
        properties[p.name] = {**_json_type(hints[p.name], where),
                              **({"description": described[p.name]} if p.name in described else {})}
        if p.default is p.empty:
            required.append(p.name)
    schema = {"type": "function", "function": {"name": name or fn.__name__, "description": description,
                                               "parameters": {"type": "object", "properties": properties,
                                                              "required": required}}}
    return schema, takes_state


def make_tool(fn: Callable[..., Any]) -> UserTool:
    """A `UserTool` from a function (marked with `tool` or not); raises ValueError when no schema can be had."""
    if not callable(fn):
        raise ValueError(f"tools must be functions, got {fn!r}")
    marks = getattr(fn, "__tracerl_tool__", {})
    schema = marks.get("schema")
    if schema is None:
        schema, takes_state = schema_from_function(fn, marks.get("name", ""))
    else:
        function = schema.get("function", schema)  # {"type": "function", "function": {...}} or the inner object
        if not isinstance(function.get("name"), str) or not isinstance(function.get("parameters", {}), dict):
            raise ValueError(f"tool {fn.__name__!r}: schema must be OpenAI-style {{'type': 'function', 'function': "
                             "{'name': ..., 'description': ..., 'parameters': {...}}}")
        schema = {"type": "function", "function": function}
        params = list(inspect.signature(fn).parameters)
        takes_state = bool(params) and params[0] == "state"
    function = schema["function"]
    depth = nesting_depth(function, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"tool {function['name']!r}: its schema nests deeper than {MAX_SCHEMA_DEPTH} levels of "
                         "objects and lists; no model reads such a schema: flatten it")
    parameters = function.get("parameters") or {"type": "object", "properties": {}, "required": []}
    return UserTool(Tool(function["name"], function.get("description", ""), parameters, _with_enums(fn)),
                    takes_state, marks.get("state", ""))


def _with_enums(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` taking the Enum members of its Enum-typed parameters from their JSON values (what the model writes)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an explicit schema over a function whose hints do not resolve: nothing to convert
        return fn
    enums = {k: h for k, h in hints.items() if isinstance(h, type) and issubclass(h, enum.Enum) and k != "return"}
    if not enums:
        return fn

    def converted(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: enums[k](v) if k in enums else v for k, v in kwargs.items()})
    return converted


@dataclass(frozen=True)
class ToolOutput:
    """What a tool may return besides text: the observation plus a step reward and metrics (verl's `execute`
    returns this triple). The reward is kept on the turn's node (`meta["tool_reward"]`), not added to the leaf's."""

    text: str
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


def _call(fn: Callable[..., Any], takes_state: bool, give_state: bool, state: Any, arguments: dict[str, Any],
          max_chars: int) -> tuple[str, dict[str, Any], Any]:
    """One tool call where it runs (a worker process, or a thread): (observation cut to `max_chars`, what it leaves
    on its node, the state after it when `give_state`)."""
    out = fn(state, **arguments) if takes_state else fn(**arguments)
    meta: dict[str, Any] = {}
    if isinstance(out, ToolOutput):
        reward = None if out.reward is None else finite_number(out.reward)
        if out.reward is not None and reward is None:
            raise ValueError(f"it returned a step reward of {describe(out.reward)}; a ToolOutput's reward must be a "
                             "finite number or None")
        meta = {"tool_reward": reward, **({"tool_metrics": dict(out.metrics)} if out.metrics else {})}
    text = str(out)
    if len(text) > max_chars:
        text = f"{text[:max_chars]} [cut: the tool returned {len(text)} characters; max_tool_output_chars={max_chars}]"
    return text, meta, state if give_state else None


class ToolRunner:
    """A task's tool calls and state factories under one deadline and output cap (module docstring)."""

    def __init__(self, tools: dict[str, UserTool], make_state: Callable[..., Any] | None = None,
                 close_state: Callable[..., Any] | None = None, *, timeout_s: float = 10.0,
                 max_output_chars: int = 100_000, isolation: str = "process") -> None:
        if finite_number(timeout_s) is None or timeout_s <= 0:
            raise ValueError(f"tool_timeout_s={timeout_s!r} must be a finite number of seconds > 0 (the deadline of "
                             "every tool call, make_state and close_state); raise it for slow tools")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"max_tool_output_chars={max_output_chars!r} must be an int >= 1 (a tool's text beyond "
                             "it is cut where the tool runs)")
        if isolation not in ISOLATIONS:
            raise ValueError(f"tool_isolation={isolation!r}; use 'process' (worker processes, killed at a call's "
                             "deadline) or 'thread' (in this process, for tools that need its threads)")
        self.timeout_s, self.max_output_chars, self.isolation = timeout_s, max_output_chars, isolation
        # Python state comes back after each call; "replay" state lives outside Python, where its changes stay
        self._entries = {name: functools.partial(_call, t.tool.fn, t.takes_state, t.takes_state and t.state != "replay")
                         for name, t in tools.items()}
        self.make_state, self.close_state = make_state, close_state
        inherited = [*self._entries.values(), *(f for f in (make_state, close_state) if f is not None)]
        self.runner = Runner(isolation, workers=2, timeout_s=timeout_s, label="tool", inherited=inherited)
        self.counts = {"calls": 0, "errors": 0, "timeouts": 0}
        self._lock = threading.Lock()

    def call(self, name: str, state: Any, arguments: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
        """(observation, node meta, state after the call: the one sent back for Python state under "process", else
        `state`); raises CallFailed / CallTimeout, counted."""
        entry = self._entries[name]
        try:
            text, meta, after = self.runner.call(entry, state, arguments, self.max_output_chars)
        except CallFailed as err:
            self._count("timeouts" if isinstance(err, CallTimeout) else "errors")
            raise
        self._count(None)
        return text, meta, after if entry.args[2] else state

    def new_state(self, row: dict[str, Any]) -> Any:
        """make_state(row) under the tools' deadline; raises CallFailed / CallTimeout."""
        assert self.make_state is not None, "the task has no make_state"
        return self.runner.call(self.make_state, row)

    def free_state(self, state: Any, wait: bool = True) -> None:
        """close_state(state) under the tools' deadline; raises CallFailed / CallTimeout. With `wait=False` (from a
        `__del__`, which must not block: it may run in any thread, a worker thread of this runner too) the call is
        only started, and a failure is a warning."""
        if self.close_state is None:
            return
        if wait:
            self.runner.call(self.close_state, state)
            return

        def report(future: Any) -> None:
            if not future.cancelled() and future.exception() is not None:
                warnings.warn(f"the task's close_state failed: {future.exception()}", UserWarning, stacklevel=2)
        self.runner.submit(self.close_state, state).add_done_callback(report)

    def close(self) -> None:
        """Kill the worker processes (and what their calls left running); a later call starts fresh ones."""
        self.runner.close()

    def _count(self, failure: str | None) -> None:
        with self._lock:
            self.counts["calls"] += 1
            if failure:
                self.counts[failure] += 1
