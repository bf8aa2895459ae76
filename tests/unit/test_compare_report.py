"""The comparison report read from run directories written by hand: equal-token reading, pairing, complete seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tracerl.io.files.runlog import RunLog
from tracerl.report.compare import (complete_seeds, load_run, paired_spread, run_dir_name, summarize,
                                    to_markdown, write_report)

pytest.importorskip("matplotlib")


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    """200 bootstrap resamples instead of 2,000: these tests check what is read, not the interval's precision."""
    import tracerl.report.compare

    monkeypatch.setattr(tracerl.report.compare, "NUM_RESAMPLES", 200)


def write_run(out, label, seed, evals, tokens_per_step, units_per_step=128.0, informative=0.5, weights=None):
    """evals: {step: per-question success list}; one train row per step with cumulative units and tokens;
    `weights`: the starting weights hash its provenance.json records (None: no provenance)."""
    log = RunLog(out / run_dir_name(label, seed))
    if weights:
        (out / run_dir_name(label, seed) / "provenance.json").write_text(json.dumps(
            {"weights_sha256": weights, "torch": "2.13.0+cpu", "cpu": "test cpu", "gpu": None}))
    last = max(evals)
    for step in range(0, last + 1):
        if step:
            log.write("train", step, {"rollout/cum_units": units_per_step * step,
                                      "rollout/cum_tokens": tokens_per_step * step,
                                      "alloc/informative_rollouts_per_budget": informative,
                                      "alloc/informative_units_per_unit": informative / 2,
                                      "alloc/effective_ratio": 0.5})
        if step in evals:
            per = np.asarray(evals[step], dtype=float)
            log.write("eval", step, {"eval/success": float(per.mean()), "eval/success_se": 0.01,
                                     "eval/per_prompt": per.tolist(), "rollout/cum_units": units_per_step * step,
                                     "rollout/cum_tokens": tokens_per_step * step})


def test_a_method_twice_as_cheap_in_tokens_is_read_at_the_baselines_token_count(tmp_path):
    # grpo: 0.2 -> 0.4 over 4 steps at 1000 tokens a step; trace: same success curve per step at 500 tokens a step,
    # so at grpo's final 4000 tokens trace has run all its 4 steps (2000 tokens) -- not enough: flagged -- and at
    # equal units both are at 0.4
    q = 4
    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * q, 2: [0.3] * q, 4: [0.4] * q}, 1000)
        write_run(tmp_path, "trace", seed, {0: [0.2] * q, 2: [0.3] * q, 4: [0.5] * q}, 500)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1, 2])
    assert kept == [0, 1]
    summary = summarize(runs, "grpo", kept)
    trace = summary["methods"]["trace"]
    assert trace["diff_at_equal_units"]["mean"] == pytest.approx(0.1)
    assert trace["diff_at_equal_tokens"]["mean"] == pytest.approx(0.1)
    assert trace["seeds_short_of_tokens"] == 2
    assert "--set run.total_token_budget=N" in to_markdown({**summary, "weights": None}, "cmd")  # the way out
    # trace reaches grpo's final 0.4 halfway between its evaluations at 1000 and 2000 tokens
    assert trace["tokens_to_baseline"] == pytest.approx(1500.0)
    assert trace["share_of_baseline_tokens"] == pytest.approx(1500 / 4000)
    assert summary["methods"]["grpo"]["diff_at_equal_tokens"]["mean"] == 0.0


