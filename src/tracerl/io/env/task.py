"""A user's own task: prompt rows from parquet or JSONL, tools as plain Python functions, a verl-style reward.

A task is a `UserTask` (made by a factory named in the config, `data.task = "my_pkg.tasks:make_task"`, whose rows
`data.train_files`/`data.test_files` may replace) or files alone (a tool-free task scored by `exact_match`).
`UserTaskDomain` wraps it in the interface the built-in domains have (`rows`, `make_env`, `expert_turn`), so the
driver, the trainer and the embedded policy's warm start run it unchanged.

- Rows are verl's layout: `data_source`, `prompt` (chat messages), `reward_model.ground_truth`, `extra_info`.
  A row without `prompt` or `reward_model.ground_truth` fails at load, naming the file and the line.
- A tool is a function; its JSON schema comes from its signature (type hints, written as transformers'
  `get_json_schema` writes them: Optional and unions, list[T], dict[str, T], tuples, Literal, Enum) and docstring (the
  first paragraph describes the tool, `name: text` lines under `Args:` describe parameters), or from an explicit
  OpenAI-style schema (`tool(fn, schema=...)`). A function whose schema cannot be derived fails at load. A tool may
  return a `ToolOutput` to leave a step reward on its turn's node.
- The reward has verl's custom-reward signature `compute_score(data_source, solution_str, ground_truth,
  extra_info)` and returns a number or a dict with a numeric "score" (or is a list of such functions, weighted). It
  runs in the task's `RewardPool` (`tracerl.io.env.rewards`: workers, a timeout per call, counts). One that raises,
  times out or returns anything else makes the leaf fail: `step` raises `RewardError`, which the driver turns into a
  failed leaf and counts (`rollout/reward_errors` or `rollout/reward_timeouts`, and `rollout/env_exceptions`); the
  run goes on.
- Tools and state factories (`make_state`, `close_state`) run in the task's `ToolRunner` (`tracerl.io.env.task_tools`):
  by default in worker processes, a call past `tool_timeout_s` killed with its worker and everything it started,
  its text cut to `max_tool_output_chars` where it runs. A tool that times out, raises or dies is an error observation
  the model sees (counted: `rollout/tool_errors`, and `rollout/tool_timeouts`); a `make_state` that fails raises
  `EpisodeError` from `reset`.
- Everything that can be checked at load is: rows and message shapes, tool schemas, the reward's signature, and,
  when the method branches, that every stateful tool declares how it branches and that replayed tools give the
  same observations on the expert's calls. An exception while importing the task names the file and line.

State for branching. A stateful tool takes the episode's state object as its first parameter, named `state` (made
per environment by `UserTask.make_state(row)`, never shown to the model), and declares how a continuation resumes
it: `state="copy"` (Python data: snapshot and restore deep-copy it, as the built-in domains do) or
`state="replay"` (outside state such as a database file or a sandbox: a snapshot is the list of tool calls made so
far, and restore replays the stateful ones, in order, in the fresh environment the driver made; each replayed call
must give the observation it gave the first time, the episodes' own state paths masked, else restore raises and
shows where they differ). A stateful tool that declares neither fails at load under a method that branches, and
otherwise runs. Stateless tools (no `state` parameter) need nothing and are never replayed.

Deliberately not here: async tools, tools that return images, reading parquet without pyarrow. verl's `BaseTool`
classes, tool config YAML and custom reward settings load into a `UserTask` in `tracerl.io.env.verl_task`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.io.env import EpisodeError, StepResult
from tracerl.io.env.actions import Tool, call_tool, nesting_depth, parse_action
from tracerl.io.env.rewards import RewardError, RewardPool, score_of  # noqa: F401 (RewardError, score_of: public here)
from tracerl.io.env.task_tools import (STATE_KINDS, ToolOutput, ToolRunner, UserTool,  # noqa: F401 (public here too)
                                   make_tool, schema_from_function, tool)
from tracerl.io.env.user_code import CallFailed, CallTimeout, ResultNotSent
from tracerl.io.files.rows import check_ids, check_row, non_finite, read_row_file

REWARD_ARGUMENTS = dict.fromkeys(("data_source", "solution_str", "ground_truth", "extra_info"))  # verl's call
MAX_ROW_DEPTH = 64  # levels of lists and objects in a row; deeper fails at load


# ---------------------------------------------------------------- rows

def load_rows(paths: Sequence[str | Path], split: str) -> list[dict[str, Any]]:
    """Rows of `split` from parquet/JSONL files in verl's layout, checked; `extra_info.split`/`index` filled in."""
    rows: list[dict[str, Any]] = []
    wheres: list[str] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise ValueError(f"data file {path} does not exist; check data.{split}_files or the task's "
                             f"{split}_files (relative paths start at the working directory), or generate it first")
        for number, row in enumerate(read_row_file(path), 1):
            where = f"{path} row {number}"
            if nesting_depth(row, MAX_ROW_DEPTH) > MAX_ROW_DEPTH:  # deep copies and JSON of it would recurse
                raise ValueError(f"{where} nests deeper than {MAX_ROW_DEPTH} levels of lists and objects; flatten "
                                 "its fields (extra_info, the ground truth)")
            row = check_row(row, where)  # fields, message shapes and types (tracerl.io.files.rows)
            prompt, reward_model = row["prompt"], row["reward_model"]
            extra = dict(row.get("extra_info") or {})
            extra.setdefault("index", len(rows))
            rows.append({**row, "data_source": str(row.get("data_source") or "task"), "prompt": list(prompt),
                         "reward_model": dict(reward_model), "extra_info": {**extra, "split": split}})
            wheres.append(where)
    if not rows:
        raise ValueError(f"data.{split}_files={list(map(str, paths))} hold no rows")
    check_ids(rows, wheres)
    return rows


