"""A `UserTask` from verl's own settings: the multi-turn tool config YAML and the custom reward function.

`verl_task(tool_config_path, reward_path, reward_name)` reads what a verl user already has:

- the tool config file of `actor_rollout_ref.rollout.multi_turn.tool_config_path`: `tools: [{class_name,
  config, tool_schema}]`, where `class_name` is the dotted path of a tool class with verl's `BaseTool` interface
  (async `create`, `execute`, `release`), `config` its constructor config (`type: native`, the only type verl
  0.9.1 runs) and `tool_schema` an OpenAI-style function schema (optional when the class returns one from
  `get_openai_tool_schema()`);
- the reward of `custom_reward_function.path`/`.name` (and `.reward_kwargs`): a file whose function has verl's
  signature `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`, sync or async.

- the function tools of `function_tool_path`: a Python file whose functions carry verl's `@function_tool`
  decorator (schema from the signature and docstring, as verl derives it); stateless, called with the arguments.

Each `BaseTool` call runs as verl 0.9.1's tool agent loop runs it: `create(create_kwargs=...)` with the row's
`extra_info.tools_kwargs[tool].create_kwargs`, `execute(instance_id, arguments, agent_data=...)`, then
`release(instance_id)`. `agent_data` is the trajectory's: verl's own `AgentData` class when it imports (else
`TrajectoryData`, with the same attributes), made once per episode with a fresh `request_id`, the row's messages and
`tools_kwargs`, and an `extra_fields` dict that every call of the episode sees, so a tool can keep per-trajectory
state there across calls, as in verl. The observation is the response's text. The step reward `execute` returns is
appended to `agent_data.tool_rewards` (as verl does) and kept on the turn's node (`meta["tool_reward"]`), not added to
the leaf's reward: verl 0.9.1 also only carries it (`extra_fields["tool_rewards"]`) unless a reward function reads
it, and a tree's advantages must come from one reward. The coroutines run on one event loop thread per tool set,
so a tool's async resources live on one loop, as in verl; so the tools run in this process
(`UserTask.tool_isolation="thread"`): a call past `tool_timeout_s` is an error observation, but is not killed. `BaseTool` tools keep their state outside tracerl (in
the instance or in `agent_data`), so they are `state="replay"` tools: a continuation makes a fresh `agent_data`,
replays the prefix's calls in order (which rebuilds `extra_fields`) and checks each gives the observation it gave
before. The reward sees the whole transcript (`UserTask.solution="transcript"`), as verl's reward sees the decoded
response.

Bad files fail here, at load, naming the file, the entry and the fix (a tool config with YAML anchors or aliases
included: `load_yaml`). Deliberately not here: MCP tools, images in
tool responses, `agent_data.messages` growing with the conversation (it holds the row's prompt; verl appends each
turn), and reading the verl Hydra config (`tracerl.integrations.verl` does).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tracerl.io.env.task import ToolOutput, UserTask, UserTaskDomain, tool


class EventLoopThread:
    """One asyncio loop in a daemon thread; `run(coro)` runs a coroutine there from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tracerl-verl-tools", daemon=True).start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def _import_class(dotted: str, where: str) -> type:
    module_name, _, attr = str(dotted).rpartition(".")
    if not module_name:
        raise ValueError(f"{where}: class_name={dotted!r} must be a dotted path 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{where}: cannot import {module_name!r} ({err}); put its folder on PYTHONPATH or install "
                         "the package") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"{where}: module {module_name!r} has no class {attr!r}")
    missing = [m for m in ("create", "execute", "release") if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{where}: {dotted} lacks {missing}; a tool class needs verl's BaseTool interface "
                         "(async create, execute, release), e.g. by subclassing verl.tools.base_tool.BaseTool")
    return cls