def test_equal_tokens_interpolates_a_method_that_spends_more(tmp_path):
    for seed in (0, 1, 2):
        write_run(tmp_path, "grpo", seed, {0: [0.0, 0.0], 4: [0.5, 0.5]}, 1000)
        # pcl spends 2000 tokens a step: at 4000 tokens it is at step 2, halfway along its 0 -> 0.8 line
        write_run(tmp_path, "pcl", seed, {0: [0.0, 0.0], 4: [0.8, 0.8 + 0.05 * seed]}, 2000)
    _, runs = complete_seeds(tmp_path, ["grpo", "pcl"], [0, 1, 2])
    pcl = summarize(runs, "grpo", [0, 1, 2])["methods"]["pcl"]
    per_seed = [0.4 + 0.025 * s / 2 - 0.5 for s in (0, 1, 2)]  # mean over the two questions at half the curve
    assert pcl["diff_at_equal_tokens"]["per_seed"] == pytest.approx(per_seed)
    assert pcl["seeds_short_of_tokens"] == 0
    assert pcl["diff_at_equal_units"]["mean"] == pytest.approx(np.mean([0.8 + 0.025 * s - 0.5 for s in (0, 1, 2)]))
    lo, hi = pcl["diff_at_equal_tokens"]["lo"], pcl["diff_at_equal_tokens"]["hi"]
    assert lo < pcl["diff_at_equal_tokens"]["mean"] < hi


def test_unfinished_seeds_are_left_out_and_the_report_says_which(tmp_path):
    write_run(tmp_path, "grpo", 0, {0: [0.1, 0.2], 2: [0.3, 0.2]}, 100)
    write_run(tmp_path, "trace", 0, {0: [0.1, 0.2], 2: [0.4, 0.2]}, 100)
    write_run(tmp_path, "grpo", 1, {0: [0.1, 0.2], 2: [0.3, 0.2]}, 100)
    write_run(tmp_path, "trace", 1, {0: [0.1, 0.2]}, 100)  # stopped before its first step
    said = []
    report = write_report(tmp_path, ["grpo", "trace"], [0, 1], "grpo", "cmd", say=said.append)
    assert "seeds [0]" in said[0]
    assert "1 seed(s) (0)" in report and "normal over questions" in report
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["seeds"] == [0]
    for name in ("compare.md", "accuracy_vs_tokens.png", "accuracy_vs_units.png", "informative_per_unit.png"):
        assert (tmp_path / name).stat().st_size > 0
    with pytest.raises(ValueError, match=r"no seed with a finished run .* asked for \(0\)"):
        write_report(tmp_path, ["grpo", "pcl"], [0], "grpo", "cmd")
    with pytest.raises(ValueError, match=r"asked for \(2-4\).*seed 7 alone is --seeds 7-7"):  # none of 2-4 ran
        write_report(tmp_path, ["grpo", "trace"], [2, 3, 4], "grpo", "cmd")


def test_a_figure_path_that_is_a_symlink_is_refused_and_what_it_leads_to_is_left_as_it_was(tmp_path):
    from tracerl.io.files.run_folder import OutsideRun

    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: [0.1, 0.2], 2: [0.3, 0.2]}, 100)
        write_run(tmp_path, "trace", seed, {0: [0.1, 0.2], 2: [0.4, 0.3]}, 100)
    victim = tmp_path / "user-file.txt"
    victim.write_text("not a figure")
    (tmp_path / "accuracy_vs_units.png").symlink_to(victim)
    with pytest.raises(OutsideRun, match="accuracy_vs_units.png"):
        write_report(tmp_path, ["grpo", "trace"], [0, 1], "grpo", "cmd")
    assert victim.read_text() == "not a figure"
    assert (tmp_path / "accuracy_vs_units.png").is_symlink()


def test_markdown_shows_the_paired_intervals(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 3, 2: [0.4] * 3}, 100)
        write_run(tmp_path, "trace", seed, {0: [0.2] * 3, 2: [0.5 + 0.1 * seed] * 3}, 100)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1])
    text = to_markdown(summarize(runs, "grpo", kept), "cmd")
    row = next(line for line in text.splitlines() if line.startswith("| trace") and "[" in line)
    assert "+15.0 [" in row and "Student's t" in text