# ---------------------------------------------------------------- the task and its environment

Expert = Callable[[dict[str, Any], Sequence[tuple[str, str]], np.random.Generator], str]


@dataclass
class UserTask:
    """Everything a user supplies. Rows come from files, or from `rows(split, num, seed)` for generated tasks."""

    tools: Sequence[Callable[..., Any]]  # plain functions (optionally marked with `tool`)
    # verl's signature: (data_source, solution_str, ground_truth, extra_info); a list is summed with reward_weights
    compute_score: Callable[..., Any] | Sequence[Callable[..., Any]]
    train_files: Sequence[str] = ()  # parquet/JSONL rows of the training split
    test_files: Sequence[str] = ()  # parquet/JSONL rows of the held-out split
    make_state: Callable[[dict[str, Any]], Any] | None = None  # the episode's state for stateful tools
    close_state: Callable[[Any], None] | None = None  # frees a state (a temp folder, a connection); optional
    expert: Expert | None = None  # next policy text given (row, (action, observation) pairs, rng): demonstrations
    solution: str = "answer"  # solution_str: "answer" (text in <answer>) or "transcript" (all turns, as verl decodes)
    name: str = "task"  # shown in metrics and run summaries
    reward_weights: Sequence[float] | None = None  # one weight per reward function (TRL's reward_weights); None: all 1
    reward_timeout_s: float = 60.0  # a reward call running longer fails its leaf (counted); 0: no timeout
    reward_workers: int = 4  # reward calls of one batch of turns run at once in this many workers
    reward_pool: str = "thread"  # "thread", "process" (CPU-bound or hang-prone rewards) or "none" (inline, no timeout)
    tool_timeout_s: float = 10.0  # a tool call, make_state or close_state running longer is stopped (and counted)
    max_tool_output_chars: int = 100_000  # a tool's text is cut to this where it runs, before it is sent back
    tool_isolation: str = "process"  # "process": in worker processes, killed at the deadline; "thread": in this process
    # named features of a history's state for the success predictor (Domain.state_features: read the history only,
    # never the gold answer); None: the predictor reads the text alone
    state_features: Callable[[History], dict[str, float]] | None = None


def _state_paths(state: Any, depth: int = 2) -> list[str]:
    """The file paths an episode's state holds (a temp folder, a database file), longest first: the text that differs
    between two episodes of one row and is masked before a replayed observation is compared."""
    if isinstance(state, (str, os.PathLike)):
        text = os.fspath(state)
        return [text] if os.path.isabs(text) and len(text) > 1 else []
    if depth and isinstance(state, dict):
        state = list(state.values())
    if depth and isinstance(state, (list, tuple)):
        return sorted({p for item in state for p in _state_paths(item, depth - 1)}, key=len, reverse=True)
    return []


