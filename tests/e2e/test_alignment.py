"""`tracerl bench alignment` on the tiny policy: a draw is the very step the run takes next, and nothing is kept."""

import math

import pytest
import torch

from helpers import trainer_for
from tracerl.bench.alignment import AlignmentConfig, run, summarize, to_markdown
from tracerl.io.files.runlog import read_metrics
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training


def _sets(tiny_overrides, run_dir, steps):
    return [*tiny_overrides, "method=trace", f"run.num_steps={steps}", "run.tensorboard=false",
            f"run.out_dir={run_dir}"]


def test_a_draw_is_the_step_the_run_takes_next(tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    run_training(load_config(None, _sets(tiny_overrides, run_dir, 2)))
    checkpoint_files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    # the reference needs a held-out question with both outcomes, and whether a small batch has one depends on the
    # weights a machine builds: reference batches are drawn until one has (the bench refuses a batch without)
    for reference_seed in range(7919, 7919 + 8):
        cfg = AlignmentConfig(draws=2, reference_prompts=8, reference_samples=2, reference_seed=reference_seed)
        try:
            result = run(run_dir, ["grpo", "trace", ("still", "grpo", ["optim.lr=1e-12"])], cfg,
                         say=lambda message: None)
            break
        except ValueError as refused:
            assert "no question with both outcomes" in str(refused), refused
    else:
        pytest.fail("8 reference batches of 8 held-out questions x 2 and none had a question with both outcomes")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoint_files, "the run was written to"
    assert result["step"] == 2 and -1 <= result["reference_halves_cos"] <= 1

    run_training(load_config(None, _sets(tiny_overrides, run_dir, 3)), resume=True)  # the step the draws imitate
    names = [name for name, _ in trainer_for(load_config(None, _sets(tiny_overrides, tmp_path / "x", 1))).model
             .named_parameters()]  # tied weights once, as the trainer's parameters hold them
    before, after = (torch.load(run_dir / "checkpoints" / f"step-00000{s}" / "model.pt", weights_only=True)
                     for s in (2, 3))
    step_norm = math.sqrt(sum(float(((after[k].double() - before[k].double()) ** 2).sum()) for k in names))
    draw = result["methods"]["trace"]["draws"][0]
    # whatever its norm: a step with no mixed group leaves the weights as they are (no gradient, so AdamW skips every
    # parameter), and which step that is depends on the weights a machine builds
    assert draw["update_norm"] == pytest.approx(step_norm, rel=1e-6, abs=1e-12), "the draw is not the step taken"
    step3 = next(r for r in read_metrics(run_dir) if r["kind"] == "train" and r["step"] == 3)
    assert draw["sampled_tokens"] == step3["rollout/tokens"]
    assert draw["rollouts"] == step3["rollout/num_rollouts"]

    # `still` is grpo at lr 1e-12: draw d samples grpo's draw d and moves at most 1e-6 of it (both 0 without signal)
    for still, grpo in zip(result["methods"]["still"]["draws"], result["methods"]["grpo"]["draws"], strict=True):
        assert still["sampled_tokens"] == grpo["sampled_tokens"], "the entry's draws are not grpo's batches"
        assert still["update_norm"] <= 1e-6 * grpo["update_norm"], "the entry's own overrides were not applied"
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
