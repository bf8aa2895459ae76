"""tracerl.io.env.verl_task: verl's tool config YAML and custom reward file as a `UserTask` (no verl needed).

The tool classes here have verl's BaseTool interface (async create/execute/release) without subclassing it, so
these run in the main environment; the verl CPU test (tests/verl/test_verl_user_task.py) runs a real BaseTool.
"""

import sys

import pytest

from tracerl.io.env.task import RewardError, json_call
from tracerl.io.env.verl_task import load_reward_function, load_verl_tools, verl_task

TOOLS = '''
from uuid import uuid4

LEDGER = {}  # outside state: what each owner deposited, kept by the tool, not by tracerl


class DepositTool:
    def __init__(self, config, tool_schema):
        self.unit, self.tool_schema, self.instances = config.get("unit", "coins"), tool_schema, {}

    async def create(self, instance_id=None, **kwargs):
        instance_id = instance_id or uuid4().hex
        self.instances[instance_id] = kwargs.get("create_kwargs", {}).get("owner", "nobody")
        return instance_id, None

    async def execute(self, instance_id, parameters, **kwargs):
        owner = self.instances[instance_id]
        LEDGER[owner] = LEDGER.get(owner, 0) + int(parameters["amount"])
        return {"text": f"{owner} holds {LEDGER[owner]} {self.unit}"}, 0.0, {}

    async def release(self, instance_id, **kwargs):
        del self.instances[instance_id]


class ClockTool:
    def __init__(self, config, tool_schema):
        self.tool_schema = tool_schema

    def get_openai_tool_schema(self):
        return {"type": "function", "function": {"name": "clock", "description": "The time.",
                                                 "parameters": {"type": "object", "properties": {}}}}

    async def create(self, instance_id=None, **kwargs):
        return "c", None

    async def execute(self, instance_id, parameters, **kwargs):
        return "noon"

    async def release(self, instance_id, **kwargs):
        pass


class NotATool:
    def __init__(self, config, tool_schema):
        pass
'''

CONFIG = '''
tools:
  - class_name: {module}.DepositTool
    config: {{type: native, unit: gold}}
    tool_schema:
      type: function
      function:
        name: deposit
        description: Deposit an amount.
        parameters: {{type: object, properties: {{amount: {{type: integer}}}}, required: [amount]}}
  - class_name: {module}.ClockTool
    config: {{type: native}}
'''

REWARD = '''
import re

def gold_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    found = re.findall(r"<answer>(.*?)</answer>", solution_str)
    return scale * float(bool(found) and found[-1] == str(ground_truth))

def broken(data_source, solution_str, ground_truth, extra_info=None):
    return "yes"
'''


@pytest.fixture
def files(tmp_path, monkeypatch):
    module = f"user_tools_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tools.yaml").write_text(CONFIG.format(module=module))
    (tmp_path / "reward.py").write_text(REWARD)
    yield {"dir": tmp_path, "module": module, "tools": str(tmp_path / "tools.yaml"),
           "reward": str(tmp_path / "reward.py")}
    sys.modules.pop(module, None)


def row(owner="ada", truth="5 gold"):
    return {"data_source": "bank", "prompt": [{"role": "user", "content": "Deposit 2 then 3."}],
            "reward_model": {"ground_truth": truth},
            "extra_info": {"tools_kwargs": {"deposit": {"create_kwargs": {"owner": owner}}}}}


def test_tools_run_with_create_kwargs_and_the_reward_scores_the_transcript(files):
    domain = verl_task(files["tools"], files["reward"], "gold_score", reward_kwargs={"scale": 2.0})
    env = domain.make_env()
    env.reset(row("ada"))
    names = [t["function"]["name"] for t in env.tools()]
    assert names == ["deposit", "clock"], "the schema from the YAML, then the one the class returns"
    assert env.step(json_call("deposit", {"amount": 2})).observation == "ada holds 2 gold"
    assert env.step(json_call("clock", {})).observation == "noon"
    result = env.step("<answer>2 gold</answer>")
    assert result.done and result.reward == 0.0
    env.reset(row("bob", truth="3 gold"))
    env.step(json_call("deposit", {"amount": 3}))
    assert env.step("<answer>3 gold</answer>").reward == 2.0  # reward_kwargs reach the function
    assert "bob holds 3 gold" in env.transcript  # what the reward reads: the whole transcript, as verl's response


def test_continuation_replays_the_calls_and_detects_outside_state_that_moved(files):
    domain = verl_task(files["tools"], files["reward"], "gold_score")
    ledger = sys.modules[files["module"]].LEDGER
    env = domain.make_env()
    env.reset(row("cy"))
    env.step(json_call("deposit", {"amount": 4}))
    snap = env.snapshot()
    ledger.clear()  # a fresh outside store, as a continuation in a new sandbox would find it
    fresh = domain.make_env()
    fresh.reset(row("cy"))
    fresh.restore(snap)
    assert ledger == {"cy": 4}, "restore must replay the recorded call"
    assert fresh.step(json_call("deposit", {"amount": 1})).observation == "cy holds 5 gold"
    again = domain.make_env()
    again.reset(row("cy"))
    with pytest.raises(ValueError, match="deterministic"):  # the store was not reset: replay sees 9, not 4
        again.restore(snap)