def _masked(text: str, paths: Sequence[str]) -> str:
    for path in paths:
        text = text.replace(path, "<state>")
    return text


def _difference(first: str, again: str) -> str:
    """Where two observations part: the character offset and both texts from a little before it."""
    at = next((i for i, (a, b) in enumerate(zip(first, again)) if a != b), min(len(first), len(again)))
    start = max(0, at - 20)
    def cut(text: str) -> str:
        return ("..." if start else "") + text[start:at + 80] + ("..." if len(text) > at + 80 else "")
    return f"they differ from character {at}: first {cut(first)!r}, now {cut(again)!r}"


class UserTaskEnv:
    """One episode of a `UserTask`; the Environment protocol of `tracerl.io.env`."""

    def __init__(self, task: UserTask, tools: dict[str, UserTool], rewards: RewardPool | None = None,
                 tool_runner: ToolRunner | None = None) -> None:
        self.task, self.user_tools = task, tools
        self.rewards = rewards or RewardPool(_reward_functions(task), task.reward_weights, pool="none")
        self.tool_runner = tool_runner or _tool_runner(task, tools)
        self.row: dict[str, Any] = {}
        self.state: Any = None
        self.calls: list[tuple[str, dict[str, Any], str]] = []  # (tool, arguments, observation) in order
        self.transcript: list[str] = []
        self._pending: tuple[str, Any] | None = None  # (answer action, reward call started by `prefetch`)
        self._meta: dict[str, Any] = {}  # what the last tool call leaves on its node (a step reward)
        self._timed_out = False  # the last tool call ran past its deadline
        kinds = {t.state for t in tools.values() if t.takes_state}
        self.mode = "replay" if "replay" in kinds else "copy" if kinds == {"copy"} else "none"
        self.undeclared = sorted(n for n, t in tools.items() if t.takes_state and not t.state)

    def _table(self) -> dict[str, Tool]:
        def bound(t: UserTool) -> Tool:
            def run(**kw: Any) -> str:
                try:
                    text, self._meta, self.state = self.tool_runner.call(t.tool.name, self.state, kw)
                except CallTimeout:
                    self._timed_out = True
                    raise
                return text
            return Tool(t.tool.name, t.tool.description, t.tool.parameters, run)
        return {name: bound(t) for name, t in self.user_tools.items()}

    def reset(self, row: dict[str, Any]) -> str:
        self.close()
        self.row, self.calls, self.transcript, self._pending = row, [], [], None
        if self.task.make_state:
            try:
                self.state = self.tool_runner.new_state(row)
            except CallFailed as err:
                hint = ("; under tool_isolation='process' it runs in a worker process and its state must pickle: "
                        "keep a path or plain data in it, or set tool_isolation='thread'"
                        if isinstance(err, ResultNotSent) else "")
                raise EpisodeError(f"the task's make_state(row) failed: {err}{hint}") from None
        return row["prompt"][-1]["content"]

    def tools(self) -> list[dict[str, Any]]:
        return [t.tool.schema() for t in self.user_tools.values()]

    def _solution(self, parsed: Any, transcript: Sequence[str]) -> str:
        return parsed.answer if self.task.solution == "answer" else "\n".join(transcript)

    def _reward_call(self, parsed: Any, transcript: Sequence[str]) -> Any:
        row = self.row
        return self.rewards.submit(data_source=row["data_source"], solution_str=self._solution(parsed, transcript),
                                   ground_truth=row["reward_model"]["ground_truth"],
                                   extra_info=row.get("extra_info", {}))

    def prefetch(self, action: str) -> None:
        """Start the reward of a final answer before `step(action)` asks for it, so the rewards of a batch of turns
        run at once in the reward pool (the driver calls this for every turn of a batch first)."""
        parsed = parse_action(action)
        if parsed.kind == "answer":
            self._pending = (action, self._reward_call(parsed, [*self.transcript, action]))

    def step(self, action: str) -> StepResult:
        self.transcript.append(action)
        parsed = parse_action(action)
        if parsed.kind == "answer":
            pending, self._pending = self._pending, None
            call = pending[1] if pending and pending[0] == action else self._reward_call(parsed, self.transcript)
            return StepResult("", True, reward=self.rewards.result(call), info={"answer": parsed.answer})
        if parsed.kind == "invalid":
            return StepResult(f"error: {parsed.error}", False, tool_error=True, info={"error": "format"})
        self._meta, self._timed_out = {}, False
        observation, failed = call_tool(self._table(), parsed)
        if parsed.name in self.user_tools:
            self.calls.append((parsed.name, copy.deepcopy(parsed.arguments), observation))
        self.transcript.append(observation)
        return StepResult(observation, False, tool_error=failed,
                          info={"tool": parsed.name, **({"meta": self._meta} if self._meta else {}),
                                **({"tool_timeout": True} if self._timed_out else {})})

    def snapshot(self) -> Any:
        calls, transcript = list(self.calls), list(self.transcript)
        return {"calls": calls, "transcript": transcript, "paths": _state_paths(self.state),
                "state": copy.deepcopy(self.state) if self.mode == "copy" else None}

    def restore(self, snapshot: Any) -> None:
        """Resume a snapshot in this freshly reset environment: copy the state back, or replay the stateful calls.

        Only calls to tools that take the state are replayed (a stateless tool's answer may vary: nothing depends
        on it). A replayed observation is compared with the first one after masking each episode's own state paths
        (the temp folder an error message names differs between episodes)."""
        stateful = [c for c in snapshot["calls"] if self.user_tools[c[0]].takes_state]
        if self.undeclared and any(c[0] in self.undeclared for c in stateful):
            raise ValueError(f"a continuation branches after a call to tool(s) {self.undeclared}, which take the "
                             "episode state but do not say how it branches; mark them @tool(state='copy') when the "
                             "state is Python data, or @tool(state='replay') when it lives outside Python")
        if self.mode == "copy":
            self.state = copy.deepcopy(snapshot["state"])
        elif self.mode == "replay":
            table, paths = self._table(), _state_paths(self.state)
            for name, arguments, observation in stateful:
                again, _ = call_tool(table, parse_action(json_call(name, arguments)))
                first, now = _masked(observation, snapshot.get("paths", ())), _masked(again, paths)
                if first != now:
                    raise ValueError(f"replaying tool {name!r} with {json.dumps(arguments)[:200]} gave another "
                                     f"observation than the first time ({_difference(first, now)}): a tool with "
                                     "state='replay' must be deterministic given its earlier calls")
        self.calls, self.transcript = list(snapshot["calls"]), list(snapshot["transcript"])

    def close(self, wait: bool = True) -> None:
        """Free the episode's state (`close_state`); `wait=False` only starts it (see `ToolRunner.free_state`)."""
        state, self.state = self.state, None
        if state is not None and self.task.close_state:
            try:
                self.tool_runner.free_state(state, wait=wait)
            except CallFailed as err:  # the episode is over either way; the user sees why its state may remain
                warnings.warn(f"the task's close_state failed: {err}", UserWarning, stacklevel=2)

    def __del__(self) -> None:
        try:
            self.close(wait=False)  # never block in a finaliser: it may run inside a tool call's worker thread
        except Exception:  # interpreter shutdown: nothing left to free
            pass


