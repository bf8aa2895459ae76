"""A user's own task: prompt rows from parquet or JSONL, tools as plain Python functions, a verl-style reward.

A task is a `UserTask` (made by a factory named in the config, `data.task = "my_pkg.tasks:make_task"`, whose rows
`data.train_files`/`data.test_files` may replace) or files alone (a tool-free task scored by `exact_match`). `UserTaskDomain`
wraps it in the interface the built-in domains have (`rows`, `make_env`, `expert_turn`), so the driver, the
trainer and the embedded policy's warm start run it unchanged.

- Rows are verl's layout: `data_source`, `prompt` (chat messages), `reward_model.ground_truth`, `extra_info`.
  A row without `prompt` or `reward_model.ground_truth` fails at load, naming the file and the line.
- A tool is a function; its JSON schema comes from its signature (type hints) and docstring (the first paragraph
  describes the tool, `name: text` lines under `Args:` describe parameters), or from an explicit OpenAI-style
  schema (`tool(fn, schema=...)`). A function whose schema cannot be derived fails at load.
- The reward has verl's custom-reward signature `compute_score(data_source, solution_str, ground_truth,
  extra_info)` and returns a number or a dict with a numeric "score". One that raises or returns anything else
  makes the leaf fail: `step` raises `RewardError`, which the driver turns into a failed leaf and counts in
  `rollout/env_exceptions`; the run goes on.

State for branching. A stateful tool takes the episode's state object as its first parameter, named `state` (made
per environment by `UserTask.make_state(row)`, never shown to the model), and declares how a continuation resumes
it: `state="copy"` (Python data: snapshot and restore deep-copy it, as the built-in domains do) or
`state="replay"` (outside state such as a database file or a sandbox: a snapshot is the list of tool calls made so
far, and restore replays them, in order, in the fresh environment the driver made; each replayed call must give
the observation it gave the first time, else restore raises). A stateful tool that declares neither runs, but
restoring a snapshot past its first call raises a `ValueError` naming the tool and the fix. Stateless tools (no
`state` parameter) need nothing.

Deliberately not here: async tools, tools that return images, reading parquet without pyarrow. verl's `BaseTool`
classes, tool config YAML and custom reward settings load into a `UserTask` in `tracerl.io.verl_task`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tracerl.io.actions import Tool, call_tool, parse_action
from tracerl.io.env import EpisodeError, StepResult
from tracerl.io.rows import check_row

STATE_KINDS = ("copy", "replay")
REWARD_ARGUMENTS = dict.fromkeys(("data_source", "solution_str", "ground_truth", "extra_info"))  # verl's call
_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class RewardError(EpisodeError):
    """The task's reward function raised or returned a non-number (the leaf fails; the run goes on)."""


# ---------------------------------------------------------------- tools

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


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPE[type(values[0])], "enum": values}
    base = origin or annotation
    if base not in _JSON_TYPE:
        raise ValueError(f"{where} has type {annotation!r}, which has no JSON schema type; annotate it with str, "
                         "int, float, bool, list, dict or a Literal, or pass schema={...} to tool()")
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
    parameters = function.get("parameters") or {"type": "object", "properties": {}, "required": []}
    return UserTool(Tool(function["name"], function.get("description", ""), parameters, fn), takes_state,
                    marks.get("state", ""))


# ---------------------------------------------------------------- reward