def test_runs_logged_without_informative_measures_get_them_from_their_saved_trees(tmp_path):
    from tracerl.core.tree import Segment, Tree
    from tracerl.io.files.runlog import write_trees
    from tracerl.report.compare import load_run

    run_dir = tmp_path / run_dir_name("grpo", 0)
    log = RunLog(run_dir)
    log.write("train", 1, {"rollout/units": 6.0, "rollout/tokens": 30, "rollout/cum_units": 6.0,
                           "rollout/cum_tokens": 30})
    (run_dir / "config.json").write_text(json.dumps({"method": "grpo", "advantages": {"eps": 1e-6}}))
    trees = []
    for prompt_id, rewards in (("mixed", [1, 0, 0]), ("all-fail", [0, 0, 0])):
        tree = Tree.new(prompt_id, "prompt")
        for r in rewards:
            tree.add_child(0, Segment.text_only("answer", "", 5, 0), reward=r)
        trees.append(tree.to_dict())
    write_trees(run_dir, 1, {"step": 1, "method": "grpo", "pool": [], "trees": trees})
    row = load_run(run_dir)["train"][0]
    assert row["alloc/informative_rollouts_per_budget"] == pytest.approx(3 / 6)
    assert row["alloc/informative_tokens_per_token"] == pytest.approx(15 / 30)


def test_runs_from_different_starting_weights_are_refused_by_name(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 2, 2: [0.4] * 2}, 100, weights="a" * 64)
        write_run(tmp_path, "trace", seed, {0: [0.2] * 2, 2: [0.5] * 2}, 100, weights="a" * 64 if seed else "b" * 64)
    with pytest.raises(ValueError, match=r"2 different weights .*bbbbbbbbbbbbbbbb: trace-seed0"):
        write_report(tmp_path, ["grpo", "trace"], [0, 1], "grpo", "cmd")
    report = write_report(tmp_path, ["grpo", "trace"], [1], "grpo", "cmd")  # seed 1 alone: one build
    assert "every run started from sha256 aaaaaaaaaaaaaaaa; torch 2.13.0+cpu, test cpu" in report


def test_runs_without_provenance_are_counted_as_unchecked(tmp_path):
    write_run(tmp_path, "grpo", 0, {0: [0.2] * 2, 2: [0.4] * 2}, 100, weights="a" * 64)
    write_run(tmp_path, "trace", 0, {0: [0.2] * 2, 2: [0.5] * 2}, 100)
    report = write_report(tmp_path, ["grpo", "trace"], [0], "grpo", "cmd")
    assert "1 run(s) recorded none (unchecked)" in report


def test_the_code_each_run_recorded_is_stated_and_a_table_across_a_code_change_says_so(tmp_path):
    for seed, label in ((0, "grpo"), (0, "trace"), (1, "grpo"), (1, "trace")):
        write_run(tmp_path, label, seed, {0: [0.2] * 2, 2: [0.4] * 2}, 100, weights="a" * 64)
        record = tmp_path / run_dir_name(label, seed) / "provenance.json"
        code = {"code_sha256": "c" * 64} if (seed, label) != (1, "trace") else \
            {"code_sha256": "c" * 64, "code_sha256_resumed": ["d" * 64]}  # resumed under other code
        record.write_text(json.dumps({**json.loads(record.read_text()), **code}))
    one = write_report(tmp_path, ["grpo", "trace"], [0], "grpo", "cmd")
    assert "Code: tracerl source sha256 cccccccccccccccc in 2 run(s)." in one
    both = write_report(tmp_path, ["grpo", "trace"], [0, 1], "grpo", "cmd")
    assert ("Code: 2 different tracerl sources (cccccccccccccccc in 4 run(s); dddddddddddddddd in 1 run(s)): the "
            "pairs compare code as well as methods.") in both


def test_runs_from_before_code_was_recorded_add_no_code_sentence(tmp_path):
    write_run(tmp_path, "grpo", 0, {0: [0.2] * 2, 2: [0.4] * 2}, 100, weights="a" * 64)
    write_run(tmp_path, "trace", 0, {0: [0.2] * 2, 2: [0.5] * 2}, 100, weights="a" * 64)
    assert "Code:" not in write_report(tmp_path, ["grpo", "trace"], [0], "grpo", "cmd")


