"""A user's task that is wrong somewhere fails at load, clearly, or fails one leaf at run time and is counted.

Each test is a fault a user met: a task file that does not import, a stateless tool whose answers vary, a reward
that raises, hangs or always fails, a tool that keeps state without saying how it branches, a replayed tool that
is not deterministic, an error observation that names the episode's temporary folder, a prompt whose content is
not text, a relative path in a config read from another directory."""

import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tracerl.io.env.task import RewardError, UserTask, UserTaskDomain, load_task, tool


def write_rows(path: Path, num: int = 3) -> str:
    rows = [{"data_source": "ledger", "prompt": [{"role": "user", "content": f"Add {i} to the ledger."}],
             "reward_model": {"ground_truth": str(i)}, "extra_info": {"amount": i}} for i in range(1, num + 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth))


@tool(state="replay")
def record(state: Path, amount: int) -> str:
    """Add an amount to the ledger kept in a file; says the new total.

    Args:
        amount: what to add
    """
    ledger = state / "ledger.txt"
    total = int(ledger.read_text()) + amount if ledger.exists() else amount
    ledger.write_text(str(total))
    return f"total {total}"


def rate(currency: str) -> str:
    """Today's exchange rate of a currency (it moves between calls).

    Args:
        currency: e.g. EUR
    """
    return f"{currency} {random.random():.6f}"


def expert(row, turns, rng):
    if not turns:
        return '<tool_call>{"name": "rate", "arguments": {"currency": "EUR"}}</tool_call>'
    if len(turns) == 1:
        return json_call("record", {"amount": row["extra_info"]["amount"]})
    return f"<answer>{turns[-1][1].split()[-1]}</answer>"