def score_of(value: Any) -> float:
    """A reward function's result as a float: a finite number, or a dict with a numeric "score" (verl allows both)."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, (bool, int, float, np.number)) and math.isfinite(float(value)):
        return float(value)
    raise RewardError(f"the reward function returned {value!r:.80}; it must return a finite number or a dict "
                      "with a numeric 'score'")


# ---------------------------------------------------------------- rows

def _read_file(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"reading {path} needs pyarrow: pip install pyarrow (or write the rows as JSONL)") from None
        return pq.read_table(path).to_pylist()
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; use .parquet or .jsonl")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not JSON ({err.msg}); write one JSON object per line") from None
    return rows


def load_rows(paths: Sequence[str | Path], split: str) -> list[dict[str, Any]]:
    """Rows of `split` from parquet/JSONL files in verl's layout, checked; `extra_info.split`/`index` filled in."""
    rows: list[dict[str, Any]] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise ValueError(f"data file {path} does not exist; check data.{split}_files or the task's "
                             f"{split}_files (relative paths start at the working directory), or generate it first")
        for number, row in enumerate(_read_file(path), 1):
            where = f"{path} row {number}"
            row = check_row(row, where)  # message shapes and types (tracerl.io.rows)
            if not isinstance(row, dict):
                raise ValueError(f"{where} is not an object with data_source, prompt, reward_model, extra_info")
            prompt = row.get("prompt")
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            if (not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) and "role" in m and
                                                                      "content" in m for m in prompt)
                    or prompt[-1]["role"] != "user"):
                raise ValueError(f"{where} has no usable 'prompt': it must be a list of chat messages "
                                 "[{'role': ..., 'content': ...}] ending with the user's")
            reward_model = row.get("reward_model")
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise ValueError(f"{where} has no 'reward_model.ground_truth'; add "
                                 "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": ...}")
            extra = dict(row.get("extra_info") or {})
            extra.setdefault("index", len(rows))
            rows.append({**row, "data_source": str(row.get("data_source") or "task"), "prompt": list(prompt),
                         "reward_model": dict(reward_model), "extra_info": {**extra, "split": split}})
    if not rows:
        raise ValueError(f"data.{split}_files={list(map(str, paths))} hold no rows")
    return rows


# ---------------------------------------------------------------- the task and its environment

Expert = Callable[[dict[str, Any], Sequence[tuple[str, str]], np.random.Generator], str]


@dataclass
class UserTask:
    """Everything a user supplies. Rows come from files, or from `rows(split, num, seed)` for generated tasks."""

    tools: Sequence[Callable[..., Any]]  # plain functions (optionally marked with `tool`)
    compute_score: Callable[..., Any]  # verl's signature: (data_source, solution_str, ground_truth, extra_info)
    train_files: Sequence[str] = ()  # parquet/JSONL rows of the training split
    test_files: Sequence[str] = ()  # parquet/JSONL rows of the held-out split
    make_state: Callable[[dict[str, Any]], Any] | None = None  # the episode's state for stateful tools
    close_state: Callable[[Any], None] | None = None  # frees a state (a temp folder, a connection); optional
    expert: Expert | None = None  # next policy text given (row, (action, observation) pairs, rng): demonstrations
    solution: str = "answer"  # solution_str: "answer" (text in <answer>) or "transcript" (all turns, as verl decodes)
    name: str = "task"  # shown in metrics and run summaries


