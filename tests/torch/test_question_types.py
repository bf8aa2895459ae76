"""Question types for any task: a row's `extra_info["type"]` gives per-type held-out success (`eval`), regime shares
(`tracerl regime`) and a table in the run report, bounded in how many types and how long a name."""

import numpy as np

from tracerl.core.regime import regime_by_group
from tracerl.policy.evaluation import MAX_TYPES, success_by_type
from tracerl.report.run_report import type_table


def rows(types):
    return [{"extra_info": {} if t is None else {"type": t}} for t in types]


def test_success_by_type_means_each_type_and_skips_rows_without_one():
    got = success_by_type([1.0, 0.0, 0.5, 1.0], rows(["lookup", "clock", None, "lookup"]))
    assert got == {"eval/num_types": 2.0, "eval/success_type_clock": 0.0, "eval/success_type_lookup": 1.0}
    assert success_by_type([1.0], rows([None])) == {}, "a task that names no types logs nothing more"


def test_a_types_name_becomes_a_safe_bounded_key_and_many_types_only_a_count():
    got = success_by_type([1.0], rows(["calendar/lookup <b>" + "x" * 100]))
    (key,) = [k for k in got if k.startswith("eval/success_type_")]
    assert key == "eval/success_type_" + ("calendar_lookup__b_" + "x" * 100)[:40]
    many = success_by_type(np.zeros(MAX_TYPES + 1), rows([f"t{i}" for i in range(MAX_TYPES + 1)]))
    assert many == {"eval/num_types": float(MAX_TYPES + 1)}


def test_regime_groups_by_type_and_the_report_tabulates_it():
    groups = regime_by_group([0.0, 0.5, 1.0], rows(["a", "a", "b"]), n=2)["groups"]
    assert groups["type=a"]["num_prompts"] == 2 and groups["type=b"]["all_success"] == 1.0
    lines = type_table({"step": 0, "eval/success_type_a": 0.25}, {"step": 4, "eval/success_type_a": 0.5})
    assert "| a | 25.0% -> 50.0% |" in lines
    assert type_table({"step": 0}, {"step": 4, "eval/success": 0.5}) == []
