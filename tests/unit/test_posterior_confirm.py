"""studies/posterior_confirm.py: the registered reading of `posterior`'s confirmatory table, held to hand-computed
tables of synthetic build reports (the real table's reports are not read here)."""

from __future__ import annotations

import json
import math

import pytest

from helpers import load_study_script

confirm = load_study_script("posterior_confirm")


def write_build(root, k: int, diffs: dict[str, float], se: float = 0.5, methods=confirm.NEEDED,
                share: float | None = 0.6, candidate: str = "posterior") -> None:
    """A build's compare.json as `tracerl compare --baseline pcl` writes it, with the given differences in points, and
    its vs-grpo/compare.json with `candidate`'s share of `grpo`'s tokens (None: never reached)."""
    folder = root / f"build{k}"
    folder.mkdir(parents=True)
    rows = {m: {"success_before": 0.6, "success_after": 0.65 + diffs.get(m, 0.0) / 100, "tokens": 130_000 + k,
                "diff_at_equal_tokens": {"mean": diffs.get(m, 0.0) / 100, "se": 0.0 if m == "pcl" else se / 100,
                                         "lo": 0.0, "hi": 0.0}}  # the interval over questions is not read here
            for m in methods}
    (folder / "compare.json").write_text(json.dumps({"methods": rows, "weights": {"weights_sha256": f"{k:064x}"}}))
    (folder / "vs-grpo").mkdir()
    (folder / "vs-grpo" / "compare.json").write_text(json.dumps(
        {"methods": {candidate: {"share_of_baseline_tokens_ci": {"per_seed": [share]}}}}))


def alternating(centre: float, swing: float, k: int) -> float:
    return centre + (swing if k % 2 else -swing)


@pytest.fixture
def table(tmp_path):
    """24 builds: `posterior` - `pcl` = 1.0 +- 0.2, `knapsack_rl` - `pcl` = 1.0 -+ 0.2 (so `posterior` -
    `knapsack_rl` = +-0.4 about 0), `trace` - `pcl` = 0.5 +- 2.0; plus a build whose `trace` run has not finished."""
    for k in range(5, 29):
        write_build(tmp_path, k, {"posterior": alternating(1.0, 0.2, k), "knapsack_rl": alternating(1.0, -0.2, k),
                                  "trace": alternating(0.5, 2.0, k)})
    write_build(tmp_path, 29, {"posterior": 9.0, "knapsack_rl": 0.0}, methods=confirm.NEEDED[:-1])
    return tmp_path


def test_the_reading_holds_to_the_hand_computed_table(table):
    rows = confirm.read(table)
    assert sorted(rows) == list(range(5, 29))  # the unfinished build is left out
    primary = {item["pair"]: item for item in confirm.read_family(rows, confirm.PRIMARIES)}
    half = 2.069 / math.sqrt(24)  # t(23) at 97.5% over sqrt(n), times each sd below
    sd_posterior_pcl = 0.2 * math.sqrt(24 / 23)
    first = primary[("posterior", "pcl")]
    assert first["est"].mean == pytest.approx(1.0)
    assert first["est"].hi - first["est"].mean == pytest.approx(half * sd_posterior_pcl, rel=1e-3)
    assert first["p_holm"] == pytest.approx(2 * first["est"].p_value) and first["verdict"] == "established"
    second = primary[("posterior", "knapsack_rl")]
    assert second["est"].mean == pytest.approx(0.0, abs=1e-12)
    assert second["est"].hi == pytest.approx(half * 0.4 * math.sqrt(24 / 23), rel=1e-3)  # 0.17 < 0.5
    assert second["p_holm"] == pytest.approx(1.0) and second["verdict"] == "refuted"
    assert second["question_se"] == pytest.approx(math.hypot(0.5, 0.5))  # two differences read against one pcl
    trace, stage2, over_grpo = confirm.read_family(rows, confirm.SECONDARY)  # grpo and trace-root-only at 0 here
    assert (trace["est"].lo, trace["est"].hi) == pytest.approx((0.5 - half * 2.0 * math.sqrt(24 / 23),
                                                                 0.5 + half * 2.0 * math.sqrt(24 / 23)), rel=1e-3)
    assert trace["verdict"] == "unresolved" and trace["question_se"] == pytest.approx(0.5)
    assert stage2["p_holm"] == pytest.approx(min(1.0, 2 * stage2["est"].p_value))  # the second of three by p
    assert over_grpo["p_holm"] == pytest.approx(3 * over_grpo["est"].p_value) and over_grpo["verdict"] == "established"
    assert confirm.goal(rows) == {"builds": 24, "median": 0.6, "lo": 0.6, "hi": 0.6, "met": True,
                                  "per_build": [0.6] * 24}


