"""VLLMEngine refuses what vLLM would choke on, before vLLM sees it: token ids outside the vocabulary, sampling values
it cannot honour, shapes its CPU attention cannot run, and state dicts that are partial, mis-shaped, unmerged
adapters, sparse, meta, complex, integer or non-finite. After each refusal the engine still answers with the weights
it had, and a correct load still works."""

import pytest

from vllm_support import skip_without_vllm

skip_without_vllm()

import torch

from vllm_support import VOCAB

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.engines.vllm_engine import VLLMEngine
from tracerl.io.rollout.engine import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PREFIXES = [[1, 2, 3, 4, 5], [7, 8, 9]]


@pytest.fixture(scope="module")
def engine(model_a):
    with VLLMEngine.from_model(model_a, max_model_len=256, kv_cache_gib=0.1) as engine:
        yield engine


@pytest.fixture(scope="module")
def greedy_a(model_a):
    return [s[0].token_ids for s in TransformersEngine(model_a).generate(PREFIXES, GREEDY)]


def assert_serves(engine, want):
    assert [s[0].token_ids for s in engine.generate(PREFIXES, GREEDY)] == want, "the engine lost its weights"


def unchecked(**fields) -> SamplingParams:
    """Sampling params that skipped SamplingParams' own check (built by other code, or unpickled): the engine must
    refuse them itself."""
    import dataclasses

    params = object.__new__(SamplingParams)
    for f in dataclasses.fields(SamplingParams):
        object.__setattr__(params, f.name, fields.get(f.name, f.default))
    return params


@pytest.mark.parametrize("prefixes, params, message", [
    ([[1, VOCAB]], GREEDY, "vocabulary"),
    ([[1, -1]], GREEDY, "vocabulary"),
    ([[1, 2**40]], GREEDY, "vocabulary"),
    ([[1, 2]], SamplingParams(temperature=0, max_tokens=4, stop_token_ids=(VOCAB + 3,)), "stop_token_ids"),
    ([[1, 2]], unchecked(temperature=float("nan"), max_tokens=4), "temperature"),
    ([[1, 2]], SamplingParams(temperature=1e-300, max_tokens=4), "temperature"),
    ([[1] * 300], GREEDY, "max_model_len"),
])
def test_bad_input_is_refused_before_vllm_and_the_engine_keeps_serving(engine, greedy_a, prefixes, params, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prefixes, params)
    assert_serves(engine, greedy_a)


def unmerged_adapter(state):
    name = next(k for k in state if k.endswith("q_proj.weight"))
    base = name.removesuffix(".weight")
    out = {f"base_model.model.{k}": v for k, v in state.items() if k != name}
    out[f"base_model.model.{base}.base_layer.weight"] = state[name]
    out[f"base_model.model.{base}.lora_A.default.weight"] = torch.zeros(4, state[name].shape[1])
    out[f"base_model.model.{base}.lora_B.default.weight"] = torch.zeros(state[name].shape[0], 4)
    return out


def replace_last(state, make):
    key = [k for k in state if k.endswith("mlp.down_proj.weight")][-1]
    return {**state, key: make(state[key])}


BAD_STATES = [
    ("wrong shape", lambda s: replace_last(s, lambda t: torch.zeros(t.shape[0], t.shape[1] + 1)), "shape"),
    ("missing tensor", lambda s: {k: v for k, v in list(s.items())[:-3] + list(s.items())[-2:]}, "missing"),
    ("unexpected tensor", lambda s: {**s, "model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}, "unexpected"),
    ("unmerged adapter", unmerged_adapter, "lora"),
    ("sparse", lambda s: replace_last(s, lambda t: t.to_sparse()), "sparse"),
    ("meta", lambda s: replace_last(s, lambda t: torch.empty_like(t, device="meta")), "meta"),
    ("complex", lambda s: replace_last(s, lambda t: t.to(torch.complex64)), "dtype"),
    ("integer", lambda s: replace_last(s, lambda t: t.to(torch.int32)), "dtype"),
    ("nan", lambda s: replace_last(s, lambda t: t.clone().index_fill_(0, torch.tensor([0]), float("nan"))), "finite"),
    ("not a tensor", lambda s: replace_last(s, lambda t: t.tolist()), "tensor"),
]


@pytest.mark.parametrize("name, make, message", BAD_STATES, ids=[b[0] for b in BAD_STATES])
def test_bad_state_dict_is_refused_and_the_previous_weights_keep_serving(engine, model_a, model_b, greedy_a, name,
                                                                        make, message):
    bad = make(dict(model_b.state_dict()))
    with pytest.raises(ValueError, match=message):
        engine.load_weights(bad)
    assert_serves(engine, greedy_a)
    try:  # and a correct load afterwards works
        engine.load_weights(model_b.state_dict())
        assert_serves(engine, [s[0].token_ids for s in TransformersEngine(model_b).generate(PREFIXES, GREEDY)])
    finally:
        engine.load_weights(model_a.state_dict())
    assert_serves(engine, greedy_a)


def test_non_contiguous_tensors_load(engine, model_a, greedy_a):
    state = {k: v.t().contiguous().t() if v.dim() == 2 else v for k, v in model_a.state_dict().items()}
    assert not all(v.is_contiguous() for v in state.values())
    engine.load_weights(state)
    assert_serves(engine, greedy_a)


def test_lm_head_may_be_left_out_when_tied(engine, model_a, greedy_a):
    state = {k: v for k, v in model_a.state_dict().items() if k != "lm_head.weight"}
    engine.load_weights(state)
    assert_serves(engine, greedy_a)


def test_unsupported_shapes_are_refused_at_construction():
    from tracerl.engines.tiny import tiny_qwen3

    narrow = tiny_qwen3(VOCAB, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2)  # head_dim 16
    with pytest.raises(ValueError, match="head_dim=16"):
        VLLMEngine.from_model(narrow, max_model_len=128, kv_cache_gib=0.05)
    with pytest.raises(ValueError, match="block_size=48"):
        VLLMEngine.from_model(tiny_qwen3(VOCAB, hidden_size=128, num_layers=1), max_model_len=128, block_size=48,
                              kv_cache_gib=0.05)


def test_a_load_that_fails_inside_vllm_loads_the_previous_weights_back(engine, model_b, greedy_a, monkeypatch):
    from tracerl.engines.errors import EngineError

    reload = engine._reload

    def fail_halfway(state):  # checks passed, then the stream of tensors breaks inside vLLM's layerwise reload
        if state is engine._last_weights:
            return reload(state)
        items = list(state.items())

        def broken():
            yield from items[: len(items) // 2]
            raise RuntimeError("the weight stream broke (on purpose)")
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": broken(),
                                                            "is_checkpoint_format": True})
    monkeypatch.setattr(engine, "_reload", fail_halfway)
    with pytest.raises(EngineError, match="previous weights were loaded back"):
        engine.load_weights(model_b.state_dict())
    monkeypatch.undo()
    assert_serves(engine, greedy_a)


def test_a_weights_path_that_is_not_a_file_is_refused(engine, greedy_a, tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.pt")
    for path in [tmp_path / "fifo.pt", tmp_path, tmp_path / "missing.pt"]:
        with pytest.raises(ValueError, match="no weights file"):
            engine.load_weights(path)
    assert_serves(engine, greedy_a)
