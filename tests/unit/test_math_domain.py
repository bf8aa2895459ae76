"""Math domain without the sandbox: rows, splits, numeric matching, file loaders, scoring and bad tool calls."""

import json
import string
import sys

import numpy as np
import pytest

from tracerl.io.domains.math import (MathDomain, MathEnv, exact_value, last_boxed, load_math_file,
                                     numeric_match, parse_number)


@pytest.fixture(scope="module")
def domain():
    return MathDomain()


@pytest.fixture(scope="module")
def test_rows(domain):
    return domain.rows("test", 60, seed=0)


def questions(rows):
    return [r["prompt"][-1]["content"] for r in rows]


def test_same_seed_same_rows_and_other_seed_other_rows(domain, test_rows):
    assert domain.rows("test", 60, seed=0) == test_rows
    other = domain.rows("test", 60, seed=1)
    assert len(set(questions(other)) & set(questions(test_rows))) < 10, "seed 1 repeats most of seed 0's questions"


def test_splits_are_disjoint_across_seeds(domain, test_rows):
    train = domain.rows("train", 300, seed=0) + domain.rows("train", 100, seed=7)
    shared = set(questions(train)) & set(questions(test_rows + domain.rows("test", 40, seed=7)))
    assert not shared, f"questions in both splits: {sorted(shared)[:3]}"


def test_rows_are_distinct_verl_rows_with_numeric_ground_truth(test_rows):
    assert len(test_rows) == 60 and len(set(questions(test_rows))) == 60
    for i, row in enumerate(test_rows):
        assert row["data_source"].startswith("math/") and row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == i
        assert row["prompt"][0]["role"] == "system" and row["prompt"][-1]["role"] == "user"
        assert parse_number(row["reward_model"]["ground_truth"]) is not None, row["reward_model"]
        expression = row["extra_info"]["expression"]
        if expression is not None:  # arithmetic rows: the shown expression gives exactly the ground truth
            assert exact_value(expression) == exact_value(row["reward_model"]["ground_truth"]), row
    assert {r["extra_info"]["generator"] for r in test_rows} == {"gsm_symbolic", "basic_arithmetic", "chain_sum"}


