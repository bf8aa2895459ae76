"""The recorded `tracerl bench alloc` tables from its JSON: the mean ± std table, then each method minus grpo paired
by seed with a 95% interval (Student's t over seeds), priced measures first.

    tracerl bench alloc --seeds 0,1,2,3,4 --json > alloc.json
    python benchmarks/alloc_report.py alloc.json --title "..." > benchmarks/results/alloc-5seeds.md

Every method of a seed sees the same simulator, pools and drift, so the seed is the pairing unit.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import numpy as np

from tracerl.bench.alloc import to_markdown
from tracerl.core.stats import paired_difference

# (key, column title, scale): priced first (continuations at their cost; the tokens a rollout sampled itself)
PAIRED = (("informative_units_per_unit", "informative units / unit (priced)", 1.0),
          ("informative_sampled_tokens_per_token", "informative sampled tokens / token (priced)", 1.0),
          ("informative_rollouts_per_budget", "informative rollouts / unit (counted)", 1.0),
          ("informative_rollouts_per_ktoken", "informative rollouts / 1k sampled tokens (counted)", 1.0))


def paired_rows(result: dict, baseline: str = "grpo") -> list[str]:
    per_seed = result["per_seed"]
    titles = [title for _, title, _ in PAIRED]
    lines = ["| method | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for method in result["methods"]:
        if method == baseline:
            continue
        cells = []
        for key, _, scale in PAIRED:
            ours = [np.array([scale * seed[method][key]]) for seed in per_seed]
            base = [np.array([scale * seed[baseline][key]]) for seed in per_seed]
            d = paired_difference(ours, base)
            cells.append(f"{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json_file", help="the output of `tracerl bench alloc --seeds ... --json`")
    parser.add_argument("--title", default="`tracerl bench alloc`", help="the table's heading")
    args = parser.parse_args(argv)
    result = json.load(open(args.json_file))
    seeds = result["seeds"]
    print(f"# {args.title}\n")
    print(to_markdown(result))
    print("\n" + textwrap.fill(
        f"Paired over the {len(seeds)} seeds (the same simulator, pools and drift for every method of a seed), "
        "method minus grpo, 95% interval (Student's t over seeds, `tracerl.core.stats.paired_difference`). Priced "
        "measures count a continuation at its budget cost (units) or the tokens a rollout sampled below its anchor "
        "(tokens); the counted ones count every informative rollout whole.", width=120) + "\n")
    print("\n".join(paired_rows(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
