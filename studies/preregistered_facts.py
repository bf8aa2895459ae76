"""The figures of a pre-registered reading, as Markdown, straight from its reports: what a study's README quotes.

    python studies/preregistered_facts.py studies/preregistered-<testbed> [--out FACTS.md]

Reads the folder `read_preregistered.sh` fills: `primary.json` (`tracerl verdict`), `compare.json` (against `grpo`)
and `vs-pcl/compare.json` (against `pcl`), and prints every number the README of such a reading states: the seeds,
the starting weights, the regime of `grpo`'s first batches, sampled tokens per run, held-out success before and
after, the planned questions with their t and bootstrap intervals and Holm-adjusted p, the per-seed differences,
the token shares (mean and median, seeds that never reach, seeds at the goal) for `trace` and, exploratory, `pcl`,
and where the tokens went. Nothing is computed here that the reports do not hold but means, standard deviations
and counts over their per-seed lists; the README's sentences are written around these figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def pts(x: float, signed: bool = True) -> str:
    """A fraction as points: +0.65."""
    return f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}"


def pct(x: float | None) -> str:
    return "infinite" if x is None else f"{100 * x:.0f}%"


def interval(d: dict, lo: str = "lo", hi: str = "hi") -> str:
    return f"[{pts(d[lo])}, {pts(d[hi])}]"


def facts(folder: Path) -> str:
    primary = json.loads((folder / "primary.json").read_text())
    vs_grpo = json.loads((folder / "compare.json").read_text())
    vs_pcl = json.loads((folder / "vs-pcl" / "compare.json").read_text())
    methods = vs_grpo["methods"]
    seeds = primary["seeds"]
    if not (list(vs_grpo["seeds"]) == list(vs_pcl["seeds"]) == list(seeds)):
        raise SystemExit(f"{folder}: the reports hold different seeds (primary {seeds}, against grpo "
                         f"{vs_grpo['seeds']}, against pcl {vs_pcl['seeds']}); rerun read_preregistered.sh")
    regime = primary["regime"]
    num_prompts = sum(r["num_prompts"] for r in vs_grpo["regime"])
    lines = [f"# Figures of {folder.name} (from primary.json, compare.json, vs-pcl/compare.json)", "",
             f"- Seeds: {len(seeds)} ({seeds[0]}-{seeds[-1]}), planned {primary['planned_seeds']}"
             + (" (an interim look)" if primary["interim"] else "") + f"; starting weights sha256 "
             f"`{primary['weights_sha256'][:12]}`.",
             f"- Regime (`grpo`'s first batches, {num_prompts} prompts, n = 8): {100 * regime['all_fail']:.1f}% "
             f"all-fail, {100 * regime['mixed']:.1f}% mixed, {100 * regime['all_success']:.1f}% all-success.",
             "- Sampled tokens per run, mean: " + ", ".join(f"`{m}` {methods[m]['tokens']:,.0f}" for m in methods)
             + ".",
             f"- Held-out success: start {100 * methods['grpo']['success_before']:.1f}%; after (mean +- sd over seeds) "
             + ", ".join(f"`{m}` {100 * r['success_after']:.1f}% +- {100 * r['success_after_std']:.1f}%"
                         for m, r in methods.items()) + ".", "",
             "## Planned questions", "",
             "| question | estimate [95% t CI] | bootstrap | p (Holm) | reading |", "|---|---|---|---|---|"]
    names = {"grpo": ("1a", "1b"), "pcl": ("2a", "2b")}
    for c in primary["comparisons"]:
        eq, share = c["equal_tokens"], c["share"]
        a, b = names.get(c["comparator"], ("", ""))
        lines.append(f"| {a}. `{primary['method']}` - `{c['comparator']}` at `{c['comparator']}`'s final sampled "
                     f"tokens, points | {pts(eq['mean'])} {interval(eq)} | {interval(eq, 'boot_lo', 'boot_hi')} | "
                     f"{eq['p_holm']:.3g} | {eq['verdict']} |")
        mean = share["mean"]
        lines.append(f"| {b}. share of `{c['comparator']}`'s tokens to reach its final success, mean of per-seed "
                     f"shares | {pct(mean['estimate'])} [{pct(mean['lo'])}, {pct(mean['hi'])}]; "
                     f"{share['num_unreached']} of {len(seeds)} seeds never reach it | | | {mean['verdict']} |")
    lines += ["", "## Per-seed differences at equal tokens, points (seed order)", ""]
    for c in primary["comparisons"]:
        per_seed = c["equal_tokens"]["per_seed"]
        lines.append(f"- `{primary['method']}` - `{c['comparator']}`: " + " ".join(pts(d) for d in per_seed)
                     + f" (sd {100 * statistics.stdev(per_seed):.2f}; {sum(d > 0 for d in per_seed)} of "
                     f"{len(per_seed)} positive)")
    pcl_vs_grpo = methods["pcl"]["diff_at_equal_tokens"]
    lines += [f"- `pcl` - `grpo` (secondary): {pts(pcl_vs_grpo['mean'])} {interval(pcl_vs_grpo)}, Holm-adjusted p "
              f"{pcl_vs_grpo['p_holm']:.3g}", "",
              "## Share of `grpo`'s tokens to reach `grpo`'s final success", "",
              "| method | median of per-seed shares [95% bootstrap CI] | seeds never reaching "
              "| seeds at or below 70% |",
              "|---|---|---|---|"]
    for m in ("trace", "pcl"):
        share = methods[m]["share_of_baseline_tokens_ci"]
        at_goal = sum(s is not None and s <= 0.7 for s in share["per_seed"])
        lines.append(f"| `{m}` | {pct(share['median'])} [{pct(share['median_lo'])}, {pct(share['median_hi'])}] | "
                     f"{share['num_unreached']} of {len(share['per_seed'])} | {at_goal} of {len(share['per_seed'])} |")
    lines += ["", "## Where the tokens went (per seed, t intervals)", "",
              "| against | `trace`'s sampled tokens per unit, % more | informative sampled tokens per token, `trace` "
              "minus the comparator |", "|---|---|---|"]
    for c in primary["comparisons"]:
        sig = c["signal"]
        lines.append(f"| `{c['comparator']}` | {pts(sig['tokens_per_unit']['mean'])} "
                     f"{interval(sig['tokens_per_unit'])} | {sig['diff']['mean']:+.3f} [{sig['diff']['lo']:+.3f}, "
                     f"{sig['diff']['hi']:+.3f}] ({sig[primary['method']]:.3f} against {sig[c['comparator']]:.3f}) |")
    pcl_signal = methods["pcl"]["signal_vs_baseline"]["informative_sampled_tokens_per_token"]
    lines += ["", f"`pcl` minus `grpo`, informative sampled tokens per token: {pcl_signal['mean']:+.3f} "
              f"[{pcl_signal['lo']:+.3f}, {pcl_signal['hi']:+.3f}].",
              f"Overall (`tracerl verdict`): {primary['overall']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = facts(args.folder)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