@pytest.mark.parametrize("shares, met", [([0.75] * 24, False), ([0.5] * 12 + [None] * 12, False),
                                         ([0.65] * 20 + [None] * 4, True)])
def test_the_goal_is_the_median_share_below_70_with_its_upper_end_below_100(tmp_path, shares, met):
    """A median above 70% misses; half the builds never reaching puts the median's upper end at infinity; 4 of 24 never
    reaching leaves the median at 65%, its interval finite."""
    for k, share in enumerate(shares):
        write_build(tmp_path, k, {}, share=share)
    assert confirm.goal(confirm.read(tmp_path))["met"] is met


@pytest.mark.parametrize("mean, hi, p, expected", [
    (+0.8, +1.2, 0.049, "established"), (-0.8, -0.4, 0.01, "established, against"),
    (+0.1, +0.49, 0.30, "refuted"), (+0.1, +0.50, 0.30, "unresolved"), (+0.8, +1.6, 0.051, "unresolved")])
def test_the_verdict_follows_the_registered_rule(mean, hi, p, expected):
    assert confirm.verdict(mean, hi, p) == expected


def test_fewer_builds_than_planned_read_as_an_interim_look(table, tmp_path, capsys):
    for k in range(5, 10):
        (table / f"build{k}" / "compare.json").unlink()
    out = tmp_path / "primary.md"
    assert confirm.main([str(table), "--out", str(out)]) == 0
    text = out.read_text()
    assert "19 of the 24 planned" in text and "interim look" in text
    assert "established" not in text and "refuted" not in text
    assert capsys.readouterr().out == text


def test_a_table_with_under_two_finished_builds_says_so(tmp_path, capsys):
    write_build(tmp_path, 5, {"posterior": 1.0})
    assert confirm.main([str(tmp_path)]) == 1
    assert "needs two" in capsys.readouterr().err


def test_the_root_only_design_reads_its_own_families_and_goal(tmp_path, capsys):
    """`trace-root-only`'s table (its section of the plan): 24 builds (29-52) of four methods; `trace-root-only` -
    `pcl` = 0.6 +- 0.1 and `knapsack_rl` - `pcl` = 0.2 -+ 0.1, so `trace-root-only` - `knapsack_rl` = 0.4 +- 0.2, both
    established; the secondary `trace-root-only` - `grpo` (grpo at 0) = 0.6 +- 0.1; the goal from its own share; a
    build without its `grpo` run is left out."""
    design = confirm.DESIGNS["root-only"]
    for k in range(29, 53):
        diffs = {"trace-root-only": alternating(0.6, 0.1, k), "knapsack_rl": alternating(0.2, -0.1, k)}
        write_build(tmp_path, k, diffs, methods=design.needed, share=0.65, candidate="trace-root-only")
    write_build(tmp_path, 53, {"trace-root-only": 9.0}, methods=design.needed[:-1], candidate="trace-root-only")
    rows = confirm.read(tmp_path, design)
    assert list(rows) == list(range(29, 53))
    over_pcl, over_knapsack = confirm.read_family(rows, design.primaries)
    assert over_pcl["est"].mean == pytest.approx(0.6) and over_knapsack["est"].mean == pytest.approx(0.4)
    assert over_pcl["verdict"] == over_knapsack["verdict"] == "established"
    (over_grpo,) = confirm.read_family(rows, design.secondary)
    assert over_grpo["est"].mean == pytest.approx(0.6) and over_grpo["p_holm"] == over_grpo["est"].p_value
    assert confirm.goal(rows)["median"] == pytest.approx(0.65) and confirm.goal(rows)["met"]
    assert confirm.main([str(tmp_path), "--design", "root-only"]) == 0
    text = capsys.readouterr().out
    assert "24 of the 24 planned" in text and "`trace-root-only`'s share" in text and "`posterior`" not in text


