"""Read math's confirmatory table over builds (studies/preregistration.md, amendments 13, 15 and 16).

    python studies/math_confirm.py runs/math-confirm [--funcall-p P] [--out studies/math-confirm/primary.md]

Each build (one training seed) has two reports of `tracerl compare` (studies/math_confirm.sh): `vs-grpo/compare.json`
gives every method minus `grpo` at `grpo`'s final sampled tokens, `vs-pcl/compare.json` every method minus `pcl` at
`pcl`'s; each difference with its paired standard error over the held-out questions. The unit is the build: each
build gives one difference, its interval is Student's t over builds. The rule, as registered:

- (a) `trace` - `grpo` at `grpo`'s final sampled tokens (the registered question of "Other domains at equal tokens"),
  in one Holm family with function calling's `trace` - `grpo` (`--funcall-p`: that table's paired-t p once it is
  read). Without it, Holm's adjusted p is only bounded, by p and min(1, 2p): the reading is *established* when 2p
  is at most 0.05, *waits on function calling's* when p is at most 0.05 and 2p is not, and otherwise read as below.
- (b) `posterior`'s primaries, a family of their own: `posterior` - `pcl` and `posterior` - `knapsack_rl`, Holm over
  the two, both read at `pcl`'s final sampled tokens (`posterior` - `knapsack_rl` is the difference of their
  differences from `pcl`; every run stops within a step of 190,000 sampled tokens). Secondary: `trace` - `pcl`.
- (c) `trace-root-only`'s (amendment 16), a family of its own: `trace-root-only` - `pcl` and `trace-root-only` -
  `knapsack_rl`, Holm over the two, read as (b) is.
- Each reading: *established* when its Holm-adjusted p is at most 0.05 with the mean above zero (below zero:
  "established, against"); *refuted* when its 95% interval lies below +0.5 points; *unresolved* otherwise
  (`posterior_confirm.verdict`).
- The build count B = 12, appended to amendment 13 from the pilot before build 1 trained (`PLANNED_BUILDS`); over
  fewer builds than B a reading is an interim look that decides nothing.

Also stated, not tested: each build's weights hash, its start, every method's final success and sampled tokens, and
the paired question noise of each difference beside the spread over builds; where the kept builds span machines
(amendment 20, as amendment 17 reads a table over builds), each difference's mean [95% t] over each machine's builds
and Welch's difference between two machines' means (descriptive: no reading changes with them).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from tracerl.core.stats import holm

_path = Path(__file__).resolve().parent / "posterior_confirm.py"
_spec = importlib.util.spec_from_file_location("posterior_confirm", _path)
posterior_confirm = importlib.util.module_from_spec(_spec)  # studies/ is not a package
sys.modules["posterior_confirm"] = posterior_confirm
_spec.loader.exec_module(posterior_confirm)
posterior_screen = posterior_confirm.posterior_screen  # the one it loaded

PLANNED_BUILDS: int | None = 12  # B of amendment 13, appended there from the pilot before build 1 trained
METHODS = ("grpo", "pcl", "trace", "knapsack_rl", "posterior", "trace-root-only")
REGISTERED = (("trace", "grpo"),)  # (a), against grpo's report; Holm with function calling's
PRIMARIES = (("posterior", "pcl"), ("posterior", "knapsack_rl"))  # (b), against pcl's report
SECONDARY = (("trace", "pcl"),)
ROOT_ONLY = (("trace-root-only", "pcl"), ("trace-root-only", "knapsack_rl"))  # (c), against pcl's report


def read(root: Path) -> dict[str, dict[int, dict]]:
    """{"grpo": rows, "pcl": rows}: the builds under `root` whose six runs finished and whose two reports are both
    written, each report read as the screen reads one (`posterior_screen.per_build`), by build seed."""
    found = {base: posterior_screen.read(root, METHODS, f"vs-{base}/compare.json") for base in ("grpo", "pcl")}
    both = sorted(set(found["grpo"]) & set(found["pcl"]))
    return {base: {k: rows[k] for k in both} for base, rows in found.items()}


def registered(rows: dict[int, dict], funcall_p: float | None) -> dict:
    """(a): `trace` - `grpo` over builds, its Holm-adjusted p with function calling's, and its reading. Without
    function calling's p the adjusted p is only bounded, by p and min(1, 2p) (`p_holm_bounds`)."""
    (item,) = posterior_confirm.read_family(rows, REGISTERED)
    est = item["est"]
    lo, hi = (holm([est.p_value, funcall_p])[0],) * 2 if funcall_p is not None else (est.p_value,
                                                                                     min(1.0, 2 * est.p_value))
    item["p_holm_bounds"] = (lo, hi)
    if lo <= 0.05 < hi:
        item["verdict"] = "waits on function calling's p"
    else:
        item["verdict"] = posterior_confirm.verdict(est.mean, est.hi, hi)
    return item


