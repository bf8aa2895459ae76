"""verl tools with state, in tracerl's driver as in verl's tool agent loop: `examples/verl_ledger`, a `BaseTool` that
keeps a ledger in the trajectory's `agent_data.extra_fields`, and a `@function_tool`, loaded from verl's own
settings (tool config YAML, `function_tool_path`) and run unchanged.

Checked against verl itself: the same calls through verl 0.9.1's `ToolAgentLoop._call_tool` give the same
observations, step rewards and `extra_fields`. No Ray: these run the tools, not the trainer."""

import asyncio
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl.experimental.agent_loop.tool_agent_loop",
                    reason="needs verl 0.9.1 in its own environment: run .ci/verl")

from helpers import make_renderer  # noqa: E402

from tracerl.io.env.task import json_call  # noqa: E402
from tracerl.io.env.verl_task import verl_task  # noqa: E402
from tracerl.io.rollout.driver import DriverLimits, ReActDriver  # noqa: E402
from tracerl.io.rollout.scripted_engine import ScriptedEngine  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_ledger"


@pytest.fixture(scope="module")
def domain():
    sys.path.insert(0, str(EXAMPLE.parent))  # class_name verl_ledger.tools.LedgerTool, as verl imports it
    try:
        yield verl_task(tool_config_path=str(EXAMPLE / "tool_config.yaml"), reward_path=str(EXAMPLE / "reward.py"),
                        reward_name="ledger_score", function_tool_path=str(EXAMPLE / "functions.py"))
    finally:
        sys.path.remove(str(EXAMPLE.parent))


def row(opening=10, amounts=(5, -3), index=0):
    return {"data_source": "ledger", "prompt": [{"role": "user", "content": f"Record {amounts}; what is the balance?"}],
            "reward_model": {"ground_truth": str(opening + sum(amounts))},
            "extra_info": {"index": index, "amounts": list(amounts),
                           "tools_kwargs": {"ledger": {"create_kwargs": {"opening": opening}}}}}


def record(amount):
    return json_call("ledger", {"amount": amount})


def test_a_verl_tool_keeps_state_across_the_calls_of_one_trajectory(domain):
    first, second = domain.make_env(), domain.make_env()
    first.reset(row(opening=10))
    second.reset(row(opening=100))
    assert first.step(record(5)).observation == "recorded 5; balance 15 after 1 entries"
    assert second.step(record(1)).observation == "recorded 1; balance 101 after 1 entries"
    assert first.step(record(-3)).observation == "recorded -3; balance 12 after 2 entries"
    data = first.state["agent_data"]
    assert data.extra_fields["ledger"] == [10, 5, -3], "one store per trajectory, shared by its calls"
    assert data.request_id != second.state["agent_data"].request_id, "each trajectory has its own identity"
    assert data.tools_kwargs["ledger"]["create_kwargs"] == {"opening": 10}


def test_a_continuation_rebuilds_the_store_by_replaying_the_calls(domain):
    env = domain.make_env()
    env.reset(row())
    env.step(record(5))
    env.step(record(-3))
    fresh = domain.make_env()
    fresh.reset(row())
    assert fresh.state["agent_data"].extra_fields == {}
    fresh.restore(env.snapshot())
    assert fresh.state["agent_data"].extra_fields["ledger"] == [10, 5, -3]
    assert fresh.step(record(4)).observation == "recorded 4; balance 16 after 3 entries"


def test_the_step_reward_is_kept_on_the_turn_and_in_agent_data(domain):
    env = domain.make_env()
    env.reset(row(opening=1))
    up, down = env.step(record(2)), env.step(record(-9))
    assert up.info["meta"]["tool_reward"] == pytest.approx(0.1)
    assert down.info["meta"]["tool_reward"] == pytest.approx(-0.1)
    assert down.info["meta"]["tool_metrics"] == {"entries": 2}
    assert env.state["agent_data"].tool_rewards == pytest.approx([0.1, -0.1])