def _schema_object(schema: dict[str, Any]) -> Any:
    """verl's pydantic schema when verl is installed (its BaseTool reads `schema.function.name`), else the dict."""
    try:
        from verl.tools.schemas import OpenAIFunctionToolSchema
    except ImportError:
        return schema
    return OpenAIFunctionToolSchema.model_validate(schema)


def _schema_dict(schema: Any) -> Any:
    return schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump") else schema


def _checked_schema(schema: Any, where: str) -> dict[str, Any]:
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"{where}: tool_schema needs an OpenAI-style function with a name: {{type: function, "
                         "function: {name: ..., description: ..., parameters: {type: object, properties: ...}}}")
    if not isinstance(function.get("parameters", {}), dict):
        raise ValueError(f"{where}: tool_schema.function.parameters must be a JSON schema object")
    return {"type": "function", "function": function}


class TrajectoryData:
    """The attributes of verl's `AgentData` (verl/experimental/agent_loop/tool_agent_loop.py) that a tool reads,
    for when verl's class cannot be imported: one per trajectory; `extra_fields` is where tools keep session data."""

    def __init__(self, messages: list[dict[str, Any]], image_data: Any, video_data: Any, audio_data: Any,
                 mm_processor_kwargs: Any, metrics: dict[str, Any], request_id: str,
                 tools_kwargs: dict[str, Any]) -> None:
        self.messages, self.image_data, self.video_data, self.audio_data = messages, image_data, video_data, audio_data
        self.mm_processor_kwargs, self.metrics = mm_processor_kwargs or {}, metrics
        self.request_id, self.tools_kwargs = request_id, tools_kwargs
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.turn_scores: list[float] = []
        self.tool_rewards: list[float] = []
        self.user_turns = self.assistant_turns = 0
        self.tool_calls: list[Any] = []
        self.routed_experts = None
        self.extra_fields: dict[str, Any] = {}


@functools.cache
def _agent_data_class() -> type:
    try:
        from verl.experimental.agent_loop.tool_agent_loop import AgentData
    except Exception:  # verl absent, or its agent loop's heavy imports fail here: the same attributes
        return TrajectoryData
    return AgentData


def _response(result: Any) -> tuple[str, float | None, dict[str, Any]]:
    """(text, step reward, metrics) of `execute`'s result: (ToolResponse | str | dict, reward, metrics), or the
    response alone."""
    response, reward, metrics = (*result, None, None)[:3] if isinstance(result, tuple) else (result, None, None)
    if isinstance(response, dict):
        response = response.get("text")
    else:
        response = getattr(response, "text", response)
    reward = float(reward) if isinstance(reward, (int, float)) else None
    return "" if response is None else str(response), reward, dict(metrics or {})


def _takes_agent_data(method: Callable[..., Any]) -> bool:
    params = inspect.signature(method).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or p.name == "agent_data" for p in params)


def _verl_call(instance: Any, name: str, loop: EventLoopThread) -> Callable[..., ToolOutput]:
    """The tracerl tool function over one verl tool instance: create, execute, release per call (verl 0.9.1)."""
    with_agent_data = _takes_agent_data(instance.execute)

    async def run(agent_data: Any, arguments: dict[str, Any]) -> Any:
        create_kwargs = (agent_data.tools_kwargs.get(name) or {}).get("create_kwargs", {})
        instance_id, _ = await instance.create(create_kwargs=create_kwargs)
        try:
            if with_agent_data:
                return await instance.execute(instance_id, arguments, agent_data=agent_data)
            return await instance.execute(instance_id, arguments)
        finally:
            await instance.release(instance_id)

    def call(state: dict[str, Any], **arguments: Any) -> ToolOutput:
        agent_data = state["agent_data"]
        text, reward, metrics = _response(loop.run(run(agent_data, arguments)))
        agent_data.tool_rewards.append(0.0 if reward is None else reward)
        return ToolOutput(text, reward, metrics)
    call.__name__ = call.__qualname__ = name
    return call


