"""The run report: report.md and its figures from a hand-built run directory."""

import re

import numpy as np
import pytest
from view_fixtures import CONTINUATION_COST, make_run, mixed_tree

from tracerl.cli import main
from tracerl.core.tally import Rollout, to_columns
from tracerl.io.files.runlog import write_rollouts
from tracerl.report.run_report import FIGURES, read_run, write_run_report


def figure_links(report: str) -> list[str]:
    return re.findall(r"!\[[^\]]+\]\(([^)]+)\)", report)


def test_report_writes_every_figure_and_names_it(run_dir):
    path = write_run_report(run_dir)
    assert path == run_dir / "report.md"
    report = path.read_text()
    assert sorted(figure_links(report)) == sorted(FIGURES.values())
    for name in FIGURES.values():
        png = run_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, f"{name} is not a plot"
    assert "25.0% ± 5.0% at step 0 -> 37.5% ± 6.0% at step 2" in report


def test_calibration_pairs_each_prediction_with_its_natural_backup(run_dir):
    pred = read_run(run_dir)["predictions"]  # rows: step, is_root, p_pred, natural vhat, leaves
    tree = mixed_tree()
    natural, plain = tree.natural_backup(), tree.backup()
    assert natural.vhat[0] != plain.vhat[0], "the fixture must tell natural and plain backup apart"
    step2 = pred[pred[:, 0] == 2]
    expected = [(1, 0.5, natural.vhat[0], natural.num_leaves[0]), (0, 0.4, natural.vhat[1], natural.num_leaves[1]),
                (1, 0.9, 1.0, 2), (1, 0.1, 0.0, 2)]
    np.testing.assert_allclose(step2[:, 1:], expected)


def test_budget_split_counts_roots_and_continuations(run_dir):
    budget = read_run(run_dir)["budget"]
    assert [b["step"] for b in budget] == [1, 2]
    assert budget[-1] == {"step": 2, "root_units": 6.0, "num_continuations": 2, "prefix_units": 2 * CONTINUATION_COST,
                          "logged_units": 7.0}
    report = write_run_report(run_dir).read_text()
    assert "| 2 | 6 | 2 | 1 | 7 | 14.3% | 7 |" in report


def test_method_without_predictor_is_said_not_plotted(grpo_run_dir):
    report = write_run_report(grpo_run_dir).read_text()
    assert "has no predictor" in report and "`grpo`" in report
    assert FIGURES["calibration"] not in figure_links(report)
    assert not (grpo_run_dir / FIGURES["calibration"]).exists()
    assert FIGURES["budget"] in figure_links(report)


def test_run_without_trees_still_reports_metrics(tmp_path):
    run = make_run(tmp_path / "run")
    for f in (run / "trees").iterdir():
        f.unlink()
    report = write_run_report(run).read_text()
    assert figure_links(report) == [FIGURES["success"], FIGURES["effective_ratio"], FIGURES["budget"]]
    assert report.count("run.save_trees=true") == 1, "only calibration needs the trees; the split is logged"


def test_cli_report(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.md")
    assert main(["report", str(tmp_path)]) == 2, "a folder without metrics.jsonl is a user error"
    with pytest.raises(ValueError, match="not a directory"):
        write_run_report(tmp_path / "missing")


def test_the_batch_counts_each_prompt_once_from_the_rollout_records(run_dir):
    assert "nothing to say of the batch" in write_run_report(run_dir).read_text(), "the fixture writes no records"
    prompt = {3: 0.8, 8: 0.5}  # group size -> the predictor's p at that prompt's root
    steps = {1: [3, 3, 8], 2: [3, 3, 3]}  # each step's groups
    for step, groups in steps.items():
        items = [Rollout(False, 0, prompt[g], 1.0, 10, True, grant=g) for g in groups for _ in range(g)]
        items.append(Rollout(True, 1, 0.1, 0.5, 4, True, 0, True))  # a continuation: not stage 1's
        write_rollouts(run_dir, step, to_columns(items))
    report = write_run_report(run_dir).read_text()
    # 6 prompts over 2 steps; 14 + 9 fresh rollouts; 5 prompts of 3, 1 of 8; |p - 1/2| 0.3 five times, 0 once
    assert ("Stage 1's batch, from each step's fresh rollouts (2 steps): 3.0 prompts a step (every step), 3.83 fresh "
            "rollouts a prompt. Prompts by the fresh rollouts granted: 3: 83.3%, 8: 16.7%.") in report
    assert "mean |p - 1/2| (the predictor's p at the root): 0.250;" in report  # steps: (0.3 + 0.3 + 0) / 3, 0.3
