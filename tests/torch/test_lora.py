"""LoRA training (policy.lora_rank > 0) and the device setting on tiny random and tiny embedded Qwen3 policies.

Checked: only the adapters are trainable and move in an update while the base stays bit-identical; the in-process
engine samples the adapted policy; the merged weights a served engine receives load into the plain model and compute
what the adapted one computes; checkpoints restore the adapters; a LoRA run resumed from a checkpoint repeats the
uninterrupted run; the KL reference is the adapter-free model; a missing GPU fails at load.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers import SMALL_EMBEDDED, small_trainer_overrides, trees_random_advantages  # noqa: E402

from tracerl.engines.tiny import tiny_qwen3
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.engine import SamplingParams
from tracerl.train import checkpoint
from tracerl.train.batch import RolloutBatch
from tracerl.train.config import load_config
from tracerl.train.loss import token_logprobs
from tracerl.train.policy import add_lora, load_policy, merged_state_dict, resolve_device, trainable_parameters

SMALL = SMALL_EMBEDDED
VOCAB = 97
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, seed=0)


def lora_model(rank=4, seed=0, **more):
    """A tiny random Qwen3 with LoRA adapters in its layers (the transformers model, and the peft wrapper)."""
    config = load_config(None, [f"policy.lora_rank={rank}", f"run.seed={seed}", *more])
    wrapped = add_lora(tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_heads=2, num_kv_heads=1), config)
    return wrapped.get_base_model(), wrapped


def move_adapters(model, scale=0.3, seed=1):
    """Make the adapters matter: B starts at zero, so the adapted model would equal the base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)


def ids(rows=2, length=12, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, size=(rows, length)))


def logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits


# ------------------------------------------------------------------------------------------ what is trained
def test_only_the_adapters_are_trainable_and_move_in_an_update():
    model, _ = lora_model()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable), sorted(trainable)
    # every target module of both layers got an adapter pair
    assert len(trainable) == 2 * 7 * 2, sorted(trainable)
    assert {id(p) for p in trainable_parameters(model)} == {id(p) for n, p in model.named_parameters()
                                                            if n in trainable}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    batch = ids()
    for _ in range(2):  # B starts at 0, so A only gets a gradient from the second step on
        optimizer.zero_grad()
        logprobs = token_logprobs(model, batch, torch.ones_like(batch))  # (B, T)
        (-logprobs[:, 1:].mean()).backward()
        optimizer.step()
    for name, p in model.named_parameters():
        if name in trainable:
            assert not torch.equal(p, before[name]), f"{name}: an adapter did not move in two AdamW steps"
        else:
            assert p.grad is None, f"{name}: a frozen base weight got a gradient"
            assert torch.equal(p, before[name]), f"{name}: a frozen base weight changed"


def test_adapters_start_at_zero_and_their_init_follows_the_run_seed():
    base = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_heads=2, num_kv_heads=1)
    model, _ = lora_model()
    torch.testing.assert_close(logits(model, ids()), logits(base, ids()), rtol=0, atol=0)
    state = torch.get_rng_state()
    a0, a0_again, a1 = (lora_model(seed=s)[0].state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), state), "building adapters must not move the global torch RNG"
    keys = [k for k in a0 if "lora_A" in k]
    assert all(torch.equal(a0[k], a0_again[k]) for k in keys) and not all(torch.equal(a0[k], a1[k]) for k in keys)


# ------------------------------------------------------------------------------------------ sampling and sync
def test_the_engine_samples_the_adapted_policy():
    model, wrapped = lora_model()
    move_adapters(model)
    prefixes = [[1, 2, 3, 4, 5], [7, 8, 9]]
    got = TransformersEngine(model).generate(prefixes, GREEDY, n=1)
    with wrapped.disable_adapter():
        base = TransformersEngine(model).generate(prefixes, GREEDY, n=1)
    assert any(g[0].token_ids != b[0].token_ids for g, b in zip(got, base)), "the adapters do not change sampling"
    for prefix, [completion] in zip(prefixes, got):
        sequence = torch.tensor([prefix + completion.token_ids])  # (1, T)
        with torch.no_grad():  # the peft wrapper's own forward, the reference for "the adapted policy"
            logprobs = torch.log_softmax(wrapped(input_ids=sequence).logits[0].float(), -1)  # (T, V)
        want = [logprobs[len(prefix) - 1 + i, t].item() for i, t in enumerate(completion.token_ids)]
        assert completion.token_ids == logprobs[len(prefix) - 1:-1].argmax(-1).tolist()
        np.testing.assert_allclose(completion.logprobs, want, rtol=0, atol=1e-4)