def _tool_runner(task: UserTask, tools: dict[str, UserTool]) -> ToolRunner:
    return ToolRunner(tools, task.make_state, task.close_state, timeout_s=task.tool_timeout_s,
                      max_output_chars=task.max_tool_output_chars, isolation=task.tool_isolation)


def _reward_functions(task: UserTask) -> list[Callable[..., Any]]:
    score = task.compute_score
    return list(score) if isinstance(score, (list, tuple)) else [score]


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

    def state_features(self, history: History) -> dict[str, float]:
        """The task's own state features (`UserTask.state_features`), or none."""
        return self.task.state_features(history) if self.task.state_features is not None else {}

    def __init__(self, task: UserTask, source: str = "", need_rows: bool = True, branching: bool = False) -> None:
        """`need_rows=False` when rows come from elsewhere (verl's batch) and the task may name no files;
        `branching=True` when the method resumes rollouts from a turn (stage 2): then every stateful tool must
        say how it branches, and a replayed tool is checked for determinism on the expert's calls, both here."""
        functions = _reward_functions(task)
        for fn in functions:
            try:
                inspect.signature(fn).bind(**REWARD_ARGUMENTS)
            except (TypeError, ValueError):
                raise ValueError(f"the task's compute_score {getattr(fn, '__name__', fn)!r} must take (data_source, "
                                 "solution_str, ground_truth, extra_info) by keyword, as verl's custom reward "
                                 "functions do") from None
        if task.solution not in ("answer", "transcript"):
            raise ValueError(f"task solution={task.solution!r}; use 'answer' or 'transcript'")
        self.task, self.name = task, task.name
        self.rewards = RewardPool(functions, task.reward_weights, workers=task.reward_workers,
                                  pool=task.reward_pool, timeout_s=task.reward_timeout_s)
        tools = [make_tool(fn) for fn in task.tools]
        self.tools = {t.tool.name: t for t in tools}
        # _tool_runner checks tool_timeout_s, max_tool_output_chars and tool_isolation
        self.tool_runner = _tool_runner(task, self.tools)
        if len(self.tools) != len(tools):
            raise ValueError(f"two tools share a name: {[t.tool.name for t in tools]}")
        if any(t.takes_state for t in tools) and task.make_state is None:
            raise ValueError(f"tool(s) {[n for n, t in self.tools.items() if t.takes_state]} take a state, but the "
                             "task has no make_state(row) to create it")
        undeclared = sorted(n for n, t in self.tools.items() if t.takes_state and not t.state)
        if branching and undeclared:
            raise ValueError(f"tool(s) {undeclared} take the episode state but do not say how a continuation resumes "
                             "it, and this method branches (stage 2); mark them @tool(state='copy') when the state "
                             "is Python data, or @tool(state='replay') when it lives outside Python (or train with a "
                             "method without stage 2, e.g. method='grpo')")
        self._rows = {split: load_rows(files, split) if files else []
                      for split, files in (("train", task.train_files), ("test", task.test_files))}
        if need_rows and not self._rows["train"]:
            raise ValueError("the task has no training rows; set data.train_files or the task's train_files")
        self.source = source
        if branching and task.expert and self._rows["train"] and any(t.state == "replay" for t in tools):
            self.check_replay(self._rows["train"][:2])

    @property
    def reward_counts(self) -> dict[str, int]:
        """Reward calls so far, and how many failed (`errors`) or ran out of time (`timeouts`)."""
        return dict(self.rewards.counts)

    @property
    def tool_counts(self) -> dict[str, int]:
        """Tool calls that ran so far, and how many raised or died (`errors`) or ran out of time (`timeouts`)."""
        return dict(self.tool_runner.counts)

    def check_replay(self, rows: Sequence[dict[str, Any]], max_turns: int = 8) -> None:
        """Play the expert on `rows` without scoring, replay its calls in a fresh episode and compare, so a replayed
        tool that is not deterministic fails at load rather than at the first continuation."""
        rng = np.random.default_rng(0)
        for number, row in enumerate(rows, 1):
            env, turns = self.make_env(), []
            env.reset(row)
            try:
                for _ in range(max_turns):
                    action = self.task.expert(row, turns, rng)
                    if parse_action(action).kind != "tool_call":
                        break
                    turns.append((action, env.step(action).observation))
                fresh = self.make_env()
                fresh.reset(row)
                try:
                    fresh.restore(env.snapshot())
                finally:
                    fresh.close()
            except ValueError as err:
                raise ValueError(f"at load, the expert's calls on training row {number} replayed in a fresh episode: "
                                 f"{err}") from None
            finally:
                env.close()

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        """The first `num` rows of `split` in file order (all of them when there are fewer)."""
        if split not in self._rows:
            raise ValueError(f"split={split!r}; use 'train' or 'test'")
        if not self._rows[split]:
            raise ValueError(f"the task has no {split} rows; set data.{split}_files")
        return copy.deepcopy(self._rows[split][:num])

    def make_env(self) -> UserTaskEnv:
        return UserTaskEnv(self.task, self.tools, self.rewards, self.tool_runner)

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
    surrounding spaces and a final period. A NaN or infinite ground truth matches nothing (its text "nan" or "inf"
    would match those answers)."""
    def norm(text: Any) -> str:
        return " ".join(str(text).lower().split()).rstrip(".")
    if non_finite(ground_truth) or (isinstance(ground_truth, list) and any(map(non_finite, ground_truth))):
        return 0.0
    return float(norm(solution_str) == norm(ground_truth))


def _where_raised(err: BaseException) -> str:
    """file:line of the code that raised `err` while importing or calling the user's task: a syntax error's own
    position, else the deepest frame outside the import machinery."""
    if isinstance(err, SyntaxError) and err.filename:
        return f"{err.filename}:{err.lineno}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _import_task(spec: str, module_name: str) -> Any:
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    path = Path(module_name)  # a file path: the task need not be an installed package
    if not path.is_file():
        raise ValueError(f"data.task={spec!r}: no file {path} (a relative path in a config file starts at the "
                         "config's folder, on the command line at the working directory)")
    name = f"tracerl_user_task_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # as an import would: pickling its functions (reward_pool='process') finds them
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def resolve_task_paths(data: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """A config's `data` section with its relative paths (`task` given as "file.py:function", `train_files`,
    `test_files`) made absolute against `folder`: the config file's folder for what the file says, the working
    directory for what the command line says. A module task ("pkg.mod:function") is left to the import system."""
    folder, out = Path(folder), dict(data)
    task = out.get("task")
    if isinstance(task, str) and ".py:" in task:
        path, _, attr = task.rpartition(":")
        out["task"] = f"{folder / Path(path).expanduser()}:{attr}"  # an absolute path stays as it is
    for key in ("train_files", "test_files"):
        files = out.get(key)
        if isinstance(files, str):
            files = [files]
        if isinstance(files, (list, tuple)):
            out[key] = [str(folder / Path(f).expanduser()) if isinstance(f, str) else f for f in files]
    return out


def load_task(spec: str = "", train_files: Sequence[str] = (), test_files: Sequence[str] = (),
              branching: bool = False) -> UserTaskDomain:
    """The domain of `data.task` ("module:function" returning a `UserTask`), with the config's files, when given,
    in place of the task's own. Files alone (no `spec`) give a tool-free task scored by `exact_match`.
    `branching`: the method resumes rollouts from a turn (see `UserTaskDomain`).

    Any exception while importing the task or calling its factory becomes a ValueError naming the file and line."""
    if not spec:
        return UserTaskDomain(UserTask(tools=(), compute_score=exact_match, train_files=tuple(train_files),
                                       test_files=tuple(test_files), name="files"), source="files")
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"data.task={spec!r} must be \"module:function\" or \"path/to/file.py:function\", e.g. "
                         "\"my_pkg.tasks:make_task\"")
    try:
        module = _import_task(spec, module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ValueError(f"data.task={spec!r}: cannot import {module_name!r} ({err}); put its folder on "
                             "PYTHONPATH or install the package") from None
        raise ValueError(f"data.task={spec!r}: {_where_raised(err)}: importing it raised {type(err).__name__}: "
                         f"{err}; install what it imports") from None
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(f"data.task={spec!r}: {_where_raised(err)}: importing it raised {type(err).__name__}: "
                         f"{err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"data.task={spec!r}: module {module_name!r} has no {attr!r} (the function that returns "
                         "the UserTask)")
    try:
        task = factory()
    except Exception as err:
        raise ValueError(f"data.task={spec!r}: {_where_raised(err)}: {attr}() raised {type(err).__name__}: "
                         f"{err}") from None
    if not isinstance(task, UserTask):
        raise ValueError(f"data.task={spec!r} returned {type(task).__name__}, not tracerl.io.env.task.UserTask")
    if train_files or test_files:
        task = UserTask(**{**task.__dict__, **({"train_files": tuple(train_files)} if train_files else {}),
                           **({"test_files": tuple(test_files)} if test_files else {})})
    return UserTaskDomain(task, source=spec, branching=branching)
