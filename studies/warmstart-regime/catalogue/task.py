"""A library-catalogue task for tracerl: look a title up at a branch, answer its copies or its shelf.

Rows come from `make_data.py`; each carries its own small catalogue in `extra_info`, which `make_state` hands to the
tools as plain data (`state="copy"`). `lookup` returns the record or raises (an error observation for the model);
`list_branches` names the branches in the catalogue. The reward is an exact match of the final answer; the expert
(for the embedded policy's warm start) looks the asked title up, then copies the asked field from the observation,
keeping a leading space on every copied word (docs/tasks.md).
"""

import json
import re
from pathlib import Path

from tracerl.io.env.task import UserTask, tool

DATA = Path(__file__).parent / "data"
RECORD = re.compile(r"copies (\d+), shelf (\S+)")


@tool(state="copy")
def lookup(state, title: str, branch: str) -> str:
    """Look a book up in the catalogue of one branch; returns its number of copies and its shelf.

    Args:
        title: the book's title
        branch: the branch's name
    """
    title, branch = title.strip(), branch.strip()
    for r in state["catalogue"]:
        if r["title"] == title and r["branch"] == branch:
            return f"{title} at {branch}: copies {r['copies']}, shelf {r['shelf']}"
    raise LookupError(f"no record of {title} at the {branch} branch")


@tool(state="copy")
def list_branches(state) -> str:
    """List the branches that appear in the catalogue."""
    return "branches: " + ", ".join(sorted({r["branch"] for r in state["catalogue"]}))


def make_state(row: dict) -> dict:
    return dict(row["extra_info"])


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return float(str(solution_str).strip() == str(ground_truth).strip())


def expert(row: dict, turns: list, rng) -> str:
    info = row["extra_info"]
    found = RECORD.search(turns[-1][1]) if turns else None
    if found:
        value = found.group(1) if info["type"] == "copies" else found.group(2)
        return f"<answer> {value}</answer>"
    args = {"title": " " + info["title"], "branch": " " + info["branch"]}
    return "<tool_call>" + json.dumps({"name": "lookup", "arguments": args}) + "</tool_call>"


def make_task() -> UserTask:
    return UserTask(tools=[lookup, list_branches], compute_score=compute_score, expert=expert,
                    make_state=make_state,
                    train_files=[str(DATA / "train.jsonl")], test_files=[str(DATA / "test.jsonl")])