def test_merged_weights_load_into_the_plain_model_and_compute_the_adapted_policy():
    model, wrapped = lora_model()
    move_adapters(model)
    base_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    merged = merged_state_dict(model)
    plain = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_heads=2, num_kv_heads=1, seed=5)  # other weights
    assert set(merged) == set(plain.state_dict()), set(merged) ^ set(plain.state_dict())
    plain.load_state_dict(merged, strict=True)
    torch.testing.assert_close(logits(plain, ids()), logits(wrapped, ids()), rtol=1e-5, atol=1e-5)
    q = "model.layers.0.self_attn.q_proj"
    layer = dict(model.named_modules())[q]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, in), (out, r)
    want = base_before[f"{q}.base_layer.weight"] + layer.scaling["default"] * b @ a  # W + (alpha / r) B A
    torch.testing.assert_close(merged[f"{q}.weight"], want, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base_before.items()), "merging changed the model"
    assert merged_state_dict(plain).keys() == plain.state_dict().keys(), "no adapters: the plain state dict"


def test_checkpoint_round_trip_restores_adapters_and_optimizer(tmp_path):
    model, _ = lora_model(seed=0)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    batch = ids()
    for _ in range(2):
        optimizer.zero_grad()
        (-token_logprobs(model, batch, torch.ones_like(batch)).mean()).backward()
        optimizer.step()
    checkpoint.save(tmp_path, 2, model, optimizer, None, {"step": 2})
    other, _ = lora_model(seed=1)  # other initial adapters
    other_optimizer = torch.optim.AdamW(trainable_parameters(other), lr=1e-2)
    assert checkpoint.load(tmp_path, other, other_optimizer, None)["step"] == 2
    for (name, want), got in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(want, got), f"{name} not restored"
    for want, got in zip(optimizer.state_dict()["state"].values(), other_optimizer.state_dict()["state"].values()):
        assert all(torch.equal(want[k], got[k]) for k in want)


def test_bad_target_modules_name_the_model_s_layers():
    config = load_config(None, ["policy.lora_rank=4", 'policy.lora_target_modules=["attn_qkv"]'])
    with pytest.raises(ValueError, match=r"lora_target_modules=\['attn_qkv'\] does not fit.*'q_proj'"):
        add_lora(tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_heads=2, num_kv_heads=1), config)


# ------------------------------------------------------------------------------------------ device
def test_device_auto_is_cpu_without_a_gpu_and_cuda_fails_at_load(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"policy.device='{device}' but torch .* sees no CUDA device; set "
                                             r"policy.device=cpu \(or auto\)"):
            load_config(None, [f"policy.device={device}"])
    with pytest.raises(ValueError, match="use cpu, cuda, cuda:N or auto"):
        load_config(None, ["policy.device=gpu"])


def test_an_engine_without_a_device_leaves_the_model_where_it_is():
    model = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_heads=2, num_kv_heads=1)
    assert TransformersEngine(model).device == next(model.parameters()).device


# ------------------------------------------------------------------------------------------ the trainer
@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    """--set overrides for a trainer with LoRA on a small embedded policy (built on first use, under a second)."""
    cache = tmp_path_factory.mktemp("policy-cache")
    return small_trainer_overrides(cache, "policy.lora_rank=4", "policy.device=auto")


def _comparable(row):
    return {k: v for k, v in row.items() if not k.startswith("sys/") and k != "alloc/overhead_frac"}


