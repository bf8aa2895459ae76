"""studies/funcall_confirm.py: the registered reading of function calling's confirmatory table, held to hand-computed
cases on synthetic reports (the real table's reports are not read here)."""

from __future__ import annotations

import json

import pytest

from helpers import load_study_script

confirm = load_study_script("funcall_confirm")

WEIGHTS = "c1ad6c76e6b3" + "0" * 52


def diff(mean_pts: float, lo_pts: float, hi_pts: float, p: float) -> dict:
    """A report's `diff_at_equal_tokens` (fractions, as compare.json keeps them)."""
    return {"mean": mean_pts / 100, "lo": lo_pts / 100, "hi": hi_pts / 100, "boot_lo": lo_pts / 100,
            "boot_hi": hi_pts / 100, "p": p, "per_seed": []}


def write_table(dest, trace_grpo: dict, pcl_grpo: dict, trace_pcl: dict, seeds=89, weights=WEIGHTS) -> None:
    """The two reports `tracerl compare --report-only` writes: against grpo in dest, against pcl in dest/vs-pcl."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "vs-pcl").mkdir(exist_ok=True)
    common = {"seeds": list(range(seeds)), "weights": {"weights_sha256": weights}}
    (dest / "compare.json").write_text(json.dumps({**common, "baseline": "grpo", "methods": {
        "grpo": {}, "pcl": {"diff_at_equal_tokens": pcl_grpo}, "trace": {"diff_at_equal_tokens": trace_grpo}}}))
    (dest / "vs-pcl" / "compare.json").write_text(json.dumps({**common, "baseline": "pcl", "methods": {
        "pcl": {}, "grpo": {}, "trace": {"diff_at_equal_tokens": trace_pcl}}}))


NOTHING = diff(0.0, -1.0, 1.0, 0.9)


@pytest.mark.parametrize("p, math_p, holm_bounds, reading", [
    (0.02, None, (0.02, 0.04), "established: trace better"),  # 2p <= 0.05 whatever math's p
    (0.04, None, (0.04, 0.08), "waits on math's (a)"),  # p <= 0.05 < 2p
    (0.04, 0.01, (0.04, 0.04), "established: trace better"),  # Holm: math's 0.01 x 2 = 0.02, then max(0.02, 0.04)
    (0.04, 0.50, (0.08, 0.08), "unresolved"),  # the smaller p of the two, doubled
    (0.30, None, (0.30, 0.60), "unresolved"),
])
def test_the_question_is_read_with_holm_over_the_two_domains_or_its_bounds(tmp_path, p, math_p, holm_bounds,
                                                                          reading):
    write_table(tmp_path, diff(+1.2, +0.1, +2.3, p), NOTHING, NOTHING)
    item = confirm.question(confirm.read_reports(tmp_path), math_p)
    assert item["p_holm_bounds"] == pytest.approx(holm_bounds)
    assert item["verdict"] == reading


def test_an_interval_below_half_a_point_is_refuted_and_a_negative_established_one_is_against(tmp_path):
    write_table(tmp_path, diff(-0.8, -1.5, +0.4, 0.03), NOTHING, NOTHING)
    assert confirm.question(confirm.read_reports(tmp_path), None)["verdict"] == "waits on math's (a)"
    refuted = confirm.question(confirm.read_reports(tmp_path), 0.2)["verdict"]
    assert refuted == "refuted: the interval excludes +0.5 points"
    write_table(tmp_path, diff(-1.0, -1.6, -0.4, 0.001), NOTHING, NOTHING)
    assert confirm.question(confirm.read_reports(tmp_path), None)["verdict"].startswith("established: trace worse")


def test_the_secondaries_are_one_holm_family_within_the_table(tmp_path):
    # p 0.02 and 0.04: Holm 0.04 and 0.04, both established; p 0.02 and 0.06: 0.04 and 0.06
    write_table(tmp_path, NOTHING, diff(+2.0, +0.5, +3.5, 0.02), diff(+1.0, +0.1, +1.9, 0.04))
    first, second = confirm.secondaries(confirm.read_reports(tmp_path))
    assert [first["p_holm"], second["p_holm"]] == pytest.approx([0.04, 0.04])
    assert first["verdict"] == "established: pcl better" and second["verdict"] == "established: trace better"
    write_table(tmp_path, NOTHING, diff(+2.0, +0.5, +3.5, 0.02), diff(+1.0, -0.1, +2.1, 0.06))
    first, second = confirm.secondaries(confirm.read_reports(tmp_path))
    assert [first["p_holm"], second["p_holm"]] == pytest.approx([0.04, 0.06])
    assert second["verdict"] == "unresolved"


def test_fewer_seeds_than_planned_is_an_interim_look_and_the_markdown_says_so(tmp_path):
    write_table(tmp_path, diff(+1.2, +0.1, +2.3, 0.02), NOTHING, NOTHING, seeds=60)
    text = confirm.to_markdown(confirm.read_reports(tmp_path))
    assert "60 of the planned 89" in text and "interim look" in text and "established" not in text
    write_table(tmp_path, diff(+1.2, +0.1, +2.3, 0.02), NOTHING, NOTHING)
    text = confirm.to_markdown(confirm.read_reports(tmp_path))
    assert "| +1.20 [+0.10, +2.30] |" in text and "[0.020, 0.040]" in text and "established: trace better" in text
    assert "bounded, by p and min(1, 2p)" in text and "`c1ad6c76e6b3`" in text


def test_reports_of_other_runs_or_a_missing_one_are_refused_with_what_to_do(tmp_path, capsys):
    write_table(tmp_path, NOTHING, NOTHING, NOTHING)
    other = json.loads((tmp_path / "vs-pcl" / "compare.json").read_text())
    other["weights"]["weights_sha256"] = "d94244c40a7e" + "0" * 52
    (tmp_path / "vs-pcl" / "compare.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="not of the same runs .*d94244c40a7e"):
        confirm.read_reports(tmp_path)
    (tmp_path / "vs-pcl" / "compare.json").unlink()
    assert confirm.main([str(tmp_path)]) == 1
    assert "tracerl compare --report-only --baseline pcl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        confirm.main([str(tmp_path), "--math-p", "1.5"])


def test_the_cli_prints_the_reading_and_writes_it_where_asked(tmp_path, capsys):
    write_table(tmp_path / "table", diff(+1.2, +0.1, +2.3, 0.02), NOTHING, NOTHING)
    assert confirm.main([str(tmp_path / "table"), "--math-p", "0.3", "--out", str(tmp_path / "primary.md")]) == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "primary.md").read_text() and "| 0.040 |" in printed
    assert "bounded" not in printed