def test_tool_free_task_from_the_reward_alone(files):
    domain = verl_task(reward_path=files["reward"], reward_name="gold_score")
    env = domain.make_env()
    env.reset(row())
    assert env.tools() == [] and env.step("<answer>5 gold</answer>").reward == 1.0


def test_missing_tool_config_file(tmp_path):
    with pytest.raises(ValueError, match=r"tool config .*nope.yaml .*tool_config_path.* does not exist"):
        load_verl_tools(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text, message", [
    ("tools: []", "non-empty list `tools"),
    ("tools: [{config: {type: native}}]", r"tools\[0\] has no class_name"),
    ("tools: [{class_name: NoDots}]", "must be a dotted path"),
    ("tools: [{class_name: no_such_pkg_xyz.Tool}]", "cannot import 'no_such_pkg_xyz'"),
    ("tools: [{class_name: {module}.Missing}]", "has no class 'Missing'"),
    ("tools: [{class_name: {module}.NotATool}]", r"lacks \['create', 'execute', 'release'\]"),
    ("tools: [{class_name: {module}.DepositTool, config: {type: mcp}}]", "only 'native'"),
    ("tools: [{class_name: {module}.DepositTool, tool_schema: {type: function, function: {description: x}}}]",
     "tool_schema needs an OpenAI-style function with a name"),
    ("tools: [{class_name: {module}.DepositTool}]", "tool_schema needs an OpenAI-style function with a name"),
    ("tools: [{class_name: {module}.DepositTool, tool_schema: {type: function, function: {name: deposit}}},"
     " {class_name: {module}.DepositTool, tool_schema: {type: function, function: {name: deposit}}}]",
     "two tools share a name"),
    ("tools: [oops", "is not YAML"),
])
def test_bad_tool_config(files, text, message):
    path = files["dir"] / "bad.yaml"
    path.write_text(text.replace("{module}", files["module"]))
    with pytest.raises(ValueError, match=message):
        verl_task(str(path), files["reward"], "gold_score")


def test_missing_reward_file_and_missing_function(files, tmp_path):
    with pytest.raises(ValueError, match=r"custom_reward_function.path=.*nope.py.* does not exist"):
        load_reward_function(tmp_path / "nope.py", "compute_score")
    with pytest.raises(ValueError, match=r"has no function 'compute_score' \(custom_reward_function.name\); "
                                         r"it defines \['broken', 'gold_score'\]"):
        load_reward_function(files["reward"], "compute_score")
    with pytest.raises(ValueError, match="the task has no reward"):
        verl_task(files["tools"])


def test_reward_file_that_fails_to_import(tmp_path):
    (tmp_path / "bad.py").write_text("import no_such_module_xyz\n")
    with pytest.raises(ValueError, match="importing it raised ModuleNotFoundError"):
        load_reward_function(tmp_path / "bad.py", "compute_score")


def test_reward_returning_a_non_number_fails_the_leaf(files):
    env = verl_task(files["tools"], files["reward"], "broken").make_env()
    env.reset(row())
    with pytest.raises(RewardError, match="must return a finite number"):
        env.step("<answer>x</answer>")


def test_rows_from_files_still_checked(files):
    (files["dir"] / "train.jsonl").write_text('{"prompt": "hi"}\n')
    with pytest.raises(ValueError, match="reward_model.ground_truth"):
        verl_task(files["tools"], files["reward"], "gold_score", train_files=[str(files["dir"] / "train.jsonl")])


# ---------------------------------------------------------------- YAML that expands

LAUGHS = '''
a: &a ["ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
tools:
  - class_name: {module}.DepositTool
    config: {{type: native}}
    tool_schema:
      type: function
      function:
        name: deposit
        description: *g
        parameters: {{type: object, properties: {{amount: {{type: integer}}}}, required: [amount]}}
'''

SHARED = '''
native: &native {{type: native}}
tools:
  - class_name: {module}.DepositTool
    config: *native
    tool_schema: {{type: function, function: {{name: deposit, parameters: {{type: object, properties: {{}}}}}}}}
'''


@pytest.mark.parametrize("text", [LAUGHS, SHARED], ids=["billion laughs", "one shared anchor"])
def test_a_tool_config_with_anchors_or_aliases_is_refused_naming_the_file(files, text):
    path = files["dir"] / "aliased.yaml"
    path.write_text(text.format(module=files["module"]))
    with pytest.raises(ValueError, match=r"aliased\.yaml.*(alias|anchor).*line \d+"):
        verl_task(str(path), files["reward"], "gold_score")


def test_a_tool_config_without_aliases_still_loads(files):
    path = files["dir"] / "plain.yaml"
    path.write_text(SHARED.replace("config: *native", "config: {{type: native}}").format(module=files["module"]))
    assert [t["function"]["name"] for t in verl_task(str(path), files["reward"], "gold_score").make_env().tools()] \
        == ["deposit"]
