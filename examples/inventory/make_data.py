"""Write the inventory task's prompt rows (verl's layout, JSONL) into examples/inventory/data/.

    python examples/inventory/make_data.py [--num-train 400] [--num-test 250] [--seed 0] [--out DIR]

Each row is a shop with its own stock (kept in `extra_info.stock`; the task's SQLite database starts from it) and
one question: the cost of some units (the `price` tool), or what is left after one or two sales (the `sell` tool,
which changes the database, so the second sale sees the first). Train and test never share a question text.
"""

import argparse
import json
import random
from pathlib import Path

ITEMS = ("apple", "pear", "lemon", "melon", "plum", "mango", "grape", "peach")
PRICES = {"apple": 3, "pear": 4, "lemon": 2, "melon": 9, "plum": 5, "mango": 7, "grape": 6, "peach": 8}
SYSTEM = "You run a fruit shop. Use the tools, then give the final number as <answer>N</answer>."


def make_row(rng: random.Random, split: str, index: int) -> dict:
    stock = {item: rng.randint(20, 60) for item in ITEMS}
    item = rng.choice(ITEMS)
    kind = rng.choice(("cost", "sell", "sell_twice"))
    if kind == "cost":
        quantity = rng.randint(2, 9)
        question, truth = f"What do {quantity} units of {item} cost?", quantity * PRICES[item]
    elif kind == "sell":
        quantity = rng.randint(2, 9)
        question, truth = f"Sell {quantity} units of {item}. How many are left?", stock[item] - quantity
    else:
        first, second = rng.randint(2, 9), rng.randint(2, 9)
        question = f"Sell {first} units of {item}, then {second} more. How many are left?"
        truth = stock[item] - first - second
    return {"data_source": "inventory",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": str(truth)},
            "extra_info": {"split": split, "index": index, "kind": kind, "stock": stock}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-train", type=int, default=400)
    parser.add_argument("--num-test", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}  # question text -> split, so the splits never share one
    rows: dict[str, list] = {"train": [], "test": []}
    while len(rows["train"]) < args.num_train or len(rows["test"]) < args.num_test:
        split = "test" if len(rows["test"]) < args.num_test and rng.random() < 0.3 else "train"
        if len(rows[split]) >= (args.num_test if split == "test" else args.num_train):
            continue
        row = make_row(rng, split, len(rows[split]))
        question = row["prompt"][-1]["content"]
        if seen.setdefault(question, split) != split:
            continue
        rows[split].append(row)
    for split, items in rows.items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
        print(f"wrote {len(items)} {split} rows to {out / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()
