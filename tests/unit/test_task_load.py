"""A user's task at load: tool schemas from functions, rows from files, and every bad input named clearly."""

import json
from typing import Literal

import pytest

from tracerl.io.env.task import (RewardError, UserTask, UserTaskDomain, load_rows, load_task, make_tool, score_of,
                             tool)
from tracerl.train.config import DataConfig


def lookup(city: str, days: int = 1, units: Literal["c", "f"] = "c") -> str:
    """Weather forecast for a city.

    More text that is not part of the description.

    Args:
        city: the city's name
        days (int): how many days ahead
    Returns:
        the forecast
    """
    return f"{city} {days} {units}"


def row(question="q?", truth="1", **extra):
    return {"data_source": "mine", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": extra}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def score(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str == ground_truth)


def test_schema_comes_from_signature_and_docstring():
    schema = make_tool(lookup).tool.schema()["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Weather forecast for a city."
    props = schema["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name"}
    assert props["days"] == {"type": "integer", "description": "how many days ahead"}
    assert props["units"] == {"type": "string", "enum": ["c", "f"]}
    assert schema["parameters"]["required"] == ["city"], "parameters with defaults are optional"


def test_state_parameter_is_hidden_and_explicit_schema_wins():
    @tool(state="copy")
    def add(state, amount: int) -> str:
        """Add to the total."""
        return ""
    made = make_tool(add)
    assert made.takes_state and made.state == "copy"
    assert list(made.tool.parameters["properties"]) == ["amount"], "the model never sees the state parameter"
    explicit = {"type": "function", "function": {"name": "weather", "description": "d",
                                                 "parameters": {"type": "object", "properties": {}}}}
    assert make_tool(tool(lambda: "x", schema=explicit)).tool.name == "weather"


def no_hint(city) -> str:
    """Look up."""


def no_doc(city: str) -> str:
    return city


def odd_type(when: complex) -> str:
    """Look up."""


def star(*cities: str) -> str:
    """Look up."""


@pytest.mark.parametrize("fn, words", [(no_hint, "no type hint"), (no_doc, "no docstring"),
                                        (odd_type, "no JSON schema type"), (star, "*args")])
def test_a_tool_without_a_derivable_schema_fails_at_load(fn, words):
    with pytest.raises(ValueError, match="schema|docstring|hint") as err:
        UserTaskDomain(UserTask(tools=[fn], compute_score=score, train_files=[]))
    assert words in str(err.value) and fn.__name__ in str(err.value)


def test_bad_state_declaration_and_missing_state_factory():
    with pytest.raises(ValueError, match="use 'copy'"):
        tool(state="snapshot")

    @tool(state="copy")
    def add(state, amount: int) -> str:
        """Add."""
    with pytest.raises(ValueError, match="make_state"):
        UserTaskDomain(UserTask(tools=[add], compute_score=score))


def test_rows_load_and_fill_split_and_index(tmp_path):
    rows = load_rows([write_jsonl(tmp_path / "a.jsonl", [row("a?"), row("b?", index=7)])], "test")
    assert [r["extra_info"]["split"] for r in rows] == ["test", "test"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 7]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*data.train_files"):
        load_rows([str(tmp_path / "nope.jsonl")], "train")


@pytest.mark.parametrize("bad, words", [({"reward_model": {"ground_truth": 1}}, "no usable 'prompt'"),
                                        ({"prompt": [{"role": "user", "content": "q"}]}, "reward_model.ground_truth"),
                                        ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {}},
                                         "reward_model.ground_truth"),
                                        ({"prompt": [{"content": "q"}], "reward_model": {"ground_truth": 1}},
                                         "no usable 'prompt'")])
def test_a_row_without_prompt_or_ground_truth_fails_at_load_naming_the_row(tmp_path, bad, words):
    path = write_jsonl(tmp_path / "rows.jsonl", [row(), bad])
    with pytest.raises(ValueError, match=words) as err:
        load_rows([path], "train")
    assert "rows.jsonl row 2" in str(err.value)


def test_bad_json_and_unknown_file_type(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"prompt": \n')
    with pytest.raises(ValueError, match="x.jsonl:1 is not JSON"):
        load_rows([str(tmp_path / "x.jsonl")], "train")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown file type"):
        load_rows([str(tmp_path / "x.csv")], "train")


def test_reward_results_that_are_not_numbers_are_errors():
    assert score_of(1) == 1.0 and score_of({"score": 0.5, "acc": True}) == 0.5 and score_of(True) == 1.0
    for bad in (None, "1", float("nan"), {"acc": 1}, [1]):
        with pytest.raises(RewardError):
            score_of(bad)


def test_reward_must_have_verls_signature(tmp_path):
    with pytest.raises(ValueError, match="data_source, solution_str, ground_truth"):
        UserTaskDomain(UserTask(tools=[], compute_score=lambda answer: 1.0,
                                train_files=[write_jsonl(tmp_path / "t.jsonl", [row()])]))


def test_files_alone_give_a_tool_free_exact_match_task(tmp_path):
    domain = load_task("", [write_jsonl(tmp_path / "t.jsonl", [row("q?", "Paris")])],
                       [write_jsonl(tmp_path / "v.jsonl", [row("r?", "Rome")])])
    env = domain.make_env()
    assert env.reset(domain.rows("test", 5)[0]) == "r?" and env.tools() == []
    assert env.step("<answer> rome. </answer>").reward == 1.0


def test_task_spec_errors(tmp_path):
    for spec, words in [("nomodule", "module:function"), ("tracerl_no_such_mod:f", "cannot import"),
                        ("tracerl.io.env.task:nothing", "has no 'nothing'"), ("tracerl.io.env.task:exact_match", None),
                        (str(tmp_path / "absent.py") + ":make", "no file")]:
        with pytest.raises((ValueError, TypeError)) as err:
            load_task(spec)
        assert words is None or words in str(err.value), (spec, str(err.value))


def test_config_selects_the_task_domain():
    assert DataConfig(task="m:f").domain == "task"
    assert DataConfig(train_files=("a.jsonl",)).domain == "task"
    with pytest.raises(ValueError, match="drop data.domain"):
        DataConfig(domain="math", task="m:f")
    with pytest.raises(ValueError, match="needs data.task"):
        DataConfig(domain="task")


def test_a_task_on_ray_workers_is_refused_at_load():
    pytest.importorskip("ray")
    from tracerl.train.config import load_config
    with pytest.raises(ValueError, match="run.executor=local"):
        load_config(None, ["data.task=m:f", "run.executor=ray", "policy.engine=openai",
                           "policy.base_url=http://127.0.0.1:1"])


def test_the_cache_fingerprint_follows_rows_and_expert_code(tmp_path):
    files = [write_jsonl(tmp_path / "t.jsonl", [row()])]

    def expert_a(row, turns, rng):
        return "<answer>1</answer>"

    def expert_b(row, turns, rng):
        return "<answer> 1</answer>"
    prints = {UserTaskDomain(UserTask(tools=[lookup], compute_score=score, train_files=files, expert=e)).fingerprint()
              for e in (expert_a, expert_b, expert_a)}
    assert len(prints) == 2, "an edited expert must build a new warm start; the same one must reuse it"
    other = UserTaskDomain(UserTask(tools=[lookup], compute_score=score, expert=expert_a,
                                    train_files=[write_jsonl(tmp_path / "u.jsonl", [row("other?")])]))
    assert other.fingerprint() not in prints
