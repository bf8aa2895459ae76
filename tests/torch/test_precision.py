"""Mixed precision on tiny policies, on the CPU (torch's CPU autocast): policy.precision=bfloat16 in the update, and
the transformers engine's compute_dtype.

Checked: the engine with compute_dtype=bfloat16 generates with a bfloat16 copy of the weights (its logprobs differ
from the float32 engine's by rounding and stay within bfloat16's error of them) that follows every change of the
model's weights, and whose attention never runs on cuDNN's backend (per-shape plans); with policy.precision=bfloat16
the trainer's engine samples a bfloat16 copy on a GPU and the float32 model itself on a CPU, a training
step keeps the weights, their gradients and AdamW's moments float32 and still moves them, and a resumed run repeats
the uninterrupted one; the loss forward under autocast runs in bfloat16 (its logprobs differ from float32's by
rounding, and agree with them to bfloat16's error); a value outside float32/bfloat16 fails at load, naming the
choices.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import small_trainer_overrides, trainer_for, trees_random_advantages  # noqa: E402

from tracerl.engines.tiny import tiny_qwen3  # noqa: E402
from tracerl.engines.transformers_engine import TransformersEngine  # noqa: E402
from tracerl.io.rollout.engine import SamplingParams  # noqa: E402
from tracerl.train.config import load_config  # noqa: E402
from tracerl.train.loss import token_logprobs  # noqa: E402
from tracerl.train.policy import autocast, compute_dtype, sampling_dtype  # noqa: E402

SAMPLE = SamplingParams(temperature=1.0, max_tokens=12, seed=0)


def test_the_engine_generates_with_bfloat16_weights_and_stays_within_bfloat16_error():
    model = tiny_qwen3(vocab_size=211, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    prefixes = [[1, 2, 3, 4, 5], [6, 7, 8]]
    full = TransformersEngine(model).generate(prefixes, SAMPLE, n=2)
    engine = TransformersEngine(model, compute_dtype=torch.bfloat16)
    half = engine.generate(prefixes, SAMPLE, n=2)
    assert next(model.parameters()).dtype == torch.float32, "the trained weights must stay float32"
    assert {p.dtype for p in engine.runner.parameters()} == {torch.bfloat16}
    compared = differ = 0
    for a, b in zip(full, half):
        for x, y in zip(a, b):
            n = min(len(x.logprobs), len(y.logprobs))
            if x.token_ids[:n] == y.token_ids[:n]:  # the same draws, so the same tokens unless a rounding flipped one
                np.testing.assert_allclose(y.logprobs[:n], x.logprobs[:n], atol=0.05)
                compared += n
                differ += int(np.any(np.asarray(y.logprobs[:n]) != np.asarray(x.logprobs[:n])))
    assert compared > 0 and differ > 0, "the engine did not compute in bfloat16"


def test_the_bfloat16_copy_follows_every_change_of_the_trained_weights():
    model = tiny_qwen3(vocab_size=211, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=5)
    engine = TransformersEngine(model, compute_dtype=torch.bfloat16)
    engine.generate([[1, 2, 3]], SAMPLE)  # fills the key/value store with the old weights' keys and values
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    after = engine.generate([[1, 2, 3], [4, 5]], SAMPLE, n=2)
    fresh = TransformersEngine(model, compute_dtype=torch.bfloat16).generate([[1, 2, 3], [4, 5]], SAMPLE, n=2)
    assert [[(c.token_ids, c.logprobs) for c in row] for row in after] == \
        [[(c.token_ids, c.logprobs) for c in row] for row in fresh], "the engine sampled stale weights"
    for mine, theirs in zip(engine.runner.parameters(), model.parameters()):
        assert torch.equal(mine, theirs.to(torch.bfloat16))


def test_the_engine_keeps_attention_off_cudnn_while_it_generates():
    model = tiny_qwen3(vocab_size=211, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=6)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(
        (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled())))
    TransformersEngine(model, compute_dtype=torch.bfloat16).generate([[1, 2, 3]], SAMPLE, n=2)
    TransformersEngine(model).generate([[1, 2, 3]], SAMPLE)
    assert seen and set(seen) == {(False, True)}, "a forward could pick cuDNN's attention (or lost the others)"
    assert torch.backends.cuda.cudnn_sdp_enabled(), "the engine left the process's attention backends changed"


def test_the_trainer_samples_in_bfloat16_on_a_gpu_only():
    assert sampling_dtype(torch.device("cuda"), "bfloat16") == torch.bfloat16
    assert sampling_dtype(torch.device("cuda"), "float32") is None
    assert sampling_dtype(torch.device("cpu"), "bfloat16") is None


def test_the_loss_forward_runs_in_bfloat16_with_float32_logits():
    model = tiny_qwen3(vocab_size=211, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=4)
    ids = torch.randint(0, 211, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    full = token_logprobs(model, ids, mask)
    with autocast(torch.device("cpu"), compute_dtype("bfloat16")):
        half = token_logprobs(model, ids, mask)
    with autocast(torch.device("cpu"), compute_dtype("float32")):  # a no-op
        same = token_logprobs(model, ids, mask)
    assert half.dtype == torch.float32 and torch.equal(same, full)
    assert not torch.equal(half, full), "bfloat16 matmuls round differently from float32 ones"
    torch.testing.assert_close(half, full, rtol=0, atol=0.05)


@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    return small_trainer_overrides(tmp_path_factory.mktemp("policy-cache"), "policy.precision=bfloat16")


def _comparable(row):
    return {k: v for k, v in row.items() if not k.startswith("sys/") and k != "alloc/overhead_frac"}


def test_a_bfloat16_step_keeps_float32_state_moves_the_weights_and_resumes_exactly(small_policy, tmp_path,
                                                                                     monkeypatch):
    from tracerl.core import step as step_module

    monkeypatch.setattr(step_module, "compute_advantages", trees_random_advantages)  # the step computes them

    config = load_config(None, [*small_policy, f"run.out_dir={tmp_path / 'run'}"])
    trainer = trainer_for(config)
    assert trainer.engine.runner is trainer.model, "on a CPU the trainer's engine samples the float32 model itself"
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    first = trainer.train_step()
    assert first["train/num_trained_trees"] > 0 and np.isfinite(first["train/pg_loss"]), first
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moments = [s for state in trainer.optimizer.state.values() for s in (state["exp_avg"], state["exp_avg_sq"])]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters()), "nothing moved"
    trainer.save()
    second = trainer.train_step()
    resumed = trainer_for(config)
    assert resumed.resume() and resumed.step == 1
    assert _comparable(resumed.train_step()) == _comparable(second)
    for (name, want), got in zip(trainer.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(want, got), f"{name} differs after the resumed step"


def test_an_unknown_precision_fails_at_load_naming_the_choices():
    with pytest.raises(ValueError, match=r"policy\.precision.*float32.*bfloat16"):
        load_config(None, ["policy.precision=float16"])