class UserTaskEnv:
    """One episode of a `UserTask`; the Environment protocol of `tracerl.io.env`."""

    def __init__(self, task: UserTask, tools: dict[str, UserTool]) -> None:
        self.task, self.user_tools = task, tools
        self.row: dict[str, Any] = {}
        self.state: Any = None
        self.calls: list[tuple[str, dict[str, Any], str]] = []  # (tool, arguments, observation) in order
        self.transcript: list[str] = []
        kinds = {t.state for t in tools.values() if t.takes_state}
        self.mode = "replay" if "replay" in kinds else "copy" if kinds == {"copy"} else "none"
        self.undeclared = sorted(n for n, t in tools.items() if t.takes_state and not t.state)

    def _table(self) -> dict[str, Tool]:
        def bound(t: UserTool) -> Tool:
            fn = (lambda **kw: t.tool.fn(self.state, **kw)) if t.takes_state else t.tool.fn
            return Tool(t.tool.name, t.tool.description, t.tool.parameters, fn)
        return {name: bound(t) for name, t in self.user_tools.items()}

    def reset(self, row: dict[str, Any]) -> str:
        self.close()
        self.row, self.calls, self.transcript = row, [], []
        self.state = self.task.make_state(row) if self.task.make_state else None
        return row["prompt"][-1]["content"]

    def tools(self) -> list[dict[str, Any]]:
        return [t.tool.schema() for t in self.user_tools.values()]

    def step(self, action: str) -> StepResult:
        self.transcript.append(action)
        parsed = parse_action(action)
        if parsed.kind == "answer":
            solution = parsed.answer if self.task.solution == "answer" else "\n".join(self.transcript)
            row = self.row
            try:
                value = self.task.compute_score(data_source=row["data_source"], solution_str=solution,
                                                ground_truth=row["reward_model"]["ground_truth"],
                                                extra_info=row.get("extra_info", {}))
            except Exception as err:
                raise RewardError(f"the reward function raised {err.__class__.__name__}: {str(err)[:200]}") from err
            return StepResult("", True, reward=score_of(value), info={"answer": parsed.answer})
        if parsed.kind == "invalid":
            return StepResult(f"error: {parsed.error}", False, tool_error=True, info={"error": "format"})
        observation, failed = call_tool(self._table(), parsed)
        if parsed.name in self.user_tools:
            self.calls.append((parsed.name, copy.deepcopy(parsed.arguments), observation))
        self.transcript.append(observation)
        return StepResult(observation, False, tool_error=failed, info={"tool": parsed.name})

    def snapshot(self) -> Any:
        calls, transcript = list(self.calls), list(self.transcript)
        return {"calls": calls, "transcript": transcript,
                "state": copy.deepcopy(self.state) if self.mode == "copy" else None}

    def restore(self, snapshot: Any) -> None:
        """Resume a snapshot in this freshly reset environment: copy the state back, or replay the calls."""
        stateful = [c for c in snapshot["calls"] if self.user_tools[c[0]].takes_state]
        if self.undeclared and any(c[0] in self.undeclared for c in stateful):
            raise ValueError(f"a continuation branches after a call to tool(s) {self.undeclared}, which take the "
                             "episode state but do not say how it branches; mark them @tool(state='copy') when the "
                             "state is Python data, or @tool(state='replay') when it lives outside Python")
        if self.mode == "copy":
            self.state = copy.deepcopy(snapshot["state"])
        elif self.mode == "replay":
            table = self._table()
            for name, arguments, observation in snapshot["calls"]:
                again, _ = call_tool(table, parse_action(json_call(name, arguments)))
                if again != observation:
                    raise ValueError(f"replaying tool {name!r} with {arguments} gave {again[:100]!r}, not "
                                     f"{observation[:100]!r} as the first time: a tool with state='replay' must be "
                                     "deterministic given its earlier calls")
        self.calls, self.transcript = list(snapshot["calls"]), list(snapshot["transcript"])

    def close(self) -> None:
        if self.state is not None and self.task.close_state:
            self.task.close_state(self.state)
        self.state = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to free
            pass


def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):  # defined interactively, or a builtin: its name is all there is
        return getattr(fn, "__qualname__", repr(fn))