def test_the_share_is_the_mean_of_per_seed_shares_not_read_off_the_mean_curve(tmp_path):
    """Seed 0: trace reaches grpo's final 0.4 at half grpo's tokens; seed 1 at all of them. Per seed that is 0.5
    and 1.0, mean 0.75. The seed-mean curve (0.2, 0.35, 0.425) would cross 0.4 at 333 tokens: a share of 0.83."""
    write_run(tmp_path, "grpo", 0, {0: [0.2] * 4, 2: [0.3] * 4, 4: [0.4] * 4}, 100)
    write_run(tmp_path, "trace", 0, {0: [0.2] * 4, 2: [0.4] * 4, 4: [0.45] * 4}, 100)
    write_run(tmp_path, "grpo", 1, {0: [0.2] * 4, 2: [0.3] * 4, 4: [0.4] * 4}, 100)
    write_run(tmp_path, "trace", 1, {0: [0.2] * 4, 2: [0.3] * 4, 4: [0.4] * 4}, 100)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1])
    trace = summarize(runs, "grpo", kept)["methods"]["trace"]
    assert trace["share_of_baseline_tokens_ci"]["per_seed"] == pytest.approx([0.5, 1.0])
    assert trace["share_of_baseline_tokens"] == pytest.approx(0.75)
    ci = trace["share_of_baseline_tokens_ci"]
    assert 0.5 - 1e-9 <= ci["lo"] < 0.75 < ci["hi"] <= 1 + 1e-9
    assert trace["tokens_to_baseline"] == pytest.approx(0.75 * 400)


def test_a_method_that_never_reaches_is_unbounded_and_said_so(tmp_path):
    for seed in (0, 1, 2):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 2, 2: [0.4] * 2}, 100)
        write_run(tmp_path, "pcl", seed, {0: [0.2] * 2, 2: [0.3 if seed == 1 else 0.5] * 2}, 100)
    report = write_report(tmp_path, ["grpo", "pcl"], [0, 1, 2], "grpo", "cmd")
    data = json.loads((tmp_path / "compare.json").read_text())  # never reached: None (JSON has no infinity)
    pcl = data["methods"]["pcl"]
    assert pcl["share_of_baseline_tokens"] is None and pcl["share_of_baseline_tokens_ci"]["num_unreached"] == 1
    assert "not reached on 1 of 3 seeds" in report


def test_secondary_comparisons_get_holm_adjusted_p_values(tmp_path):
    rng = np.random.default_rng(0)
    for seed in range(4):
        base = rng.random(8)
        write_run(tmp_path, "grpo", seed, {0: base, 2: base}, 100)
        write_run(tmp_path, "trace", seed, {0: base, 2: base + 0.05 + 0.01 * seed}, 100)
        write_run(tmp_path, "pcl", seed, {0: base, 2: base + 0.02 * (-1) ** seed}, 100)
    kept, runs = complete_seeds(tmp_path, ["grpo", "pcl", "trace"], [0, 1, 2, 3])
    methods = summarize(runs, "grpo", kept)["methods"]
    trace, pcl = methods["trace"]["diff_at_equal_tokens"], methods["pcl"]["diff_at_equal_tokens"]
    assert trace["p"] < 0.01 and pcl["p"] > 0.5
    assert trace["p_holm"] == pytest.approx(2 * trace["p"])
    assert pcl["p_holm"] == pytest.approx(max(pcl["p"], 2 * trace["p"]))
    assert trace["boot_lo"] > 0 and trace["lo"] > 0
    text = to_markdown({**summarize(runs, "grpo", kept), "weights": None}, "cmd")
    assert "p (Holm)" in text
    header = next(line for line in text.splitlines() if line.startswith("| method | success before"))
    assert header.index("(priced)") < header.index("(counted)"), "the priced measure must lead"


