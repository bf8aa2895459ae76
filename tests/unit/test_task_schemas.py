"""Tool schemas as users write type hints: Optional, unions with None, list[T], dict[str, T], tuples, Literal and
Enum, derived as transformers' `get_json_schema` derives them (the schema chat templates and verl's function tools
use), and arguments of those types accepted when the model sends them."""

import enum
from typing import Any, Literal, Optional, Union

import pytest

from tracerl.io.env.actions import check_arguments
from tracerl.io.env.task import UserTask, UserTaskDomain, make_tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def paint(wall: Optional[str], trim: str | None, colors: list[str], counts: dict[str, int],
          finish: Literal["matte", "gloss"], color: Color, size: Union[int, str], corner: tuple[int, str],
          layers: list[Optional[int]], note: Any, mixed: int | list[str] | None, plain: list, scale: float = 1.0,
          level: Literal[1, 2] = 1, dry: bool = False) -> str:
    """Paint a wall.

    Args:
        wall: which wall
        trim: the trim, if any
        colors: colours to use
        counts: cans per colour
        finish: the finish
        color: the main colour
        size: size in cm or a name
        corner: a corner's x and label
        layers: coats per layer
        note: anything
        mixed: a count or some names
        plain: a list of anything
        scale: how much
        level: quality level
        dry: a dry run
    """
    return f"{color.value} {wall}"


def test_the_schema_matches_transformers_get_json_schema():
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    theirs = chat_template_utils.get_json_schema(paint)
    theirs["function"].pop("return")  # the return type, which no tool-call format reads
    assert make_tool(paint).tool.schema() == theirs


@pytest.mark.parametrize("hint, expected", [
    (Optional[str], {"type": "string", "nullable": True}),
    (str | None, {"type": "string", "nullable": True}),
    (list[str], {"type": "array", "items": {"type": "string"}}),
    (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
    (Color, {"type": "string", "enum": ["red", "blue"]}),
    (Union[int, list[str]], {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]}),
])
def test_each_hint_without_transformers(hint, expected):
    def fn(x: hint) -> str:
        """A tool.

        Args:
            x: the value
        """
        return ""
    assert make_tool(fn).tool.parameters["properties"]["x"] == {**expected, "description": "the value"}


def test_arguments_of_these_types_are_accepted_and_an_enum_arrives_as_its_member():
    made = make_tool(paint).tool
    good = {"wall": None, "trim": "oak", "colors": ["red"], "counts": {"red": 2}, "finish": "matte", "color": "blue",
            "size": "large", "corner": [1, "a"], "layers": [1, None], "note": {"x": 1}, "mixed": None, "plain": [1]}
    assert check_arguments(made, good) == ""
    assert "must be of type" in check_arguments(made, {**good, "size": 2.5})
    assert "must be of type" in check_arguments(made, {**good, "colors": "red"})
    assert made.fn(**good) == "blue None", "the Enum parameter receives Color.BLUE, not the string"


def test_a_type_with_no_json_schema_still_fails_at_load_naming_the_fix():
    class Point:
        pass

    def move(to: Point) -> str:
        """Move."""
        return ""
    with pytest.raises(ValueError, match=r"parameter 'to'.*schema=\{\.\.\.\}"):
        make_tool(move)


def test_a_tool_output_keeps_its_step_reward_on_the_turn(tmp_path):
    from tracerl.io.env.task import ToolOutput

    def probe(depth: int) -> ToolOutput:
        """Probe the ground.

        Args:
            depth: how deep
        """
        return ToolOutput(f"rock at {depth}", reward=0.25, metrics={"depth": depth})
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": [{"role": "user", "content": "dig"}], "reward_model": {"ground_truth": "3"}}\n')
    domain = UserTaskDomain(UserTask(tools=[probe], compute_score=lambda data_source, solution_str, ground_truth,
                                     extra_info=None: 1.0, train_files=[str(rows)]))
    env = domain.make_env()
    env.reset(domain.rows("train", 1)[0])
    result = env.step('<tool_call>{"name": "probe", "arguments": {"depth": 3}}</tool_call>')
    assert result.observation == "rock at 3"
    assert result.info["meta"] == {"tool_reward": 0.25, "tool_metrics": {"depth": 3}}
