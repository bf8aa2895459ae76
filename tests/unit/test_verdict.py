"""The pre-registered reading: Holm over the primary tests, each verdict by its interval, interim looks labelled,
reports of different runs refused; and the same reading on reports that `tracerl compare` wrote from run folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tracerl.cli import main
from tracerl.core.stats import holm, paired_t_pvalue, t_half_width
from tracerl.report.verdict import Plan, primary_verdict, to_markdown


def diff(per_seed_points: list[float]) -> dict:
    """A compare report's diff_at_equal_tokens from per-seed differences in points (statistics as the report's)."""
    d = np.asarray(per_seed_points) / 100
    half = t_half_width(d)
    return {"mean": float(d.mean()), "lo": float(d.mean() - half), "hi": float(d.mean() + half),
            "boot_lo": float(d.mean() - half), "boot_hi": float(d.mean() + half), "p": paired_t_pvalue(d),
            "per_seed": d.tolist()}


def report(baseline: str, per_seed_points: list[float], share: tuple = (0.6, 0.5, 0.7), seeds=None,
           weights: str = "abc", signal: tuple[float, float] = (0.4, 0.4), median: tuple | None = None,
           per_seed_shares: list | None = None, signal_diff: tuple | None = None) -> dict:
    """A compare.json against `baseline` holding `trace`; share = (mean, lo, hi) and median = (median, lo, hi) of
    the per-seed shares (every seed at the mean unless given), None for a seed never reaching."""
    seeds = list(range(len(per_seed_points))) if seeds is None else seeds
    mean, lo, hi = share
    shares = [mean] * len(seeds) if per_seed_shares is None else per_seed_shares
    ci = {"lo": lo, "hi": hi, "per_seed": shares, "num_unreached": sum(v is None for v in shares)}
    if median is not None:
        ci.update(zip(("median", "median_lo", "median_hi"), median))
    row = {"success_after": 0.6, "tokens": 1000.0, "informative_sampled_tokens_per_token": signal[0],
           "diff_at_equal_tokens": diff(per_seed_points), "share_of_baseline_tokens": mean,
           "share_of_baseline_tokens_ci": ci}
    if signal_diff is not None:  # (mean, lo, hi) of the per-seed difference in informative sampled tokens / token
        row["signal_vs_baseline"] = {
            "informative_sampled_tokens_per_token": dict(zip(("mean", "lo", "hi"), signal_diff)),
            "tokens_per_unit_ratio": {"mean": 0.04, "lo": 0.02, "hi": 0.06}}
    base = {"success_after": 0.58, "tokens": 1000.0, "informative_sampled_tokens_per_token": signal[1]}
    return {"baseline": baseline, "seeds": seeds, "methods": {baseline: base, "trace": row},
            "weights": {"weights_sha256": weights}, "regime": [{"all_fail": 0.25, "mixed": 0.5, "all_success": 0.25,
                                                               "num_prompts": 16}]}


WIN = [1.0, 1.5, 2.0, 1.2, 0.8, 1.7]


def test_a_clear_win_on_both_comparators_pays_and_meets_the_goal():
    result = primary_verdict([report("grpo", WIN), report("pcl", WIN)], Plan(planned_seeds=6))
    assert result["pays"] and not result["interim"]
    assert result["overall"] == "trace pays for itself on this testbed"
    for c in result["comparisons"]:
        assert c["equal_tokens"]["verdict"] == "established: trace better"
        assert c["share"]["mean"]["goal_met"] and c["share"]["mean"]["fewer_tokens"]


def test_holm_withholds_two_tests_that_each_pass_alone():
    # each p is between 0.025 and 0.05: each passes at 0.05 alone, neither survives Holm over the two
    a, b = [0.2, 1.4, 0.9, -0.1, 1.1, 0.3], [0.3, 1.2, 0.8, 0.0, 1.2, 0.2]
    pa, pb = paired_t_pvalue(np.array(a)), paired_t_pvalue(np.array(b))
    assert 0.025 < min(pa, pb) and max(pa, pb) < 0.05
    result = primary_verdict([report("grpo", a), report("pcl", b)], Plan(planned_seeds=6))
    assert [c["equal_tokens"]["established"] for c in result["comparisons"]] == [False, False]
    assert not result["pays"]
    assert result["overall"] == "no evidence that trace pays for itself on this testbed"


def test_an_interval_below_the_worthwhile_effect_is_refuted_and_a_significant_loss_says_worse():
    near_zero, loss = [0.1, -0.1, 0.2, 0.0, -0.2, 0.1], [-1.0, -1.5, -0.8, -1.2, -1.1, -0.9]
    result = primary_verdict([report("grpo", near_zero), report("pcl", loss)], Plan(planned_seeds=6))
    first, second = (c["equal_tokens"]["verdict"] for c in result["comparisons"])
    assert first == "refuted: the interval excludes +0.5 points"
    assert second.startswith("established: trace worse") and "refuted" in second


def test_a_wide_interval_is_unresolved():
    result = primary_verdict([report("grpo", [3.0, -2.5, 1.0, -1.5, 2.0, -0.5])], Plan(planned_seeds=6))
    assert result["comparisons"][0]["equal_tokens"]["verdict"] == "unresolved"


def test_fewer_seeds_than_planned_is_an_interim_look_even_when_it_would_pass():
    result = primary_verdict([report("grpo", WIN), report("pcl", WIN)], Plan(planned_seeds=30))
    assert result["interim"] and result["pays"]
    assert result["overall"].startswith("interim look (6 of 30 planned seeds), decides nothing")
    assert "interim look" in to_markdown(result)


def test_a_share_never_reached_is_infinite_and_cannot_meet_the_goal():
    unreached = report("grpo", WIN, share=(None, None, None))
    share = primary_verdict([unreached], Plan(planned_seeds=6))["comparisons"][0]["share"]["mean"]
    assert share["estimate"] == float("inf") and not share["fewer_tokens"] and not share["goal_met"]
    assert share["verdict"].startswith("refuted: needs more than 80%")
    # a share whose interval reaches 100% is not "fewer tokens", however low the estimate
    wide = primary_verdict([report("grpo", WIN, share=(0.6, 0.3, 1.2))], Plan(planned_seeds=6))
    assert wide["comparisons"][0]["share"]["mean"]["verdict"] == "unresolved" and not wide["pays"]


def test_one_seed_that_never_reaches_sinks_the_mean_but_not_the_median():
    """Of 30 seeds 29 reach at 60%: the registered mean is infinite (and so is its upper end), the secondary median
    reading passes; the overall verdict follows the registered one."""
    shares = [0.6] * 29 + [None]
    result = primary_verdict([report("grpo", WIN * 5, share=(None, 0.9, None), median=(0.6, 0.55, 0.65),
                                     per_seed_shares=shares)], Plan(planned_seeds=30))
    share = result["comparisons"][0]["share"]
    assert not share["mean"]["fewer_tokens"] and share["mean"]["estimate"] == float("inf")
    assert share["median"]["fewer_tokens"] and share["median"]["goal_met"]
    assert share["num_unreached"] == 1 and share["num_at_goal"] == 29
    assert not result["pays"]
    text = to_markdown(result)
    assert "(median of per-seed shares, secondary) | 60% | [55%, 65%]; not reached on 1 of 30 seeds" in text
    assert "seeds at or below a 70% share against `grpo` | 29 of 30" in text


def test_a_report_without_median_fields_reads_the_median_without_an_interval():
    share = primary_verdict([report("grpo", WIN)], Plan(planned_seeds=6))["comparisons"][0]["share"]["median"]
    assert share["estimate"] == pytest.approx(0.6) and share["verdict"] == "unresolved"
    assert "| 60% | [n/a, n/a] |" in to_markdown(primary_verdict([report("grpo", WIN)], Plan(planned_seeds=6)))


@pytest.mark.parametrize("signal_diff, reading", [
    ((0.2, 0.1, 0.3), "more informative tokens per token, with no held-out gain established"),
    ((0.2, -0.1, 0.5), "not distinguishable"),  # the means favour the method; the interval does not
    ((-0.02, -0.03, -0.01), "fewer informative tokens per token"),
    (None, "no per-seed interval in this report"),  # a report before the per-seed reading: nothing off the means
])
def test_the_learning_signal_is_read_off_its_per_seed_interval(signal_diff, reading):
    text = to_markdown(primary_verdict([report("grpo", [3.0, -2.5, 1.0, -1.5, 2.0, -0.5], signal=(0.5, 0.3),
                                               signal_diff=signal_diff)], Plan(planned_seeds=6)))
    assert reading in text
    assert ("+4.0 [+2.0, +6.0]" in text) == (signal_diff is not None)


@pytest.mark.parametrize("reports, message", [
    ([report("grpo", WIN), report("pcl", WIN, weights="other")], "not of the same runs"),
    ([report("grpo", WIN), report("pcl", WIN[:5])], "not of the same runs"),
    ([report("grpo", WIN), report("grpo", WIN)], "share a baseline"),
    ([{**report("grpo", WIN), "baseline": None}], "has no baseline"),
    ([report("grpo", WIN)], "planned_seeds"),
])
def test_reports_that_cannot_be_read_together_are_refused_with_the_fix(reports, message):
    with pytest.raises(ValueError, match=message):
        primary_verdict(reports, Plan(planned_seeds=1 if message == "planned_seeds" else 6))


def test_a_report_without_the_method_is_refused():
    with pytest.raises(ValueError, match="must hold 'treepo'"):
        primary_verdict([report("grpo", WIN)], Plan(method="treepo", planned_seeds=6))


def test_the_command_writes_the_reading_and_refuses_an_unreadable_report(tmp_path, capsys):
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "compare.json").write_text(json.dumps(report("grpo", WIN)))
    (tmp_path / "pcl.json").write_text(json.dumps(report("pcl", WIN)))
    assert main(["verdict", str(tmp_path / "grpo"), str(tmp_path / "pcl.json"), "--planned-seeds", "6",
                 "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "primary.json").read_text())
    assert saved["pays"] and saved["comparisons"][1]["comparator"] == "pcl"
    assert (tmp_path / "out" / "primary.md").read_text() == capsys.readouterr().out
    with pytest.raises(SystemExit, match="cannot read .*missing.json"):
        main(["verdict", str(tmp_path / "missing.json"), "--planned-seeds", "6"])


def test_the_reading_of_reports_written_from_run_folders(tmp_path):
    """The keys read here are the ones `tracerl compare` writes: trace beats both comparators on every seed."""
    pytest.importorskip("matplotlib")
    from tests.unit.test_compare_report import write_run
    from tracerl.report.compare import complete_seeds, summarize

    rng = np.random.default_rng(0)
    q, seeds = 64, [0, 1, 2, 3]
    for seed in seeds:
        start = rng.uniform(0.2, 0.4, q)
        for label, gain in (("grpo", 0.10), ("pcl", 0.11), ("trace", 0.20)):
            write_run(tmp_path, label, seed, {0: start, 2: start + gain / 2, 4: start + gain}, 1000, weights="w")
    kept, runs = complete_seeds(tmp_path, ["grpo", "pcl", "trace"], seeds)
    summaries = [{**summarize(runs, base, kept), "weights": {"weights_sha256": "w"}} for base in ("grpo", "pcl")]
    result = primary_verdict(summaries, Plan(planned_seeds=4))
    for c in result["comparisons"]:
        assert c["equal_tokens"]["verdict"] == "established: trace better"
        assert c["share"]["mean"]["fewer_tokens"] and c["share"]["mean"]["estimate"] < 0.7
        assert c["share"]["median"]["fewer_tokens"] and c["share"]["median"]["estimate"] < 0.7
    assert result["pays"]


def test_one_seed_has_no_test_and_reads_unresolved():
    result = primary_verdict([report("grpo", [1.0])], Plan(planned_seeds=4))
    assert result["comparisons"][0]["equal_tokens"]["verdict"] == "unresolved"
    assert "+1.00 [n/a, n/a] | [n/a, n/a] | n/a | n/a | unresolved" in to_markdown(result)


def test_across_testbeds_the_tests_form_one_holm_family_and_each_testbed_has_its_own_plan():
    from tracerl.report.verdict import testbed_verdict, testbeds_to_markdown

    # math: a clear win over 8 seeds (of 8 planned); funcall: a weaker one over 6 of 10 planned, other runs and weights
    math = report("grpo", [1.0, 1.5, 2.0, 1.2, 0.8, 1.7, 1.1, 1.4], weights="math", signal_diff=(0.01, 0.005, 0.02))
    funcall = report("grpo", [2.0, -0.5, 1.5, 0.2, 1.8, -0.1], weights="funcall")
    plans = {"math": Plan(planned_seeds=8), "funcall": Plan(planned_seeds=10)}
    result = testbed_verdict({"math": math, "funcall": funcall}, plans)
    by_name = {t["testbed"]: t for t in result["testbeds"]}
    p = [r["methods"]["trace"]["diff_at_equal_tokens"]["p"] for r in (math, funcall)]
    assert [by_name[n]["equal_tokens"]["p_holm"] for n in ("math", "funcall")] == pytest.approx(holm(p))
    assert by_name["math"]["equal_tokens"]["favours_method"] and not by_name["math"]["interim"]
    assert by_name["funcall"]["interim"]
    text = testbeds_to_markdown(result)
    assert "| math | 8 of 8 |" in text and "established: trace better" in text
    assert "interim look (6 of 10 seeds), decides nothing" in text and "+0.010 [+0.005, +0.020]" in text
    assert "no curve" not in text  # these reports say nothing of their evaluations: the share is listed


def test_across_testbeds_a_design_evaluated_at_the_start_and_the_stop_lists_no_share():
    from tracerl.report.verdict import testbed_verdict, testbeds_to_markdown

    ends_only = {**report("grpo", WIN, per_seed_shares=[None] * 6), "resolution": {"eval_steps": [0, 31]}}
    curve = {**report("grpo", WIN, weights="other", median=(0.6, 0.5, 0.7)), "resolution": {"eval_steps": [0, 2, 4]}}
    result = testbed_verdict({"ends": ends_only, "curve": curve}, {"ends": Plan(planned_seeds=6),
                                                                   "curve": Plan(planned_seeds=6)})
    rows = {line.split(" | ")[0][2:]: line for line in testbeds_to_markdown(result).splitlines()
            if line.startswith("| ends") or line.startswith("| curve")}
    assert "none: evaluated at 2 points, no curve to read it on" in rows["ends"] and "never reach" not in rows["ends"]
    assert "60% [50%, 70%]" in rows["curve"]


@pytest.mark.parametrize("reports, message", [
    ({"a": report("grpo", WIN), "b": report("pcl", WIN)}, "the same comparator"),
    ({"a": report("grpo", WIN), "b": {**report("grpo", WIN), "methods": {"grpo": {}}}}, "must hold 'trace'"),
])
def test_across_testbeds_the_reports_must_share_a_comparator_and_hold_the_method(reports, message):
    from tracerl.report.verdict import testbed_verdict

    with pytest.raises(ValueError, match=message):
        testbed_verdict(reports, {name: Plan(planned_seeds=6) for name in reports})


def test_the_command_reads_testbeds_by_their_folders_with_a_plan_each(tmp_path, capsys):
    for name, weights in (("math", "m"), ("funcall", "f")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "compare.json").write_text(json.dumps(report("grpo", WIN, weights=weights)))
    reports = [str(tmp_path / "math"), str(tmp_path / "funcall" / "compare.json")]
    assert main(["verdict", *reports, "--planned-seeds", "6,12", "--across-testbeds", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "| math | 6 of 6 |" in text and "| funcall | 6 of 12 |" in text
    assert json.loads((tmp_path / "primary.json").read_text())["testbeds"][1]["interim"]
    for args, message in ((["--planned-seeds", "6,12"], "one count, or with --across-testbeds one per report"),
                          (["--planned-seeds", "6,x", "--across-testbeds"], "one count per report separated"),
                          (["--planned-seeds", "6"], "share a baseline")):  # two testbeds read as comparators
        with pytest.raises(SystemExit, match=message):
            main(["verdict", *reports, *args])