def test_a_function_tool_loads_with_verls_schema_and_runs(domain):
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY

    schemas = {s["function"]["name"]: s for s in domain.make_env().tools()}
    assert set(schemas) == {"ledger", "fee"}
    expected = FUNCTION_TOOL_REGISTRY["fee"].tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert schemas["fee"] == expected
    env = domain.make_env()
    env.reset(row())
    assert env.step(json_call("fee", {"amount": 250, "express": True})).observation == "fee 5"


def test_the_same_calls_through_verls_tool_agent_loop_agree(domain):
    """verl's own `_call_tool` on the same tool instances and calls: same text, reward and extra_fields."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY
    from verl.tools.tool_registry import initialize_tools_from_config

    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        tools = {t.name: t for t in initialize_tools_from_config(str(EXAMPLE / "tool_config.yaml"))}
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    tools["fee"] = FUNCTION_TOOL_REGISTRY["fee"]
    loop = object.__new__(ToolAgentLoop)
    loop.tools, loop.max_tool_response_length, loop.tool_response_truncate_side = tools, 10_000, "right"
    the_row = row(opening=3)
    data = AgentData(messages=the_row["prompt"], image_data=None, video_data=None, audio_data=None,
                     mm_processor_kwargs=None, metrics={}, request_id="r",
                     tools_kwargs=the_row["extra_info"]["tools_kwargs"])
    calls = [("ledger", {"amount": 4}), ("fee", {"amount": 40}), ("ledger", {"amount": -10})]

    async def in_verl():
        return [await loop._call_tool(FunctionCall(name=n, arguments=json.dumps(a)), data.tools_kwargs, data)
                for n, a in calls]
    theirs = asyncio.run(in_verl())
    env = domain.make_env()
    env.reset(the_row)
    ours = [env.step(json_call(n, a)) for n, a in calls]
    assert [r.observation for r in ours] == [response.text for response, _, _ in theirs]
    assert [r.info.get("meta", {}).get("tool_reward", 0.0) for r in ours] == pytest.approx([rw for _, rw, _ in theirs])
    assert env.state["agent_data"].extra_fields == data.extra_fields


def test_the_driver_branches_a_verl_tool_and_keeps_step_rewards_on_nodes(domain):
    """Real continuations through `ReActDriver` (scripted engine) that branch after the first call: the second
    call's balance, which the answer repeats, is right only if the branch's fresh `agent_data` was rebuilt by
    replaying the first; nodes carry the step reward."""
    rows = [row(opening=10, amounts=(5, -3), index=0), row(opening=0, amounts=(7, 2), index=1)]
    texts = [record(a) for r in rows for a in r["extra_info"]["amounts"]] + ["recorded 5; balance 15 after 1 entries"]
    renderer = make_renderer(texts * 10, vocab_size=400)

    def script(prefix, sample_index, rng):
        text = renderer.decode(prefix)
        question = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        the_row = next(r for r in rows if r["prompt"][-1]["content"] == question)
        done = text.count("<tool_response>")
        amounts = the_row["extra_info"]["amounts"]
        seen = re.findall(r"balance (-?\d+)", text)  # the answer is what the tool said last
        action = record(amounts[done]) if done < len(amounts) else f"<answer>{seen[-1]}</answer>"
        return renderer.encode(action) + [renderer.stop_token_ids[0]]
    driver = ReActDriver(ScriptedEngine(script), renderer, domain, limits=DriverLimits(max_turns=4))
    driver.set_rows(rows)
    trees, _ = driver.run_roots([0, 1], [1, 1])
    anchors = [(tree, tree.children[0][0], 2) for tree in trees]  # after the first call: the second one needs it
    driver.run_continuations(anchors)
    for tree, the_row in zip(trees, rows):
        leaves = [tree.nodes[i] for i in tree.leaves()]
        assert len(leaves) == 3 and all(leaf.reward == 1.0 for leaf in leaves), [leaf.reward for leaf in leaves]
        calls = [n for n in tree.nodes if n.meta.get("tool_reward") is not None]
        assert calls and all(np.isclose(n.meta["tool_reward"], 0.1) for n in calls)
    assert driver.counters["rollout/env_exceptions"] == 0
