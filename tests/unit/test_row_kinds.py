"""Rows the loader accepts must be rows the step can use: a ground truth that is a number is a finite one, every row
of a split has its own id, and no scorer takes a non-finite value for a match.

The attacker's side: JSON's `NaN`, `Infinity` and `-Infinity` (Python's json module reads them) as a ground truth
or inside one; a GSM8K answer `#### 1e400`, a float overflow each time the row is scored; a model answering "nan",
"inf" or "1e999"; two rows of a file, or of two files, with one id. Each load is refused naming the file, the row
and the fix; each answer scores 0 without raising.
"""

import json
import math

import pytest

from tracerl.io.domains.math import MathEnv, load_math_file, numeric_match
from tracerl.io.env.task import exact_match, load_rows
from tracerl.io.rollout.driver import prompt_id

NON_FINITE_JSON = ["NaN", "Infinity", "-Infinity", '{"answer": NaN}', "[4, Infinity]", '{"a": [{"b": -Infinity}]}']
NON_FINITE_ANSWERS = ["nan", "NaN", "inf", "-inf", "Infinity", "-Infinity", "1e400", "-1e400", "1e999",
                      "9" * 400 + "e99"]


def jsonl(path, *lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def row_text(truth_json: str = '"4"', index: int | None = None, data_source: str = "mine") -> str:
    extra = {} if index is None else {"index": index}
    return ('{"data_source": "%s", "prompt": [{"role": "user", "content": "q?"}], '
            '"reward_model": {"style": "rule", "ground_truth": %s}, "extra_info": %s}'
            % (data_source, truth_json, json.dumps(extra)))


# ---------------------------------------------------------------- non-finite ground truths

@pytest.mark.parametrize("truth", NON_FINITE_JSON)
def test_a_non_finite_ground_truth_is_refused_at_load_naming_the_row(tmp_path, truth):
    path = jsonl(tmp_path / "rows.jsonl", row_text(), row_text(truth))
    with pytest.raises(ValueError, match=r"rows\.jsonl row 2\b.*ground_truth.*finite"):
        load_rows([path], "train")


def test_finite_numeric_ground_truths_still_load(tmp_path):
    path = jsonl(tmp_path / "rows.jsonl", row_text("4"), row_text("-1.5e300"), row_text('{"answer": 0.0}'))
    assert [r["reward_model"]["ground_truth"] for r in load_rows([path], "train")] == [4, -1.5e300, {"answer": 0.0}]


@pytest.mark.parametrize("answer", ["#### 1e400", "#### -1e400", "#### 1e999", "#### nan", "#### inf",
                                    "#### Infinity"])
def test_a_gsm8k_answer_that_is_not_a_finite_number_is_refused_at_load(tmp_path, answer):
    path = jsonl(tmp_path / "gsm.jsonl", json.dumps({"question": "q?", "answer": "#### 4"}),
                 json.dumps({"question": "q2?", "answer": answer}))
    with pytest.raises(ValueError, match=r"gsm\.jsonl.*line 2\b"):
        load_math_file(path)


def test_a_math_boxed_answer_that_overflows_is_refused_and_infinity_as_text_loads(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", json.dumps({"problem": "p?", "solution": "\\boxed{1e400}"}))
    with pytest.raises(ValueError, match=r"m\.jsonl.*line 1\b"):
        load_math_file(path)
    text = jsonl(tmp_path / "t.jsonl", json.dumps({"problem": "limit?", "solution": "\\boxed{\\infty}"}))
    assert load_math_file(text)[0]["reward_model"]["ground_truth"] == "\\infty"


@pytest.mark.parametrize("truth", [math.nan, math.inf, -math.inf])
def test_the_default_reward_never_matches_a_non_finite_ground_truth(truth):
    for answer in NON_FINITE_ANSWERS + [str(truth)]:
        assert exact_match("d", answer, truth) == 0.0, (answer, truth)
        assert exact_match("d", answer, [truth]) == 0.0, (answer, truth)


def test_the_default_reward_still_matches_finite_numbers_and_text():
    assert exact_match("d", "4", 4) == 1.0 and exact_match("d", "Paris.", "paris") == 1.0


def test_a_qa_answer_never_matches_a_non_finite_ground_truth():
    from tracerl.io.domains.multihop import exact_match as qa_match

    for answer in NON_FINITE_ANSWERS:
        assert qa_match(answer, [math.nan, math.inf, -math.inf]) == 0.0, answer


@pytest.mark.parametrize("answer", NON_FINITE_ANSWERS)
def test_a_math_answer_that_is_not_finite_scores_zero_without_raising(answer):
    env = MathEnv()
    env.reset({"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q?"}],
               "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 0}})
    assert env.step(f"<answer>{answer}</answer>").reward == 0.0
    assert numeric_match(answer, "4") is False


def test_funcall_answers_that_overflow_are_not_equal_by_value():
    from tracerl.io.domains.funcall import normalize_answer

    for a, b in [("inf", "Infinity"), ("1e400", "1e999"), ("inf", "1e400"), ("-inf", "-1e400")]:
        assert normalize_answer(a) != normalize_answer(b), (a, b)
    assert normalize_answer("1,200") == normalize_answer("1200.0"), "finite numbers still compare by value"


# ---------------------------------------------------------------- one id per row

def test_two_rows_with_one_id_are_refused_naming_both(tmp_path):
    path = jsonl(tmp_path / "rows.jsonl", row_text(index=7), row_text(index=3), row_text(index=7))
    with pytest.raises(ValueError, match=r"rows\.jsonl row 3\b.*row 1\b.*index"):
        load_rows([path], "train")


def test_rows_of_two_files_get_ids_of_their_own(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", row_text(), row_text())
    b = jsonl(tmp_path / "b.jsonl", row_text(), row_text())
    rows = load_rows([a, b], "train")
    assert len({prompt_id(r) for r in rows}) == 4, [prompt_id(r) for r in rows]


def test_two_files_that_set_one_id_are_refused(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", row_text(index=0))
    b = jsonl(tmp_path / "b.jsonl", row_text(index=0))
    with pytest.raises(ValueError, match=r"b\.jsonl row 1\b.*a\.jsonl row 1\b"):
        load_rows([a, b], "train")


def test_one_index_under_two_data_sources_is_two_ids(tmp_path):
    path = jsonl(tmp_path / "rows.jsonl", row_text(index=0, data_source="a"), row_text(index=0, data_source="b"))
    assert len(load_rows([path], "train")) == 2


def test_a_qa_file_repeating_a_question_id_is_refused(tmp_path):
    from tracerl.io.domains.multihop import load_qa_file

    record = {"_id": "h1", "question": "Which city?", "answer": "Pelora", "context": [["Pelora", ["A city."]]]}
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "question": "Which town?"}) + "\n")
    with pytest.raises(ValueError, match=r"qa\.jsonl.*h1"):
        load_qa_file(path)


def test_a_qa_record_without_an_id_never_takes_another_records_id(tmp_path):
    """A record's own id "1" beside a record with none at position 1: two questions, not a repeat."""
    from tracerl.io.domains.multihop import load_qa_file

    record = {"question": "Which city?", "answer": "Pelora", "context": [["Pelora", ["A city."]]]}
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({**record, "id": "1"}) + "\n" + json.dumps({**record, "question": "Which town?"}) + "\n")
    rows, _ = load_qa_file(path)
    assert [r["extra_info"].get("id") for r in rows] == ["1", None]