def test_builds_on_two_machines_are_also_read_per_machine_without_changing_a_reading(tmp_path, capsys):
    """Amendment 17: builds 29-40 on machine `aaaa` read `trace-root-only` - `pcl` = 1.0 +- 0.2, builds 41-52 on
    `bbbb` 0.2 +- 0.2 (alternating): each machine's mean and t interval, Welch's difference between them, and the
    registered table above it unchanged; a build whose runs name two machines is in
    no group; one machine adds nothing."""
    design = confirm.DESIGNS["root-only"]
    for k in range(29, 53):
        write_build(tmp_path, k, {"trace-root-only": alternating(1.0 if k <= 40 else 0.2, 0.2, k)},
                    methods=design.needed, candidate="trace-root-only")
        for i, m in enumerate(design.needed):
            (tmp_path / f"build{k}" / f"{m}-seed0").mkdir()
            where = "aaaa" if k <= 40 else ("bbbb" if k < 52 or i else "aaaa")  # build 52: its runs disagree
            saved = tmp_path / f"build{k}" / f"{m}-seed0" / "saved_on.json"
            saved.write_text(json.dumps({"cpu_flags_sha256": where}))
    rows = confirm.read(tmp_path, design)
    machine = confirm.machines(tmp_path, rows, design.needed)
    assert sorted(machine) == list(range(29, 52)) and {machine[29], machine[51]} == {"aaaa", "bbbb"}
    lines = confirm.by_machine(rows, design, machine)
    (row,) = [line for line in lines if line.startswith("| `trace-root-only` - `pcl`")]
    sd = 0.2 * math.sqrt(12 / 11)  # aaaa: 12 builds; bbbb: 11 (not build 52), mean 0.2 + 0.2/11 (six odd builds)
    half_a = 2.201 * sd / math.sqrt(12)
    assert f"+1.00 [{1.0 - half_a:+.2f}, {1.0 + half_a:+.2f}]" in row
    diff, lo, hi = confirm.welch([alternating(1.0, 0.2, k) for k in range(29, 41)],
                                 [alternating(0.2, 0.2, k) for k in range(41, 52)])
    assert diff == pytest.approx(0.8 - 0.2 / 11) and lo < diff < hi and f"{diff:+.2f} [{lo:+.2f}, {hi:+.2f}]" in row
    assert lines[1].endswith("not in a group, as its runs name no one machine: build 52.")
    assert confirm.by_machine(rows, design, {k: "aaaa" for k in rows}) == []
    assert confirm.main([str(tmp_path), "--design", "root-only"]) == 0
    text = capsys.readouterr().out
    assert "By machine" in text and text.index("The goal") < text.index("By machine")


def test_welch_matches_a_hand_computed_interval():
    """a = (1, 2, 3), b = (0, 0, 1, 1): variances of the means 1/3 and 1/12, dof (5/12)^2 / ((1/3)^2/2 + (1/12)^2/3)
    = 2.97 -> 2, t(2) = 4.303."""
    diff, lo, hi = confirm.welch([1.0, 2.0, 3.0], [0.0, 0.0, 1.0, 1.0])
    assert diff == pytest.approx(1.5) and hi - diff == pytest.approx(4.303 * math.sqrt(5 / 12), rel=1e-3)
    assert math.isnan(confirm.welch([1.0], [0.0, 1.0])[1])


PILOT = confirm.DESIGNS["funcall-pilot"]


def pilot_table(root, trace_swing: float, knapsack_swing: float) -> None:
    """Function calling's pilot, builds 101-106: `trace` - `pcl` = 0.5 +- trace_swing and `knapsack_rl` - `pcl` =
    0 -+ knapsack_swing, alternating (so `trace` - `knapsack_rl` = 0.5 +- (trace_swing + knapsack_swing))."""
    for k in range(101, 107):
        diffs = {"trace": alternating(0.5, trace_swing, k), "knapsack_rl": alternating(0.0, -knapsack_swing, k),
                 "grpo": -0.3, "trace-root-only": 0.2}
        write_build(root, k, diffs, methods=PILOT.needed, candidate="trace")


