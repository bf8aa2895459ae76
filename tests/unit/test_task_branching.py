"""Branching on a user's task: copied state, replayed outside state, and the error when a tool says neither.

The replay test drives real continuations through `ReActDriver` (scripted engine, trained tokenizer) on a tool whose
state is a file on disk, where a deep copy of the Python state cannot help."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from tracerl.io.env.task import RewardError, UserTask, UserTaskDomain, UserTaskEnv, tool  # noqa: E402
from tracerl.io.rollout.driver import DriverLimits, ReActDriver  # noqa: E402

from helpers import expert_engine, make_renderer  # noqa: E402


def bump_file(state: Path, by: int) -> str:
    counter = state / "counter.txt"
    value = int(counter.read_text()) + by if counter.exists() else by
    counter.write_text(str(value))
    return f"counter is {value}"


@tool(state="replay")
def bump(state: Path, by: int) -> str:
    """Add to the counter kept in a file; says its new value.

    Args:
        by: how much to add
    """
    return bump_file(state, by)


def bump_undeclared(state: Path, by: int) -> str:
    """Add to the counter kept in a file."""
    return bump_file(state, by)


@tool(state="copy")
def bump_copy(state: dict, by: int) -> str:
    """Add to the counter kept in Python."""
    state["value"] = state.get("value", 0) + by
    return f"counter is {state['value']}"


def expert(row, turns, rng):
    steps = row["extra_info"]["steps"]
    if len(turns) < len(steps):
        name = row["extra_info"]["tool"]
        return f"<tool_call>{json.dumps({'name': name, 'arguments': {'by': steps[len(turns)]}})}</tool_call>"
    return f"<answer>{turns[-1][1].split()[-1]}</answer>"


def score(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str.strip() == str(ground_truth))


def make_rows(tmp_path, tool_name="bump"):
    rows = [{"data_source": "counter", "prompt": [{"role": "user", "content": f"Add {' then '.join(map(str, s))}."}],
             "reward_model": {"ground_truth": str(sum(s))}, "extra_info": {"steps": s, "tool": tool_name}}
            for s in ([3, 5, 7], [2, 4, 1, 6], [9, 9, 1])]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make_domain(tmp_path, tools=(bump,), tool_name="bump", reward=score, make_state=None):
    made: list[Path] = []

    def fresh_folder(row):
        made.append(Path(tempfile.mkdtemp(dir=tmp_path)))
        return made[-1]
    task = UserTask(tools=list(tools), compute_score=reward, train_files=[make_rows(tmp_path, tool_name)],
                    make_state=make_state or fresh_folder, close_state=lambda f: shutil.rmtree(f, True)
                    if isinstance(f, Path) else None, expert=expert)
    return UserTaskDomain(task)


@pytest.fixture(scope="module")
def renderer():
    texts = ["Add 3 then 5 then 7.", "counter is 15", '{"name": "bump", "arguments": {"by": 3}}'] * 10
    return make_renderer(texts, vocab_size=400)


def grow_and_branch(domain, renderer, depth=2):
    """One expert rollout per row, then two expert continuations from each tree's node at `depth`."""
    rows = domain.rows("train", 10)
    driver = ReActDriver(expert_engine(renderer, rows, domain), renderer, domain, limits=DriverLimits(max_turns=8))
    driver.set_rows(rows)
    trees, _ = driver.run_roots(list(range(len(rows))), [1] * len(rows))
    anchors = []
    for tree in trees:
        node = 0
        for _ in range(depth):
            node = tree.children[node][0]
        anchors.append((tree, node, 2))
    driver.run_continuations(anchors)
    return trees, anchors, driver


def observations_after(tree, node_id):
    """Per child of node_id, the observations on its path down to its leaf."""
    result = []
    for child in tree.children[node_id]:
        path, node = [], child
        while True:
            path.append(tree.nodes[node].segment.observation_text)
            if not tree.children[node]:
                break
            node = tree.children[node][0]
        result.append((tree.nodes[child].origin, path, tree.nodes[node].reward))
    return result