# ---------------------------------------------------------------- a prompt the model's context cannot hold

QUESTION = "What is 2+2?"


class _NoToolsDomain:
    """A domain whose environments have no tools and read the row's question."""

    def make_env(self):
        from tracerl.io.domains.base import ToolEnv

        return ToolEnv()


def _row(index: int, question: str = QUESTION) -> dict:
    return {"data_source": "mine", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": index}}


@pytest.fixture(scope="module")
def renderer():
    pytest.importorskip("transformers")
    from helpers import make_renderer

    return make_renderer([QUESTION] * 20, vocab_size=400)


def test_a_prompt_longer_than_the_context_is_refused_at_load_naming_the_row_and_the_fix(renderer):
    from tracerl.io.rollout.driver import check_prompt_lengths

    rows = [_row(0), _row(1, "why " * 3000), _row(2)]
    with pytest.raises(ValueError, match=r"(?s)train row 2 \(id 'mine:train:1'\).*tokens.*256 positions.*shorten"):
        check_prompt_lengths(rows, renderer, _NoToolsDomain(), context_tokens=256, max_tokens_per_turn=32,
                             split="train")


def test_a_prompt_is_checked_with_room_for_one_turn(renderer):
    from tracerl.io.rollout.driver import check_prompt_lengths

    rows = [_row(0)]
    size = len(renderer.prompt_ids(rows[0]["prompt"], []))
    check_prompt_lengths(rows, renderer, _NoToolsDomain(), context_tokens=size + 32, max_tokens_per_turn=32,
                         split="train")
    with pytest.raises(ValueError, match=rf"{size} tokens"):
        check_prompt_lengths(rows, renderer, _NoToolsDomain(), context_tokens=size + 31, max_tokens_per_turn=32,
                             split="train")


def test_a_model_without_a_known_context_checks_nothing(renderer):
    from tracerl.io.rollout.driver import check_prompt_lengths

    check_prompt_lengths([_row(0, "why " * 3000)], renderer, _NoToolsDomain(), context_tokens=None,
                         max_tokens_per_turn=32, split="train")


# ---------------------------------------------------------------- written after the fix

@pytest.mark.parametrize("loader", ["rows", "math", "qa"])
def test_a_row_nested_past_the_json_parser_is_a_clear_error(tmp_path, loader):
    """Found while reading the loaders: a line nested 100,000 deep raised a bare RecursionError."""
    from tracerl.io.domains.multihop import load_qa_file

    path = jsonl(tmp_path / "deep.jsonl", "[" * 100_000 + "]" * 100_000)
    load = {"rows": lambda: load_rows([path], "train"), "math": lambda: load_math_file(path),
            "qa": lambda: load_qa_file(path)}[loader]
    with pytest.raises(ValueError, match=r"deep\.jsonl.*nest"):
        load()