def json_call(name: str, arguments: dict[str, Any]) -> str:
    """The policy text of one tool call, in the format `parse_action` reads."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class UserTaskDomain:
    """A `UserTask` behind the domain interface of the built-in domains (`tracerl.io.domains.base.Domain`)."""

    def __init__(self, task: UserTask, source: str = "", need_rows: bool = True) -> None:
        """`need_rows=False` when rows come from elsewhere (verl's batch) and the task may name no files."""
        try:
            inspect.signature(task.compute_score).bind(**REWARD_ARGUMENTS)
        except (TypeError, ValueError):
            raise ValueError("the task's compute_score must take (data_source, solution_str, ground_truth, "
                             "extra_info) by keyword, as verl's custom reward functions do") from None
        if task.solution not in ("answer", "transcript"):
            raise ValueError(f"task solution={task.solution!r}; use 'answer' or 'transcript'")
        self.task, self.name = task, task.name
        tools = [make_tool(fn) for fn in task.tools]
        self.tools = {t.tool.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError(f"two tools share a name: {[t.tool.name for t in tools]}")
        if any(t.takes_state for t in tools) and task.make_state is None:
            raise ValueError(f"tool(s) {[n for n, t in self.tools.items() if t.takes_state]} take a state, but the "
                             "task has no make_state(row) to create it")
        self._rows = {split: load_rows(files, split) if files else []
                      for split, files in (("train", task.train_files), ("test", task.test_files))}
        if need_rows and not self._rows["train"]:
            raise ValueError("the task has no training rows; set data.train_files or the task's train_files")
        self.source = source

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        """The first `num` rows of `split` in file order (all of them when there are fewer)."""
        if split not in self._rows:
            raise ValueError(f"split={split!r}; use 'train' or 'test'")
        if not self._rows[split]:
            raise ValueError(f"the task has no {split} rows; set data.{split}_files")
        return copy.deepcopy(self._rows[split][:num])

    def make_env(self) -> UserTaskEnv:
        return UserTaskEnv(self.task, self.tools)

    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        if self.task.expert is None:
            raise ValueError("the task has no expert(row, turns, rng); the embedded policy's warm start needs one "
                             "(or train a real model: policy.model=<local model directory>)")
        return self.task.expert(row, turns, rng)

    def fingerprint(self) -> str:
        """16 hex digits naming this task's rows, tool schemas and the source of its tools and expert (part of the
        embedded policy's cache key: editing the expert or a tool builds the warm start anew)."""
        code = [_source(f) for f in [*self.task.tools, self.task.expert, self.task.make_state]]
        text = json.dumps([self.source, self._rows, [t.tool.schema() for t in self.tools.values()], code],
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The reward of a task given by files alone: 1.0 iff the answer equals the ground truth, ignoring case,
    surrounding spaces and a final period."""
    def norm(text: Any) -> str:
        return " ".join(str(text).lower().split()).rstrip(".")
    return float(norm(solution_str) == norm(ground_truth))


def load_task(spec: str = "", train_files: Sequence[str] = (), test_files: Sequence[str] = ()) -> UserTaskDomain:
    """The domain of `data.task` ("module:function" returning a `UserTask`), with the config's files, when given,
    in place of the task's own. Files alone (no `spec`) give a tool-free task scored by `exact_match`."""
    if not spec:
        return UserTaskDomain(UserTask(tools=(), compute_score=exact_match, train_files=tuple(train_files),
                                       test_files=tuple(test_files), name="files"), source="files")
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"data.task={spec!r} must be \"module:function\" or \"path/to/file.py:function\", e.g. "
                         "\"my_pkg.tasks:make_task\"")
    try:
        if module_name.endswith(".py"):  # a file path: the task need not be an installed package
            path = Path(module_name)
            if not path.is_file():
                raise ValueError(f"data.task={spec!r}: no file {path} (relative paths start at the working "
                                 "directory)")
            module_spec = importlib.util.spec_from_file_location(f"tracerl_user_task_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except ImportError as err:
        raise ValueError(f"data.task={spec!r}: cannot import {module_name!r} ({err}); put its folder on PYTHONPATH "
                         "or install the package") from None
    except AttributeError:
        raise ValueError(f"data.task={spec!r}: module {module_name!r} has no {attr!r}") from None
    task = factory()
    if not isinstance(task, UserTask):
        raise ValueError(f"data.task={spec!r} returned {type(task).__name__}, not tracerl.io.task.UserTask")
    if train_files or test_files:
        task = UserTask(**{**task.__dict__, **({"train_files": tuple(train_files)} if train_files else {}),
                           **({"test_files": tuple(test_files)} if test_files else {})})
    return UserTaskDomain(task, source=spec)
