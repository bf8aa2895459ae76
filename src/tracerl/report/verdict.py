"""The pre-registered reading of a method's primary comparisons: from `tracerl compare` reports to a verdict each.

Input: one compare.json per comparator, all over the same runs (`tracerl compare --report-only --baseline X` on
one run folder), and the plan: the method, the seed count the power analysis fixed, the family-wise level and the
smallest effect worth the machinery. For each comparator X it reads the two primary measures the report already
computed (docs/design.md section 3, "accuracy" and "The pre-registered reading"):

    (a) d_X = success(method) - success(X) at X's final sampled tokens, per seed; paired t-test over seeds
    (b) s_X = tokens(method) / tokens(X) to reach X's final success, per seed; bootstrap over seeds

and applies the rule fixed before the runs (studies/preregistration.md):

- the (a) tests form one family: Holm's adjustment over the comparators at level `alpha`;
- (a) is *established* when its Holm-adjusted p <= alpha (the sign says for or against the method), *refuted*
  when the 95% t interval lies below `min_effect` (it excludes the effect worth the machinery), else *unresolved*;
- (b): "fewer tokens" only where the bootstrap interval's upper end is below 100%; *refuted* where its lower end
  is above `max_share` (the method needs more than that share, confidently); the goal (`goal_share`, 70%) is met
  when the estimate is at most the goal and the upper end below 100%. The registered estimate pools the per-seed
  shares by their mean, which is infinite as soon as one seed never reaches (so with many seeds it can only pass
  if every seed reaches); the median over seeds, from the same resamples, is read beside it as a secondary reading;
- overall: the method pays for itself only if every (a) is established in its favour and every (b) interval
  ends below 100%; otherwise "no evidence that it pays for itself on this testbed", with the intervals;
- a reading over fewer seeds than planned is an interim look and decides nothing: it is labelled so.

Across testbeds (`testbed_verdict`, `tracerl verdict --across-testbeds`): one report per testbed, each against the
same comparator, their (a) tests one family (Holm over the testbeds), each testbed's difference established,
refuted or unresolved as above, with its own planned seed count; the share is listed, not read, and not even listed
for a report evaluated at two points (a design that evaluates at the start and the stop only has no curve to read it
on; studies/preregistration.md, "Other domains at equal tokens, with power").

Beside the verdicts it lists the priced learning-signal measure (informative sampled tokens per sampled token) and the
report's per-seed reading of it against the comparator (`signal_vs_baseline`: difference and t interval over seeds,
with the ratio of sampled tokens per unit), read off the interval, never the means, and as a description only: the
measure has not been shown to rank methods as held-out success does (a proxy is read as a cause only once it has).

Deliberately not here: any new statistic. Every number is the compare report's; this module only applies the
decision rule, so the rule cannot drift between the plan and its reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracerl.core.stats import holm


@dataclass(frozen=True)
class Plan:
    """The pre-registered decision rule (studies/preregistration.md, "Decision rule")."""

    method: str = "trace"  # the entry whose payoff is tested
    planned_seeds: int = 0  # seeds the power analysis fixed; fewer seeds make the reading an interim look
    alpha: float = 0.05  # family-wise level over the (a) tests (Holm)
    min_effect: float = 0.005  # smallest success gain worth the machinery at equal tokens (+0.5 points)
    max_share: float = 0.80  # largest token share worth the machinery
    goal_share: float = 0.70  # the share the method is held to

    def __post_init__(self):
        if self.planned_seeds < 2:
            raise ValueError(f"planned_seeds={self.planned_seeds}: give the seed count the power analysis fixed "
                             "(at least 2), e.g. --planned-seeds 30")
        if not 0 < self.alpha < 1 or not 0 < self.goal_share <= self.max_share <= 1 or self.min_effect <= 0:
            raise ValueError(f"need 0 < alpha < 1, 0 < goal_share <= max_share <= 1 and min_effect > 0; got "
                             f"alpha={self.alpha}, goal_share={self.goal_share}, max_share={self.max_share}, "
                             f"min_effect={self.min_effect}")


def planned_seeds(text: str, num_reports: int, across_testbeds: bool) -> list[int]:
    """`--planned-seeds` as one count per report: one count for all, or with across_testbeds one per report."""
    try:
        seeds = [int(s) for s in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--planned-seeds {text}: a seed count, or with --across-testbeds one count per report "
                         "separated by commas (16,45)") from None
    if len(seeds) not in (1, num_reports) or (len(seeds) > 1 and not across_testbeds):
        raise ValueError(f"--planned-seeds {text}: give one count, or with --across-testbeds one per report "
                         f"({num_reports})")
    return seeds * num_reports if len(seeds) == 1 else seeds


def _check(summaries: list[dict[str, Any]], method: str) -> None:
    """The reports must be of the same runs: same seeds, same starting weights, one comparator each."""
    if not summaries:
        raise ValueError("no report given: pass one compare.json per comparator")
    baselines = [s.get("baseline") for s in summaries]
    for s, base in zip(summaries, baselines):
        if not base:
            raise ValueError("a report has no baseline: write it with tracerl compare --baseline X")
        if method not in s["methods"] or base == method:
            raise ValueError(f"the report against {base} has entries {sorted(s['methods'])}: it must hold "
                             f"{method!r} as an entry other than its baseline")
    if len(set(baselines)) != len(baselines):
        raise ValueError(f"two reports share a baseline ({baselines}): give one report per comparator")
    seeds = {tuple(s["seeds"]) for s in summaries}
    hashes = {s.get("weights", {}).get("weights_sha256") for s in summaries}
    if len(seeds) > 1 or len(hashes) > 1:
        raise ValueError(f"the reports are not of the same runs (seeds {sorted(seeds)}, starting weights "
                         f"{sorted(str(h)[:12] for h in hashes)}): regenerate them from one run folder with "
                         "tracerl compare --report-only")


def equal_tokens_reading(diff: dict[str, Any], p_holm: float, plan: Plan) -> dict[str, Any]:
    """One equal-token difference (a report's `diff_at_equal_tokens`) read by the rule, given its Holm-adjusted p:
    established when that p is at most `plan.alpha` (the sign says for or against `plan.method`), refuted when the
    95% t interval lies below `plan.min_effect`, unresolved otherwise."""
    established = p_holm <= plan.alpha
    if established:
        verdict = f"established: {plan.method} {'better' if diff['mean'] > 0 else 'worse'}"
        if diff["hi"] < plan.min_effect:
            verdict += f"; the +{100 * plan.min_effect:.1f}-point effect refuted"
    elif diff["hi"] < plan.min_effect:
        verdict = f"refuted: the interval excludes +{100 * plan.min_effect:.1f} points"
    else:
        verdict = "unresolved"
    return {"mean": diff["mean"], "lo": diff["lo"], "hi": diff["hi"], "boot_lo": diff.get("boot_lo"),
            "boot_hi": diff.get("boot_hi"), "p": diff["p"], "p_holm": p_holm, "per_seed": diff["per_seed"],
            "established": established, "favours_method": established and diff["mean"] > 0, "verdict": verdict}


def _share_reading(estimate: float, lo: float, hi: float, plan: Plan) -> dict[str, Any]:
    """One pooled share with its interval, read by the rule: fewer tokens, refuted or unresolved; the goal."""
    fewer = hi < 1.0
    if fewer:
        verdict = f"fewer tokens established (upper end {_pct(hi)} < 100%)"
    elif lo > plan.max_share:
        verdict = f"refuted: needs more than {plan.max_share:.0%} of the tokens (lower end {_pct(lo)})"
    else:
        verdict = "unresolved"
    return {"estimate": estimate, "lo": lo, "hi": hi, "fewer_tokens": fewer,
            "goal_met": fewer and estimate <= plan.goal_share, "verdict": verdict}


def _share(row: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """The token share s, pooled over seeds as the mean (registered) and as the median (secondary); None in the
    report stands for infinity (a seed whose curve never reached the target)."""
    ci = row["share_of_baseline_tokens_ci"]

    def value(v):
        return math.inf if v is None else v

    per_seed = [value(v) for v in ci["per_seed"]]
    median = ci.get("median", float(np.median(per_seed)) if per_seed else None)  # reports before the median: no CI
    return {"mean": _share_reading(value(row["share_of_baseline_tokens"]), value(ci["lo"]), value(ci["hi"]), plan),
            "median": _share_reading(value(median), value(ci.get("median_lo", math.nan)),
                                     value(ci.get("median_hi", math.nan)), plan),
            "per_seed": per_seed, "num_unreached": ci["num_unreached"],
            "num_at_goal": sum(v <= plan.goal_share for v in per_seed)}


def primary_verdict(summaries: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """The verdict of every primary question, and overall, under `plan` (the rule in the module docstring)."""
    _check(summaries, plan.method)
    diffs = [s["methods"][plan.method]["diff_at_equal_tokens"] for s in summaries]
    adjusted = holm([d["p"] for d in diffs])
    seeds = list(summaries[0]["seeds"])
    comparisons = []
    for summary, diff, p_holm in zip(summaries, diffs, adjusted):
        base, row = summary["baseline"], summary["methods"][plan.method]
        base_row = summary["methods"][summary["baseline"]]
        comparisons.append({
            "comparator": base, "equal_tokens": equal_tokens_reading(diff, p_holm, plan), "share": _share(row, plan),
            "signal": {plan.method: row.get("informative_sampled_tokens_per_token"),
                       base: base_row.get("informative_sampled_tokens_per_token"),
                       **_signal_diffs(row.get("signal_vs_baseline") or {})},
            "success_after": {plan.method: row["success_after"], base: base_row["success_after"]},
            "tokens": {plan.method: row["tokens"], base: base_row["tokens"]}})
    pays = all(c["equal_tokens"]["favours_method"] and c["share"]["mean"]["fewer_tokens"] for c in comparisons)
    interim = len(seeds) < plan.planned_seeds
    overall = (f"{plan.method} pays for itself on this testbed" if pays
               else f"no evidence that {plan.method} pays for itself on this testbed")
    return {"method": plan.method, "seeds": seeds, "planned_seeds": plan.planned_seeds, "interim": interim,
            "plan": {"alpha": plan.alpha, "min_effect": plan.min_effect, "max_share": plan.max_share,
                     "goal_share": plan.goal_share},
            "weights_sha256": summaries[0].get("weights", {}).get("weights_sha256"),
            "regime": _pooled_regime(summaries[0].get("regime", [])),
            "comparisons": comparisons, "pays": pays,
            "overall": (f"interim look ({len(seeds)} of {plan.planned_seeds} planned seeds), decides nothing; "
                        f"read as it stands: {overall}") if interim else overall}


def _signal_diffs(signal: dict[str, Any]) -> dict[str, Any]:
    """The report's per-seed readings of where the tokens went (`signal_vs_baseline`): the difference in informative
    sampled tokens per token and the ratio of tokens per unit, each {mean, lo, hi}; empty for reports without."""
    keys = {"diff": "informative_sampled_tokens_per_token", "tokens_per_unit": "tokens_per_unit_ratio"}
    return {name: {k: signal[key].get(k) for k in ("mean", "lo", "hi")} for name, key in keys.items() if key in signal}


def _signal_reading(signal: dict[str, Any], held_out_gain: bool) -> str:
    """What the per-seed signal difference says beside the held-out verdict, read off its interval only, and only
    as a description: the measure is not shown to rank methods as held-out success does, so it explains nothing."""
    diff = signal.get("diff")
    if not diff or diff["lo"] is None or diff["hi"] is None:
        return "no per-seed interval in this report"
    if diff["lo"] > 0:
        return ("more informative tokens per token, with no held-out gain established" if not held_out_gain
                else "more informative tokens per token, and a held-out gain")
    if diff["hi"] < 0:
        return "fewer informative tokens per token"
    return "informative tokens per token not distinguishable"


def testbed_verdict(reports: dict[str, dict[str, Any]], plans: dict[str, Plan]) -> dict[str, Any]:
    """The primary question of one method against one comparator on several testbeds (name -> compare.json), the
    equal-token tests one Holm family; each testbed read under its own plan (its planned seeds). Nothing pools
    across testbeds: they differ in runs, weights and seeds."""
    if not reports:
        raise ValueError("no report given: pass one compare.json per testbed")
    first = next(iter(plans.values()))
    baselines = {name: s.get("baseline") for name, s in reports.items()}
    if len(set(baselines.values())) != 1 or None in baselines.values():
        raise ValueError(f"the testbeds' reports have baselines {baselines}: across testbeds every report is against "
                         "the same comparator (tracerl compare --baseline X)")
    for name, summary in reports.items():
        _check([summary], first.method)
    diffs = {name: s["methods"][first.method]["diff_at_equal_tokens"] for name, s in reports.items()}
    adjusted = dict(zip(diffs, holm([d["p"] for d in diffs.values()])))
    testbeds = []
    for name, summary in reports.items():
        plan, row = plans[name], summary["methods"][first.method]
        interim = len(summary["seeds"]) < plan.planned_seeds
        testbeds.append({
            "testbed": name, "seeds": list(summary["seeds"]), "planned_seeds": plan.planned_seeds, "interim": interim,
            "weights_sha256": summary.get("weights", {}).get("weights_sha256"),
            "regime": _pooled_regime(summary.get("regime", [])),
            "equal_tokens": equal_tokens_reading(diffs[name], adjusted[name], plan), "share": _share(row, plan),
            "eval_points": len((summary.get("resolution") or {}).get("eval_steps") or []) or None,
            "signal": _signal_diffs(row.get("signal_vs_baseline") or {})})
    return {"method": first.method, "comparator": next(iter(baselines.values())), "testbeds": testbeds,
            "plan": {"alpha": first.alpha, "min_effect": first.min_effect}}


def testbeds_to_markdown(result: dict[str, Any]) -> str:
    method, base, plan = result["method"], result["comparator"], result["plan"]
    lines = [f"# Primary analysis across testbeds: `{method}` against `{base}`", "",
             f"Rule: Holm over the {len(result['testbeds'])} testbeds' equal-token tests at family-wise level "
             f"{plan['alpha']}; established where the adjusted p is at most that, refuted where the 95% t interval "
             f"lies below +{100 * plan['min_effect']:.1f} points, unresolved otherwise; a testbed with fewer seeds "
             "than planned is an interim look that decides nothing. The token share is listed, not read.", "",
             f"| testbed | seeds | `{method}` - `{base}` at `{base}`'s final tokens, points [95% t CI] | "
             "[95% bootstrap CI] | p | p (Holm) | verdict | share of the tokens, median over seeds [bootstrap CI] "
             "(listed) | "
             "informative sampled tokens / token, difference per seed [95% t CI] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in result["testbeds"]:
        d, share = t["equal_tokens"], t["share"]["median"]
        unreached = t["share"]["num_unreached"]
        verdict = (f"interim look ({len(t['seeds'])} of {t['planned_seeds']} seeds), decides nothing; as it stands: "
                   if t["interim"] else "") + d["verdict"]
        share_cell = (f"{_pct(share['estimate'])} [{_pct(share['lo'])}, {_pct(share['hi'])}]"
                      + (f", {unreached} of {len(t['seeds'])} seeds never reach" if unreached else ""))
        if t.get("eval_points") is not None and t["eval_points"] <= 2:  # no curve between the start and the stop
            share_cell = f"none: evaluated at {t['eval_points']} points, no curve to read it on"
        lines.append(f"| {t['testbed']} | {len(t['seeds'])} of {t['planned_seeds']} | "
                     f"{_pts(d['mean'])} [{_pts(d['lo'])}, {_pts(d['hi'])}] | "
                     f"[{_pts(d['boot_lo'])}, {_pts(d['boot_hi'])}] | {_p(d['p'])} | {_p(d['p_holm'])} | {verdict} | "
                     f"{share_cell} | {_interval(t['signal'].get('diff'), 1, '+.3f')} |")
    lines.append("")
    for t in result["testbeds"]:
        regime = t["regime"]
        lines.append(f"- {t['testbed']}: seeds {', '.join(map(str, t['seeds']))}; starting weights sha256 "
                     f"{str(t['weights_sha256'])[:16]}" + (f"; regime (the comparator's first batch) all-fail "
                                                           f"{regime['all_fail']:.1%}, mixed {regime['mixed']:.1%}, "
                                                           f"all-success {regime['all_success']:.1%}" if regime else "")
                     + ".")
    return "\n".join(lines) + "\n"


def _pooled_regime(regimes: list[dict[str, float]]) -> dict[str, float] | None:
    """All-fail / mixed / all-success shares of the comparator's first batch, pooled over seeds by prompt count."""
    total = sum(r["num_prompts"] for r in regimes)
    if not total:
        return None
    return {k: sum(r[k] * r["num_prompts"] for r in regimes) / total for k in ("all_fail", "mixed", "all_success")}


def _pts(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:+.2f}"


def _pct(value: float) -> str:
    return "infinite" if math.isinf(value) else "n/a" if math.isnan(value) else f"{value:.0%}"


def to_markdown(result: dict[str, Any]) -> str:
    method, plan = result["method"], result["plan"]
    lines = [f"# Primary analysis: `{method}`", "",
             f"**{result['overall']}.**", "",
             f"Seeds: {len(result['seeds'])} of {result['planned_seeds']} planned "
             f"({', '.join(map(str, result['seeds']))}); starting weights sha256 {str(result['weights_sha256'])[:16]}."]
    if result["regime"]:
        r = result["regime"]
        lines.append(f"Regime (the comparator's first batch, pooled over seeds): all-fail {r['all_fail']:.1%}, "
                     f"mixed {r['mixed']:.1%}, all-success {r['all_success']:.1%}.")
    lines += ["", f"Rule: Holm over the {len(result['comparisons'])} equal-token tests at "
              f"family-wise level {plan['alpha']}; refuted where the 95% interval excludes the effect worth the "
              f"machinery (+{100 * plan['min_effect']:.1f} points, or a token share of {plan['max_share']:.0%}); "
              f"\"fewer tokens\" only where the share's bootstrap interval ends below 100%; the goal is a share of at "
              f"most {plan['goal_share']:.0%} with that interval below 100%. The share is pooled over seeds by its "
              "mean (registered: the overall line reads it) and by its median (a secondary reading).", "",
              f"| question | estimate [95% t CI] | [95% bootstrap CI] | p | p (Holm) | verdict |",
              "|---|---|---|---|---|---|"]
    for c in result["comparisons"]:
        d, s, base = c["equal_tokens"], c["share"], c["comparator"]
        lines.append(f"| `{method}` - `{base}`, held-out success at `{base}`'s final tokens, points | "
                     f"{_pts(d['mean'])} [{_pts(d['lo'])}, {_pts(d['hi'])}] | "
                     f"[{_pts(d['boot_lo'])}, {_pts(d['boot_hi'])}] | {_p(d['p'])} | {_p(d['p_holm'])} | "
                     f"{d['verdict']} |")
        unreached = f"; not reached on {s['num_unreached']} of {len(s['per_seed'])} seeds" if s["num_unreached"] else ""
        for pool, what in (("mean", "mean of per-seed shares, registered"),
                           ("median", "median of per-seed shares, secondary")):
            reading = s[pool]
            lines.append(f"| share of `{base}`'s tokens `{method}` needs to reach `{base}`'s final success ({what}) | "
                         f"{_pct(reading['estimate'])} | [{_pct(reading['lo'])}, {_pct(reading['hi'])}]{unreached} "
                         f"| | | {reading['verdict']}; goal {'met' if reading['goal_met'] else 'not met'} |")
        lines.append(f"| seeds at or below a {plan['goal_share']:.0%} share against `{base}` | "
                     f"{s['num_at_goal']} of {len(s['per_seed'])} | | | | descriptive |")
    lines += ["", "| comparator | final success, method / comparator | sampled tokens, method / comparator | "
              "sampled tokens per unit, % more [95% t CI] | informative sampled tokens / token, method / comparator | "
              "difference per seed [95% t CI] | reading |", "|---|---|---|---|---|---|---|"]
    for c in result["comparisons"]:
        base, sig = c["comparator"], c["signal"]
        lines.append(f"| `{base}` | {c['success_after'][method]:.1%} / {c['success_after'][base]:.1%} | "
                     f"{c['tokens'][method]:,.0f} / {c['tokens'][base]:,.0f} | "
                     f"{_interval(sig.get('tokens_per_unit'), 100, '+.1f')} | "
                     f"{_num(sig[method])} / {_num(sig[base])} | "
                     f"{_interval(sig.get('diff'), 1, '+.3f')} | "
                     f"{_signal_reading(sig, c['equal_tokens']['favours_method'])} |")
    return "\n".join(lines) + "\n"


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(reading: dict[str, Any] | None, scale: float, fmt: str) -> str:
    if not reading or reading["mean"] is None:
        return "n/a"
    bounds = "" if reading["lo"] is None else f" [{scale * reading['lo']:{fmt}}, {scale * reading['hi']:{fmt}}]"
    return f"{scale * reading['mean']:{fmt}}{bounds}"
