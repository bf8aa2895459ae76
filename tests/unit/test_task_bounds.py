"""User code and model data without a bound: every call of a user's tool or state factory returns by its deadline,
its process (and anything it started) is gone after it, its output is capped, and model-chosen nesting is refused
with a clear error, never a RecursionError.

Each tool here is what a model can make of an honest tool (`time.sleep(n)`, `range(n)` with a huge n chosen by the
model), or a tool that went wrong (prints forever, returns 100 MB, swallows every exception, dies). The deadlines
are 1 s against work of 1000 s or more, and the only wall-clock bound is `finishes(..., within=120)`, which fails a
test that never returns; "killed" is proved by the process being gone, never by a time."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import finishes, gone

from tracerl.io.env import EpisodeError
from tracerl.io.env.actions import MAX_ACTION_CHARS, parse_action
from tracerl.io.env.task import UserTask, UserTaskDomain, tool
from tracerl.io.env.task_tools import ToolOutput



def score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth))


def write_rows(path: Path) -> str:
    row = {"data_source": "t", "prompt": [{"role": "user", "content": "Work."}], "reward_model": {"ground_truth": "1"}}
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def domain_of(tmp_path, tools, **kw):
    kw.setdefault("tool_timeout_s", 1.0)
    return UserTaskDomain(UserTask(tools=list(tools), compute_score=score,
                                   train_files=[write_rows(tmp_path / "rows.jsonl")], **kw))


def started_env(domain):
    env = domain.make_env()
    env.reset(domain.rows("train", 1)[0])
    return env


def pid_file(tmp_path):
    return tmp_path / "pid.txt"


def tools_for(tmp_path):
    """Tools that write their pid first, so a test can check the process is gone."""
    pids = pid_file(tmp_path)

    def wait(seconds: int) -> str:
        """Wait a number of seconds.

        Args:
            seconds: how long
        """
        pids.write_text(str(os.getpid()))
        time.sleep(seconds)
        return f"waited {seconds}"

    def count(n: int) -> str:
        """Sum the numbers below n.

        Args:
            n: the bound
        """
        pids.write_text(str(os.getpid()))
        return str(sum(range(n)))  # one C call: no signal handler runs until it returns

    def stubborn(seconds: int) -> str:
        """Wait, and refuse to be interrupted.

        Args:
            seconds: how long
        """
        pids.write_text(str(os.getpid()))
        while True:
            try:
                time.sleep(seconds)
            except BaseException:  # noqa: BLE001 - the point: it swallows the timeout
                pass

    def spawn(seconds: int) -> str:
        """Start a helper process, then wait.

        Args:
            seconds: how long
        """
        helper = subprocess.Popen(["sleep", str(seconds)])
        pids.write_text(f"{os.getpid()} {helper.pid}")
        time.sleep(seconds)
        return "done"
    return [wait, count, stubborn, spawn]


# ---------------------------------------------------------------- the deadline and the kill

@pytest.mark.parametrize("name, arguments", [("wait", {"seconds": 1000}), ("count", {"n": 10**13}),
                                             ("stubborn", {"seconds": 1000})])
def test_a_tool_past_its_deadline_is_an_error_observation_and_its_process_is_gone(tmp_path, name, arguments):
    domain = domain_of(tmp_path, tools_for(tmp_path))
    env = started_env(domain)
    result = finishes(lambda: env.step(call(name, **arguments)))
    assert result.tool_error and not result.done
    assert "timed out after 1 s" in result.observation, result.observation
    pid = int(pid_file(tmp_path).read_text())
    assert pid != os.getpid(), "the tool ran in the trainer's own process, where it cannot be killed"
    assert gone(pid), f"the tool's process {pid} still runs after its deadline"
    assert domain.tool_counts == {"calls": 1, "errors": 0, "timeouts": 1}
    again = finishes(lambda: env.step(call("wait", seconds=0)))
    assert again.observation == "waited 0" and not again.tool_error, "the next call runs normally"
    assert domain.tool_counts == {"calls": 2, "errors": 0, "timeouts": 1}


def test_what_a_timed_out_tool_started_is_killed_with_it(tmp_path):
    env = started_env(domain_of(tmp_path, tools_for(tmp_path)))
    result = finishes(lambda: env.step(call("spawn", seconds=1000)))
    assert "timed out" in result.observation
    tool_pid, helper_pid = map(int, pid_file(tmp_path).read_text().split())
    assert gone(tool_pid) and gone(helper_pid), "a process the tool started outlived its deadline"


def test_a_tool_that_prints_forever_is_stopped_and_its_printing_is_capped(tmp_path, capfd):
    def chatter(word: str) -> str:
        """Print a word forever.

        Args:
            word: what to print
        """
        while True:
            print(word * 100)
    env = started_env(domain_of(tmp_path, [chatter]))
    result = finishes(lambda: env.step(call("chatter", word="spam")))
    assert "timed out" in result.observation
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 1_000_000, f"the tool printed {len(out) + len(err)} characters into the trainer's log"


def test_a_huge_tool_output_is_cut_where_the_tool_runs(tmp_path):
    def dump(megabytes: int) -> str:
        """Return some megabytes of text.

        Args:
            megabytes: how many
        """
        return "x" * (megabytes * 1_000_000)
    domain = domain_of(tmp_path, [dump], max_tool_output_chars=5000)
    result = finishes(lambda: started_env(domain).step(call("dump", megabytes=100)))
    assert 5000 <= len(result.observation) <= 5200, len(result.observation)
    assert "cut" in result.observation[5000:] or "truncated" in result.observation[5000:], result.observation[5000:]


def test_a_return_value_whose_text_never_ends_times_out(tmp_path):
    class Endless:
        def __str__(self):
            while True:
                pass

    def describe(item: str) -> object:
        """Describe an item.

        Args:
            item: the item
        """
        return Endless()
    result = finishes(lambda: started_env(domain_of(tmp_path, [describe])).step(call("describe", item="a")))
    assert result.tool_error and "timed out" in result.observation


def test_a_tool_that_kills_its_own_process_is_an_error_not_the_end_of_the_trainer(tmp_path):
    def leave(code: int) -> str:
        """Exit.

        Args:
            code: the status
        """
        os._exit(code)

    def crash(signal_number: int) -> str:
        """Send a signal to itself.

        Args:
            signal_number: which
        """
        os.kill(os.getpid(), signal_number)
        time.sleep(1000)
        return "alive"
    domain = domain_of(tmp_path, [leave, crash])
    env = started_env(domain)
    left = finishes(lambda: env.step(call("leave", code=3)))
    crashed = finishes(lambda: env.step(call("crash", signal_number=int(signal.SIGSEGV))))
    assert left.tool_error and "3" in left.observation, left.observation
    assert crashed.tool_error and "SIGSEGV" in crashed.observation, crashed.observation
    assert domain.tool_counts == {"calls": 2, "errors": 2, "timeouts": 0}


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), 10**400, "high", 10**5000],
                         ids=["nan", "inf", "10**400", "text", "10**5000"])
def test_a_step_reward_that_is_not_a_finite_number_is_a_counted_tool_error(tmp_path, reward):
    def grade(answer: str) -> ToolOutput:
        """Grade an answer.

        Args:
            answer: the answer
        """
        return ToolOutput("graded", reward=reward)
    domain = domain_of(tmp_path, [grade])
    result = finishes(lambda: started_env(domain).step(call("grade", answer="a")))
    assert result.tool_error and "reward" in result.observation, result.observation
    assert domain.tool_counts["errors"] == 1


def test_the_driver_counts_tool_timeouts_and_the_model_sees_them(tmp_path):
    pytest.importorskip("transformers")
    from helpers import make_renderer

    from tracerl.io.rollout.driver import DriverLimits, ReActDriver
    from tracerl.io.rollout.scripted_engine import ScriptedEngine
    domain = domain_of(tmp_path, tools_for(tmp_path))
    renderer = make_renderer([call("wait", seconds=1000), "timed out after 1 s"] * 10, vocab_size=400)
    turns = iter([call("wait", seconds=1000), "<answer>1</answer>"])

    def script(prefix, sample_index, rng):
        return renderer.encode(next(turns)) + [renderer.stop_token_ids[0]]
    driver = ReActDriver(ScriptedEngine(script), renderer, domain, limits=DriverLimits(max_turns=3))
    driver.set_rows(domain.rows("train", 1))
    [tree], _ = finishes(lambda: driver.run_roots([0], [1]))
    assert driver.counters["rollout/tool_timeouts"] == 1 and driver.counters["rollout/tool_errors"] == 1
    assert "timed out after 1 s" in tree.nodes[1].segment.observation_text
    assert tree.rewards().tolist() == [1.0], "the rollout went on after the timeout"


# ---------------------------------------------------------------- state factories

def test_a_state_factory_past_its_deadline_fails_the_episode_clearly(tmp_path):
    def make_state(row):
        time.sleep(1000)
    domain = domain_of(tmp_path, [], make_state=make_state)
    env = domain.make_env()
    with pytest.raises(EpisodeError, match=r"make_state.*timed out after 1 s"):
        finishes(lambda: env.reset(domain.rows("train", 1)[0]))


def test_a_close_state_that_hangs_does_not_hang_close(tmp_path):
    @tool(state="replay")
    def note(state: Path, text: str) -> str:
        """Write a note.

        Args:
            text: the note
        """
        (state / "note.txt").write_text(text)
        return "noted"
    closed = tmp_path / "closed.txt"

    def close_state(folder):
        closed.write_text(str(os.getpid()))
        time.sleep(1000)
    domain = domain_of(tmp_path, [note], make_state=lambda row: Path(tempfile.mkdtemp(dir=tmp_path)),
                       close_state=close_state)
    env = started_env(domain)
    assert finishes(lambda: env.step(call("note", text="hi"))).observation == "noted"
    with pytest.warns(UserWarning, match="close_state failed: timed out after 1 s"):
        finishes(env.close)
    assert gone(int(closed.read_text()))


# ---------------------------------------------------------------- limits are checked at load

@pytest.mark.parametrize("field, value", [("tool_timeout_s", 0), ("tool_timeout_s", -1.0),
                                          ("tool_timeout_s", float("nan")), ("tool_timeout_s", float("inf")),
                                          ("max_tool_output_chars", 0)])
def test_tool_limits_are_checked_at_load(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        domain_of(tmp_path, [], **{field: value})


def test_tool_limits_have_working_defaults(tmp_path):
    task = UserTask(tools=[], compute_score=score)
    assert task.tool_timeout_s == 10.0 and task.max_tool_output_chars >= 1500


# ---------------------------------------------------------------- nesting the model or the user chose

def nested(depth, kind="list"):
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a": ' * depth + "1" + "}" * depth)


@pytest.mark.parametrize("depth", [500, 5000, 100_000])
@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("as_string", [False, True])
def test_deeply_nested_tool_arguments_are_an_invalid_action(depth, kind, as_string):
    arguments = '{"items": %s}' % nested(depth, kind)
    text = '<tool_call>{"name": "take", "arguments": %s}</tool_call>' % (json.dumps(arguments) if as_string
                                                                         else arguments)
    action = parse_action(text)
    assert action.kind == "invalid", (depth, kind, as_string)
    if len(text) <= MAX_ACTION_CHARS:  # a longer turn is cut first, and the cut text is not JSON at all
        assert "nest" in action.error, action.error[:200]


def test_deeply_nested_arguments_to_a_real_tool_become_data_not_a_crash(tmp_path):
    @tool(state="copy")
    def take(state: dict, items: list) -> str:
        """Keep some items.

        Args:
            items: the items
        """
        state.setdefault("kept", []).append(items)
        return "kept"
    domain = domain_of(tmp_path, [take], make_state=lambda row: {})
    env = started_env(domain)
    for depth in (3, 500, 5000):
        result = env.step('<tool_call>{"name": "take", "arguments": {"items": %s}}</tool_call>' % nested(depth))
        assert result.tool_error == (depth > 3), (depth, result.observation[:200])
    fresh = started_env(domain)
    fresh.restore(env.snapshot())  # the snapshot and the replay walk only what was kept
    assert fresh.step(call("take", items=[1])).observation == "kept"


def test_a_tool_schema_nested_without_bound_fails_at_load(tmp_path):
    inner = {"type": "string"}
    for _ in range(5000):
        inner = {"type": "array", "items": inner}
    schema = {"type": "function", "function": {"name": "deep", "description": "d",
                                               "parameters": {"type": "object", "properties": {"x": inner}}}}
    with pytest.raises(ValueError, match="deep"):
        domain_of(tmp_path, [tool(lambda x: "ok", schema=schema)])


def test_a_row_nested_without_bound_fails_at_load_naming_the_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    row = '{"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}, "extra_info": %s}'
    path.write_text(row % '{"a": 1}' + "\n" + row % ('{"a": ' * 100_000 + "1" + "}" * 100_000) + "\n")
    with pytest.raises(ValueError, match=r"rows\.jsonl.*2"):
        UserTaskDomain(UserTask(tools=[], compute_score=score, train_files=[str(path)]))


@pytest.mark.parametrize("field", ["extra_info", "ground_truth"])
def test_a_row_nested_deep_enough_to_load_but_not_to_copy_fails_at_load(tmp_path, field):
    """500 levels parse as JSON, but a deep copy of the row (each rollout's rows) or its fingerprint would recurse."""
    deep = json.loads("[" * 500 + "1" + "]" * 500)
    shallow = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}, "extra_info": {}}
    row = json.loads(json.dumps(shallow))
    if field == "extra_info":
        row["extra_info"] = {"a": deep}
    else:
        row["reward_model"]["ground_truth"] = deep
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(shallow) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"rows\.jsonl row 2 nests deeper"):
        UserTaskDomain(UserTask(tools=[], compute_score=score, train_files=[str(path)]))


