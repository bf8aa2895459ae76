"""studies/: each registered table's figures regenerated from what is kept, by the code that wrote them.

- The headroom testbed's confirmatory table (`studies/preregistered-headroom/`): its 123 runs restored from
  `runs.tar.xz`, its reports written again by `tracerl compare --report-only` with the command each report records,
  against `grpo` and against `pcl`: every field of the committed compare.json is the same in the new one
  (`same_report.differences`), the primary differences and intervals its README quotes first among them; then
  `tracerl verdict` writes the committed primary.md and primary.json from the new reports, and
  `preregistered_facts.py` the committed facts.md. The per-seed plots, which are not kept, are written again.
- Both read testbeds: `tracerl verdict` on the committed reports writes the committed primary.md (the default
  testbed's runs were not kept, so its figures start from its reports).
- The seed counts the plan registered ("Seed counts", amendments 2 and 6), by `power.py` from the reports they were
  read from.
- Function calling's confirmatory table (`studies/domain-funcall-confirmatory/`): its 267 runs restored, its two
  reports written again field for field, and `funcall_confirm.py` writes the committed primary.md from them.
- Every archive holds the whole, finished seeds its README lists, all from the one build kept with it (where one
  is), saved on the machine it names.
- Every archive is what `run_records.pack` makes of its own contents: packed again, the same bytes; those of the
  tables over builds (`posterior`'s, `trace-root-only`'s, function calling's and its pilot, math's kept so far), one
  per build, each hold that build's finished runs and no build; each read table's reading (`primary.md`, the pilot's
  `pilot.md`) comes back from its builds' kept reports by `posterior_confirm.py`.
- A table over builds is read from its archives alone: `REPORTS=1 posterior_confirm.sh` on one of function calling's
  pilot builds, in an empty checkout, writes the bytes of its committed reports.
- The proxy-rank table (`proxy-ranks/ranks.md`) from the reports, by `proxy_ranks.py`; the posterior screen's table
  (`posterior-screen/screen.md`) from its five builds' reports, by `posterior_screen.py`.
- Every kept report of the current format shows the intervals over seeds that today's statistics compute from its
  per-seed values (`restate_reports.py --check`).

Tables that cannot be regenerated, and why, are listed in studies/README.md ("What is kept"). Slow
(tests/conftest.py): the reports' bootstraps over 41 and 89 seeds and the archives' compression take minutes on
the 2-core machine.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import load_study_script
from tracerl.cli import main as tracerl

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies"
HEADROOM = STUDIES / "preregistered-headroom"
FUNCALL = STUDIES / "domain-funcall-confirmatory"
PLANNED_SEEDS = {"preregistered-default": 30, "preregistered-headroom": 41}  # the plan, amendment 2
LABELS = ["grpo", "pcl", "trace"]
MACHINE = "1ddebed04610ae65"  # the CPU flags hash of the machine every kept run trained on (the READMEs)


def recorded_command(report: Path) -> list[str]:
    """The `tracerl compare` arguments a compare.md records on its last line."""
    line = report.read_text().rstrip("\n").splitlines()[-1]
    assert line.startswith("Command: `tracerl compare "), f"{report} does not end with the command that wrote it"
    return shlex.split(line[len("Command: `tracerl "):-1])


def reports_again(kept: Path, base: Path, runs_planned: int) -> tuple[Path, Path]:
    """kept's two reports (against its baseline, and in vs-pcl/ against `pcl`) written again from its archive by the
    `tracerl compare --report-only` commands they record, laid out as kept (a folder of the same name under base,
    with the main report's plots); returns (that folder, the restored runs)."""
    runs, table = base / "runs", base / kept.name
    restored = load_study_script("run_records").restore(kept / "runs.tar.xz", runs)
    assert len(restored) == runs_planned, restored
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the recorded --config is relative to the repository
        for sub in ("", "vs-pcl"):
            (table / sub).mkdir(parents=True, exist_ok=True)
            status = tracerl([*recorded_command(kept / sub / "compare.md"), "--out", str(runs), "--report-only"])
            assert status == 0
            for path in [runs / "compare.md", runs / "compare.json", *(runs.glob("*.png") if not sub else [])]:
                shutil.copy2(path, table / sub / path.name)
    return table, runs


def same_reports(kept: Path, again: Path) -> None:
    """Every field of kept's two compare.json is the same in the reports written again, and so is each compare.md."""
    same_report = load_study_script("same_report")
    for name in ("compare.json", "vs-pcl/compare.json"):
        mismatches, _ = same_report.differences(json.loads((kept / name).read_text()),
                                                json.loads((again / name).read_text()))
        assert mismatches == [], f"{name}: the report over the archive's runs differs from the committed one"
        markdown = name.replace(".json", ".md")
        assert (again / markdown).read_text() == (kept / markdown).read_text(), markdown


@pytest.fixture(scope="module")
def headroom(tmp_path_factory):
    """The headroom table's reports and verdict written again from its archive; returns (that folder, the restored
    runs)."""
    table, runs = reports_again(HEADROOM, tmp_path_factory.mktemp("headroom"), 3 * PLANNED_SEEDS[HEADROOM.name])
    assert tracerl(["verdict", str(table), str(table / "vs-pcl"), "--planned-seeds",
                    str(PLANNED_SEEDS[HEADROOM.name]), "--out", str(table)]) == 0
    return table, runs


def test_the_headroom_tables_primary_differences_come_back_from_its_archive(headroom):
    table, _ = headroom
    quoted = {("compare.json", "trace"): "+0.61 [+0.43, +0.80]", ("compare.json", "pcl"): "+0.45 [+0.21, +0.69]",
              ("vs-pcl/compare.json", "trace"): "+0.15 [-0.05, +0.36]"}  # as the README and primary.md state them
    for (name, method), figure in quoted.items():
        committed = json.loads((HEADROOM / name).read_text())["methods"][method]["diff_at_equal_tokens"]
        again = json.loads((table / name).read_text())["methods"][method]["diff_at_equal_tokens"]
        read = f"{100 * again['mean']:+.2f} [{100 * again['lo']:+.2f}, {100 * again['hi']:+.2f}]"
        assert read == figure, f"{name}, {method}: the archive's runs now read {read}, the table says {figure}"
        for key in ("mean", "lo", "hi", "boot_lo", "boot_hi", "p_holm", "per_seed"):
            assert again[key] == pytest.approx(committed[key], rel=1e-9, abs=1e-15), f"{name}, {method}: {key}"


def test_the_headroom_reports_come_back_field_for_field(headroom):
    table, _ = headroom
    same_reports(HEADROOM, table)
    for name in ("primary.md", "primary.json"):
        assert (table / name).read_text() == (HEADROOM / name).read_text(), f"{name}: the verdict reads otherwise"
    assert load_study_script("preregistered_facts").facts(table) == (HEADROOM / "facts.md").read_text()
    for name in ("accuracy_vs_tokens_per_seed.png", "accuracy_vs_units_per_seed.png"):  # dropped, written again
        assert (table / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_function_callings_confirmatory_reading_comes_back_from_its_archive(tmp_path, capsys):
    """Its two reports written again from runs.tar.xz, field for field, and `funcall_confirm.py` on them writes the
    committed primary.md (amendment 18), whose three differences its README quotes."""
    table, _ = reports_again(FUNCALL, tmp_path, 3 * 89)
    same_reports(FUNCALL, table)
    out = tmp_path / "primary.md"
    assert load_study_script("funcall_confirm").main([str(table), "--out", str(out)]) == 0
    capsys.readouterr()
    assert out.read_text() == (FUNCALL / "primary.md").read_text()
    for figure in ("+0.55 [+0.36, +0.75]", "+0.21 [+0.01, +0.41]", "+0.32 [+0.09, +0.54]"):
        assert figure in out.read_text() and figure in (FUNCALL / "README.md").read_text(), figure


def test_the_evaluation_design_comes_back_from_the_archive(headroom, tmp_path, monkeypatch):
    """studies/eval-design-headroom/design.md, written again from the restored runs by the command its README
    gives."""
    _, runs = headroom
    out = tmp_path / "design.md"
    monkeypatch.setattr("sys.argv", ["eval_schedule.py", str(runs), "--curve-steps", "0,12", "--var-build", "0.64",
                                     "--build-seconds", "1021", "--title", "Evaluation design from the headroom "
                                     "table's runs (preregistered-headroom/runs.tar.xz)", "--out", str(out)])
    load_study_script("eval_schedule").main()
    assert out.read_text() == (ROOT / "studies" / "eval-design-headroom" / "design.md").read_text()


def test_the_evaluation_noise_of_a_reading_is_what_its_samples_say():
    """Two evaluations read halfway between them: the noise is the weights squared times each question's
    x (1 - x) / (k - 1), plus the baseline's, over Q^2."""
    schedule = load_study_script("eval_schedule")
    method = [{"step": 0, "rollout/cum_tokens": 0, "eval/per_prompt": [0.5, 1.0]},
              {"step": 2, "rollout/cum_tokens": 100, "eval/per_prompt": [0.25, 0.75]}]
    baseline = [{"step": 2, "rollout/cum_tokens": 50, "eval/per_prompt": [0.0, 0.5]}]
    got = schedule.reading(method, baseline, "tokens", samples=4)
    assert got.steps == (0, 2)
    assert got.difference == pytest.approx(((0.375 - 0.0) + (0.875 - 0.5)) / 2)
    var = lambda x: x * (1 - x) / 3  # noqa: E731
    expected = (0.25 * (var(0.5) + var(1.0)) + 0.25 * (var(0.25) + var(0.75)) + var(0.0) + var(0.5)) / 4
    assert got.noise == pytest.approx(expected)


def test_every_kept_report_is_stated_by_todays_statistics(capsys):
    """Each report's intervals over seeds, computed again from its per-seed values, are the ones it shows (the
    headroom table's also come back from its runs: `test_the_headroom_reports_come_back_field_for_field`)."""
    assert load_study_script("restate_reports").main(["--check"]) == 0, capsys.readouterr().out


def test_the_proxy_ranks_come_back_from_the_reports(tmp_path, capsys):
    """studies/proxy-ranks/ranks.md, the table its README reads, is what proxy_ranks.py computes from the reports."""
    assert load_study_script("proxy_ranks").main(["--out", str(tmp_path / "ranks.md")]) == 0
    capsys.readouterr()
    assert (tmp_path / "ranks.md").read_text() == (STUDIES / "proxy-ranks" / "ranks.md").read_text()


def test_the_posterior_screen_comes_back_from_its_builds_reports(tmp_path, capsys):
    """studies/posterior-screen/screen.md is what posterior_screen.py reads from the five builds' kept reports."""
    folder = STUDIES / "posterior-screen"
    assert load_study_script("posterior_screen").main([str(folder), "--out", str(tmp_path / "screen.md")]) == 0
    capsys.readouterr()
    assert (tmp_path / "screen.md").read_text() == (folder / "screen.md").read_text()
    assert sorted(p.name for p in folder.glob("build*")) == [f"build{k}" for k in range(5)]


@pytest.mark.parametrize("name", sorted(PLANNED_SEEDS))
def test_each_read_testbeds_verdict_comes_back_from_its_reports(name, tmp_path, capsys):
    folder = STUDIES / name
    assert tracerl(["verdict", str(folder), str(folder / "vs-pcl"), "--planned-seeds", str(PLANNED_SEEDS[name]),
                    "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    for file in ("primary.md", "primary.json"):
        assert (tmp_path / file).read_text() == (folder / file).read_text(), f"{name}/{file}"


def test_the_registered_seed_counts_come_back_from_their_reports():
    """The plan's "Seed counts" table (from the 5-seed methods table, level 0.05 and 0.025, and 0.025 at 1.5 times
    the sd), amendment 2's 41 seeds (the headroom pilot, level 0.025) and amendment 6's 83 (the function-calling pilot,
    a +1 point effect at level 0.025)."""
    power = load_study_script("power")

    def per_seed(table: str) -> dict[str, tuple[float, float, int]]:
        out = {}
        for name, diffs in power.comparisons(json.loads((STUDIES / table / "compare.json").read_text())):
            out[name] = (float(diffs.mean()), float(diffs.std(ddof=1)), len(diffs))
        return out

    methods = per_seed("learning-gain-methods")
    for name, (level_05, level_025, wider) in {"trace - grpo": (13, 15, 31), "trace - pcl": (24, 29, 63),
                                               "pcl - grpo": (27, 32, 69)}.items():
        mean, sd, _ = methods[name]
        assert [power.seeds_needed(mean, sd, 0.8, 0.05), power.seeds_needed(mean, sd, 0.8, 0.025),
                power.seeds_needed(mean, 1.5 * sd, 0.8, 0.025)] == [level_05, level_025, wider], name
    mean, sd, n = methods["trace - grpo"]
    assert f"{power.power(mean, sd, n):.0%}" == "33%"
    pilot = per_seed("preregistered-headroom-pilot")
    assert max(power.seeds_needed(m, s, 0.8, 0.025) for m, s, _ in
               (pilot["trace - grpo"], pilot["trace - pcl"])) == 41
    _, sd, _ = per_seed("domain-funcall-equal-tokens")["trace - grpo"]
    assert f"{sd:.2f}" == "2.90" and power.seeds_needed(1.0, sd, 0.8, 0.025) == 83


SAMPLERS = ["grpo", "pcl", "dapo", "reinforce_ada", "speed", "pilot_commit", "knapsack_rl"]


SECOND_MACHINE = "6a93d771884cba54"  # another 2-core AMD EPYC (samplers-headroom, posterior-confirm, some others)
THIRD_MACHINE = "25fc08b1fed3d885"  # another, with AVX-512 (funcall-builds from build 10, amendment 20)
BUILD_MACHINES = {  # each build's machine, by table (amendment 17: a table over builds may span machines)
    "posterior-confirm": {k: SECOND_MACHINE for k in range(5, 29)},
    "root-only-confirm": {k: SECOND_MACHINE if k in (29, 31, 33) else MACHINE for k in range(29, 53)},
}
OVER_BUILDS = [("posterior-confirm", "posterior"), ("root-only-confirm", "root-only")]  # table, its design (read)
# math's builds kept so far (its README), of 1-12
BUILD_MACHINES["math-confirm"] = {1: MACHINE, 2: MACHINE, **{k: THIRD_MACHINE for k in range(3, 13)}}
BUILD_MACHINES["funcall-builds-pilot"] = {k: MACHINE for k in range(101, 107)}  # all six, read
# function calling over builds: all 24, read (builds 1-9 on one machine, 10-24 on another: amendment 20)
BUILD_MACHINES["funcall-builds"] = {k: MACHINE if k < 10 else THIRD_MACHINE for k in range(1, 25)}
KEPT_OVER_BUILDS = [*OVER_BUILDS, ("math-confirm", "math"), ("funcall-builds-pilot", "funcall-pilot"),
                    ("funcall-builds", "funcall")]  # and the tables still training


def design_methods(design: str) -> list[str]:
    """The methods every build of a table over builds trains (math's: `math_confirm.METHODS`)."""
    if design == "math":
        return list(load_study_script("math_confirm").METHODS)
    return list(load_study_script("posterior_confirm").DESIGNS[design].needed)


READ_OVER_BUILDS = [*((table, design, "primary.md") for table, design in OVER_BUILDS),
                    ("funcall-builds-pilot", "funcall-pilot", "pilot.md"),
                    ("funcall-builds", "funcall", "primary.md")]  # table, design, the file it reads to


@pytest.mark.parametrize("table, design, reading", READ_OVER_BUILDS)
def test_a_reading_over_builds_comes_back_from_its_builds_reports(table, design, reading, tmp_path, capsys):
    """studies/<table>/<reading> is what posterior_confirm.py reads from the builds' kept reports (each build's
    report against `pcl` and, in vs-grpo/, against `grpo`; where the builds span machines, each run's
    saved_on.json, which names its machine)."""
    folder = STUDIES / table / "reports"
    assert sorted(p.name for p in folder.glob("build*")) == sorted(f"build{k}" for k in BUILD_MACHINES[table])
    out = tmp_path / reading
    assert load_study_script("posterior_confirm").main([str(folder), "--design", design, "--out", str(out)]) == 0
    capsys.readouterr()
    assert out.read_text() == (STUDIES / table / reading).read_text()


def test_maths_reading_over_builds_comes_back_from_its_builds_reports(tmp_path, capsys):
    """studies/math-confirm/primary.md and proxy-check.md are what math_confirm.py (with function calling's p, as
    registered) and proxy_ranks.py --check (amendment 19) read from the 12 builds' kept reports."""
    folder = STUDIES / "math-confirm" / "reports"
    assert sorted(p.name for p in folder.glob("build*")) == sorted(f"build{k}" for k in BUILD_MACHINES["math-confirm"])
    out, check = tmp_path / "primary.md", tmp_path / "proxy-check.md"
    assert load_study_script("math_confirm").main(
        [str(folder), "--funcall-p", "2.151532680905177e-07", "--out", str(out)]) == 0
    assert load_study_script("proxy_ranks").main(["--check", str(folder), "--out", str(check)]) == 0
    capsys.readouterr()
    assert out.read_text() == (STUDIES / "math-confirm" / "primary.md").read_text()
    assert check.read_text() == (STUDIES / "math-confirm" / "proxy-check.md").read_text()


@pytest.mark.parametrize("table, design", KEPT_OVER_BUILDS)
def test_each_kept_build_of_a_table_over_builds_holds_its_finished_runs(table, design, tmp_path):
    """studies/<table>/build<k>.tar.xz (no success figure read here): one for each build `BUILD_MACHINES` lists, each
    seed 0 of the design's methods, finished on the machine it names, from one build whose weights no other kept
    build shares, no build kept, packing to its own bytes."""
    records = load_study_script("run_records")
    weights = {}
    archives = sorted((STUDIES / table).glob("build*.tar.xz"))
    assert sorted(a.name for a in archives) == sorted(f"build{k}.tar.xz" for k in BUILD_MACHINES[table])
    for archive in archives:
        folder = tmp_path / archive.name
        records.unpack(archive, folder)
        kept = records.whole_seeds(folder, design_methods(design))
        assert list(kept) == [0] and all(records.finished(run) for run in kept[0].values()), archive.name
        assert not (folder / records.POLICY).exists(), f"{archive.name} keeps a build"
        hashes = {records.starting_weights(run)[0] for run in kept[0].values()}
        assert len(hashes) == 1 and None not in hashes, f"{archive.name}: its runs start from {hashes}"
        weights[archive.name] = hashes.pop()
        saved = {json.loads((run / "saved_on.json").read_text())["cpu_flags_sha256"] for run in kept[0].values()}
        assert saved == {BUILD_MACHINES[table].get(int(archive.name[5:-7]))}, f"{archive.name} trained on {saved}"
        again = tmp_path / "again" / archive.name
        again.parent.mkdir(exist_ok=True)
        records.pack(folder, again)
        assert again.read_bytes() == archive.read_bytes(), f"{archive.name}: packing its own files gives other bytes"
    assert len(set(weights.values())) == len(weights), "two kept builds share their weights"


@pytest.mark.parametrize("table, seeds, weights, labels, machine", [
    ("preregistered-headroom", range(0, 41), "7d0c30370fb5", LABELS, MACHINE),
    ("domain-funcall-confirmatory", range(0, 89), "c1ad6c76e6b3", LABELS, MACHINE),
    ("domain-math-equal-tokens", range(100, 106), "eb0c145b449c", LABELS,  # 103, 104 on the machine of its README
     {100: MACHINE, 101: MACHINE, 102: MACHINE, 103: SECOND_MACHINE, 104: SECOND_MACHINE, 105: MACHINE}),
    ("samplers-headroom", range(0, 8), "f4c94567f6a7", SAMPLERS, SECOND_MACHINE),  # its README: where saved
], ids=["headroom", "funcall-confirmatory", "math-pilot", "samplers"])
def test_each_archive_holds_whole_finished_seeds_and_packs_to_its_own_bytes(table, seeds, weights, labels, machine,
                                                                            tmp_path):
    """No success figure is read here (the read tables' figures come back from their archives above)."""
    records = load_study_script("run_records")
    archive = STUDIES / table / "runs.tar.xz"
    folder = tmp_path / "runs"
    records.unpack(archive, folder)
    kept = records.whole_seeds(folder, labels)
    assert sorted(kept) == list(seeds), f"{table}: the archive holds seeds {sorted(kept)}"
    assert not [p.name for p in folder.iterdir() if p.name not in {d.name for r in kept.values()
                                                                    for d in r.values()} | {records.POLICY}]
    for seed, runs in kept.items():
        for run in runs.values():
            assert records.finished(run), f"{run.name} is not finished"
            assert records.starting_weights(run)[0].startswith(weights), f"{run.name} starts from other weights"
            where = machine[seed] if isinstance(machine, dict) else machine
            assert json.loads((run / "saved_on.json").read_text())["cpu_flags_sha256"] == where, run.name
    builds = list((folder / records.POLICY).glob("*/model/model.safetensors"))
    assert len(builds) == (0 if table == "preregistered-headroom" else 1), builds  # read: its build is not needed
    again = tmp_path / "again" / archive.name
    again.parent.mkdir()
    records.pack(folder, again)
    assert again.read_bytes() == archive.read_bytes(), f"{table}: packing its own files gives other bytes"


def test_a_builds_kept_reports_come_back_from_its_archive_alone(tmp_path):
    """`REPORTS=1 studies/posterior_confirm.sh`, the way a table over builds is read on any machine: build 101 of
    function calling's pilot restored from its archive into an empty checkout's runs/, its two reports written by
    `tracerl compare --report-only` as the lane wrote them, and what the reader reads of it kept under reports/:
    the same bytes as the committed reports/build101/ (which the lane wrote on the machine that trained it)."""
    table = "funcall-builds-pilot"
    (tmp_path / "studies" / table).mkdir(parents=True)
    for script in ("posterior_confirm.sh", "run_records.py"):
        shutil.copy2(STUDIES / script, tmp_path / "studies" / script)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copy2(STUDIES / table / "build101.tar.xz", tmp_path / "studies" / table / "build101.tar.xz")
    done = subprocess.run(["bash", str(tmp_path / "studies" / "posterior_confirm.sh"), "101"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "REPORTS": "1", "DESIGN": "funcall-pilot",
                                                      "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-2000:]
    again, kept = tmp_path / "studies" / table / "reports" / "build101", STUDIES / table / "reports" / "build101"
    files = sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file())
    assert sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file()) == files and len(files) == 9
    for name in files:
        assert (again / name).read_bytes() == (kept / name).read_bytes(), name