def test_the_report_plots_every_seed(tmp_path):
    for seed in (3, 5):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 2, 2: [0.4] * 2}, 100)
        write_run(tmp_path, "trace", seed, {0: [0.2] * 2, 2: [0.5] * 2}, 100)
    write_report(tmp_path, ["grpo", "trace"], [3, 5], "grpo", "cmd")
    for name in ("accuracy_vs_tokens_per_seed.png", "accuracy_vs_units_per_seed.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_resolution_line_measures_the_spread_of_one_question_alone_and_paired(tmp_path):
    """Questions alternate 0 and 1 (sd 0.52 over 8 questions); trace differs from grpo by +-0.1 per question at
    step 2, so the paired difference spreads far less than the questions do."""
    hard_easy = [0.0, 1.0] * 4
    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: hard_easy, 2: hard_easy}, 100)
        write_run(tmp_path, "trace", seed, {0: hard_easy, 2: [v + 0.1 * (-1) ** i for i, v in enumerate(hard_easy)]},
                  100)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1])
    res = summarize(runs, "grpo", kept)["resolution"]
    assert res["sd_paired_per_question"] == pytest.approx(np.std([0.1, -0.1] * 4, ddof=1))
    assert res["sd_per_question"] > 4 * res["sd_paired_per_question"]
    assert res["paired_questions_for_target"] < res["questions_for_target"]
    assert res["eval_steps"] == [0, 2]


def test_runs_that_stop_at_different_steps_read_the_paired_resolution_between_their_last_evaluations(tmp_path):
    """Under one token budget trace stops at step 6 and grpo at step 4: no evaluation but the start pairs by step,
    so the paired spread is read between each seed's last evaluations, +-0.2 per question on seed 0 and +-0.1 on
    seed 1: sqrt(mean(var)) over the two seeds."""
    hard_easy = [0.0, 1.0] * 4
    for seed, delta in ((0, 0.2), (1, 0.1)):
        write_run(tmp_path, "grpo", seed, {0: hard_easy, 4: hard_easy}, 100)
        write_run(tmp_path, "trace", seed, {0: hard_easy, 6: [v + delta * (-1) ** i for i, v in enumerate(hard_easy)]},
                  50)
    runs = {label: [load_run(tmp_path / run_dir_name(label, seed)) for seed in (0, 1)] for label in ("grpo", "trace")}
    summary = summarize(runs, "grpo", [0, 1])
    res = summary["resolution"]
    expected = np.sqrt(np.mean([np.var([d, -d] * 4, ddof=1) for d in (0.2, 0.1)]))
    assert np.isnan(res["sd_paired_per_question"]) and res["paired_questions_for_target"] is None
    assert res["sd_paired_at_stop_per_question"] == pytest.approx(expected)
    assert paired_spread(runs["trace"], runs["grpo"], at_stop=True) == pytest.approx(expected)
    assert res["paired_at_stop_questions_for_target"] < res["questions_for_target"]
    text = to_markdown({**summary, "weights": None}, "cmd")
    assert f"The paired difference from grpo between each seed's last evaluations spreads sd {expected:.3f}" in text


