"""studies/coupled_eval.py on two tiny runs whose own evaluations sampled coupled (as the over-builds tables do)."""

import numpy as np
from helpers import load_study_script

from tracerl.io.files.runlog import read_metrics
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training


def _run(overrides, path, method):
    config = load_config(None, [*overrides, f"run.out_dir={path}", f"method={method}", "run.num_steps=1",
                                "run.eval_coupled=true", "run.eval_prompts=8", "run.eval_samples=2",
                                "run.tensorboard=false"])
    run_training(config)
    return path


def test_runs_recorded_coupled_are_evaluated_again_independently(tiny_overrides, tmp_path, capsys):
    coupled_eval = load_study_script("coupled_eval")
    a = _run(tiny_overrides, tmp_path / "grpo-seed0", "grpo")
    b = _run(tiny_overrides, tmp_path / "trace-seed0", "trace")
    recorded = [r for r in read_metrics(a) if r["kind"] == "eval"][-1]["eval/per_prompt"]
    # the final checkpoint evaluated again as the run evaluated it gives the run's own per-question results
    assert list(coupled_eval.evaluate_checkpoint(a, coupled=True)[0]) == recorded
    runs = coupled_eval.pair_evaluations(a, b)
    assert list(runs["coupled"][0]) == recorded
    independent, _ = coupled_eval.evaluate_checkpoint(a, coupled=False)
    assert np.array_equal(runs["independent"][0], independent)
    out = tmp_path / "coupled.md"
    assert coupled_eval.main([str(a), str(b), "--no-floor", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| coupled (as recorded) |" in text and "| independent (evaluated again) |" in text
    assert "noise floor" not in text and "coupled over independent" in text