def _episode_state(row: dict[str, Any]) -> dict[str, Any]:
    """What a verl tool call needs from its episode: the row, and the trajectory's `agent_data` (a fresh
    `request_id`, the row's prompt messages and `tools_kwargs`, an empty `extra_fields` store)."""
    tools_kwargs = (row.get("extra_info") or {}).get("tools_kwargs") or {}
    agent_data = _agent_data_class()(messages=list(row.get("prompt") or []), image_data=None, video_data=None,
                                     audio_data=None, mm_processor_kwargs=None, metrics={},
                                     request_id=uuid.uuid4().hex, tools_kwargs=dict(tools_kwargs))
    return {"row": row, "agent_data": agent_data}


def load_function_tools(path: str | Path, loop: EventLoopThread | None = None) -> list[Callable[..., Any]]:
    """verl's function tools (`actor_rollout_ref.rollout.multi_turn.function_tool_path`): the file is executed by
    verl's own loader, each `@function_tool` becomes a stateless tracerl tool with verl's schema, called with the
    arguments (sync functions in a thread, as verl does); its return is normalised as verl normalises it."""
    path = Path(path)
    label = f"function_tool_path={str(path)!r}"
    if not path.is_file():
        raise ValueError(f"{label} does not exist; check the path (relative paths start at the working directory)")
    try:
        from verl.tools.function_tool import load_function_tools_from_path, normalize_function_tool_return
    except ImportError as err:
        raise ValueError(f"{label}: function tools are defined with verl's @function_tool, which needs verl: "
                         f"pip install -e '.[verl]' ({err})") from None
    try:
        found = load_function_tools_from_path(str(path))
    except Exception as err:
        raise ValueError(f"{label}: loading it raised {type(err).__name__}: {err}") from None
    if not found:
        raise ValueError(f"{label} defines no function decorated with verl's @function_tool")
    loop = loop or EventLoopThread()
    return [tool(_function_call(entry, loop, normalize_function_tool_return),
                 schema=_checked_schema(_schema_dict(entry.tool_schema), f"{label}, tool {entry.name!r}"))
            for entry in found]


def _function_call(entry: Any, loop: EventLoopThread, normalize: Callable[[Any], Any]) -> Callable[..., ToolOutput]:
    """The tracerl tool function over one verl `FunctionTool`: `entry.call(arguments)` on the tools' loop."""
    def call(**arguments: Any) -> ToolOutput:
        response, reward, metrics = normalize(loop.run(entry.call(arguments)))
        return ToolOutput(_response(response)[0], reward, dict(metrics or {}))
    call.__name__ = call.__qualname__ = entry.name
    return call