def test_where_the_tokens_went_is_read_per_seed_with_an_interval(tmp_path):
    # trace samples 10% more tokens per unit than grpo and logs 0.05 more informative units per unit on every seed
    # but the last, where it logs 0.05 fewer: the interval over seeds must hold that spread, not the pooled means'
    for seed, extra in enumerate((0.1, 0.1, 0.1, -0.1)):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 2, 2: [0.4] * 2}, 1000, informative=0.5)
        write_run(tmp_path, "trace", seed, {0: [0.2] * 2, 2: [0.4] * 2}, 1100, informative=0.5 + extra)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1, 2, 3])
    summary = summarize(runs, "grpo", kept)
    signal = summary["methods"]["trace"]["signal_vs_baseline"]
    assert signal["tokens_per_unit_ratio"]["per_seed"] == pytest.approx([0.1] * 4)
    units = signal["informative_units_per_unit"]
    assert units["per_seed"] == pytest.approx([0.05, 0.05, 0.05, -0.05])
    assert units["mean"] == pytest.approx(0.025) and units["lo"] < 0 < units["hi"] and 0.05 < units["p"] < 1
    assert signal["informative_sampled_tokens_per_token"]["mean"] is None  # not logged: no reading, not zero
    text = to_markdown({**summary, "weights": None}, "cmd")
    row = [line for line in text.splitlines() if line.startswith("| trace")][-1]  # the last table: the signal
    assert "+10.0% [+10.0, +10.0]" in row and "| - |" in row and "+0.025 [" in row
    json.dumps(summary, allow_nan=False)  # the report's JSON holds no NaN


def test_under_a_token_budget_runs_that_end_at_different_steps_are_finished_by_their_config(tmp_path):
    # grpo reaches 4,000 tokens at step 4, trace (500 a step) at step 8; trace seed 1 stopped at step 4, short of it
    for seed in (0, 1):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 2, 2: [0.3] * 2, 4: [0.4] * 2}, 1000)
        last = 8 if seed == 0 else 4
        write_run(tmp_path, "trace", seed, {s: [0.2 + 0.03 * s] * 2 for s in range(0, last + 1, 2)}, 500)
        for label in ("grpo", "trace"):
            (tmp_path / run_dir_name(label, seed) / "config.json").write_text(
                json.dumps({"run": {"num_steps": 100, "total_token_budget": 4000}}))
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], [0, 1])
    assert kept == [0] and [run["train"][-1]["step"] for run in (runs["grpo"][0], runs["trace"][0])] == [4, 8]
    summary = summarize(runs, "grpo", kept)
    trace = summary["methods"]["trace"]
    assert trace["seeds_short_of_tokens"] == 0 and trace["diff_at_equal_tokens"]["mean"] == pytest.approx(0.44 - 0.4)
    assert "1 seed(s) (0), steps per run grpo 4, trace 8." in to_markdown({**summary, "weights": None}, "cmd")


def test_a_reports_intervals_come_back_from_its_per_seed_values_alone(tmp_path):
    """`restate` recomputes every interval over seeds from the per-seed values a report keeps: on a report written now
    it changes nothing, and on one whose intervals were written otherwise it gives back what the runs give."""
    from tracerl.report.restate import restate

    rng = np.random.default_rng(0)
    for seed in range(4):
        write_run(tmp_path, "grpo", seed, {0: [0.2] * 8, 2: list(rng.random(8)), 4: list(rng.random(8))}, 1000)
        write_run(tmp_path, "trace", seed, {0: [0.2] * 8, 2: list(rng.random(8)), 4: list(rng.random(8))}, 900,
                  informative=0.5 + 0.1 * seed)
    kept, runs = complete_seeds(tmp_path, ["grpo", "trace"], list(range(4)))
    summary = json.loads(json.dumps({**summarize(runs, "grpo", kept), "weights": None}))  # as compare.json keeps it
    assert _close(restate(summary), summary)
    doctored = json.loads(json.dumps(summary))
    row = doctored["methods"]["trace"]
    for axis in ("units", "tokens"):
        row[f"diff_at_equal_{axis}"].update(lo=-1.0, hi=1.0, boot_lo=-1.0, boot_hi=1.0)
        row[f"share_of_baseline_{axis}_ci"].update(lo=0.0, hi=9.0, median_lo=0.0, median_hi=9.0)
    for reading in row["signal_vs_baseline"].values():
        reading.update(lo=-1.0, hi=1.0)
    assert _close(restate(doctored), summary)


def _close(a, b) -> bool:
    """Equal at every depth, numbers to within float rounding (1e-12 relative)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-15, nan_ok=True)
    return a == b
