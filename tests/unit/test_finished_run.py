"""`finished_run`, the one reading of "this run folder holds a finished run" that `tracerl compare` and the records
script share: its last training step evaluated, and the stop its saved config set (steps or sampled tokens) reached;
None when no config was saved, False for anything missing, torn or cut short."""

import json

from tracerl.io.files.runlog import finished_run


def _run(tmp_path, rows, run_config=None, name="trace-seed0"):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if run_config is not None:
        (run / "config.json").write_text(json.dumps({"run": run_config}))
    return run


def _rows(last_step, tokens_per_step=100, eval_last=True):
    rows = [{"step": 0, "kind": "eval"}]
    for step in range(1, last_step + 1):
        rows.append({"step": step, "kind": "train", "rollout/cum_tokens": step * tokens_per_step})
        if step < last_step or eval_last:
            rows.append({"step": step, "kind": "eval"})
    return rows


def test_a_run_that_reached_its_steps_and_evaluated_them_is_finished(tmp_path):
    assert finished_run(_run(tmp_path, _rows(4), {"num_steps": 4, "total_token_budget": 0})) is True


def test_a_run_under_a_token_budget_is_finished_once_it_sampled_the_budget(tmp_path):
    budget = {"num_steps": 100, "total_token_budget": 350}
    assert finished_run(_run(tmp_path, _rows(4), budget, "a")) is True
    assert finished_run(_run(tmp_path, _rows(3), budget, "b")) is False


def test_stopped_early_or_with_its_last_step_unevaluated_is_not_finished(tmp_path):
    steps = {"num_steps": 4, "total_token_budget": 0}
    assert finished_run(_run(tmp_path, _rows(3), steps, "short")) is False
    assert finished_run(_run(tmp_path, _rows(4, eval_last=False), steps, "unevaluated")) is False
    assert finished_run(_run(tmp_path, [], steps, "empty")) is False


def test_missing_metrics_or_a_torn_config_is_not_finished_and_no_config_is_unknown(tmp_path):
    assert finished_run(tmp_path / "nothing-here") is False
    torn = _run(tmp_path, _rows(4), name="torn")
    (torn / "config.json").write_text('{"run": {"num_st')
    assert finished_run(torn) is False
    assert finished_run(_run(tmp_path, _rows(4), name="no-config")) is None
