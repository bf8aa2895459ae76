"""How far `trace-root-only`'s batch departs from `pcl`'s, step by step, on the runs three tables over builds kept
(`studies/batch-shape/README.md` states the questions; nothing is trained or sampled).

    python studies/batch_shape.py --out studies/batch-shape/batch.md

For each build archive (`studies/<table>/build<k>.tar.xz`, unpacked into a temporary folder and dropped), each of
the two runs is read from its `metrics.jsonl` train rows and its `rollouts/step-*.json` columns: one value a step,
averaged over the run's steps (`MEASURES`). Q1 states each method's mean over builds and their paired difference;
Q2 the Pearson correlation over builds between that difference and the build's held-out difference
`trace-root-only` - `pcl`, read from the table's own reports (`posterior_confirm.read`), with a Fisher interval.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import posterior_confirm  # noqa: E402
from run_records import records_folder  # noqa: E402

from tracerl.core.stats import seed_mean  # noqa: E402
from tracerl.core.tally import batch_shape, from_columns  # noqa: E402

STUDIES = Path(__file__).resolve().parent
METHODS = ("pcl", "trace-root-only")
CANDIDATE, COMPARATOR = "trace-root-only", "pcl"
Z_975 = 1.959963984540054


@dataclass(frozen=True)
class Table:
    name: str  # its folder under studies/, holding build<k>.tar.xz and reports/
    design: str  # its posterior_confirm design, whose reader gives the held-out differences
    label: str


TABLES = (Table("posterior-confirm", "posterior", "headroom, builds 5-28"),
          Table("root-only-confirm", "root-only", "headroom, builds 29-52"),
          Table("funcall-builds", "funcall", "function calling, builds 1-24"))

# (key, label, digits): what Q1 reads of a run, each a mean over its training steps
MEASURES = (("prompts", "prompts a step", 1), ("per_prompt", "fresh rollouts a prompt", 2),
            ("share_n", "share of fresh rollouts in a group of n", 3),
            ("distance", "mean abs(p - 1/2) of granted prompts", 3),
            ("mixed", "mixed trees per budget unit", 4), ("success", "batch success rate", 3),
            ("tokens", "sampled tokens a step", 0))


def step_measures(row: dict, columns: dict, n: int) -> dict[str, float]:
    """One training step's values: `row` its metrics line, `columns` its rollouts file's columns, n `pcl`'s group
    size. Only fresh rollouts count (`tally.batch_shape`: a prompt is its fresh rollouts, each weighing 1/grant)."""
    shape = batch_shape(from_columns(columns))
    fresh = shape["fresh"]
    return {"prompts": float(row["alloc/num_prompts"]),
            "per_prompt": fresh / shape["prompts"] if fresh else math.nan,
            "share_n": shape["prompts_by_grant"].get(n, 0.0) * n / fresh if fresh else math.nan,
            "distance": shape["distance"],
            "mixed": float(row["alloc/mixed_trees_per_budget"]), "success": float(row["alloc/success_rate"]),
            "tokens": float(row["rollout/tokens"])}


def run_measures(run: Path) -> dict[str, float]:
    """The mean over a run's training steps of each `step_measures` value (nan steps left out)."""
    n = json.loads((run / "config.json").read_text())["allocation"]["rollouts_per_prompt"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = []
    for row in (r for r in rows if r["kind"] == "train"):
        columns = json.loads((run / "rollouts" / f"step-{row['step']:06d}.json").read_text())["rollouts"]
        steps.append(step_measures(row, columns, n))
    if not steps:
        raise ValueError(f"{run}: no training step recorded")
    return {key: float(np.nanmean([s[key] for s in steps])) for key, _, _ in MEASURES}


def table_measures(folder: Path) -> dict[int, dict[str, dict[str, float]]]:
    """build -> method -> measures, for every kept `build<k>.tar.xz` under `folder`."""
    out = {}
    for archive in sorted(folder.glob("build*.tar.xz"), key=lambda p: int(p.name[5:-7])):
        with records_folder(archive) as runs:
            out[int(archive.name[5:-7])] = {m: run_measures(runs / f"{m}-seed0") for m in METHODS}
    return out


def pearson(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Pearson's r and its 95% Fisher interval (tanh(atanh r -/+ z / sqrt(n - 3))); nan bounds below 4 pairs."""
    if np.std(x) == 0 or np.std(y) == 0:  # a measure equal in every build (every `pcl` group has n rollouts)
        return math.nan, math.nan, math.nan
    r = float(np.corrcoef(x, y)[0, 1])
    if len(x) < 4 or abs(r) >= 1:
        return r, math.nan, math.nan
    half = Z_975 / math.sqrt(len(x) - 3)
    return r, math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)


def _cell(est, digits: int, sign: bool = False) -> str:
    f = f"{{:{'+' if sign else ''},.{digits}f}}"
    return f"{f.format(est.mean)} [{f.format(est.lo)}, {f.format(est.hi)}]"


def table_lines(table: Table, measures: dict[int, dict], held_out: dict[int, float],
                held_se: dict[int, float]) -> list[str]:
    builds = [k for k in measures if k in held_out]
    lines = [f"## `{table.name}/` ({table.label}; {len(builds)} builds)", "",
             f"| measure | `{COMPARATOR}` | `{CANDIDATE}` | difference | r with the held-out difference [95% Fisher] |",
             "|---|---|---|---|---|"]
    gain = [held_out[k] for k in builds]
    for key, label, digits in MEASURES:
        per = {m: [measures[k][m][key] for k in builds] for m in METHODS}
        diff = [a - b for a, b in zip(per[CANDIDATE], per[COMPARATOR])]
        r, lo, hi = pearson(diff, gain)
        lines.append(f"| {label} | {_cell(seed_mean(per[COMPARATOR]), digits)} | "
                     f"{_cell(seed_mean(per[CANDIDATE]), digits)} | {_cell(seed_mean(diff), digits, True)} | "
                     + ("n/a (the same in every build) |" if math.isnan(r) else f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}] |"))
    held = seed_mean(gain)
    noise = float(np.mean(np.square([held_se[k] for k in builds])))
    spread = float(np.var(gain, ddof=1))
    lines += ["", f"Held-out `{CANDIDATE}` - `{COMPARATOR}` over these builds (the table's own reading): "
              f"{held.mean:+.2f} [{held.lo:+.2f}, {held.hi:+.2f}] points, variance over builds {spread:.2f}, of which "
              f"question noise (the mean squared standard error over questions) {noise:.2f}: a measure that told "
              f"the true per-build difference exactly would correlate with the measured one at about "
              f"r = {math.sqrt(max(0.0, 1 - noise / spread)):.2f}.", ""]
    return lines


def to_markdown(tables: list[tuple[Table, dict, dict, dict]]) -> str:
    lines = ["# Stage 1 alone against PCL's filter: the batches", "",
             "Each run's value is its mean over training steps; each cell the mean over builds [95% t over builds]; "
             "difference is `trace-root-only` - `pcl` paired by build; r is over builds, against the build's "
             "held-out difference in points (`python studies/batch_shape.py`).", ""]
    for table, measures, held_out, held_se in tables:
        lines += table_lines(table, measures, held_out, held_se)
    return "\n".join(lines)


def read_table(table: Table, studies: Path = STUDIES) -> tuple[Table, dict, dict, dict]:
    """The table's measures by build, and its held-out differences and their standard errors over questions."""
    rows = posterior_confirm.read(studies / table.name / "reports", posterior_confirm.DESIGNS[table.design])
    values, errors = posterior_confirm.difference(rows, CANDIDATE, COMPARATOR)
    return table, table_measures(studies / table.name), dict(zip(rows, values)), dict(zip(rows, errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=Path, default=STUDIES, help="the folder holding the tables' folders")
    parser.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    args = parser.parse_args(argv)
    text = to_markdown([read_table(t, args.studies) for t in TABLES])
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