def test_mix_selects_generators():
    rows = MathDomain(mix={"products": 1.0}).rows("train", 10, seed=3)
    assert {r["extra_info"]["generator"] for r in rows} == {"products"}
    assert all(" * " in r["extra_info"]["expression"] for r in rows)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"mix": {"algebra": 1.0}}, "unknown generator"),
    ({"mix": {"chain_sum": 0.0}}, "positive sum"),
    ({"mix": {"chain_sum": -1.0, "products": 2.0}}, ">= 0"),
    ({"test_fraction": 1.0}, "test_fraction"),
])
def test_bad_options_raise_with_the_fix(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        MathDomain(**kwargs)


@pytest.mark.parametrize("answer, truth, expected", [
    ("1,234", "1234", True),
    ("The total is $1,234.50.", "1234.5", True),
    ("3/4", "0.75", True),
    ("\\frac{3}{4}", "0.75", True),
    ("-5", "-5", True),
    ("-5", "5", False),
    ("1e3", "1000", True),
    ("2.5e-3", "0.0025", True),
    ("So the answer is 42.", "42", True),
    ("first 7, then 8", "7", False),  # the last number counts
    ("1,000,001", "1000000", False),
    ("12 and 3-2", "2", True),  # "3-2" is subtraction: the last number is 2, not -2
    ("(8)-2", "2", True),
    ("x = (-7)", "-7", True),
    ("\\frac{-3}{4}", "-0.75", True),
    ("no number here", "4", False),
    ("41.9999", "42", False),
    ("41.99999", "42", True),  # within rel_tol 1e-6
    ("1000001", "1000000", False),  # two integers must be equal, whatever rel_tol says
    ("1000001.", "1000000", False),  # a sentence's period does not make a decimal
    ("1.000001e6", "1000000", True),
    ("793546072.0", "793546072", True),
    ("1e99999999999", "99999999", True),  # the exponent is capped at 3 digits; no hang
    ("9" * 5000, "1", False),  # a 5000-digit reply parses without error or hang
])
def test_numeric_match(answer, truth, expected):
    assert numeric_match(answer, truth) is expected, (answer, truth, parse_number(answer))


def test_numeric_match_tolerance_is_adjustable():
    assert not numeric_match("100.5", "100") and numeric_match("100.5", "100", rel_tol=0.01)


def test_exact_value_accepts_only_arithmetic():
    assert exact_value("( 56 + -33 ) - 84") == -61 and exact_value("-( 6 / 4 )") == -1.5
    assert exact_value("__import__('os')") is None and exact_value("1 / 0") is None and exact_value("2 ** 3") is None


def test_last_boxed_balances_braces():
    assert last_boxed("so \\boxed{1} or rather \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("no box") is None


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_load_gsm8k_and_math_jsonl(tmp_path):
    gsm = load_math_file(write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "Tom has 3 bags of 400 apples. How many?", "answer": "3 * 400 = 1,200\n#### 1,200"},
        "",  # blank lines are skipped
        {"question": "What is 2 - 5?", "answer": "#### -3"},
    ]))
    assert [r["reward_model"]["ground_truth"] for r in gsm] == ["1200", "-3"]
    assert gsm[0]["data_source"] == "gsm8k" and gsm[1]["extra_info"]["index"] == 1
    assert gsm[0]["prompt"][-1]["content"].startswith("Tom has 3 bags")

    math_rows = load_math_file(write_jsonl(tmp_path / "math.jsonl", [
        {"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Root?", "solution": "We get $\\boxed{\\sqrt{2}}$"},
    ]), split="train")
    assert [r["reward_model"]["ground_truth"] for r in math_rows] == ["\\frac{1}{2}", "\\sqrt{2}"]
    assert math_rows[0]["extra_info"]["split"] == "train"

    env = MathEnv()
    env.reset(math_rows[0])
    assert env.step("<answer>0.5</answer>").reward == 1.0
    env.reset(math_rows[1])  # not a number: compared as normalised text
    assert env.step("<answer>$\\sqrt{2}$</answer>").reward == 1.0
    env.reset(math_rows[1])
    assert env.step("<answer>1.414</answer>").reward == 0.0


@pytest.mark.parametrize("records, fragment", [
    ([{"question": "q", "answer": "#### 1"}, {"text": "hello"}], "line 2: expected fields"),
    ([{"question": "q", "answer": "no hashes"}], "line 1: GSM8K-style 'answer' has no '####"),
    ([{"problem": "p", "solution": "no box"}], "line 1: MATH-style 'solution' has no"),
    (["{not json"], "line 1: not valid JSON"),
    (["[1, 2]"], "line 1: a row must be a JSON object"),
    ([], "no rows"),
])
def test_bad_file_names_file_line_and_fields(tmp_path, records, fragment):
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(ValueError) as err:
        load_math_file(path)
    assert str(path) in str(err.value) and fragment in str(err.value), str(err.value)


