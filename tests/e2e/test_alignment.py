"""`tracerl bench alignment` on the tiny policy: a draw is the very step the run takes next, and nothing is kept."""

import math

import pytest
import torch

from tracerl.bench.alignment import AlignmentConfig, run, summarize, to_markdown
from tracerl.io.runlog import read_metrics
from tracerl.train.config import load_config
from tracerl.train.trainer import Trainer, run_training


def _sets(tiny_overrides, run_dir, steps):
    return [*tiny_overrides, "method=trace", f"run.num_steps={steps}", "run.tensorboard=false",
            f"run.out_dir={run_dir}"]


def test_a_draw_is_the_step_the_run_takes_next(tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    run_training(load_config(None, _sets(tiny_overrides, run_dir, 2)))
    checkpoint_files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    cfg = AlignmentConfig(draws=2, reference_prompts=6, reference_samples=2)
    result = run(run_dir, ["grpo", "trace", ("still", "grpo", ["optim.lr=1e-12"])], cfg, say=lambda message: None)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoint_files, "the run was written to"
    assert result["step"] == 2 and -1 <= result["reference_halves_cos"] <= 1

    run_training(load_config(None, _sets(tiny_overrides, run_dir, 3)), resume=True)  # the step the draws imitate
    names = [name for name, _ in Trainer(load_config(None, _sets(tiny_overrides, tmp_path / "x", 1))).model
             .named_parameters()]  # tied weights once, as the trainer's parameters hold them
    before, after = (torch.load(run_dir / "checkpoints" / f"step-00000{s}" / "model.pt", weights_only=True)
                     for s in (2, 3))
    step_norm = math.sqrt(sum(float(((after[k].double() - before[k].double()) ** 2).sum()) for k in names))
    draw = result["methods"]["trace"]["draws"][0]
    assert step_norm > 0
    assert draw["update_norm"] == pytest.approx(step_norm, rel=1e-6)
    step3 = next(r for r in read_metrics(run_dir) if r["kind"] == "train" and r["step"] == 3)
    assert draw["sampled_tokens"] == step3["rollout/tokens"]
    assert draw["rollouts"] == step3["rollout/num_rollouts"]

    moved = min(row["update_norm"] for row in result["methods"]["grpo"]["draws"])
    assert all(row["update_norm"] < 1e-6 * moved for row in result["methods"]["still"]["draws"]), "its own overrides"
    summary = summarize([result])
    assert set(summary["methods"]) == {"grpo", "trace", "still"} and set(summary["differences"]) == {"trace", "still"}
    for method in ("grpo", "trace"):
        for row in result["methods"][method]["draws"]:
            assert -1 <= row["cos_gradient"] <= 1 and -1 <= row["cos_update"] <= 1
    text = to_markdown([result])
    assert "| grpo | 2 x 1 |" in text and "| trace |" in text


def test_a_run_without_a_checkpoint_is_refused(tiny_overrides, tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        run(tmp_path, ["grpo"], AlignmentConfig(draws=2, reference_prompts=4), say=lambda message: None)
    with pytest.raises(ValueError, match="draws >= 2"):
        AlignmentConfig(draws=1)
