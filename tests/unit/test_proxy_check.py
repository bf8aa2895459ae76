"""studies/proxy_ranks.py --check: amendment 19's registered check of mixed trees per budget unit on a table over
builds, held to hand-computed cases (tau-b of the methods' order and its reading from the interval over builds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_study_script

PROXY = "mixed_trees_per_budget"


def write_table(folder: Path, builds: list[dict[str, tuple[float, float]]]) -> Path:
    """One build per entry: {method: (held-out difference from pcl, proxy difference from pcl)}, each kept as
    math_confirm.sh keeps it (build<k>/vs-pcl/compare.json), with a report against grpo beside it that must not be
    read (its values reversed)."""
    for k, build in enumerate(builds, start=1):
        for name, sign, baseline in (("vs-pcl/compare.json", 1.0, "pcl"), ("compare.json", -1.0, "grpo")):
            report = {"baseline": baseline, "methods": {baseline: {}, **{
                m: {"diff_at_equal_tokens": {"per_seed": [sign * held]},
                    "signal_vs_baseline": {PROXY: {"per_seed": [sign * proxy]}}}
                for m, (held, proxy) in build.items()}}}
            path = folder / f"build{k}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report))
    return folder


def reading(folder: Path, capsys) -> str:
    assert load_study_script("proxy_ranks").main(["--check", str(folder)]) == 0
    return capsys.readouterr().out


def test_a_proxy_that_orders_every_build_as_held_out_success_does_holds(tmp_path, capsys):
    """a below b below c on both measures in every build: every resample's tau-b is +1, so the interval is [+1, +1]."""
    table = write_table(tmp_path, [{"a": (0.5, 0.01), "b": (1.0, 0.02), "c": (1.5 + k / 10, 0.03)} for k in range(12)])
    out = reading(table, capsys)
    assert "| c > b > a > pcl | c > b > a > pcl | +1.00 [+1.00, +1.00] | +1.00 [+1.00, +1.00] | holds" in out


def test_a_proxy_that_reverses_the_order_fails(tmp_path, capsys):
    table = write_table(tmp_path, [{"a": (1.0, -0.01), "b": (2.0, -0.02)} for _ in range(12)])
    out = reading(table, capsys)
    assert "| b > a > pcl | pcl > a > b | -1.00 [-1.00, -1.00]" in out and "fails" in out


def test_a_proxy_whose_order_turns_with_the_resample_is_unresolved(tmp_path, capsys):
    """Held-out: b (+2) > a (+1) > pcl in every build. The proxy: a +1 always, b +2 in six builds and -2 in six, so b's
    mean is 0, tied with pcl: pairs (pcl, a) +1, (pcl, b) tied, (a, b) -1, tau-b 0. In a resample with k of its 12
    draws from the +2 builds b's mean is (4k - 24) / 12: below 0 (k < 6, 1586 / 4096 of resamples) the order gives
    -1/3, so the lower end is -1/3; tied with a at 1 (k = 9, 220 / 4096) it gives 2 / sqrt(6) = +0.82 and above it
    (k >= 10, 79 / 4096) +1, so the upper end is +0.82. Within a build: +1 or -1/3, mean +1/3, sd 0.70 over 12."""
    table = write_table(tmp_path, [{"a": (1.0, 1.0), "b": (2.0, 2.0 if k % 2 else -2.0)} for k in range(12)])
    out = reading(table, capsys)
    assert "| b > a > pcl | a > pcl > b | +0.00 [-0.33, +0.82] | +0.33 [-0.11, +0.78] |" in out
    assert "unresolved: its interval holds zero" in out


def test_fewer_builds_than_planned_is_an_interim_look(tmp_path, capsys):
    table = write_table(tmp_path, [{"a": (0.5, 0.01), "b": (1.0, 0.02)} for _ in range(11)])
    assert "interim look (11 of 12 builds): decides nothing" in reading(table, capsys)


def test_a_folder_without_builds_reports_are_named_and_refused(tmp_path, capsys):
    (tmp_path / "build1").mkdir()
    assert load_study_script("proxy_ranks").main(["--check", str(tmp_path)]) == 1
    assert "holds no build*/vs-pcl/compare.json" in capsys.readouterr().err


@pytest.mark.parametrize("lo, hi, expected", [(0.01, 1.0, "holds"), (-1.0, 0.0, "fails"), (0.0, 0.4, "unresolved"),
                                              (-0.2, 0.4, "unresolved")])
def test_the_reading_follows_the_interval_alone(lo, hi, expected):
    got = load_study_script("proxy_ranks").check_reading({"order": 0.0, "order_lo": lo, "order_hi": hi}, builds=12)
    assert got.startswith(expected)
