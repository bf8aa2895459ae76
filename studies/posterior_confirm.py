"""Read the confirmatory table of `posterior` (studies/preregistration.md, its section and amendment 14) over builds.

    python studies/posterior_confirm.py runs/posterior-confirm [--out studies/posterior-confirm/primary.md]
    python studies/posterior_confirm.py runs/root-only-confirm --design root-only [--out ...]

`--design root-only` reads the next registered table the same way (`trace-root-only`'s section of the plan: its
primaries `trace-root-only` - `pcl` and - `knapsack_rl`, Holm; secondary `trace-root-only` - `grpo`; its own token
share as the goal; four methods a build; `DESIGNS`). `--design funcall-pilot` reads the pilot of function calling's
table over builds (the plan's section on `trace` in function calling over builds): each difference's mean and spread
over its builds, no reading and no token share (two evaluations, no curve), and the build count its rule takes from
the spread (`pilot_count`); `--design funcall` reads that table itself, its 24 builds (B, appended to the plan from
the pilot), by `posterior`'s rule without the token share. What follows is `posterior`'s.

Each `build<k>/compare.json` (`tracerl compare --baseline pcl`, one seed) gives every method minus `pcl` at `pcl`'s
final sampled tokens, with its standard error over the 512 questions; a difference between two other methods is
the difference of their two (every run stops within a step of 130,000 sampled tokens). The unit is the build: each
build gives one difference, and its interval is Student's t over builds. The rule, as registered:

- Primaries, Holm over the two: `posterior` - `pcl` and `posterior` - `knapsack_rl`. Each is *established* when its
  Holm-adjusted p (paired t over builds) is at most 0.05 and its mean is above zero, which is the same as its interval
  at Holm's level excluding zero on the positive side; *refuted* when its 95% interval lies below +0.5 points;
  *unresolved* otherwise. (Established against `posterior`, a mean below zero, reads "established, against".)
- Secondaries, Holm over the three (amendment 14): `trace` - `pcl`, `trace` - `trace-root-only` (stage 2's own
  value) and `posterior` - `grpo`, by the same rule.
- The goal, descriptive: `posterior`'s share of `grpo`'s sampled tokens to reach `grpo`'s final success, per build
  from `build<k>/vs-grpo/compare.json` (`tracerl compare --baseline grpo`; infinite where never reached), the median
  over builds with its percentile bootstrap interval over builds; met when the median is at most 70% and the upper
  end below 100%.
- A reading over fewer builds than planned (24) is an interim look that decides nothing.

Where the kept builds trained on more than one machine (amendment 17, and 20 for function calling's: each build's
runs name their machine in `saved_on.json`, restored with its records), each difference is also stated over each
machine's builds, with Welch's difference between two machines' means: descriptive, no reading changes with it.

Also stated, not tested: each build's weights hash, the paired question noise of each difference beside the spread
over builds (the design sized the evaluation so the first is at most about half the second), and each method's
sampled tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracerl.core.stats import bootstrap_over_seeds, holm, seed_mean, t_quantile_975

_spec = importlib.util.spec_from_file_location("posterior_screen",
                                               Path(__file__).resolve().parent / "posterior_screen.py")
posterior_screen = importlib.util.module_from_spec(_spec)
sys.modules["posterior_screen"] = posterior_screen
_spec.loader.exec_module(posterior_screen)
_spec = importlib.util.spec_from_file_location("power", Path(__file__).resolve().parent / "power.py")
power = importlib.util.module_from_spec(_spec)  # studies/ is not a package
_spec.loader.exec_module(power)

SMALLEST_GAIN = 0.5  # points: a gain below this is not worth a new sampler (the plan's refutation bound)
GOAL_SHARE = 0.70  # of grpo's sampled tokens, to reach grpo's final held-out success


@dataclass(frozen=True)
class Design:
    """One registered table over builds: its candidate (whose token share is the goal), its two Holm families, the
    methods every build trains, and how many builds the plan fixed."""

    candidate: str
    primaries: tuple[tuple[str, str], ...]
    secondary: tuple[tuple[str, str], ...]
    needed: tuple[str, ...]
    planned_builds: int
    share: bool = True  # the candidate's token share to reach grpo's final success is read (it needs a curve)
    pilot: bool = False  # a pilot: spreads over builds and the count they size, no question read
    machines_rule: str = "amendment 17"  # the amendment that lets this table's builds span machines


DESIGNS = {  # studies/preregistration.md: `posterior`'s section with amendment 14, and `trace-root-only`'s section
    "posterior": Design("posterior", (("posterior", "pcl"), ("posterior", "knapsack_rl")),
                        (("trace", "pcl"), ("trace", "trace-root-only"), ("posterior", "grpo")),
                        ("pcl", "knapsack_rl", "posterior", "trace", "grpo", "trace-root-only"), 24),
    "root-only": Design("trace-root-only", (("trace-root-only", "pcl"), ("trace-root-only", "knapsack_rl")),
                        (("trace-root-only", "grpo"),), ("pcl", "knapsack_rl", "trace-root-only", "grpo"), 24),
    "funcall-pilot": Design("trace", (("trace", "pcl"), ("trace", "knapsack_rl")),
                            (("trace", "grpo"), ("trace", "trace-root-only"), ("trace-root-only", "pcl")),
                            ("pcl", "knapsack_rl", "trace", "grpo", "trace-root-only"), 6, share=False, pilot=True),
}
# function calling's table over builds: the pilot's families and runs, B = 24 appended from the pilot's count
DESIGNS["funcall"] = dataclasses.replace(DESIGNS["funcall-pilot"], planned_builds=24, pilot=False,
                                         machines_rule="amendment 20")
# the pilot's rule for the confirmatory count: B = max(MIN, n), n the fewest builds with 80% power at level 0.025
# (paired t) for +0.5 points at the larger spread over builds of the two primaries, at most MAX
PILOT_RULE = {"effect": SMALLEST_GAIN, "power": 0.8, "alpha": 0.025, "min_builds": 6, "max_builds": 24}
POSTERIOR = DESIGNS["posterior"]
PLANNED_BUILDS, PRIMARIES, SECONDARY, NEEDED = (POSTERIOR.planned_builds, POSTERIOR.primaries, POSTERIOR.secondary,
                                                POSTERIOR.needed)


def read(root: Path, design: Design = POSTERIOR) -> dict[int, dict]:
    """Every build under `root` whose methods all finished, as the screen reads one (`posterior_screen.per_build`:
    differences from `pcl` and their standard errors over questions, in points)."""
    rows = posterior_screen.read(root, design.needed)
    for k, row in rows.items():
        row["share"] = (token_share(root / f"build{k}" / "vs-grpo" / "compare.json", design.candidate)
                        if design.share else math.nan)
    return rows


def token_share(report: Path, method: str = "posterior") -> float:
    """`method`'s share of `grpo`'s sampled tokens to reach `grpo`'s final success in one build's report against
    `grpo` (one seed); infinite where it never reached, nan where the report is missing."""
    if not report.exists():
        return math.nan
    ci = json.loads(report.read_text())["methods"][method]["share_of_baseline_tokens_ci"]
    (value,) = ci["per_seed"]
    return math.inf if value is None else float(value)


def goal(rows: dict[int, dict]) -> dict:
    """The median share over builds, its bootstrap interval over builds, and whether the goal is met."""
    shares = [r["share"] for r in rows.values() if not math.isnan(r["share"])]
    if len(shares) < 2:
        return {"builds": len(shares), "median": math.nan, "lo": math.nan, "hi": math.nan, "met": False}
    est = bootstrap_over_seeds(shares)
    return {"builds": len(shares), "median": est.median, "lo": est.median_lo, "hi": est.median_hi,
            "met": bool(est.median <= GOAL_SHARE and est.median_hi < 1.0), "per_build": shares}


def difference(rows: dict[int, dict], method: str, comparator: str) -> tuple[list[float], list[float]]:
    """Per build: `method` - `comparator` in points and its paired standard error over questions (for a
    comparator other than `pcl` both differences are read against the same `pcl` run, so the errors add in
    quadrature: an upper bound, as the two share `pcl`'s questions)."""
    values, errors = [], []
    for r in rows.values():
        values.append(r["diff"][method] - r["diff"][comparator])
        errors.append(r["se"][method] if comparator == "pcl" else math.hypot(r["se"][method], r["se"][comparator]))
    return values, errors


def verdict(mean: float, hi: float, p_adjusted: float) -> str:
    if p_adjusted <= 0.05:
        return "established" if mean > 0 else "established, against"
    return "refuted" if hi < SMALLEST_GAIN else "unresolved"


def read_family(rows: dict[int, dict], pairs: tuple[tuple[str, str], ...]) -> list[dict]:
    """Each pair's mean over builds, 95% t interval, paired-t p, Holm-adjusted p within `pairs`, and verdict."""
    found = []
    for method, comparator in pairs:
        values, errors = difference(rows, method, comparator)
        est = seed_mean(values, test=True)
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
        found.append({"pair": (method, comparator), "est": est, "sd": sd, "question_se": float(np.mean(errors))})
    for item, p_adjusted in zip(found, holm([item["est"].p_value for item in found])):
        item["p_holm"] = p_adjusted
        item["verdict"] = verdict(item["est"].mean, item["est"].hi, p_adjusted)
    return found


def pilot_count(rows: dict[int, dict], design: Design, rule: dict | None = None) -> dict:
    """The confirmatory build count a pilot sizes (`PILOT_RULE`): the primaries' spreads over the pilot's builds, the
    larger one, n (None beyond the cap), B, and the power B gives at the rule's effect and at twice it."""
    rule = rule or PILOT_RULE
    sds = {item["pair"]: item["sd"] for item in read_family(rows, design.primaries)}
    sd = max(sds.values())
    n = power.seeds_needed(rule["effect"], sd, rule["power"], rule["alpha"], max_seeds=rule["max_builds"])
    builds = rule["max_builds"] if n is None else max(rule["min_builds"], n)
    return {"sds": sds, "sd": sd, "n": n, "builds": builds,
            "power": {effect: power.power(effect, sd, builds, rule["alpha"])
                      for effect in (rule["effect"], 2 * rule["effect"])}}


def machines(root: Path, builds: Iterable[int], methods: Iterable[str]) -> dict[int, str]:
    """Each build's machine: the CPU flags hash that its runs (seed 0 of `methods`) name in `saved_on.json` (records
    restored under `root`). A build whose runs name none, or name two, has none here."""
    found = {}
    for k in builds:
        named = set()
        for m in methods:
            saved = root / f"build{k}" / f"{m}-seed0" / "saved_on.json"
            named.add(json.loads(saved.read_text()).get("cpu_flags_sha256") if saved.exists() else None)
        if len(named) == 1 and None not in named:
            found[k] = named.pop()
    return found


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% Welch interval (Satterthwaite's degrees of freedom, rounded down); nan bounds
    where either side has fewer than 2 values."""
    diff = float(np.mean(a) - np.mean(b)) if a and b else math.nan
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan, math.nan
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    dof = max(1, int((va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))))
    return diff, diff - t_quantile_975(dof) * se, diff + t_quantile_975(dof) * se


def by_machine(rows: dict[int, dict], design: Design, machine: dict[int, str]) -> list[str]:
    """The descriptive lines of amendment 17 (20 for function calling's table), where the builds span machines: each
    difference's mean [95% t] over each machine's builds and, for two machines, Welch's difference between them.
    Nothing where one machine (or none is known)."""
    differences = {f"`{m}` - `{c}`": dict(zip(rows, difference(rows, m, c)[0]))
                   for m, c in design.primaries + design.secondary}
    return per_machine(differences, machine, list(rows), amendment=design.machines_rule)


def per_machine(differences: dict[str, dict[int, float]], machine: dict[int, str], builds: list[int],
                amendment: str = "amendment 17") -> list[str]:
    """The lines of `by_machine` for any differences (label -> {build: value in points}) of `builds`."""
    counts: dict[str, list[int]] = {}
    for k, h in machine.items():
        counts.setdefault(h, []).append(k)
    groups = sorted(counts, key=lambda g: (-len(counts[g]), g))  # the machine with most builds first
    if len(groups) < 2:
        return []
    unknown = [k for k in builds if k not in machine]
    header = " | ".join(f"`{g}` ({len(counts[g])} builds)" for g in groups)
    lines = ["", f"By machine ({amendment}; descriptive, no reading changes with it): mean [95% t over that "
             "machine's builds]" + (f"; not in a group, as its runs name no one machine: build "
                                    f"{', '.join(map(str, unknown))}" if unknown else "")
             + ".", "", f"| difference | {header} |" + (" first - second [95% Welch] |" if len(groups) == 2 else ""),
             "|---|" + "---|" * (len(groups) + (len(groups) == 2))]
    for label, values in differences.items():
        per = [[values[k] for k in counts[g]] for g in groups]
        cells = []
        for group in per:
            est = seed_mean(group)
            cells.append(f"{est.mean:+.2f} [{est.lo:+.2f}, {est.hi:+.2f}]")
        if len(groups) == 2:
            cells.append("{:+.2f} [{:+.2f}, {:+.2f}]".format(*welch(*per)))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Builds by machine: " + "; ".join(f"`{g}`: {', '.join(map(str, counts[g]))}" for g in groups) + "."]
    return lines


def to_markdown(rows: dict[int, dict], design: Design = POSTERIOR, machine: dict[int, str] | None = None) -> str:
    interim = len(rows) < design.planned_builds
    status = ((" **A pilot: it reads no question; its spreads size the confirmatory table.**" if design.pilot else "")
              + (" **An interim look: it decides nothing.**" if interim else ""))
    lines = [f"Builds read: {len(rows)} of the {design.planned_builds} planned ({', '.join(map(str, rows))})."
             + status, "",
             "| family | difference | mean [95% t over builds] | p (paired t) | Holm p | reading | sd over builds | "
             "question SE (mean per build) |", "|---|---|---|---|---|---|---|---|"]
    for family, pairs in (("primary", design.primaries), ("secondary", design.secondary)):  # a Holm family each
        for item in read_family(rows, pairs):
            est, (m, c) = item["est"], item["pair"]
            reading = "pilot" if design.pilot else ("interim" if interim else item["verdict"])
            lines.append(f"| {family} | `{m}` - `{c}` | {est.mean:+.2f} [{est.lo:+.2f}, {est.hi:+.2f}] | "
                         f"{est.p_value:.3f} | {item['p_holm']:.3f} | {reading} | {item['sd']:.2f} | "
                         f"{item['question_se']:.2f} |")
    if design.share:
        share = goal(rows)
        lines += ["", f"The goal (descriptive): `{design.candidate}`'s share of `grpo`'s sampled tokens to reach "
                  f"`grpo`'s final success, median over {share['builds']} builds {_pct(share['median'])} "
                  f"[{_pct(share['lo'])}, {_pct(share['hi'])}] (percentile bootstrap over builds); "
                  + ("interim" if interim else ("met" if share["met"] else "not met"))
                  + f" (at most {GOAL_SHARE:.0%}, upper end below 100%)."]
    if design.pilot:
        count, rule = pilot_count(rows, design), PILOT_RULE
        spreads = ", ".join(f"`{m}` - `{c}` {sd:.2f}" for (m, c), sd in count["sds"].items())
        found = (f"{count['n']} builds" if count["n"] is not None else f"more than {rule['max_builds']} builds")
        lines += ["", f"The count (the plan's rule): the primaries' sd over builds {spreads}; at the larger, "
                  f"{count['sd']:.2f}, {rule['power']:.0%} power at level {rule['alpha']} (paired t) for "
                  f"{rule['effect']:+.1f} points takes {found}, so B = {count['builds']} (at least "
                  f"{rule['min_builds']}, at most {rule['max_builds']}), which gives "
                  + " and ".join(f"{pw:.0%} at {effect:+.1f}" for effect, pw in count["power"].items())
                  + (" (an interim pilot: the count is read once all its builds are kept)." if interim else ".")]
    lines += by_machine(rows, design, machine or {})
    lines += ["", "Per build (points of held-out success; differences at `pcl`'s final sampled tokens, with their "
              "paired standard error over questions):", "",
              "| build | weights | start | method | final success | sampled tokens | minus `pcl` (SE) |",
              "|---|---|---|---|---|---|---|"]
    for k, r in rows.items():
        for m in design.needed:
            lines.append(f"| {k} | `{r['weights']}` | {r['start']:.1f}% | `{m}` | {r['final'][m]:.1f}% | "
                         f"{r['tokens'][m]:,.0f} | {r['diff'][m]:+.2f} ({r['se'][m]:.2f}) |")
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "infinite" if x == math.inf else ("-" if math.isnan(x) else f"{100 * x:.0f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the table's runs (runs/posterior-confirm)")
    parser.add_argument("--design", choices=sorted(DESIGNS), default="posterior",
                        help="which registered table: `posterior`'s (default), `trace-root-only`'s, function "
                             "calling's over builds (`funcall`) or its pilot")
    parser.add_argument("--out", type=Path, default=None, help="write the reading here as well")
    args = parser.parse_args(argv)
    design = DESIGNS[args.design]
    rows = read(args.root, design)
    if len(rows) < 2:
        print(f"{len(rows)} build(s) under {args.root} have all of {', '.join(design.needed)} finished; an interval "
              "over builds needs two", file=sys.stderr)
        return 1
    text = to_markdown(rows, design, machines(args.root, rows, design.needed))
    return posterior_screen.emit(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
