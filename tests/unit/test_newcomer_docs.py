"""What a new user looked for in docs/tasks.md and docs/training.md and did not find: how a tool reads the row's data,
the leading-space tip for the embedded tokenizer, the warm start's check and its split, the saved trees' format.
Each check ties the text to the code or example it describes, so either changing alone fails here."""

import dataclasses
import re
from pathlib import Path

from tracerl.core.tree import Node, Segment

ROOT = Path(__file__).resolve().parents[2]
TASKS = (ROOT / "docs" / "tasks.md").read_text()
TRAINING = (ROOT / "docs" / "training.md").read_text()
INVENTORY = (ROOT / "examples" / "inventory" / "task.py").read_text()


def section(text: str, title: str) -> str:
    assert f"\n## {title}\n" in text, f"no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def flat(text: str) -> str:
    """Prose with its line breaks as spaces (a phrase may wrap anywhere)."""
    return " ".join(text.split())


def test_tasks_md_says_how_a_tool_reads_the_rows_data():
    pieces = section(TASKS, "The pieces")
    bullet = flat(pieces.split("**The row's data reaches a tool through the state.**", 1)[1].split("\n- **", 1)[0])
    assert "`make_state(row)`" in bullet and "never gets the row" in bullet and "`extra_info`" in bullet
    quoted = re.search(r'`(row\["extra_info"\]\["\w+"\])`', bullet).group(1)
    make_state = INVENTORY.split("def make_state", 1)[1].split("\ndef ", 1)[0]
    assert quoted in make_state, "the inventory example the docs quote reads the row this way"
    assert '@tool(state="copy")' in bullet, "a read-only state still declares how it branches"


def test_tasks_md_gives_the_leading_space_tip_the_code_follows():
    embedded = flat(section(TASKS, "The embedded policy on your task, or a real model"))
    assert "keeps the space before it" in embedded and "`tracerl.policy.embedded.spaced`" in embedded
    assert '" " + item' in INVENTORY, "the inventory expert the tip names copies the item with a leading space"
    source = (ROOT / "src" / "tracerl" / "policy" / "embedded.py").read_text()
    assert "def spaced(" in source and "different ids" in source


def test_tasks_md_names_the_split_the_warm_starts_check_reads():
    embedded = flat(section(TASKS, "The embedded policy on your task, or a real model"))
    source = (ROOT / "src" / "tracerl" / "policy" / "embedded.py").read_text()
    split = re.search(r'^CHECK_SPLIT = "(\w+)"', source, flags=re.M).group(1)
    assert f"`held-out success on the {split} split ...`" in embedded
    assert "held-out success on the {CHECK_SPLIT} split" in source, "the printed line the docs quote"


def test_training_md_documents_the_saved_trees_file_and_its_reader():
    trees = section(TRAINING, "Saved trees")
    assert "`tracerl.io.files.runlog.read_trees(run_dir, step=None)`" in flat(trees) and "write_trees" in trees
    assert "step-NNNNNN.json.gz" in trees and "gzipped" in trees
    node_table = trees.split("| field | what |", 1)[1]
    listed = {name.strip("` ") for cell in re.findall(r"^\| (`[^|]+`) \|", node_table, flags=re.M)
              for name in cell.split(",")}
    assert listed == {f.name for f in dataclasses.fields(Node)}, "every Node field, and only those"
    assert all(f"`{f.name}`" in node_table for f in dataclasses.fields(Segment))


def test_docs_say_where_training_success_is_not_the_policys():
    metrics = flat(section(TRAINING, "Metrics"))
    assert "p = 0.5" in metrics and "report.md" in metrics and "`tracerl methods`" in metrics


def test_docs_say_what_eval_out_reads():
    text = flat(section(TRAINING, "Checkpoints and resume"))
    assert "`tracerl eval --out <run> --checkpoint`" in text and "run's own `config.json`" in text