def by_machine(tables: dict[str, dict[int, dict]], machine: dict[int, str]) -> list[str]:
    """Amendment 20's descriptive lines: every difference the reading states, per machine (`per_machine`); none
    where the builds trained on one machine."""
    builds = list(tables["pcl"])
    differences = {}
    for base, pairs in (("grpo", REGISTERED), ("pcl", PRIMARIES + SECONDARY + ROOT_ONLY)):
        for m, c in pairs:
            values = posterior_confirm.difference(tables[base], m, c)[0]
            differences[f"`{m}` - `{c}` at `{base}`'s final tokens"] = dict(zip(tables[base], values))
    return posterior_confirm.per_machine(differences, machine, builds, amendment="amendment 20")


def to_markdown(tables: dict[str, dict[int, dict]], funcall_p: float | None = None,
                machine: dict[int, str] | None = None) -> str:
    builds = list(tables["pcl"])
    interim = PLANNED_BUILDS is None or len(builds) < PLANNED_BUILDS
    planned = "not yet fixed (amendment 13's B)" if PLANNED_BUILDS is None else f"{PLANNED_BUILDS}"
    lines = [f"Builds read: {len(builds)} of the planned {planned} ({', '.join(map(str, builds))})."
             + (" **An interim look: it decides nothing.**" if interim else ""), "",
             "| family | difference | read at | mean [95% t over builds] | p (paired t) | Holm p | reading | "
             "sd over builds | question SE (mean per build) |", "|---|---|---|---|---|---|---|---|---|"]
    families = [("(a), Holm with function calling", "grpo", [registered(tables["grpo"], funcall_p)]),
                ("(b) primary", "pcl", posterior_confirm.read_family(tables["pcl"], PRIMARIES)),
                ("(b) secondary", "pcl", posterior_confirm.read_family(tables["pcl"], SECONDARY)),
                ("(c)", "pcl", posterior_confirm.read_family(tables["pcl"], ROOT_ONLY))]
    for family, base, items in families:
        for item in items:
            est, (m, c) = item["est"], item["pair"]
            lo, hi = item.get("p_holm_bounds", (item["p_holm"],) * 2)
            holm_p = f"{lo:.3f}" if lo == hi else f"[{lo:.3f}, {hi:.3f}]"
            lines.append(f"| {family} | `{m}` - `{c}` | `{base}`'s final tokens | {est.mean:+.2f} [{est.lo:+.2f}, "
                         f"{est.hi:+.2f}] | {est.p_value:.3f} | {holm_p} | "
                         f"{'interim' if interim else item['verdict']} | {item['sd']:.2f} | "
                         f"{item['question_se']:.2f} |")
    if funcall_p is None:
        lines += ["", "(a)'s Holm p with function calling's is bounded, by p and min(1, 2p), until that table is "
                  "read (`--funcall-p`)."]
    lines += ["", "Per build (points of held-out success; each method minus `grpo` at `grpo`'s final sampled tokens "
              "and minus `pcl` at `pcl`'s, with their paired standard errors over questions):", "",
              "| build | weights | start | method | final success | sampled tokens | minus `grpo` (SE) | "
              "minus `pcl` (SE) |",
              "|---|---|---|---|---|---|---|---|"]
    for k in builds:
        g, p = tables["grpo"][k], tables["pcl"][k]
        for m in METHODS:
            lines.append(f"| {k} | `{p['weights']}` | {p['start']:.1f}% | `{m}` | {p['final'][m]:.1f}% | "
                         f"{p['tokens'][m]:,.0f} | {g['diff'][m]:+.2f} ({g['se'][m]:.2f}) | "
                         f"{p['diff'][m]:+.2f} ({p['se'][m]:.2f}) |")
    lines += by_machine(tables, machine or {})
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the table's runs (runs/math-confirm)")
    parser.add_argument("--funcall-p", type=float, default=None,
                        help="function calling's paired-t p of trace - grpo, once its confirmatory table is read")
    parser.add_argument("--out", type=Path, default=None, help="write the reading here as well")
    args = parser.parse_args(argv)
    if args.funcall_p is not None and not 0.0 <= args.funcall_p <= 1.0:
        parser.error(f"--funcall-p {args.funcall_p}: a p-value lies in [0, 1]")
    tables = read(args.root)
    if len(tables["pcl"]) < 2:
        print(f"{len(tables['pcl'])} build(s) under {args.root} have all of {', '.join(METHODS)} finished and both "
              "reports written; an interval over builds needs two", file=sys.stderr)
        return 1
    text = to_markdown(tables, args.funcall_p, posterior_confirm.machines(args.root, tables["pcl"], METHODS))
    return posterior_screen.emit(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
