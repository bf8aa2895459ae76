"""An error that names keys a file, a row or the model chose stays a few hundred characters, whatever it is given: the
first few keys, then "and N more" (every listing goes through `tracerl.io.files.boundary.listing`).

The attacker's side: a config file, an override, a row or a tool call with a hundred thousand unknown keys; a JSON
file that repeats a hundred thousand keys. Before, each listed every key: a megabyte of message in a log, a
terminal or (for a tool call) the model's next observation.
"""

import json

import pytest

MANY = 100_000
BOUND = 1_000


def keys(prefix: str = "k") -> dict[str, int]:
    return {f"{prefix}{i:06d}": 1 for i in range(MANY)}


def assert_bounded(text: str, *words: str) -> None:
    assert len(text) < BOUND, f"a message of {len(text)} characters: {text[:200]}..."
    assert "more" in text, f"the message must count the keys it leaves out: {text}"
    for word in words:
        assert word in text, f"{word!r} missing from {text}"


def test_unknown_config_keys():
    from dataclasses import dataclass

    from tracerl.io.files.config import from_dict

    @dataclass(frozen=True)
    class Small:
        rate: float = 0.5

    with pytest.raises(ValueError) as caught:
        from_dict(Small, keys(), where="inner")
    assert_bounded(str(caught.value), "inner", "unknown key", "k000000", "rate")


def test_repeated_keys_in_a_json_config(tmp_path):
    from tracerl.io.files.config import load_file

    path = tmp_path / "repeated.json"
    pairs = ",".join(f'"{i:x}": 0, "{i:x}": 0' for i in range(MANY // 2))
    path.write_text("{" + pairs + "}")
    with pytest.raises(ValueError) as caught:
        load_file(path)
    assert_bounded(str(caught.value), str(path), "more than once")


def test_unknown_predictor_options():
    from tracerl.train.config import load_config

    with pytest.raises(ValueError) as caught:
        load_config(None, ["predictor.options=" + json.dumps(keys("o"))])
    assert_bounded(str(caught.value), "predictor.options", "o000000")


def test_unknown_embedded_config_fields():
    from tracerl.policy.embedded_config import EmbeddedConfig

    with pytest.raises(ValueError) as caught:
        EmbeddedConfig.from_dict(keys())
    assert_bounded(str(caught.value), "EmbeddedConfig", "k000000")


def test_a_row_message_with_many_keys(tmp_path):
    from tracerl.io.env.task import load_rows

    message = {"role": "user", "content": "q?", **keys()}
    row = {"data_source": "d", "prompt": [message], "reward_model": {"ground_truth": "4"}, "extra_info": {}}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError) as caught:
        load_rows([tmp_path / "rows.jsonl"], "train")
    assert_bounded(str(caught.value), "row 1", "prompt[0]", "k000000")


def test_a_tool_call_with_many_unknown_arguments_is_a_short_observation():
    from tracerl.io.env.actions import Tool, check_arguments

    tool = Tool("search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}},
                lambda query: query)
    assert_bounded(check_arguments(tool, {"query": "x", **keys()}), "search", "unknown argument", "query")


def test_a_math_mix_naming_many_generators():
    from tracerl.io.domains.math import MathDomain

    with pytest.raises(ValueError) as caught:
        MathDomain(mix=dict.fromkeys(keys(), 1.0))
    assert_bounded(str(caught.value), "unknown generator", "k000000")


# ---------------------------------------------------------------- written after the fix
# (the sites the grep for key listings found beyond the brief's: a domain's options and its named choices)

def _funcall():
    from tracerl.io.domains.funcall import FuncallDomain
    return FuncallDomain


def _multihop():
    from tracerl.io.domains.multihop import MultiHopDomain
    return MultiHopDomain


def _check_options(**options):
    from tracerl.io.domains import check_options
    return check_options("funcall", options)


@pytest.mark.parametrize("make, words", [
    (lambda: _check_options(**keys()), ("data.options",)),
    (lambda: _funcall()().with_options(**keys()), ("no option",)),
    (lambda: _funcall()(templates=dict.fromkeys(keys(), 1.0)), ("templates",)),
    (lambda: _multihop()(missing_kinds=tuple(keys())), ("missing_kinds",)),
], ids=["data options", "domain options in with_options", "funcall templates", "multihop missing_kinds"])
def test_unknown_names_of_a_domain(make, words):
    with pytest.raises(ValueError) as caught:
        make()
    assert_bounded(str(caught.value), *words, "k000000")
