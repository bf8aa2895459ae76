"""The built-in function-calling suite: generation, reward rule, expert, robustness to bad calls, snapshot/restore."""

import functools
import json

import numpy as np
import pytest

from helpers import play_episode

from tracerl.io.domains import funcall
from tracerl.io.domains.funcall import FuncallDomain, api_state, format_tool_call

DOMAIN = FuncallDomain()
WORDS = sorted(set(funcall.FOLDERS + funcall.FILES + funcall.NOTES + funcall.ACCOUNTS + funcall.DAYS
                   + funcall.TITLES + ("..", "/")))


def play(row, policy, max_turns=8):
    return play_episode(DOMAIN, row, policy, max_turns)


def expert(row, turns):
    return DOMAIN.expert_turn(row, turns, np.random.default_rng(0))


def random_policy(rng):
    """Well-formed calls to random tools with random arguments from the task vocabulary; sometimes an answer."""
    def act(row, turns):
        if rng.random() < 0.25:
            return f"<answer>{rng.choice(WORDS + [str(v) for v in range(0, 600, 10)])}</answer>"
        name = str(rng.choice(sorted(funcall.TOOL_SPECS)))
        arguments = {key: int(rng.integers(1, 51)) * 10 if spec["type"] == "integer" else str(rng.choice(WORDS))
                     for key, spec in funcall.TOOL_SPECS[name].properties.items()}
        return format_tool_call(name, arguments)
    return act


@functools.cache
def held_out_rows(num=200):
    return DOMAIN.rows("test", num, seed=0)


def row_of(task):
    return next(r for r in held_out_rows() if r["extra_info"]["task"] == task)


def test_rows_are_deterministic_by_seed_and_json():
    rows = DOMAIN.rows("train", 40, seed=3)
    assert rows == DOMAIN.rows("train", 40, seed=3)
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in DOMAIN.rows("train", 40, seed=4)]
    assert json.loads(json.dumps(rows)) == rows, "rows must survive a JSON round trip (parquet/JSONL)"
    assert {r["data_source"] for r in rows} == {"funcall"}
    assert all(1 <= len(r["reward_model"]["ground_truth"]["calls"]) <= 3 for r in rows)


def test_splits_share_no_question_and_cover_the_templates():
    train = DOMAIN.rows("train", 600, seed=0)
    test = DOMAIN.rows("test", 200, seed=1)
    shared = {r["prompt"][-1]["content"] for r in train} & {r["prompt"][-1]["content"] for r in test}
    assert not shared, f"questions in both splits: {sorted(shared)[:3]}"
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    assert len({r["extra_info"]["task"] for r in test}) >= len(funcall.TEMPLATES) - 2


def test_expert_solves_the_test_split():
    rewards = [play(row, expert)[0].reward for row in held_out_rows()]
    assert np.mean(rewards) >= 0.95, f"expert reward {np.mean(rewards):.3f}"


def test_random_policy_scores_near_zero():
    rng = np.random.default_rng(0)
    rewards = [play(row, random_policy(rng), max_turns=6)[0].reward for row in held_out_rows()]
    assert np.mean(rewards) <= 0.05, f"random policy reward {np.mean(rewards):.3f}"


def test_reward_needs_the_state_the_calls_and_the_answer():
    row = row_of("transfer_then_balance")
    truth = row["reward_model"]["ground_truth"]
    calls = [format_tool_call(c["name"], c["arguments"]) for c in truth["calls"]]
    fixed = lambda actions: (lambda row, turns: actions[len(turns)])  # noqa: E731
    correct = f"<answer>{truth['answer']}</answer>"
    assert play(row, fixed(calls + [correct]))[0].reward == 1.0
    # extra read-only calls are allowed, and the answer is normalised
    read = format_tool_call("balance", {"account": truth["calls"][0]["arguments"]["target"]})
    assert play(row, fixed([read] + calls + [f"<answer> {truth['answer']}. </answer>"]))[0].reward == 1.0
    assert play(row, fixed(calls + ["<answer>12345</answer>"]))[0].reward == 0.0, "wrong answer"
    assert play(row, fixed(calls[:1] + [correct]))[0].reward == 0.0, "the balance was never read"
    deposit = format_tool_call("deposit", {"account": truth["calls"][0]["arguments"]["target"], "amount": 10})
    assert play(row, fixed(calls + [deposit, correct]))[0].reward == 0.0, "extra state change"


def test_required_calls_are_compared_without_order_and_numbers_by_value():
    required = [{"name": "transfer", "arguments": {"source": "a", "target": "b", "amount": 30}},
                {"name": "balance", "arguments": {"account": "a"}}]
    executed = [{"name": "balance", "arguments": {"account": "a"}},
                {"name": "transfer", "arguments": {"amount": 30.0, "target": "b", "source": "a"}}]
    assert funcall.calls_included(required, executed)
    assert not funcall.calls_included(required + required[1:], executed), "multiplicity counts"
    assert not funcall.calls_included(required, executed[:1])


