"""studies/same_report.py: a later tree's report must hold every number of the frozen tree's report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "studies" / "same_report.py"


@pytest.fixture(scope="module")
def same_report():
    spec = importlib.util.spec_from_file_location("same_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OLD = {"seeds": [0, 1], "methods": {"trace": {"diff": {"mean": 0.0123, "lo": -0.011737190311086764, "p": 0.2},
                                              "share": None, "flag": True}}}


def test_added_fields_and_float_rounding_pass(same_report):
    new = json.loads(json.dumps(OLD))
    new["methods"]["trace"]["diff"]["lo"] = -0.011737190311086762  # the last bits of a float
    new["methods"]["trace"]["signal_vs_baseline"] = {"mean": 0.1}
    mismatches, added = same_report.differences(OLD, new)
    assert mismatches == [] and added == ["/methods/trace/signal_vs_baseline"]


@pytest.mark.parametrize("change, where", [
    (lambda r: r["methods"]["trace"]["diff"].update(mean=0.0124), "/methods/trace/diff/mean"),  # another reading
    (lambda r: r["methods"]["trace"]["diff"].pop("p"), "/methods/trace/diff/p: missing"),
    (lambda r: r.update(seeds=[0, 1, 2]), "/seeds: 2 items, now 3"),
    (lambda r: r["methods"]["trace"].update(share=0.5), "/methods/trace/share"),
    (lambda r: r["methods"]["trace"].update(flag=1), "/methods/trace/flag"),  # a bool is not the number 1
])
def test_a_changed_or_missing_value_is_named(same_report, change, where):
    new = json.loads(json.dumps(OLD))
    change(new)
    mismatches, _ = same_report.differences(OLD, new)
    assert len(mismatches) == 1 and mismatches[0].startswith(where)


def test_the_command_exits_by_its_finding(same_report, tmp_path, capsys):
    old, new, bad = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "bad.json"
    old.write_text(json.dumps(OLD))
    new.write_text(json.dumps({**OLD, "median": 1.0}))
    bad.write_text("{not json")
    assert same_report.main([str(old), str(new)]) == 0 and "same: 0 field(s)" in capsys.readouterr().out
    assert same_report.main([str(new), str(old)]) == 1 and "/median: missing" in capsys.readouterr().out
    assert same_report.main([str(old), str(bad)]) == 2
