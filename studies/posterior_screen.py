"""Read the posterior screen (studies/posterior-screen/README.md): per build and over builds.

    python studies/posterior_screen.py runs/posterior-screen [--out studies/posterior-screen/screen.md]

Each `build<k>/compare.json` (written by `tracerl compare --baseline pcl`, one seed) gives every method minus `pcl`
at `pcl`'s final sampled tokens, with the normal interval over its 512 questions; a candidate minus `knapsack_rl` is
the difference of two of them. Over the builds: the mean of each and its Student-t 95% interval over builds
(`tracerl.core.stats.seed_mean`). A candidate is read over the builds where it and both comparators finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.core.stats import seed_mean

COMPARATORS = ("pcl", "knapsack_rl")


def candidates(rows: dict[int, dict]) -> list[str]:
    """Every method of any build that is not a comparator, in order of first appearance."""
    seen: list[str] = []
    for row in rows.values():
        seen += [m for m in row["diff"] if m not in COMPARATORS and m not in seen]
    return seen


def per_build(report: dict) -> dict:
    """The build's differences from `pcl` in points (with their intervals and standard errors over questions), its
    weights hash, start, final successes and sampled tokens."""
    methods = report["methods"]
    diff = {m: 100 * r["diff_at_equal_tokens"]["mean"] for m, r in methods.items()}
    interval = {m: (100 * r["diff_at_equal_tokens"]["lo"], 100 * r["diff_at_equal_tokens"]["hi"])
                for m, r in methods.items()}
    return {"weights": (report.get("weights") or {}).get("weights_sha256", "")[:12],
            "start": 100 * methods["pcl"]["success_before"], "diff": diff, "interval": interval,
            "se": {m: 100 * (r["diff_at_equal_tokens"].get("se") or 0.0) for m, r in methods.items()},
            "final": {m: 100 * r["success_after"] for m, r in methods.items()},
            "tokens": {m: r["tokens"] for m, r in methods.items()}}


def read(root: Path, needed: tuple[str, ...] = COMPARATORS, report_name: str = "compare.json") -> dict[int, dict]:
    """Every `build<k>/<report_name>` under `root` in which all of `needed` finished (a build still training is left
    out), by build seed."""
    rows = {}
    for folder in sorted(root.glob("build*"), key=lambda p: int(p.name[5:])):
        report = folder / report_name
        summary = json.loads(report.read_text()) if report.exists() else None
        if summary and all(m in summary["methods"] for m in needed):
            rows[int(folder.name[5:])] = per_build(summary)
    return rows


def to_markdown(rows: dict[int, dict]) -> str:
    methods = [*COMPARATORS, *candidates(rows)]
    lines = ["| build | weights | start | method | final success | sampled tokens "
             "| minus `pcl` at `pcl`'s final tokens [95% over questions] | minus `knapsack_rl` |",
             "|---|---|---|---|---|---|---|---|"]
    for k, r in rows.items():
        for m in methods:
            if m not in r["diff"]:
                continue
            lo, hi = r["interval"][m]
            against_knapsack = r["diff"][m] - r["diff"]["knapsack_rl"]
            lines.append(f"| {k} | `{r['weights']}` | {r['start']:.1f}% | `{m}` | {r['final'][m]:.1f}% | "
                         f"{r['tokens'][m]:,.0f} | {r['diff'][m]:+.2f} [{lo:+.2f}, {hi:+.2f}] "
                         f"| {against_knapsack:+.2f} |")
    lines += ["", "Over builds (mean, Student-t 95% interval over builds; points at `pcl`'s final sampled tokens):", ""]
    for m in methods[1:]:
        builds = [k for k, r in rows.items() if m in r["diff"]]
        for comparator in COMPARATORS:
            if m == comparator:
                continue
            est = seed_mean([rows[k]["diff"][m] - rows[k]["diff"][comparator] for k in builds])
            lines.append(f"- `{m}` - `{comparator}` over {len(builds)} builds ({', '.join(map(str, builds))}): "
                         f"{est.mean:+.2f} [{est.lo:+.2f}, {est.hi:+.2f}]; per build "
                         + ", ".join(f"{v:+.2f}" for v in est.per_seed))
    return "\n".join(lines) + "\n"


def emit(text: str, out: Path | None) -> int:
    """Print a reading, and write it to `out` as well where one is named; 0, the exit status."""
    print(text, end="")
    if out:
        out.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the screen's runs (runs/posterior-screen)")
    parser.add_argument("--out", type=Path, default=None, help="write the table here as well")
    args = parser.parse_args(argv)
    rows = read(args.root)
    if not rows:
        print(f"no build under {args.root} has finished runs of {' and '.join(COMPARATORS)}", file=sys.stderr)
        return 1
    text = to_markdown(rows)
    return emit(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
