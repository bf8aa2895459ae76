"""A design's measured core-seconds a seed against the registered table's, and the share of core-seconds it needs for
the registered standard error, with the variances `design.md` models (the cost measured, the variance modelled).

    python studies/eval-design-headroom/measured_cost.py MEASURED_RUNS [--beside REGISTERED_RUNS] [--registered ARCHIVE]

MEASURED_RUNS holds `measured.sh`'s runs of the projected design, REGISTERED_RUNS its runs of the registered design
(the same seed on the same machine, trained beside them); ARCHIVE, the registered table's own runs, defaults to
`preregistered-headroom/runs.tar.xz` (unpacked into a temporary folder). A seed's core-seconds: its runs' training
seconds (each on one torch thread) plus the seconds of its distinct evaluations (step 0's once: the methods of a
seed share it), as `eval_schedule.py` counts them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
METHODS = ("grpo", "pcl", "trace")


def _script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


eval_schedule = _script("eval_schedule", HERE.parent / "eval_schedule.py")
run_records = _script("run_records", HERE.parent / "run_records.py")


def seed_costs(runs: Path, drop: tuple[int, ...] = ()) -> dict[int, tuple[float, float, int]]:
    """seed -> (training seconds, evaluation seconds, distinct evaluations) for every seed all methods finished;
    `drop`: steps whose evaluations are left out (the design without them, priced from the same runs)."""
    out = {}
    seeds = sorted({int(p.name.rsplit("seed", 1)[1]) for p in runs.glob("grpo-seed*")})
    for seed in seeds:
        dirs = [runs / f"{m}-seed{seed}" for m in METHODS]
        if not all((d / "metrics.jsonl").exists() for d in dirs):
            continue
        loaded = [eval_schedule.load_evals(d) for d in dirs]
        train = sum(t for _, t in loaded)
        evals = [r for i, (rows, _) in enumerate(loaded) for r in rows
                 if (r["step"] != 0 or i == 0) and r["step"] not in drop]
        out[seed] = (train, sum(r["eval/seconds"] for r in evals), len(evals))
    return out


def _row(name: str, costs: dict[int, tuple[float, float, int]]) -> str:
    c = np.array(list(costs.values()))
    return (f"| {name} | {len(c)} | {c[:, 2].mean():.0f} | {c[:, 0].mean():.0f} | {c[:, 1].mean():.0f} | "
            f"{(c[:, 0] + c[:, 1]).mean():.0f} |")


def _total(costs: dict[int, tuple[float, float, int]]) -> float:
    return float(np.mean([a + b for a, b, _ in costs.values()]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path)
    parser.add_argument("--beside", type=Path, help="the registered design's runs trained beside MEASURED_RUNS")
    parser.add_argument("--registered", type=Path, default=HERE.parent / "preregistered-headroom" / "runs.tar.xz")
    args = parser.parse_args()
    measured = seed_costs(args.measured)
    with tempfile.TemporaryDirectory() as tmp:
        run_records.unpack(args.registered, Path(tmp))
        table = seed_costs(Path(tmp))
        readings = eval_schedule.table(Path(tmp), list(METHODS), "grpo", "tokens")["readings"]
    # variances a seed (points^2), the registered design's and this one's (coupled), as design.md models them
    shares = {}
    for method, rows in readings.items():
        var_seed, noise = eval_schedule.spread(rows)
        coupled = eval_schedule.Design("coupled", [], eval_schedule.COUPLING, 1.0)
        shares[f"{method} - grpo"] = eval_schedule.variance(coupled, var_seed - noise, noise) / var_seed
    rows = [("the registered table's runs (preregistered-headroom/)", table)]
    if args.beside:
        rows.append(("registered design, trained beside (seed 200)", seed_costs(args.beside)))
    rows.append(("projected design: where it reads + 0, 12, coupled (seed 200)", measured))
    without = seed_costs(args.measured, drop=(18,))  # trace - grpo reads 20-24; step 18 is pcl's
    print("| design | seeds | distinct evaluations a seed | training s | evaluation s | core-seconds a seed |")
    print("|---|---|---|---|---|---|")
    for name, costs in rows:
        print(_row(name, costs))
    print(_row("... without step 18 (`trace` - `grpo` alone; priced from the same runs)", without))
    new = _total(measured)
    print()
    for name, costs in rows[:-1]:
        ratio = new / _total(costs)
        print(f"Against {name}: cost a seed {ratio:.0%}; core-seconds for the registered SE (the cost measured, "
              f"design.md's variances): trace - grpo {ratio * shares['trace - grpo']:.0%}, "
              f"pcl - grpo {ratio * shares['pcl - grpo']:.0%}; without step 18, trace - grpo "
              f"{_total(without) / _total(costs) * shares['trace - grpo']:.0%}")


if __name__ == "__main__":
    main()
