"""The catalogue runs' reading (README.md's table): per arm, each seed's held-out gain after 30 steps with its paired
95% interval over the 200 test questions (`paired_difference` on one seed, the interval `tracerl train` prints), and
the mean over seeds with its Student-t 95% interval.

    python studies/warmstart-regime/read_runs.py [RUNS]        (default runs/warmstart)
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tracerl.core.stats import paired_difference, seed_mean


def gains(runs: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """arm -> seed -> (gain, paired half-width), in points, from the first and last evaluation of each run."""
    out: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for run in sorted(runs.glob("catalogue-*-seed*")):
        if not run.is_dir():
            continue
        arm, seed = re.fullmatch(r"(.+)-seed(\d+)", run.name).groups()
        evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
        if len(evals) < 2 or evals[-1]["step"] != 30:
            continue  # not finished
        d = paired_difference([100 * np.array(evals[-1]["eval/per_prompt"])],
                              [100 * np.array(evals[0]["eval/per_prompt"])])
        out[arm][int(seed)] = (d.mean, d.hi - d.mean)
    return out


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/warmstart")
    print("| arm | seeds | per seed: gain [paired 95% interval] | mean over seeds [t 95% interval] |")
    print("|---|---|---|---|")
    for arm, seeds in gains(runs).items():
        per_seed = "; ".join(f"{s}: {g:+.1f} [{g - h:+.1f}, {g + h:+.1f}]" for s, (g, h) in sorted(seeds.items()))
        m = seed_mean([g for g, _ in seeds.values()])
        print(f"| {arm} | {len(seeds)} | {per_seed} | {m.mean:+.1f} [{m.lo:+.1f}, {m.hi:+.1f}] |")


if __name__ == "__main__":
    main()
