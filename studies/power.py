"""Seeds needed to resolve a method's effect: a power analysis on the per-seed paired differences of finished tables.

    python studies/power.py [studies/learning-gain-*/compare.json ...] [--effects 0.5,1.0] [--power 0.8]
                            [--alpha 0.05]

For every table (a `tracerl compare` report's compare.json) and every entry against the table's baseline it reads
the per-seed differences of held-out success at the baseline's final sampled tokens (`diff_at_equal_tokens`), and
for `trace` against `pcl` the per-seed difference of the two (both read at the baseline's tokens, same seeds). With
d the mean and s the standard deviation of those per-seed differences, the two-sided paired t-test at level 0.05
with n seeds rejects with probability (at level alpha, --alpha: 0.025 plans for Holm over two primary questions)

    power(n) = P(|T'| > t_{1-alpha/2, n-1}),   T' ~ noncentral t, n-1 degrees of freedom, noncentrality d sqrt(n) / s

estimated by simulation (400,000 draws of Z + d sqrt(n) / s over sqrt(chi2_{n-1} / (n-1)), a fixed seed: +-0.2%).
It prints the power at the seeds the table has, the seeds for the target power at the observed effect, and the seeds
at the effects given with --effects (in points, with the observed s). s from 5 seeds is itself uncertain (its 80%
upper bound is about 1.6 s), so the seed counts are also given at 1.5 s.

Also printed: the spread over questions of one question's avg@k success (from the mean SE per run), which sizes the
questions per evaluation point (`tracerl.core.stats.num_eval_questions`).

Deliberately not here: the per-seed token share (compare.json before the per-seed reading holds only the share read
off the seed-mean curve; the runs themselves are needed: rerun `tracerl compare --report-only` on them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from tracerl.core.stats import num_eval_questions, t_cdf

ROOT = Path(__file__).resolve().parent
DRAWS = 400_000


def t_quantile(p: float, dof: int) -> float:
    """The p-quantile of Student's t, by bisection on `t_cdf`."""
    lo, hi = -200.0, 200.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return (lo + hi) / 2


def power(effect: float, sd: float, n: int, alpha: float = 0.05, seed: int = 0) -> float:
    """Power of the two-sided paired t-test with n seeds (the formula in the module docstring)."""
    if n < 2 or sd <= 0:
        return float("nan")
    rng = np.random.default_rng([seed, n])
    z = rng.standard_normal(DRAWS) + effect * math.sqrt(n) / sd
    t = z / np.sqrt(rng.chisquare(n - 1, DRAWS) / (n - 1))
    return float(np.mean(np.abs(t) > t_quantile(1 - alpha / 2, n - 1)))


def seeds_needed(effect: float, sd: float, target: float = 0.8, alpha: float = 0.05,
                 max_seeds: int = 200) -> int | None:
    """The fewest seeds whose power reaches `target` (None beyond max_seeds)."""
    if effect == 0 or sd <= 0:
        return None
    z = -t_quantile(alpha / 2, 10_000)
    guess = max(2, int(((z + 0.84) * sd / abs(effect)) ** 2))  # the normal approximation, then walk
    n = max(2, guess - 3)
    while n <= max_seeds:
        if power(effect, sd, n, alpha) >= target:
            return n
        n += 1
    return None


def comparisons(summary: dict) -> list[tuple[str, np.ndarray]]:
    """(name, per-seed differences in points) for every entry against the baseline, and trace against pcl."""
    base, methods = summary["baseline"], summary["methods"]
    out = [(f"{label} - {base}", 100 * np.asarray(row["diff_at_equal_tokens"]["per_seed"]))
           for label, row in methods.items() if label != base]
    if "trace" in methods and "pcl" in methods:
        trace = np.asarray(methods["trace"]["diff_at_equal_tokens"]["per_seed"])
        pcl = np.asarray(methods["pcl"]["diff_at_equal_tokens"]["per_seed"])
        out.append(("trace - pcl", 100 * (trace - pcl)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tables", nargs="*", type=Path,
                        default=sorted(ROOT.glob("learning-gain-*/compare.json")))
    parser.add_argument("--effects", default="0.5,1.0", help="effects in points to size seeds for")
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--alpha", type=float, default=0.05, help="two-sided level of each test")
    args = parser.parse_args()
    effects = [float(e) for e in args.effects.split(",") if e]
    print(f"Two-sided paired t-test at level {args.alpha:g}, target power {args.power:.0%}.\n")
    head = (["table", "comparison", "per-seed differences (points)", "mean", "sd", "seeds",
             "power at these seeds", f"seeds for {args.power:.0%} at the mean", "at 1.5 sd"]
            + [f"seeds for +{e:g}" for e in effects])
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    spreads = []
    for path in args.tables:
        summary = json.loads(path.read_text())
        table = path.parent.name
        for row in summary["methods"].values():
            spreads.append(row["success_after_se"] * math.sqrt(row["num_questions"]))
        for name, diffs in comparisons(summary):
            mean, sd, n = float(diffs.mean()), float(diffs.std(ddof=1)), len(diffs)

            def fmt(value):
                return "> 200" if value is None else str(value)

            cells = [table, name, ", ".join(f"{d:+.2f}" for d in diffs), f"{mean:+.2f}", f"{sd:.2f}", str(n),
                     f"{power(mean, sd, n, args.alpha):.0%}", fmt(seeds_needed(mean, sd, args.power, args.alpha)),
                     fmt(seeds_needed(mean, 1.5 * sd, args.power, args.alpha))]
            cells += [fmt(seeds_needed(e, sd, args.power, args.alpha)) for e in effects]
            print("| " + " | ".join(cells) + " |")
    if spreads:
        sd_q = float(np.mean(spreads))
        print(f"\nOne question's avg@k success spreads sd {sd_q:.3f} over questions (mean SE per run x "
              f"sqrt(questions), {len(spreads)} entries): one evaluation point's SE is {sd_q / math.sqrt(256):.1%} "
              f"with 256 questions, {sd_q / math.sqrt(512):.1%} with 512; questions for SE 2.5%: "
              f"{num_eval_questions(sd_q, 0.025)}, for 2.0%: {num_eval_questions(sd_q, 0.02)}.")


if __name__ == "__main__":
    main()
