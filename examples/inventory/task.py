"""The inventory task: two tools over a fruit shop, one of them writing to a SQLite database file.

- `price(item, quantity)`: what `quantity` units cost. Stateless (a fixed price list), so it needs nothing.
- `sell(state, item, quantity)`: sells from the shop's stock, kept in a SQLite file in a temporary folder made per
  episode (`make_state`). That state lives outside Python, where a deep copy cannot reach, so the tool says
  `state="replay"`: a continuation from a turn rebuilds the database by replaying the calls before it.
- `compute_score` has verl's custom-reward signature and would run unchanged as verl's `custom_reward_function`.
- `expert` solves a row (the embedded policy's warm start learns from its demonstrations).

Train on it with `tracerl train --config examples/inventory/config.toml` (see docs/tasks.md).
"""

import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

from tracerl.io.env.task import UserTask, tool

HERE = Path(__file__).parent
PRICES = {"apple": 3, "pear": 4, "lemon": 2, "melon": 9, "plum": 5, "mango": 7, "grape": 6, "peach": 8}


def price(item: str, quantity: int) -> str:
    """The cost of some units of a fruit.

    Args:
        item: the fruit, e.g. apple
        quantity: how many units
    """
    item = item.strip()
    if item not in PRICES:
        raise ValueError(f"we do not sell {item!r}")
    return f"{quantity} {item} cost {quantity * PRICES[item]}"


@tool(state="replay")
def sell(state: Path, item: str, quantity: int) -> str:
    """Sell units of a fruit from the stock; says how many are left.

    Args:
        item: the fruit, e.g. apple
        quantity: how many units to sell
    """
    item = item.strip()
    with sqlite3.connect(state / "shop.db") as db:
        row = db.execute("SELECT count FROM stock WHERE item = ?", (item,)).fetchone()
        if row is None:
            raise ValueError(f"we do not sell {item!r}")
        if quantity < 1 or quantity > row[0]:
            raise ValueError(f"cannot sell {quantity}: {row[0]} in stock")
        db.execute("UPDATE stock SET count = count - ? WHERE item = ?", (quantity, item))
    return f"sold {quantity} {item}, {row[0] - quantity} left"


def make_state(row: dict) -> Path:
    """A fresh shop database for one episode, stocked from the row."""
    folder = Path(tempfile.mkdtemp(prefix="inventory-"))
    with sqlite3.connect(folder / "shop.db") as db:
        db.execute("CREATE TABLE stock (item TEXT PRIMARY KEY, count INTEGER)")
        db.executemany("INSERT INTO stock VALUES (?, ?)", sorted(row["extra_info"]["stock"].items()))
    return folder


def close_state(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 iff the last number in the solution equals the ground truth (verl's custom-reward signature)."""
    numbers = re.findall(r"-?\d+", solution_str)
    return float(bool(numbers) and numbers[-1] == str(ground_truth).strip())


QUESTION = re.compile(r"(?:What do|Sell) (\d+) units of (\w+)(?:, then (\d+) more)?")


def expert(row, turns, rng):
    """The next call of a correct solution, given the (action, observation) pairs so far, then the answer."""
    first, item, second = QUESTION.match(row["prompt"][-1]["content"]).groups()
    kind = row["extra_info"]["kind"]
    calls = ([("price", int(first))] if kind == "cost" else
             [("sell", int(first))] + ([("sell", int(second))] if second else []))
    # The space before a copied word or number is for the embedded tiny policy: its tokenizer gives " melon" (as
    # in the question) and "melon" (after a quote) different tokens, and copying a token is far easier to learn
    # than a mapping between two. The tools strip it; the reward reads the number either way.
    if len(turns) < len(calls):
        name, quantity = calls[len(turns)]
        payload = json.dumps({"name": name, "arguments": {"item": " " + item, "quantity": quantity}})
        return f"<tool_call>{payload}</tool_call>"
    numbers = re.findall(r"-?\d+", turns[-1][1]) if turns else []
    return f"<answer> {numbers[-1] if numbers else 0}</answer>"


def make_task() -> UserTask:
    # the rows come from `python examples/inventory/make_data.py` (data.train_files/test_files may replace them)
    return UserTask(tools=[price, sell], compute_score=compute_score, make_state=make_state,
                    close_state=close_state, expert=expert, name="inventory",
                    train_files=[str(HERE / "data" / "train.jsonl")], test_files=[str(HERE / "data" / "test.jsonl")])