def test_continuations_replay_outside_state_and_see_the_original_observations(renderer, tmp_path):
    trees, anchors, driver = grow_and_branch(make_domain(tmp_path), renderer)
    for tree, node_id, _ in anchors:
        seen = observations_after(tree, node_id)
        original = [path for origin, path, _ in seen if origin == "bare"]
        branches = [(path, reward) for origin, path, reward in seen if origin == "continuation"]
        assert len(original) == 1 and len(branches) == 2
        for path, reward in branches:
            assert path == original[0], "a continuation must see what the original rollout saw after its prefix"
            assert reward == 1.0
    assert driver.counters["rollout/env_exceptions"] == 0


def test_without_replay_the_continuations_diverge(renderer, tmp_path, monkeypatch):
    """The check above can fail: skip the replay and the file counter restarts from zero."""
    monkeypatch.setattr(UserTaskEnv, "restore", lambda self, snap: None)
    trees, anchors, _ = grow_and_branch(make_domain(tmp_path), renderer)
    tree, node_id, _ = anchors[0]
    seen = observations_after(tree, node_id)
    original = next(path for origin, path, _ in seen if origin == "bare")
    assert any(path != original for origin, path, _ in seen if origin == "continuation")


def test_copied_state_branches_too(renderer, tmp_path):
    domain = make_domain(tmp_path, tools=(bump_copy,), tool_name="bump_copy", make_state=lambda row: {})
    trees, anchors, _ = grow_and_branch(domain, renderer)
    assert all(r == 1.0 for t in trees for r in t.rewards())


def test_a_stateful_tool_that_declares_nothing_fails_when_branched(renderer, tmp_path):
    domain = make_domain(tmp_path, tools=(bump_undeclared,), tool_name="bump_undeclared")
    with pytest.raises(ValueError, match=r"bump_undeclared.*state='copy'.*state='replay'"):
        grow_and_branch(domain, renderer)
    rows = domain.rows("train", 10)  # rollouts alone (no branching past a call) run fine
    driver = ReActDriver(expert_engine(renderer, rows, domain), renderer, domain, limits=DriverLimits(max_turns=8))
    driver.set_rows(rows)
    trees, _ = driver.run_roots(list(range(len(rows))), [2] * len(rows))
    assert all(r == 1.0 for t in trees for r in t.rewards())


def test_a_nondeterministic_replayed_tool_is_reported(tmp_path):
    @tool(state="replay")
    def draw(state: Path) -> str:
        """A number that changes every call (calls run in worker processes: a counter kept in Python memory moves
        in one worker only, and the replay may run in the other)."""
        return os.urandom(8).hex()
    domain = make_domain(tmp_path, tools=(draw,))
    env = domain.make_env()
    env.reset(domain.rows("train", 1)[0])
    env.step('<tool_call>{"name": "draw", "arguments": {}}</tool_call>')
    snapshot = env.snapshot()
    fresh = domain.make_env()
    fresh.reset(domain.rows("train", 1)[0])
    with pytest.raises(ValueError, match="must be deterministic"):
        fresh.restore(snapshot)


@pytest.mark.parametrize("reward", [lambda **kw: 1 / 0, lambda **kw: "yes", lambda **kw: None])
def test_a_failing_reward_is_a_counted_failed_leaf_not_a_crash(renderer, tmp_path, reward):
    domain = make_domain(tmp_path, reward=reward)
    env = domain.make_env()
    env.reset(domain.rows("train", 1)[0])
    with pytest.raises(RewardError):
        env.step("<answer>3</answer>")
    with pytest.warns(UserWarning, match=r"failed on 8 of 8 calls so far .* fix the reward") as said:
        trees, _, driver = grow_and_branch(domain, renderer)
    assert sum("fix the reward" in str(w.message) for w in said) == 1  # said once, at the 8th call, not per failure
    leaves = [t.nodes[leaf] for t in trees for leaf in t.leaves()]
    assert len(leaves) == 9 and all(n.reward == 0.0 and n.finish_reason == "error" for n in leaves)
    assert driver.counters["rollout/env_exceptions"] == 9
    assert "RewardError" in leaves[0].segment.observation_text