def test_the_function_calling_pilot_reads_no_question_and_sizes_the_count(tmp_path, capsys):
    """The spreads over six builds: `trace` - `pcl` 0.1 sqrt(6/5) = 0.110, `trace` - `knapsack_rl` 0.5 sqrt(6/5) =
    0.548, the larger. 80% power for +0.5 at level 0.025 at sd 0.548: the normal approximation gives
    ((2.241 + 0.842) x 0.548 / 0.5)^2 = 11.4 builds, Student's t a few more."""
    pilot_table(tmp_path, 0.1, 0.4)
    rows = confirm.read(tmp_path, PILOT)
    count = confirm.pilot_count(rows, PILOT)
    assert count["sds"][("trace", "pcl")] == pytest.approx(0.1 * math.sqrt(6 / 5))
    assert count["sd"] == pytest.approx(0.5 * math.sqrt(6 / 5))
    assert 12 <= count["n"] <= 15 and count["builds"] == count["n"]
    assert count["n"] == confirm.power.seeds_needed(0.5, count["sd"], 0.8, 0.025, max_seeds=24)
    assert count["power"][0.5] >= 0.8 > confirm.power.power(0.5, count["sd"], count["n"] - 1, 0.025)
    assert confirm.main([str(tmp_path), "--design", "funcall-pilot"]) == 0
    out = capsys.readouterr().out
    assert "**A pilot: it reads no question" in out and "interim" not in out
    assert "| primary | `trace` - `pcl` | +0.50 [" in out and "| pilot |" in out
    assert not any(word in out for word in ("established", "refuted", "unresolved", "The goal"))
    assert f"so B = {count['n']} (at least 6, at most 24)" in out


@pytest.mark.parametrize("trace_swing, knapsack_swing, builds, beyond", [(0.01, 0.01, 6, False), (3.0, 3.0, 24, True)])
def test_the_pilot_count_is_held_between_its_floor_and_its_cap(tmp_path, capsys, trace_swing, knapsack_swing, builds,
                                                               beyond):
    """A spread of 0.02 sqrt(6/5) needs 2-3 builds, so the floor, 6; one of 6 sqrt(6/5) more than 24, so the cap."""
    pilot_table(tmp_path, trace_swing, knapsack_swing)
    count = confirm.pilot_count(confirm.read(tmp_path, PILOT), PILOT)
    assert count["builds"] == builds and (count["n"] is None) == beyond
    assert confirm.main([str(tmp_path), "--design", "funcall-pilot"]) == 0
    assert ("more than 24 builds" in capsys.readouterr().out) == beyond


def test_function_callings_table_over_builds_reads_its_families_by_the_rule_without_a_share(tmp_path, capsys):
    """24 builds (B, from the pilot): `trace` - `pcl` 1.0 +- 0.2 (established), `knapsack_rl` - `pcl` 1.0 -+ 0.2, so
    `trace` - `knapsack_rl` 0 +- 0.4, whose upper end 2.069 x 0.4 sqrt(24/23) / sqrt(24) = 0.17 lies below +0.5
    (refuted); no token share is read (two evaluations); 23 builds are an interim look."""
    design = confirm.DESIGNS["funcall"]
    assert design.planned_builds == 24 and not design.share and not design.pilot
    for k in range(1, 25):
        write_build(tmp_path, k, {"trace": alternating(1.0, 0.2, k), "knapsack_rl": alternating(1.0, -0.2, k),
                                  "grpo": -0.5, "trace-root-only": 0.5}, methods=design.needed, candidate="trace")
    assert confirm.main([str(tmp_path), "--design", "funcall"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| primary |")}
    assert "| +1.00 [" in lines["`trace` - `pcl`"] and "| established | 0.20 |" in lines["`trace` - `pcl`"]
    assert "| +0.00 [-0.17, +0.17] |" in lines["`trace` - `knapsack_rl`"]
    assert "| refuted | 0.41 |" in lines["`trace` - `knapsack_rl`"]
    assert "The goal" not in out and "pilot" not in out and "interim" not in out
    rows = confirm.read(tmp_path, design)
    del rows[24]
    assert "**An interim look: it decides nothing.**" in confirm.to_markdown(rows, design)
