"""Where each method's rollouts went: the share of finished rollouts (tree leaves) per question type, read from the
saved trees of a `tracerl compare` folder.

    python studies/rollouts_by_type.py runs/learning-gain/methods [--skip-steps 4]

A question type is what the domain's rows name in `extra_info` (multihop: `hops` and `answerable`, the keys of
`tracerl regime`). "impossible" is a question no policy can answer on the default testbed: unanswerable (a document
on its chain is missing) or with more hops than the turn cap leaves room for (a search turn per hop, then one turn
to answer). The rows are rebuilt as the trainer builds them (the run's policy domain, `num_train_prompts` rows of
the train split drawn with the run's seed), so no data is stored beside the trees. `--skip-steps K` also reports
the share after the first K steps, once the predictor has seen some outcomes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from tracerl.io.files.runlog import read_trees
from tracerl.train.config import load_config
from tracerl.train.policy import load_policy

RUN = re.compile(r"^(?P<label>.+)-seed(?P<seed>\d+)$")


def leaves_by_type(run_dir: Path, skip_steps: int) -> tuple[Counter, Counter, int]:
    """(leaves per question type over every step, the same after `skip_steps`, the turn cap)."""
    config = load_config(str(run_dir / "config.json"))
    policy = load_policy(config)
    rows = policy.domain.rows("train", config.data.num_train_prompts, seed=config.run.seed)
    by_id = {f"{r['data_source']}:train:{r['extra_info']['index']}": r["extra_info"] for r in rows}
    turn_cap = policy.limits.max_turns
    every, late = Counter(), Counter()
    for f in sorted((run_dir / "trees").glob("step-*.json.gz")):
        record = read_trees(run_dir, int(f.name[5:11]))
        for tree in record["trees"]:
            info = by_id[tree["prompt_id"]]
            n = sum(1 for node in tree["nodes"] if node.get("reward") is not None)
            kind = ("impossible" if not info.get("answerable", True) or info.get("hops", 0) + 1 > turn_cap
                    else f"{info.get('hops')}-hop")
            every[kind] += n
            if record["step"] > skip_steps:
                late[kind] += n
    return every, late, turn_cap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a tracerl compare --out folder")
    parser.add_argument("--skip-steps", type=int, default=4)
    args = parser.parse_args(argv)
    totals: dict[str, list[Counter]] = defaultdict(lambda: [Counter(), Counter()])
    for run_dir in sorted(p for p in args.folder.iterdir() if p.is_dir() and RUN.match(p.name)):
        if not (run_dir / "report.md").exists():
            print(f"skipping {run_dir.name}: unfinished", file=sys.stderr)
            continue
        every, late, _ = leaves_by_type(run_dir, args.skip_steps)
        label = RUN.match(run_dir.name)["label"]
        totals[label][0].update(every)
        totals[label][1].update(late)
    kinds = sorted({k for pair in totals.values() for c in pair for k in c})
    print(f"| method | rollouts | {' | '.join(kinds)} | impossible after step {args.skip_steps} |")
    print("|---|---|" + "---|" * (len(kinds) + 1))
    for label, (every, late) in totals.items():
        total, late_total = sum(every.values()), max(sum(late.values()), 1)
        shares = " | ".join(f"{every[k] / total:.1%}" for k in kinds)
        print(f"| {label} | {total} | {shares} | {late['impossible'] / late_total:.1%} |")
    print(json.dumps({label: {"all": dict(e), "late": dict(l)} for label, (e, l) in totals.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