@pytest.mark.parametrize("action", [
    '<tool_call>{"name": "transfer", "arguments": {"source": </tool_call>',
    '<tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call>',
    '<tool_call>{"name": "deposit", "arguments": {"account": "alice", "amount": "30"}}</tool_call>',
    '<tool_call>{"name": "deposit", "arguments": {"account": "alice", "amount": true}}</tool_call>',
    '<tool_call>{"name": "transfer", "arguments": {"source": "alice"}}</tool_call>',
    '<tool_call>{"name": "ls", "arguments": ["x"]}</tool_call>',
    "x" * 100_000,
    format_tool_call("write", {"file": "big.txt", "text": "y" * 100_000}),
    "I think the answer is 3",
], ids=["bad_json", "unknown_tool", "string_for_integer", "bool_for_integer", "missing_args", "list_args",
        "100kb_text", "100kb_argument", "no_call_no_answer"])
def test_malformed_calls_become_error_observations(action):
    row = row_of("make_note")
    result, _, env = play(row, lambda row, turns: action, max_turns=1)
    assert result.tool_error and not result.done, result
    assert result.observation.startswith("error:") and len(result.observation) < 1000
    assert api_state(env.state["apis"]) == row["extra_info"]["initial_state"] and env.state["calls"] == []


def test_a_tool_that_raises_becomes_an_error_observation():
    row = row_of("transfer")
    env = DOMAIN.make_env()
    env.reset(row)
    rich = max(row["extra_info"]["initial_state"]["accounts"].items(), key=lambda kv: kv[1])
    poor = min(row["extra_info"]["initial_state"]["accounts"].items(), key=lambda kv: kv[1])
    result = env.step(format_tool_call("transfer", {"source": poor[0], "target": rich[0], "amount": poor[1] + 10}))
    assert result.tool_error and not result.done
    assert "insufficient funds" in result.observation
    assert env.step(format_tool_call("cd", {"folder": "nowhere"})).tool_error
    assert api_state(env.state["apis"]) == row["extra_info"]["initial_state"], "a failed call changed the state"
    assert env.state["calls"] == [], "failed calls must not count as made"


def test_snapshot_restore_resumes_the_exact_api_state():
    row = row_of("transfer")
    env = DOMAIN.make_env()
    env.reset(row)
    env.step(format_tool_call("mkdir", {"name": "scratch"}))
    env.step(format_tool_call("cd", {"folder": "scratch"}))
    before = api_state(env.state["apis"])
    snap = env.snapshot()
    account = next(iter(row["extra_info"]["initial_state"]["accounts"]))
    balance = env.step(format_tool_call("balance", {"account": account})).observation
    env.step(format_tool_call("deposit", {"account": account, "amount": 50}))
    env.step(format_tool_call("write", {"file": "a.txt", "text": "hello"}))
    assert api_state(env.state["apis"]) != before
    env.restore(snap)
    assert api_state(env.state["apis"]) == before
    assert env.state["calls"] == [{"name": "mkdir", "arguments": {"name": "scratch"}},
                                  {"name": "cd", "arguments": {"folder": "scratch"}}]
    # the tools now run on the restored objects: old balance, still inside scratch/, no a.txt
    assert env.step(format_tool_call("balance", {"account": account})).observation == balance
    assert env.step(format_tool_call("ls", {})).observation == "(empty folder)"
    env.step(format_tool_call("deposit", {"account": account, "amount": 50}))
    env.restore(snap)  # the snapshot is untouched by what ran after the first restore
    assert api_state(env.state["apis"]) == before


def test_state_features_count_the_executed_calls_from_the_transcript_only():
    from tracerl.core.history import History

    domain = FuncallDomain()
    state_features = domain.state_features
    row = domain.rows("test", 1, seed=3)[0]
    env, turns, parts = domain.make_env(), [], [row["prompt"][-1]["content"]]
    env.reset(row)
    histories = [History(parts[0], 0, prompt_id=f"funcall:test:{row['extra_info']['index']}")]
    while len(turns) < len(row["reward_model"]["ground_truth"]["calls"]):
        action = domain.expert_turn(row, turns, np.random.default_rng(0))
        result = env.step(action)
        turns.append((action, result.observation))
        parts += [action, result.observation]
        histories.append(History("\n".join(parts), len(turns), prompt_id=histories[0].prompt_id))
    for depth, h in enumerate(histories):
        f = state_features(h)
        assert f[f"calls_ran={min(depth, 4)}"] and f["calls_failed=0"] and f["last=none" if depth == 0 else "last=ran"]
    bad = History(parts[0] + "\n" + format_tool_call("cd", {"folder": "nowhere"}) + "\nerror: cd failed: KeyError",
                  1, prompt_id=histories[0].prompt_id)
    assert state_features(bad)["last=error"] and state_features(bad)["calls_failed=1"]
    forged = json.loads(json.dumps(row))
    forged["reward_model"]["ground_truth"]["answer"] = "something else"
    assert state_features(histories[-1]) == state_features(History(histories[-1].text, histories[-1].depth,
                                                                      prompt_id=histories[0].prompt_id,
                                                                      meta={"row": forged})), \
        "the features depend on the history only"
