"""Does a learning-signal measure rank methods as held-out success does? Read on the kept tables' per-seed values.

    python studies/proxy_ranks.py [--out studies/proxy-ranks.md]
    python studies/proxy_ranks.py --check runs/math-confirm [--out FILE.md]

A proxy (informative sampled tokens per token, informative units per unit, mixed trees per budget unit) may screen
methods only once it is shown to order them as held-out success at equal sampled tokens does. Every report against
`grpo` keeps, per seed, each method's held-out difference from `grpo` and each proxy's difference from `grpo`
(`signal_vs_baseline`), so both orders can be read per seed with `grpo` at zero:

- **methods' order**: Kendall's tau-b between the methods' mean proxy and their mean held-out difference (`grpo`
  included at 0), with a percentile interval from 4,000 resamples of the seeds (the same seeds for both measures);
- **per seed**: the same tau-b within each seed, averaged over seeds, with Student's t interval over seeds.

A tau near +1 means the proxy orders methods as held-out success does. Tables: the two confirmatory tables (3
methods), the samplers table (6 methods: `pilot_commit` is left out, it trains as `speed` does), the headroom pilot
and the domain tables, one build each (a reading is the build's); and the three tables read over builds, where builds
(one seed each, against `pcl`) stand where seeds stand: the posterior screen (five builds, 5 methods), the
posterior confirmatory table (24 builds, 6 methods, its kept reports in `posterior-confirm/reports/`) and
`trace-root-only`'s (24 other builds, 4 methods, `root-only-confirm/reports/`).

`--check DIR` is the registered check of one proxy (`studies/preregistration.md`, amendment 19), on a table over
builds laid out as `studies/math_confirm.sh` lays it out (each build's report against `pcl` in
`DIR/build<k>/vs-pcl/compare.json`): mixed trees per budget unit *holds* as a proxy on that table when the 95%
bootstrap interval of its tau-b of the methods' order lies above zero, *fails* when it lies at or below zero, and is
*unresolved* otherwise; over fewer builds than planned, an interim look that decides nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tracerl.core.stats import seed_mean

STUDIES = Path(__file__).resolve().parent
TABLES = ("preregistered-headroom", "preregistered-default", "samplers-headroom", "preregistered-headroom-pilot",
          "domain-math", "domain-funcall", "domain-funcall-equal-tokens", "domain-funcall-confirmatory")
OVER_BUILDS = {"posterior-screen": STUDIES / "posterior-screen",  # one seed a build: builds stand for seeds
               "posterior-confirm": STUDIES / "posterior-confirm" / "reports",
               "root-only-confirm": STUDIES / "root-only-confirm" / "reports"}
PROXIES = ("informative_sampled_tokens_per_token", "informative_units_per_unit", "mixed_trees_per_budget")
CHECKED_PROXY = "mixed_trees_per_budget"  # amendment 19
CHECK_PLANNED_BUILDS = 12  # math's confirmatory table, amendment 13
LEFT_OUT = {"pilot_commit"}  # trains as speed does at the shared screening size (studies/samplers-headroom/)
RESAMPLES = 4000


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of two equally long vectors (ties counted as neither; nan when one side is all ties)."""
    i, j = np.triu_indices(len(x), k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    denominator = np.sqrt(np.count_nonzero(sx) * np.count_nonzero(sy))
    return float(np.sum(sx * sy) / denominator) if denominator else float("nan")


def table_values(report: dict, proxy: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(methods, held-out (M, S), proxy (M, S)): per-seed differences from the baseline, the baseline a row of 0."""
    rows = {m: r for m, r in report["methods"].items() if m != report["baseline"] and m not in LEFT_OUT}
    methods = [report["baseline"], *rows]
    seeds = len(next(iter(rows.values()))["diff_at_equal_tokens"]["per_seed"])
    held = np.zeros((len(methods), seeds))
    signal = np.zeros((len(methods), seeds))
    for k, m in enumerate(methods[1:], start=1):
        held[k] = rows[m]["diff_at_equal_tokens"]["per_seed"]
        signal[k] = rows[m]["signal_vs_baseline"][proxy]["per_seed"]
    return methods, held, signal


def screen_values(proxy: str, folder: Path = STUDIES / "posterior-screen",
                  report_name: str = "compare.json") -> tuple[list[str], np.ndarray, np.ndarray]:
    """`table_values` over a table's builds (one seed each; `folder/build*/report_name`): column b is build b's."""
    parts = [table_values(json.loads(report.read_text()), proxy)
             for report in sorted(folder.glob(f"build*/{report_name}"))]
    if not parts:
        raise ValueError(f"{folder} holds no build*/{report_name}: name the folder a table over builds was written to")
    methods = parts[0][0]
    assert all(p[0] == methods for p in parts), "every build's report holds the same methods in the same order"
    return methods, np.hstack([p[1] for p in parts]), np.hstack([p[2] for p in parts])


def ranks(held: np.ndarray, signal: np.ndarray, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    order = kendall_tau_b(signal.mean(axis=1), held.mean(axis=1))
    draws = rng.integers(held.shape[1], size=(RESAMPLES, held.shape[1]))
    boot = np.array([kendall_tau_b(signal[:, d].mean(axis=1), held[:, d].mean(axis=1)) for d in draws])
    boot = boot[np.isfinite(boot)]
    per_seed = seed_mean([kendall_tau_b(signal[:, s], held[:, s]) for s in range(held.shape[1])])
    return {"order": order, "order_lo": float(np.quantile(boot, 0.025)), "order_hi": float(np.quantile(boot, 0.975)),
            "per_seed": per_seed}


def order(methods: list[str], values: np.ndarray) -> str:
    """The methods by their mean over seeds (or builds), highest first, as "a > b > c"."""
    return " > ".join(methods[k] for k in np.argsort(-values.mean(axis=1), kind="stable"))


def check_reading(r: dict, builds: int, planned: int = CHECK_PLANNED_BUILDS) -> str:
    """Amendment 19's reading of one tau-b of the methods' order, from its interval over builds."""
    if builds < planned:
        return f"interim look ({builds} of {planned} builds): decides nothing"
    if r["order_lo"] > 0:
        return "holds: its interval lies above zero"
    if r["order_hi"] <= 0:
        return "fails: its interval lies at or below zero"
    return "unresolved: its interval holds zero"


def check(folder: Path) -> str:
    """Amendment 19's check on the table over builds in `folder`, as markdown."""
    methods, held, signal = screen_values(CHECKED_PROXY, folder, "vs-pcl/compare.json")
    r = ranks(held, signal)
    p = r["per_seed"]
    return "\n".join([
        f"Registered check (amendment 19) of `{CHECKED_PROXY}` over {held.shape[1]} builds, each build's "
        f"difference from `{methods[0]}`:", "",
        "| methods by held-out success | by the proxy | tau-b of the order [95% bootstrap over builds] | "
        "mean tau-b per build [95% t] | reading |", "|---|---|---|---|---|",
        f"| {order(methods, held)} | {order(methods, signal)} | {r['order']:+.2f} [{r['order_lo']:+.2f}, "
        f"{r['order_hi']:+.2f}] | {p.mean:+.2f} [{p.lo:+.2f}, {p.hi:+.2f}] | "
        f"{check_reading(r, held.shape[1])} |", ""])


def table() -> str:
    """Every kept table's ranks, one row per table and proxy, as markdown."""
    lines = ["| table | methods, by mean held-out difference from `grpo` (the screen: from `pcl`) | seeds (the screen: "
             "builds) | proxy | its order | tau-b of the methods' order [95% bootstrap over seeds] | mean tau-b per "
             "seed [95% t] |", "|---|---|---|---|---|---|---|"]
    for name in (*TABLES, *OVER_BUILDS):
        report = None if name in OVER_BUILDS else json.loads((STUDIES / name / "compare.json").read_text())
        for proxy in PROXIES:
            methods, held, signal = (screen_values(proxy, OVER_BUILDS[name]) if report is None
                                     else table_values(report, proxy))
            r = ranks(held, signal)
            p = r["per_seed"]
            lines.append(f"| `{name}` | {order(methods, held)} | {held.shape[1]} | {proxy} | "
                         f"{order(methods, signal)} | {r['order']:+.2f} [{r['order_lo']:+.2f}, {r['order_hi']:+.2f}] | "
                         f"{p.mean:+.2f} [{p.lo:+.2f}, {p.hi:+.2f}] |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the table here as well")
    parser.add_argument("--check", type=Path, default=None, metavar="DIR",
                        help="amendment 19's check of mixed trees per budget unit on the table over builds in DIR")
    args = parser.parse_args(argv)
    try:
        text = check(args.check) if args.check is not None else table()
    except ValueError as err:
        print(f"proxy_ranks: {err}", file=sys.stderr)
        return 1
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
