"""Generate the library-catalogue rows: 400 training and 200 held-out questions in verl's layout.

Each row asks how many copies of a made-up title a branch holds, or which shelf it is on there, and carries in
`extra_info["catalogue"]` a small catalogue (the asked record, the same title at two other branches, three other
titles at the asked branch) that the task's tools read. Deterministic: `python make_data.py [--seed 0]` writes
`data/train.jsonl` and `data/test.jsonl` next to this file.
"""

import argparse
import json
import random
from pathlib import Path

ADJECTIVES = ["Silent", "Crimson", "Hidden", "Golden", "Frozen", "Last", "Wandering", "Broken"]
NOUNS = ["Harbor", "Orchard", "Lantern", "Garden", "Compass", "Tower", "River", "Mirror"]
TITLES = [f"The {a} {n}" for a in ADJECTIVES for n in NOUNS]
BRANCHES = ["Eastgate", "Northfield", "Willowmere", "Stonebridge", "Ashford", "Riverside"]
SYSTEM = "You answer questions about a library catalogue. Use the tools, then reply with <answer>...</answer>."
QUESTIONS = {
    "copies": "How many copies of {title} does the {branch} branch hold?",
    "shelf": "Which shelf is {title} on at the {branch} branch?",
}


def record(rng: random.Random, title: str, branch: str) -> dict:
    shelf = f"{rng.choice('ABCDEFGHJK')}{rng.randint(1, 30)}"
    return {"title": title, "branch": branch, "copies": rng.randint(1, 12), "shelf": shelf}


def make_row(rng: random.Random) -> dict:
    title, branch = rng.choice(TITLES), rng.choice(BRANCHES)
    kind = rng.choice(sorted(QUESTIONS))
    asked = record(rng, title, branch)
    others = [record(rng, title, b) for b in rng.sample([b for b in BRANCHES if b != branch], 2)]
    others += [record(rng, t, branch) for t in rng.sample([t for t in TITLES if t != title], 3)]
    catalogue = [asked] + others
    rng.shuffle(catalogue)
    return {
        "data_source": "library_catalogue",
        "prompt": [{"role": "system", "content": SYSTEM},
                   {"role": "user", "content": QUESTIONS[kind].format(title=title, branch=branch)}],
        "reward_model": {"style": "rule", "ground_truth": str(asked[kind])},
        "extra_info": {"type": kind, "title": title, "branch": branch, "catalogue": catalogue},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(__file__).parent / "data"
    out.mkdir(exist_ok=True)
    for split, n in [("train", 400), ("test", 200)]:
        with open(out / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps(make_row(rng)) + "\n")
        print(f"wrote {n} rows to {out / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()
