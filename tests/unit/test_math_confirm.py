"""studies/math_confirm.py and studies/math_confirm.sh: the registered reading of math's confirmatory table over builds,
held to hand-computed tables of synthetic build reports (the real table's reports are not read here)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from helpers import load_study_script

confirm = load_study_script("math_confirm")
ROOT = Path(__file__).resolve().parents[2]


def write_build(root, k: int, minus_grpo: dict[str, float], minus_pcl: dict[str, float], se: float = 0.5,
                methods=confirm.METHODS, reports=("grpo", "pcl")) -> None:
    """Build k's two reports as `tracerl compare` writes them (differences in points against `grpo` and against
    `pcl`, each with its paired standard error over questions)."""
    for base, diffs in (("grpo", minus_grpo), ("pcl", minus_pcl)):
        if base not in reports:
            continue
        rows = {m: {"success_before": 0.4, "success_after": 0.45 + diffs.get(m, 0.0) / 100, "tokens": 190_000 + k,
                    "diff_at_equal_tokens": {"mean": diffs.get(m, 0.0) / 100, "se": 0.0 if m == base else se / 100,
                                             "lo": 0.0, "hi": 0.0}}
                for m in methods}
        folder = root / f"build{k}" / f"vs-{base}"
        folder.mkdir(parents=True)
        (folder / "compare.json").write_text(json.dumps({"methods": rows,
                                                         "weights": {"weights_sha256": f"{k}" * 64}}))


def swing(centre: float, width: float, k: int) -> float:
    return centre + (width if k % 2 else -width)


def test_the_reading_holds_to_the_hand_computed_table(tmp_path, monkeypatch):
    """Six builds: `trace` - `grpo` = 1.0 +- 0.2 (p far below 0.025: established without function calling's p);
    `posterior` - `pcl` = 0.3 +- 0.1 and `knapsack_rl` - `pcl` = 0.3 -+ 0.1, so `posterior` - `knapsack_rl` =
    +-0.2 about 0, its interval below +0.5: refuted; (c) `trace-root-only` - `pcl` = 0.8 +- 0.1, so
    `trace-root-only` - `knapsack_rl` = 0.5 +- 0.2, both established; plus a build whose `trace-root-only` has not
    finished and one with only its report against `grpo` written, both left out."""
    for k in range(1, 7):
        write_build(tmp_path, k, {"trace": swing(1.0, 0.2, k)},
                    {"posterior": swing(0.3, 0.1, k), "knapsack_rl": swing(0.3, -0.1, k), "trace": 2.0,
                     "trace-root-only": swing(0.8, 0.1, k)})
    write_build(tmp_path, 7, {"trace": 9.0}, {"posterior": 9.0}, methods=confirm.METHODS[:-1])
    write_build(tmp_path, 8, {"trace": 9.0}, {"posterior": 9.0}, reports=("grpo",))
    tables = confirm.read(tmp_path)
    assert list(tables["grpo"]) == list(tables["pcl"]) == [1, 2, 3, 4, 5, 6]
    half = 2.571 / math.sqrt(6)  # t(5) at 97.5% over sqrt(n)
    item = confirm.registered(tables["grpo"], None)
    assert item["est"].mean == pytest.approx(1.0)
    assert item["est"].hi - 1.0 == pytest.approx(half * 0.2 * math.sqrt(6 / 5), rel=1e-3)
    assert item["p_holm_bounds"] == pytest.approx((item["est"].p_value, 2 * item["est"].p_value))
    assert item["verdict"] == "established" and item["question_se"] == pytest.approx(0.5)
    over_pcl, over_knapsack = confirm.posterior_confirm.read_family(tables["pcl"], confirm.PRIMARIES)
    assert over_pcl["est"].mean == pytest.approx(0.3) and over_pcl["verdict"] == "established"
    assert over_knapsack["est"].mean == pytest.approx(0.0, abs=1e-12)
    assert over_knapsack["est"].hi == pytest.approx(half * 0.2 * math.sqrt(6 / 5), rel=1e-3)
    assert over_knapsack["verdict"] == "refuted" and over_knapsack["question_se"] == pytest.approx(math.hypot(.5, .5))
    root_over_pcl, root_over_knapsack = confirm.posterior_confirm.read_family(tables["pcl"], confirm.ROOT_ONLY)
    assert root_over_pcl["est"].mean == pytest.approx(0.8) and root_over_knapsack["est"].mean == pytest.approx(0.5)
    assert root_over_pcl["verdict"] == root_over_knapsack["verdict"] == "established"
    monkeypatch.setattr(confirm, "PLANNED_BUILDS", None)  # before amendment 13's B was appended
    text = confirm.to_markdown(tables)
    assert "of the planned not yet fixed" in text and "**An interim look: it decides nothing.**" in text
    assert "| interim |" in text and "| established |" not in text  # no verdict before B is fixed
    monkeypatch.setattr(confirm, "PLANNED_BUILDS", 6)
    text = confirm.to_markdown(tables)
    assert "interim" not in text and "| `trace` - `grpo` | `grpo`'s final tokens | +1.00 [" in text
    assert "| (c) | `trace-root-only` - `knapsack_rl` | `pcl`'s final tokens | +0.50 [" in text
    assert "| 3 | `333333333333` | 40.0% | `posterior` | 45.4% | 190,003 | +0.00 (0.50) | +0.40 (0.50) |" in text


@pytest.fixture
def near_the_line(tmp_path):
    """Six builds of `trace` - `grpo` = 1.0 +- 0.81: t = 1 / (0.81 sqrt(6/5) / sqrt(6)) = 2.76 on 5 degrees of
    freedom, p about 0.04: significant alone, not after doubling."""
    for k in range(1, 7):
        write_build(tmp_path, k, {"trace": swing(1.0, 0.81, k)}, {})
    rows = confirm.read(tmp_path)["grpo"]
    p = confirm.posterior_confirm.read_family(rows, confirm.REGISTERED)[0]["est"].p_value
    assert 0.025 < p <= 0.05  # the case this fixture is for
    return rows, p


def test_a_registered_p_between_the_holm_bounds_waits_on_function_callings(near_the_line):
    rows, p = near_the_line
    assert confirm.registered(rows, None)["verdict"] == "waits on function calling's p"
    smaller = confirm.registered(rows, funcall_p=0.001)  # function calling's is rejected first: math's at level 0.05
    assert smaller["p_holm_bounds"] == pytest.approx((p, p)) and smaller["verdict"] == "established"
    larger = confirm.registered(rows, funcall_p=0.5)  # math's is the smaller: held to 0.025
    assert larger["p_holm_bounds"] == pytest.approx((2 * p, 2 * p)) and larger["verdict"] == "unresolved"


def test_the_reader_refuses_fewer_than_two_builds_and_a_p_outside_0_1(tmp_path, capsys):
    write_build(tmp_path, 1, {"trace": 1.0}, {})
    assert confirm.main([str(tmp_path)]) == 1
    assert "an interval over builds needs two" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        confirm.main([str(tmp_path), "--funcall-p", "1.5"])
    assert "a p-value lies in [0, 1]" in capsys.readouterr().err


def test_the_runner_refuses_an_evaluation_below_the_registered_floor_before_it_builds_anything(tmp_path):
    table = ROOT / "runs" / "math-confirm"  # a checkout training the table has runs here already: none may change
    before = sorted(table.rglob("*")) if table.exists() else None
    done = subprocess.run(["bash", str(ROOT / "studies" / "math_confirm.sh"), "1", "256", "4"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "below amendment 13's floor of 512 questions x 4 samples" in done.stderr
    assert (sorted(table.rglob("*")) if table.exists() else None) == before


def test_builds_on_two_machines_are_also_read_per_machine_without_changing_a_reading(tmp_path, capsys):
    """Amendment 20: builds 1-3 on machine `aaaa`, 4-6 on `bbbb`, `trace` - `grpo` = 1.0 +- 0.2 alternating (so
    1.2, 0.8, 1.2 and 0.8, 1.2, 0.8): each machine's mean and t interval, Welch's difference between them (4
    degrees of freedom: equal variances and counts), for every difference of both reports; the registered table
    above it unchanged; one machine adds nothing."""
    for k in range(1, 7):
        write_build(tmp_path, k, {"trace": swing(1.0, 0.2, k)}, {"posterior": 0.5, "trace-root-only": 0.1 * k})
        for m in confirm.METHODS:
            (tmp_path / f"build{k}" / f"{m}-seed0").mkdir()
            (tmp_path / f"build{k}" / f"{m}-seed0" / "saved_on.json").write_text(
                json.dumps({"cpu_flags_sha256": "aaaa" if k <= 3 else "bbbb"}))
    tables = confirm.read(tmp_path)
    machine = confirm.posterior_confirm.machines(tmp_path, tables["pcl"], confirm.METHODS)
    assert machine == {1: "aaaa", 2: "aaaa", 3: "aaaa", 4: "bbbb", 5: "bbbb", 6: "bbbb"}
    lines = confirm.by_machine(tables, machine)
    assert lines[1].startswith("By machine (amendment 20; descriptive") and "`aaaa` (3 builds) | `bbbb` (3" in lines[3]
    (row,) = [line for line in lines if line.startswith("| `trace` - `grpo` at `grpo`'s final tokens |")]
    sd = math.sqrt((2 * (0.4 / 3) ** 2 + (0.8 / 3) ** 2) / 2)  # either machine's three values about its mean
    half = 4.303 * sd / math.sqrt(3)  # t(2)
    assert f"+1.07 [{3.2 / 3 - half:+.2f}, {3.2 / 3 + half:+.2f}]" in row
    assert f"+0.93 [{2.8 / 3 - half:+.2f}, {2.8 / 3 + half:+.2f}]" in row
    welch_half = 2.776 * sd * math.sqrt(2 / 3)  # t(4)
    assert f"+0.13 [{0.4 / 3 - welch_half:+.2f}, {0.4 / 3 + welch_half:+.2f}]" in row
    (row,) = [line for line in lines if line.startswith("| `trace-root-only` - `pcl` at `pcl`'s final tokens |")]
    assert "+0.20 [" in row and "+0.50 [" in row
    assert row.endswith("| -0.30 [-0.53, -0.07] |")  # 2.776 * sqrt(2 * 0.01 / 3)
    assert len([line for line in lines if line.startswith("| `")]) == 6  # (a), (b)'s two, (b)'s secondary, (c)'s two
    assert lines[-1] == "Builds by machine: `aaaa`: 1, 2, 3; `bbbb`: 4, 5, 6."
    assert confirm.by_machine(tables, {k: "aaaa" for k in machine}) == []
    assert confirm.main([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text == confirm.to_markdown(tables, None, machine) and text.index("Per build") < text.index("By machine")
    assert confirm.to_markdown(tables).split("\n") == text.split("\n")[:-len(lines) - 1] + [""]


def test_the_reader_prints_and_writes_the_same_reading(tmp_path, capsys):
    for k in (1, 2, 3):
        write_build(tmp_path, k, {"trace": swing(1.0, 0.5, k)}, {"posterior": 0.5})
    out = tmp_path / "primary.md"
    assert confirm.main([str(tmp_path), "--funcall-p", "0.01", "--out", str(out)]) == 0
    assert capsys.readouterr().out == out.read_text() == confirm.to_markdown(confirm.read(tmp_path), 0.01)
    assert "bounded" not in out.read_text()  # function calling's p given: (a)'s Holm p is a value
