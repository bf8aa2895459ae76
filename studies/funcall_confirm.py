"""Read function calling's confirmatory table (studies/preregistration.md, "Other domains at equal tokens, with
power", amendments 7, 8, 10 and 18).

    python studies/funcall_confirm.py DEST [--math-p P] [--out DEST/primary.md]

DEST holds the table's two reports of `tracerl compare --report-only` over the same runs: `DEST/compare.json`
against `grpo` and `DEST/vs-pcl/compare.json` against `pcl`. The unit is the seed (every seed's runs start from one
build), each difference is read at the comparator's final sampled tokens, its interval is Student's t over seeds
and its p the paired t-test's, all as the reports computed them. The rule, as registered:

- the question, `trace` - `grpo`, in one Holm family with math's (a) (`--math-p`: math's paired-t p over builds,
  `studies/math_confirm.py`, once that table is read). Without it, Holm's adjusted p is only bounded, by p and
  min(1, 2p): the reading is *established* when 2p is at most 0.05, *waits on math's* when p is at most 0.05 and 2p
  is not, and otherwise read from the interval (amendment 18, the same bound amendment 15 gave math's side);
- the secondaries, `pcl` - `grpo` and `trace` - `pcl`, Holm over the two within the table;
- each reading by `tracerl verdict`'s rule (`verdict.equal_tokens_reading`): *established* when its Holm-adjusted p
  is at most 0.05 (the sign says for or against), *refuted* when its 95% t interval lies below +0.5 points,
  *unresolved* otherwise; over fewer seeds than the 89 planned, an interim look that decides nothing.

Deliberately not here: any new statistic (every number is the reports'), and the token share to reach `grpo`'s
final success, which this design does not read (two evaluations, no curve).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.core.stats import holm
from tracerl.report.verdict import Plan, equal_tokens_reading

PLANNED_SEEDS = 89  # amendment 7
ALPHA = 0.05
QUESTION = ("trace", "grpo")
SECONDARIES = (("pcl", "grpo"), ("trace", "pcl"))


def read_reports(dest: Path) -> dict[str, dict]:
    """{"grpo": report against grpo, "pcl": report against pcl}, refused unless both are of the same runs."""
    reports = {}
    for base, path in (("grpo", dest / "compare.json"), ("pcl", dest / "vs-pcl" / "compare.json")):
        if not path.is_file():
            raise ValueError(f"{path} is missing: write it with tracerl compare --report-only --baseline {base}")
        reports[base] = json.loads(path.read_text())
        if reports[base].get("baseline") != base:
            raise ValueError(f"{path} is against {reports[base].get('baseline')!r}, not {base!r}")
    seeds = {tuple(r["seeds"]) for r in reports.values()}
    weights = {r.get("weights", {}).get("weights_sha256") for r in reports.values()}
    if len(seeds) > 1 or len(weights) > 1:
        raise ValueError(f"the two reports are not of the same runs (seeds differ: {len(seeds) > 1}, starting "
                         f"weights {sorted(str(w)[:12] for w in weights)}): write both from one run folder")
    return reports


def _reading(diff: dict, p_holm: float, method: str) -> dict:
    return equal_tokens_reading(diff, p_holm, Plan(method=method, planned_seeds=PLANNED_SEEDS, alpha=ALPHA))


def question(reports: dict[str, dict], math_p: float | None) -> dict:
    """`trace` - `grpo`: its reading with Holm's p over the two domains, or that p's bounds while math's is unread."""
    diff = reports["grpo"]["methods"]["trace"]["diff_at_equal_tokens"]
    p = diff["p"]
    lo, hi = (holm([p, math_p])[0],) * 2 if math_p is not None else (p, min(1.0, 2 * p))
    item = _reading(diff, hi, "trace")
    item["p_holm_bounds"] = (lo, hi)
    if lo <= ALPHA < hi:
        item["verdict"] = "waits on math's (a)"
    return item


def secondaries(reports: dict[str, dict]) -> list[dict]:
    """`pcl` - `grpo` (against grpo's report) and `trace` - `pcl` (against pcl's), Holm over the two."""
    diffs = [reports[base]["methods"][method]["diff_at_equal_tokens"] for method, base in SECONDARIES]
    return [_reading(d, p_adj, method) | {"p_holm_bounds": (p_adj, p_adj)}
            for (method, _), d, p_adj in zip(SECONDARIES, diffs, holm([d["p"] for d in diffs]))]


def _pts(x: float) -> str:
    return f"{100 * x:+.2f}"


def to_markdown(reports: dict[str, dict], math_p: float | None = None) -> str:
    seeds = list(reports["grpo"]["seeds"])
    interim = len(seeds) < PLANNED_SEEDS
    weights = str(reports["grpo"].get("weights", {}).get("weights_sha256"))[:12]
    lines = [f"Seeds read: {len(seeds)} of the planned {PLANNED_SEEDS}, every run from the build `{weights}`."
             + (" **An interim look: it decides nothing.**" if interim else ""), "",
             "| family | difference | read at | mean, points [95% t over seeds] | [95% bootstrap over seeds] | "
             "p (paired t) | Holm p | reading |", "|---|---|---|---|---|---|---|---|"]
    rows = [("question, Holm with math's (a)", QUESTION, question(reports, math_p))]
    rows += [("secondary", pair, item) for pair, item in zip(SECONDARIES, secondaries(reports))]
    for family, (method, base), item in rows:
        lo, hi = item["p_holm_bounds"]
        holm_p = f"{lo:.3f}" if lo == hi else f"[{lo:.3f}, {hi:.3f}]"
        boot = (f"[{_pts(item['boot_lo'])}, {_pts(item['boot_hi'])}]" if item.get("boot_lo") is not None else "-")
        lines.append(f"| {family} | `{method}` - `{base}` | `{base}`'s final tokens | {_pts(item['mean'])} "
                     f"[{_pts(item['lo'])}, {_pts(item['hi'])}] | {boot} | {item['p']:.3f} | {holm_p} | "
                     f"{'interim' if interim else item['verdict']} |")
    if math_p is None:
        lines += ["", "The question's Holm p with math's (a) is bounded, by p and min(1, 2p), until that table is read "
                  "(`--math-p`)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder with compare.json (against grpo) and vs-pcl/compare.json")
    parser.add_argument("--math-p", type=float, default=None,
                        help="math's paired-t p of trace - grpo over builds (its (a)), once that table is read")
    parser.add_argument("--out", type=Path, default=None, help="write the reading here as well")
    args = parser.parse_args(argv)
    if args.math_p is not None and not 0.0 <= args.math_p <= 1.0:
        parser.error(f"--math-p {args.math_p}: a p-value lies in [0, 1]")
    try:
        reports = read_reports(args.dest)
    except ValueError as err:
        print(f"funcall_confirm: {err}", file=sys.stderr)
        return 1
    text = to_markdown(reports, args.math_p)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