def test_a_lora_run_trains_only_the_adapters_and_resumes_exactly(small_policy, tmp_path, monkeypatch):
    from tracerl.core import step as step_module
    from tracerl.train.trainer import Trainer

    monkeypatch.setattr(step_module, "compute_advantages", trees_random_advantages)  # the step computes them
    config = load_config(None, [*small_policy, f"run.out_dir={tmp_path / 'run'}"])
    trainer = Trainer(config, load_policy(config))
    assert trainer.device == resolve_device("auto") and trainer.ref_model is None, "LoRA needs no second model for KL"
    assert trainer.engine.model is trainer.model, "the engine must sample the model being trained"
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert {id(p) for group in trainer.optimizer.param_groups for p in group["params"]} == {
        id(p) for n, p in trainer.model.named_parameters() if n in trainable}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    first = trainer.train_step()
    assert first["train/num_trained_trees"] > 0 and np.isfinite(first["train/pg_loss"]), first
    assert first["train/grad_norm"] > 0 and "train/kl_ref" in first
    for name, p in trainer.model.named_parameters():  # lora_A has no gradient while lora_B is still zero
        if ".lora_B." in name:
            assert not torch.equal(p, before[name]), f"{name}: an adapter did not move"
        elif ".lora_A." not in name:
            assert torch.equal(p, before[name]), f"{name}: a frozen base weight moved"
    trainer.save()
    second = trainer.train_step()
    assert second["train/kl_ref"] > 0, "after an update the policy differs from its reference"

    resumed = Trainer(config, load_policy(config))
    assert resumed.resume() and resumed.step == 1
    again = resumed.train_step()
    assert _comparable(again) == _comparable(second)
    for (name, want), got in zip(trainer.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(want, got), f"{name} differs after the resumed step"

    # the KL reference is the model with its adapters off: the (unchanged) base policy
    batch = ids(length=10)
    plain = load_policy(load_config(None, small_policy[:2])).model
    rollout = RolloutBatch(batch, torch.ones_like(batch), torch.zeros(batch.shape), torch.ones(batch.shape),
                           torch.zeros(batch.shape), ())
    torch.testing.assert_close(resumed.reference_logprobs(rollout),
                               token_logprobs(plain, rollout.input_ids, rollout.attention_mask), rtol=0, atol=1e-6)


def test_a_local_model_directory_gets_adapters_too(small_policy, tmp_path):
    base = load_policy(load_config(None, small_policy[:2]))
    base.model.save_pretrained(tmp_path / "model")
    base.tokenizer.save_pretrained(tmp_path / "model")
    policy = load_policy(load_config(None, [f"policy.model={tmp_path / 'model'}", "policy.lora_rank=2",
                                            'policy.lora_target_modules=["q_proj","v_proj"]']))
    trainable = sorted(n for n, p in policy.model.named_parameters() if p.requires_grad)
    assert len(trainable) == 2 * 2 * SMALL["num_layers"], trainable
    assert all(".q_proj.lora_" in n or ".v_proj.lora_" in n for n in trainable), trainable
    assert type(policy.model) is type(base.model) and policy.peft is not None
    torch.testing.assert_close(logits(policy.model, ids()), logits(base.model, ids()), rtol=0, atol=0)


def test_sync_sends_merged_weights_a_plain_server_loads(small_policy, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from tracerl.serve.app import create_app
    from tracerl.train.trainer import Trainer

    config = load_config(None, [*small_policy, f"run.out_dir={tmp_path / 'run'}", "policy.engine=openai",
                                "policy.base_url=http://127.0.0.1:9"])
    trainer = Trainer(config, load_policy(config))
    move_adapters(trainer.model)
    served = load_policy(load_config(None, small_policy[:2])).model  # the server's plain copy of the base
    answers = []
    with TestClient(create_app(TransformersEngine(served), "tiny")) as client:  # with: the app's engine thread runs

        class Server:  # the OpenAIEngine's load_weights, over the real endpoint
            def load_weights(self, path):
                answers.append(client.post("/v1/load_weights", json={"path": path}))

        trainer.engine = Server()
        trainer.sync_weights()
    assert answers and answers[0].status_code == 200, answers[0].text
    prefix = trainer.policy.renderer.encode("Who founded the company?")
    want = TransformersEngine(trainer.model).generate([prefix], GREEDY)[0][0]
    got = TransformersEngine(served).generate([prefix], GREEDY)[0][0]
    assert got.token_ids == want.token_ids
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-4)