def test_json_array_file(tmp_path):
    path = tmp_path / "math.json"
    path.write_text(json.dumps([{"problem": "2^10?", "solution": "$\\boxed{1024}$"}]))
    assert load_math_file(path)[0]["reward_model"]["ground_truth"] == "1024"
    path.write_text(json.dumps([{"problem": "2^10?"}]))
    with pytest.raises(ValueError, match="item 1: expected fields"):
        load_math_file(path)


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow...` raise ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        load_math_file(tmp_path / "x.parquet")


def test_parquet_rows_and_bad_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"question": "2+2?", "answer": "#### 4"}, {"question": "3*3?", "answer": "#### 9"}])
    pq.write_table(table, tmp_path / "gsm.parquet")
    assert [r["reward_model"]["ground_truth"] for r in load_math_file(tmp_path / "gsm.parquet")] == ["4", "9"]
    pq.write_table(pa.Table.from_pylist([{"text": "x"}]), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="row 1: expected fields"):
        load_math_file(tmp_path / "other.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="junk.parquet: not a readable parquet file"):
        load_math_file(tmp_path / "junk.parquet")


def test_random_text_policy_scores_zero(test_rows):
    rng = np.random.default_rng(0)
    env, total = MathEnv(), 0.0
    for row in test_rows:
        env.reset(row)
        for _ in range(3):
            words = " ".join("".join(rng.choice(list(string.ascii_letters), size=5)) for _ in range(8))
            result = env.step(f"<answer>{words}</answer>" if rng.random() < 0.5 else words)
            if result.done:
                total += result.reward
                break
            assert result.tool_error and result.observation.startswith("error:"), result
    assert total == 0.0


@pytest.mark.parametrize("action, fragment", [
    ('<tool_call>{"name": "python", "arguments": {"code": 123}}</tool_call>', "must be of type string"),
    ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "missing required argument"),
    ('<tool_call>{"name": "python", "arguments": {"code": "1", "timeout": 9}}</tool_call>', "unknown argument"),
    ('<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>', "unknown tool"),
    ('<tool_call>{"name": "python", "arguments": {"code": </tool_call>', "not valid JSON"),
    ("I think the answer is 4", "no <tool_call> or <answer>"),
])
def test_malformed_tool_calls_are_error_observations(test_rows, action, fragment):
    env = MathEnv()
    env.reset(test_rows[0])
    result = env.step(action)
    assert result.tool_error and not result.done and fragment in result.observation, result
    assert env.state["num_python_calls"] == 0, "a rejected call must not reach the sandbox"


def test_tool_schema_and_answer_scoring(test_rows):
    env = MathEnv()
    assert env.reset(test_rows[0]) == test_rows[0]["prompt"][-1]["content"]
    (schema,) = env.tools()
    assert schema["function"]["name"] == "python" and schema["function"]["parameters"]["required"] == ["code"]
    truth = test_rows[0]["reward_model"]["ground_truth"]
    result = env.step(f"Done. <answer>{truth}</answer>")
    assert result.done and result.reward == 1.0
    env.reset(test_rows[0])
    assert env.step(f"<answer>{float(truth) + 1}</answer>").reward == 0.0


def test_expert_first_turn_is_a_python_call(domain, test_rows):
    rng = np.random.default_rng(0)
    for row in test_rows:
        text = domain.expert_turn(row, [], rng)
        payload = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
        code = payload["arguments"]["code"]
        assert payload["name"] == "python" and code.startswith("print(")
        if row["extra_info"]["expression"]:  # computed from the question's own numbers, not the answer
            assert row["extra_info"]["expression"] in code
    assert domain.expert_turn(test_rows[0], [("call", "  17\n")], rng) == "<answer>17</answer>"


def test_math_state_features_read_the_transcript_only():
    from tracerl.core.history import History
    from tracerl.io.domains.math import MathDomain

    state_features = MathDomain().state_features

    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(3 + 4)"}}</tool_call>'
    root = History(question, 0, prompt_id="math/gsm_symbolic:train:0", meta={"ground_truth": "7"})
    ran = History(f"{question}\nLet me compute it.\n{call}\n7", 1, prompt_id="math/gsm_symbolic:train:0")
    failed = History(f"{question}\n{call}\nTraceback (most recent call last):\nNameError: x", 1,
                     prompt_id="gsm8k:test:4")
    assert state_features(root) == {"question_numbers=2": 1.0, "calls=0": 1.0, "last=none": 1.0}
    assert state_features(ran)["last=number"] and state_features(ran)["calls=1"]
    assert state_features(failed)["last=error"]
    forged = History(root.text, 0, prompt_id=root.prompt_id, meta={"ground_truth": "8"})
    assert state_features(forged) == state_features(root), "the gold answer must not change the features"


def test_math_state_features_survive_a_cut_off_call():
    from tracerl.core.history import History
    from tracerl.io.domains.math import MathDomain

    state_features = MathDomain().state_features

    cut = History('What is 2 + 2?\n<tool_call>{"name": "python", "arguments": {"code": "print(2', 1,
                  prompt_id="math:train:0")
    assert state_features(cut)["calls=1"]