def json_call(name, arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def folder(tmp_path):
    def make_state(row):
        return Path(tempfile.mkdtemp(dir=tmp_path))
    return make_state


def ledger_task(tmp_path, tools=(rate, record), reward=score, **kw):
    kw = {"expert": expert, **kw}
    return UserTask(tools=list(tools), compute_score=reward, train_files=[write_rows(tmp_path / "rows.jsonl")],
                    make_state=folder(tmp_path), close_state=lambda f: shutil.rmtree(f, True), **kw)


def play(domain, row, actions):
    env = domain.make_env()
    env.reset(row)
    results = [env.step(a) for a in actions]
    return env, results


# ---------------------------------------------------------------- the task file itself

@pytest.mark.parametrize("body, line, kind", [("def make_task(:\n    pass\n", 1, "SyntaxError"),
                                              ("import json\n\nVALUE = undefined_name + 1\n", 3, "NameError")])
def test_a_task_file_that_does_not_import_names_the_file_and_line(tmp_path, body, line, kind):
    path = tmp_path / "broken_task.py"
    path.write_text(body)
    with pytest.raises(ValueError) as caught:
        load_task(f"{path}:make_task")
    message = str(caught.value)
    assert f"{path}:{line}" in message and kind in message, message


def test_a_task_module_that_raises_while_importing_names_its_file(tmp_path, monkeypatch):
    (tmp_path / "raising_task_mod.py").write_text("x = 1\nraise RuntimeError('no database configured')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"raising_task_mod\.py:2.*RuntimeError: no database configured"):
        load_task("raising_task_mod:make_task")


# ---------------------------------------------------------------- branching

def test_a_stateless_tool_whose_answers_vary_is_never_replay_checked(tmp_path):
    domain = UserTaskDomain(ledger_task(tmp_path))
    row = domain.rows("train", 1)[0]
    env, _ = play(domain, row, [expert(row, [], None), json_call("record", {"amount": 4})])
    fresh = domain.make_env()
    fresh.reset(row)
    fresh.restore(env.snapshot())  # rate's answer differs on a second call; only record is replayed
    assert fresh.step(json_call("record", {"amount": 1})).observation == "total 5"


def test_an_error_observation_naming_the_episode_folder_replays(tmp_path):
    @tool(state="replay")
    def read(state: Path, name: str) -> str:
        """Read a file of the episode.

        Args:
            name: the file
        """
        return (state / name).read_text()
    domain = UserTaskDomain(ledger_task(tmp_path, tools=(read, record)))
    row = domain.rows("train", 1)[0]
    env, results = play(domain, row, [json_call("read", {"name": "missing.txt"})])
    assert str(env.state) in results[0].observation, "the error names the episode's folder"
    fresh = domain.make_env()
    fresh.reset(row)
    fresh.restore(env.snapshot())


def test_a_replay_mismatch_shows_where_the_observations_differ(tmp_path):
    @tool(state="replay")
    def report(state: Path) -> str:
        """A long report whose last number moves."""
        return "ledger report: " + "all entries balanced; " * 8 + f"drift {random.random():.6f}"
    domain = UserTaskDomain(ledger_task(tmp_path, tools=(report, record)))
    row = domain.rows("train", 1)[0]
    env, results = play(domain, row, [json_call("report", {})])
    fresh = domain.make_env()
    fresh.reset(row)
    with pytest.raises(ValueError) as caught:
        fresh.restore(env.snapshot())
    first = results[0].observation
    assert first[first.index("drift"):] in str(caught.value), "the differing tail must be shown"


def test_a_tool_with_undeclared_state_fails_at_load_when_the_method_branches(tmp_path):
    def note(state: Path, text: str) -> str:
        """Write a note.

        Args:
            text: the note
        """
        (state / "note.txt").write_text(text)
        return "noted"
    task = ledger_task(tmp_path, tools=(note, record))
    with pytest.raises(ValueError, match=r"note.*state='copy'.*state='replay'"):
        UserTaskDomain(task, branching=True)
    UserTaskDomain(task, branching=False)  # no continuations: nothing to resume, so it may run


def test_a_replayed_tool_that_is_not_deterministic_fails_at_load(tmp_path):
    @tool(state="replay")
    def record_noisy(state: Path, amount: int) -> str:
        """Add an amount; says the total and a timestamp.

        Args:
            amount: what to add
        """
        return f"total {amount} at {time.perf_counter_ns()}"

    def noisy_expert(row, turns, rng):
        if not turns:
            return json_call("record_noisy", {"amount": 1})
        return "<answer>1</answer>"
    task = ledger_task(tmp_path, tools=(record_noisy,), expert=noisy_expert)
    with pytest.raises(ValueError, match=r"record_noisy.*deterministic"):
        UserTaskDomain(task, branching=True)


# ---------------------------------------------------------------- rows

@pytest.mark.parametrize("message", [{"role": "user", "content": 5}, {"role": 1, "content": "hi"},
                                     {"role": "user"}, "just text"])
def test_a_prompt_message_of_the_wrong_shape_fails_at_load(tmp_path, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": [message], "reward_model": {"ground_truth": "1"}}) + "\n")
    with pytest.raises(ValueError, match=r"rows\.jsonl row 1"):
        UserTaskDomain(UserTask(tools=[], compute_score=score, train_files=[str(path)]))


# ---------------------------------------------------------------- rewards

def test_a_failing_reward_fails_a_warm_start_demonstration_not_the_build(tmp_path):
    pytest.importorskip("torch")
    from tracerl.policy.embedded import expert_episode

    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("score_table")
    domain = UserTaskDomain(ledger_task(tmp_path, reward=broken))
    row = domain.rows("train", 1)[0]
    episode = expert_episode(domain, row, np.random.default_rng(0), 0.0, 4)
    assert episode.reward == 0.0


def test_a_reward_that_hangs_times_out_as_a_failed_leaf(tmp_path):
    """The reward returns only when the test lets it go, after the step: a step that waited for it would have got
    its 1.0, so the timeout error shows the call was cut (no clock is read)."""
    let_go = threading.Event()

    def hung(data_source, solution_str, ground_truth, extra_info=None):
        let_go.wait(60)
        return 1.0
    domain = UserTaskDomain(ledger_task(tmp_path, reward=hung, reward_timeout_s=0.2))
    row = domain.rows("train", 1)[0]
    env = domain.make_env()
    env.reset(row)
    try:
        with pytest.raises(RewardError, match="timed out after 0.2 s") as caught:
            env.step("<answer>1</answer>")
    finally:
        let_go.set()
    assert caught.value.metric == "rollout/reward_timeouts"
    assert domain.reward_counts["timeouts"] == 1 and domain.reward_counts["calls"] == 1


def test_a_reward_that_always_fails_is_counted_and_warned_about(tmp_path):
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        return {"value": 1.0}  # no "score"
    domain = UserTaskDomain(ledger_task(tmp_path, reward=broken))
    row = domain.rows("train", 1)[0]
    with pytest.warns(UserWarning, match=r"reward function failed on 8 of 8 calls"):
        for _ in range(8):
            env = domain.make_env()
            env.reset(row)
            with pytest.raises(RewardError) as caught:
                env.step("<answer>1</answer>")
    assert caught.value.metric == "rollout/reward_errors"
    assert domain.reward_counts == {"calls": 8, "errors": 8, "timeouts": 0}


# ---------------------------------------------------------------- config paths

def test_task_and_data_paths_in_a_config_resolve_against_its_folder(tmp_path, monkeypatch):
    from tracerl.train.config import load_config

    project = tmp_path / "project"
    project.mkdir()
    (project / "task.py").write_text("from tracerl.io.env.task import UserTask\n"
                                     "def make_task():\n    return UserTask(tools=[], compute_score=None)\n")
    write_rows(project / "train.jsonl")
    (project / "config.toml").write_text('[data]\ntask = "task.py:make_task"\ntrain_files = ["train.jsonl"]\n')
    monkeypatch.chdir(tmp_path)  # another directory than the config's
    config = load_config(str(project / "config.toml"), machine=False)
    assert config.data.task == f"{project / 'task.py'}:make_task"
    assert config.data.train_files == (str(project / "train.jsonl"),)
    given = load_config(str(project / "config.toml"), ["data.train_files=[\"rows.jsonl\"]"], machine=False)
    assert given.data.train_files == (str(tmp_path / "rows.jsonl"),), "a --set path starts at the working directory"