def load_yaml(text: str, label: str) -> Any:
    """The YAML document `text` (read by PyYAML's safe loader) without anchors and aliases: an alias repeats its
    anchor's value wherever it is written, so nine aliases nested six deep spell half a million copies of a string,
    built when the schema is rendered. A file with an alias is refused naming `label` and the line."""
    try:
        import yaml  # installed with verl (omegaconf needs it); not a dependency of tracerl itself
    except ImportError:
        raise ValueError(f"reading {label} needs PyYAML: pip install pyyaml") from None

    class WithoutAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ValueError(f"{label} uses the YAML alias *{str(event.anchor)[:40]} (line "
                                 f"{event.start_mark.line + 1}); anchors and aliases are refused in a tool config "
                                 "(nested ones expand without bound): write the value out where it is used")
            return super().compose_node(parent, index)

    loader = WithoutAliases(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise ValueError(f"{label} is not YAML: {err}") from None
    finally:
        loader.dispose()


def load_verl_tools(path: str | Path) -> list[Callable[..., Any]]:
    """The tools of a verl tool config file as `tool`-marked functions (state="replay", taking the episode state)."""
    path = Path(path)
    label = f"tool config {path} (actor_rollout_ref.rollout.multi_turn.tool_config_path)"
    if not path.is_file():
        raise ValueError(f"{label} does not exist; check the path (relative paths start at the working directory)")
    document = load_yaml(path.read_text(), label)
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{label} needs a non-empty list `tools: [{{class_name, config, tool_schema}}, ...]`")
    loop, tools = EventLoopThread(), []
    for number, entry in enumerate(entries):
        where = f"{path} tools[{number}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where} has no class_name; each tool is {{class_name: pkg.module.Class, config: "
                             "{type: native}, tool_schema: {...}}")
        config = dict(entry.get("config") or {})
        if config.get("type", "native") != "native":
            raise ValueError(f"{where}: config.type={config['type']!r}; only 'native' tools (BaseTool classes) "
                             "run in tracerl")
        cls = _import_class(entry["class_name"], where)
        schema = entry.get("tool_schema")
        if schema is not None:
            schema = _checked_schema(schema, where)
        try:
            instance = cls(config=config, tool_schema=None if schema is None else _schema_object(schema))
        except Exception as err:
            raise ValueError(f"{where}: {entry['class_name']}(config=..., tool_schema=...) raised "
                             f"{type(err).__name__}: {err}") from None
        if schema is None:
            getter = getattr(instance, "get_openai_tool_schema", None)
            schema = _checked_schema(_schema_dict(getter()) if getter else None, where)
        name = schema["function"]["name"]
        tools.append(tool(_verl_call(instance, name, loop), state="replay", schema=schema))
    return tools


def load_reward_function(path: str | Path, name: str = "compute_score",
                         reward_kwargs: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """verl's custom reward function (`custom_reward_function.path/name/reward_kwargs`) as a sync function of
    (data_source, solution_str, ground_truth, extra_info)."""
    path, name = Path(path), name or "compute_score"
    label = f"custom_reward_function.path={str(path)!r}"
    if not path.is_file():
        raise ValueError(f"{label} does not exist; check the path (relative paths start at the working directory)")
    spec = importlib.util.spec_from_file_location(f"tracerl_verl_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ValueError(f"{label}: importing it raised {type(err).__name__}: {err}") from None
    raw = getattr(module, name, None)
    if not callable(raw):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise ValueError(f"{label} has no function {name!r} (custom_reward_function.name); it defines {found}")
    extra = dict(reward_kwargs or {})

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
        value = raw(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                    extra_info=extra_info, **extra)
        return asyncio.run(value) if inspect.iscoroutine(value) else value
    compute_score.__name__ = compute_score.__qualname__ = name
    return compute_score


def verl_task(tool_config_path: str = "", reward_path: str = "", reward_name: str = "compute_score",
              reward_kwargs: Mapping[str, Any] | None = None, compute_score: Callable[..., Any] | None = None,
              train_files: Sequence[str] = (), test_files: Sequence[str] = (),
              function_tool_path: str = "") -> UserTaskDomain:
    """The domain of a task given by verl's settings; `compute_score` is the reward when no `reward_path` is set
    (inside verl, verl's `default_compute_score`). Rows come from the files, or from verl's batch when none."""
    if reward_path:
        compute_score = load_reward_function(reward_path, reward_name, reward_kwargs)
    if compute_score is None:
        raise ValueError("the task has no reward: set custom_reward_function.path (and .name) to the file of your "
                         "compute_score(data_source, solution_str, ground_truth, extra_info)")
    native = load_verl_tools(tool_config_path) if tool_config_path else []
    tools = native + (load_function_tools(function_tool_path) if function_tool_path else [])
    task = UserTask(tools=tools, compute_score=compute_score, train_files=tuple(train_files),
                    test_files=tuple(test_files), make_state=_episode_state if native else None,
                    solution="transcript", name="verl_task",
                    tool_isolation="thread")  # the tools' coroutines run on this process's event-loop thread
    return UserTaskDomain(task, source=f"verl:{tool_config_path}:{function_tool_path}:{reward_path}:{reward_name}",
                          need_rows=bool(train_files))