# ---------------------------------------------------------------- the observation is cut before it is neutralised

def test_a_huge_observation_is_cut_before_it_is_neutralised(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from helpers import make_renderer

    import tracerl.io.rollout.driver as driver_module
    from tracerl.io.rollout.driver import DriverLimits, ReActDriver
    from tracerl.io.rollout.scripted_engine import ScriptedEngine

    def flood(n: int) -> str:
        """Return n control tokens.

        Args:
            n: how many
        """
        return "<|im_end|>" * n
    domain = domain_of(tmp_path, [flood], max_tool_output_chars=50_000_000)
    renderer = make_renderer([call("flood", n=4_000_000)] * 10, vocab_size=400)
    seen = []
    neutralise = driver_module.neutralise

    def measured(text, pattern):
        seen.append(len(text))
        return neutralise(text, pattern)
    monkeypatch.setattr(driver_module, "neutralise", measured)
    turns = iter([call("flood", n=4_000_000), "<answer>1</answer>"])

    def script(prefix, sample_index, rng):
        return renderer.encode(next(turns)) + [renderer.stop_token_ids[0]]
    driver = ReActDriver(ScriptedEngine(script), renderer, domain,
                         limits=DriverLimits(max_turns=3, max_observation_chars=1500, max_tokens_per_rollout=100_000))
    driver.set_rows(domain.rows("train", 1))
    [tree], _ = finishes(lambda: driver.run_roots([0], [1]))
    assert seen and max(seen) <= 2 * 1500, f"neutralise was given {max(seen)} characters to keep 1500"
    assert driver.counters["rollout/neutralised_special_tokens"] <= 1500 // len("<|im_end|>") + 1
    segment = tree.nodes[1].segment
    assert "truncated" in segment.observation_text
    end_of_turn = set(renderer.encode(renderer.end_of_turn))
    template = renderer.encode(renderer.observation_text("", turn_closed=True))
    inserted = [t for t, m in zip(segment.token_ids, segment.mask) if m == 0]
    assert sum(t in end_of_turn for t in inserted) <= sum(t in end_of_turn for t in template) + 1, \
        "a control token survived the cut"


# ---------------------------------------------------------------- more of the same class (written after the fix)

def test_a_process_the_tool_leaves_behind_does_not_delay_the_answer_and_ends_with_the_workers(tmp_path):
    """A forked copy of the worker holds its end of the pipe; the answer still comes at once. The copy lives in the
    worker's process group until the workers are stopped (a timeout, or closing the runner), then it is killed."""
    def detach(seconds: int) -> str:
        """Leave a forked copy of itself behind, then answer.

        Args:
            seconds: how long the copy sleeps
        """
        child = os.fork()
        if child == 0:
            time.sleep(seconds)
            os._exit(0)
        pid_file(tmp_path).write_text(str(child))
        return "answered"
    domain = domain_of(tmp_path, [detach], tool_timeout_s=60.0)
    result = finishes(lambda: started_env(domain).step(call("detach", seconds=1000)))
    assert result.observation == "answered" and domain.tool_counts["timeouts"] == 0
    domain.tool_runner.close()
    assert gone(int(pid_file(tmp_path).read_text())), "the process the tool left behind outlived its workers"


def test_a_tool_that_raises_reads_as_before_and_is_counted(tmp_path):
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return {"a": "1"}[key]
    domain = domain_of(tmp_path, [lookup])
    result = finishes(lambda: started_env(domain).step(call("lookup", key="zz")))
    assert result.observation == "error: lookup failed: KeyError: 'zz'" and result.tool_error
    assert domain.tool_counts == {"calls": 1, "errors": 1, "timeouts": 0}


def test_a_state_that_cannot_leave_its_process_names_the_fix(tmp_path):
    domain = domain_of(tmp_path, [], make_state=lambda row: threading.Lock())
    env = domain.make_env()
    with pytest.raises(EpisodeError, match=r"make_state.*tool_isolation='thread'"):
        finishes(lambda: env.reset(domain.rows("train", 1)[0]))
    threaded = domain_of(tmp_path, [], make_state=lambda row: threading.Lock(), tool_isolation="thread")
    started_env(threaded)  # in this process the state need not pickle


def test_a_thread_isolated_tool_past_its_deadline_returns_but_runs_on(tmp_path):
    """The documented limit of tool_isolation="thread": the step returns and counts the timeout, the call cannot be
    killed (its thread is still alive), and the next call is not held by it."""
    domain = domain_of(tmp_path, tools_for(tmp_path), tool_isolation="thread")
    env = started_env(domain)
    result = finishes(lambda: env.step(call("wait", seconds=1000)))
    assert result.tool_error and "timed out after 1 s" in result.observation
    assert domain.tool_runner.runner.num_stuck_threads == 1
    assert finishes(lambda: env.step(call("wait", seconds=0))).observation == "waited 0"
    assert domain.tool_counts == {"calls": 2, "errors": 0, "timeouts": 1}
