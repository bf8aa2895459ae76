"""The BFCL v4 multi-turn adapter against the real bfcl-eval APIs and checkers (a 30-case sample)."""

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import play_episode

from tracerl.io.domains import bfcl
from tracerl.io.domains.funcall import format_tool_call

try:
    bfcl.require_bfcl()
    MISSING = ""
except ImportError as err:
    MISSING = str(err)
needs_bfcl = pytest.mark.skipif(bool(MISSING), reason=MISSING)


@functools.cache
def domain():
    return bfcl.BfclDomain()


@functools.cache
def sample_rows():
    return domain().rows("test", 30, seed=0)


@functools.cache
def tools_of(case_id):
    env = domain().make_env()
    env.reset(next(r for r in sample_rows() if r["extra_info"]["case_id"] == case_id))
    return env.tools()


def fs_row():
    return next(r for r in sample_rows() if "GorillaFileSystem" in r["extra_info"]["involved_classes"])


def play(row, policy, max_steps=120):
    return play_episode(domain(), row, policy, max_steps)


def expert(row, turns):
    return domain().expert_turn(row, turns, np.random.default_rng(0))


def test_missing_package_raises_import_error_with_the_install_line():
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'bfcl_eval':\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from tracerl.io.domains import bfcl\n"  # the module itself imports without bfcl-eval
            "try:\n"
            "    bfcl.BfclDomain()\n"
            "except ImportError as err:\n"
            "    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert bfcl.INSTALL_LINE in out.stdout, out.stdout


@needs_bfcl
def test_rows_are_deterministic_json_and_splits_disjoint():
    d = domain()
    train, test = set(d.case_ids("train")), set(d.case_ids("test"))
    assert train and test and not train & test
    assert len(train | test) == len(d.cases) == 200
    rows = d.rows("test", 10, seed=1)
    assert rows == d.rows("test", 10, seed=1)
    assert [r["extra_info"]["case_id"] for r in rows] != [r["extra_info"]["case_id"] for r in d.rows("test", 10, 2)]
    assert json.loads(json.dumps(rows)) == rows
    with pytest.raises(ValueError, match="cases; asked for"):
        d.rows("test", len(test) + 1)


@needs_bfcl
def test_ground_truth_strings_become_named_arguments():
    owners = bfcl.function_owners(["GorillaFileSystem", "MathAPI"])
    assert bfcl.parse_call("sort('final_report.pdf')", owners) == {"name": "sort",
                                                                  "arguments": {"file_name": "final_report.pdf"}}
    assert bfcl.parse_call("add(a=1, b=2.5)", owners) == {"name": "add", "arguments": {"a": 1, "b": 2.5}}
    with pytest.raises(ValueError):
        bfcl.parse_call("cd(folder=__import__('os').getcwd())", owners)  # literals only, never eval


@needs_bfcl
def test_expert_replaying_the_ground_truth_scores_at_least_95pct():
    results = [play(row, expert)[0] for row in sample_rows()]
    failed = [(r.info.get("user_turn"), r.info.get("failed_check")) for r in results if r.reward != 1.0]
    assert np.mean([r.reward for r in results]) >= 0.95, failed


@needs_bfcl
def test_the_next_user_turn_comes_back_after_an_answer():
    row = next(r for r in sample_rows() if r["reward_model"]["ground_truth"]["turns"][0])
    result, turns, env = play(row, expert, max_steps=len(row["reward_model"]["ground_truth"]["turns"][0]) + 1)
    assert not result.done and result.info["role"] == "user"
    assert result.observation == row["extra_info"]["user_turns"][1]
    assert env.state["user_turn"] == 1 and env.state["num_calls_in_turn"] == 0


@needs_bfcl
def test_answering_without_calls_fails_the_turn():
    row = next(r for r in sample_rows() if r["reward_model"]["ground_truth"]["turns"][0])
    result, _, _ = play(row, lambda row, turns: "<answer>done</answer>")
    assert result.done and result.reward == 0.0
    assert result.info["failed_check"] == "multi_turn:empty_turn_model_response"


@needs_bfcl
def test_random_policy_scores_near_zero():
    rng = np.random.default_rng(0)

    def random_policy(row, turns):
        if len(turns) % 4 == 3:
            return "<answer>done</answer>"
        schema = rng.choice(tools_of(row["extra_info"]["case_id"]))["function"]
        pool = {"string": "a", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
        arguments = {k: pool.get(p.get("type"), "a") for k, p in schema["parameters"]["properties"].items()
                     if k in schema["parameters"].get("required", [])}
        return format_tool_call(schema["name"], arguments)

    rewards = [play(row, random_policy)[0].reward for row in sample_rows()]
    assert np.mean(rewards) <= 0.1, rewards


@needs_bfcl
@pytest.mark.parametrize("action", [
    '<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>',
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": 3}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {}}</tool_call>',
    "x" * 100_000,
    format_tool_call("mkdir", {"dir_name": "y" * 100_000}),
], ids=["bad_json", "unknown_tool", "int_for_string", "missing_args", "100kb_text", "100kb_argument"])
def test_malformed_calls_become_error_observations(action):
    row = fs_row()
    env = domain().make_env()
    env.reset(row)
    before = env.snapshot()
    result = env.step(action)
    assert result.tool_error and not result.done and result.observation.startswith("error:"), result
    assert bfcl.require_bfcl().state_checker(env.state["instances"], before["instances"])["valid"]
    assert env.state["results"] == [], "a rejected call must not count as executed"


@needs_bfcl
def test_a_tool_that_raises_becomes_an_error_observation(monkeypatch):
    env = domain().make_env()
    env.reset(fs_row())

    def broken(**kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(env.state["instances"]["GorillaFileSystem"], "pwd", broken)
    result = env.step(format_tool_call("pwd", {}))
    assert result.tool_error and not result.done and "disk on fire" in result.observation
    assert env.state["results"] == ["Error during execution: disk on fire"], "recorded as bfcl-eval records it"


@needs_bfcl
def test_snapshot_restore_resumes_the_exact_api_state():
    env = domain().make_env()
    env.reset(fs_row())
    check = bfcl.require_bfcl().state_checker
    snap = env.snapshot()
    listing = env.step(format_tool_call("ls", {})).observation
    env.step(format_tool_call("mkdir", {"dir_name": "zz_scratch"}))
    assert "zz_scratch" in env.step(format_tool_call("ls", {})).observation
    assert not check(env.state["instances"], snap["instances"])["valid"]
    env.restore(snap)
    assert check(env.state["instances"], snap["instances"])["valid"] and env.state["results"] == []
    assert env.step(format_tool_call("ls", {})).observation == listing, "tools must run on the restored instances"
    env.step(format_tool_call("mkdir", {"dir_name": "zz_again"}))
    env.restore(snap)  # the snapshot is untouched by what ran after the first restore
    assert env.step(format_tool_call("ls", {})).observation == listing
