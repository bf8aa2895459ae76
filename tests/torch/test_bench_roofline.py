"""`tracerl bench engine`'s roofline: the FLOP count against a hand count, the engine's counters behind it, and the
new fields of the bench's output (no timing is asserted: the numbers depend on the machine and its load)."""

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracerl.bench.engine import EngineBenchConfig, engine_flops, flops_per_token, kv_read_bytes, run, to_markdown
from tracerl.engines.tiny import tiny_qwen3
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.engine import SamplingParams

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    # width 32, 2 layers, 2 query heads and 1 key/value head of 16, MLP width 64 (tiny_qwen3: 2 x width)
    return tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, seed=0)


def test_flops_per_token_matches_a_hand_count(model):
    # per layer: q 32x32 + k, v 2 x 32x16 + o 32x32 + gate, up, down 3 x 32x64 = 1024 + 1024 + 1024 + 6144 weights
    assert flops_per_token(model.config) == {"dense": 2 * 2 * 9216, "lm_head": 2 * 32 * VOCAB,
                                             "attention_per_key": 4 * 2 * 2 * 16}
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert flops_per_token(model.config)["dense"] == 2 * linear, "dense FLOPs must be 2 x the layers' matmul weights"


def test_engine_counts_the_tokens_and_attention_pairs_the_flop_count_needs(model):
    engine = TransformersEngine(model)
    prefix = np.random.default_rng(0).integers(0, VOCAB, 5).tolist()
    out = engine.generate([prefix], SamplingParams(temperature=1.0, max_tokens=3, seed=0), n=2)
    s = engine.stats
    # one prefill row of 5 tokens, at positions 0..4: 1 + 2 + 3 + 4 + 5 keys
    assert (s["prefill_forward_passes"], s["prefill_rows"], s["prefill_attention_pairs"]) == (1, 1, 15)
    # each sample feeds its first two sampled tokens (positions 5 and 6, 6 and 7 keys); the third is never fed
    assert (s["decode_tokens_fed"], s["decode_attention_pairs"]) == (4, 2 * (6 + 7))
    assert s["forward_passes"] == 1 + 2
    f = flops_per_token(model.config)
    assert engine_flops(s, model.config) == {
        "prefill": 5 * f["dense"] + f["lm_head"] + 15 * f["attention_per_key"],
        "decode": 4 * (f["dense"] + f["lm_head"]) + 26 * f["attention_per_key"]}
    # 26 keys and values read per layer: 2 layers x 1 key/value head x 16 numbers x 4 bytes, twice
    assert kv_read_bytes(s, model.config) == 26 * 2 * 2 * 1 * 16 * 4

    # the next turn reuses the stored prefix + output[:-1] (7 tokens) and computes 2 new ones at positions 7 and 8
    before = dict(s)
    engine.generate([prefix + out[0][0].token_ids[:-1] + [1, 2]], SamplingParams(temperature=0.0, max_tokens=1))
    assert s["prefill_tokens_computed"] - before["prefill_tokens_computed"] == 2, "the stored prefix was not reused"
    assert s["prefill_attention_pairs"] - before["prefill_attention_pairs"] == 8 + 9
    assert s["decode_tokens_fed"] == before["decode_tokens_fed"], "max_tokens=1 feeds nothing back"
    assert s["prefill_seconds"] > 0 and s["decode_seconds"] > 0, "the engine must time both phases"


def test_bench_output_has_the_roofline_fields():
    cfg = EngineBenchConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            num_prompts=2, prompt_tokens=16, num_turns=3, turn_tokens=4, observation_tokens=3,
                            branch_depths=(1, 2), repeats=1, gemm_sizes=(32, 64), sweep_rows=(1, 3),
                            sweep_decode_tokens=4, eval_shape=False)
    result = json.loads(json.dumps(run(cfg)))  # what --json prints
    roof = result["roofline"]
    assert set(roof["peak"]["by_size"]) == {"32", "64"} and roof["peak"]["flop_per_s"] > 0
    assert roof["peak"]["read_bytes_per_s"] > 0
    assert roof["peak"]["torch_threads"] == result["torch_threads"] == cfg.num_threads
    fields = {"prefill_flop", "prefill_flop_per_s", "prefill_peak_frac", "decode_flop", "decode_flop_per_s",
              "decode_kv_bytes_per_s", "decode_kv_read_frac",
              "decode_peak_frac", "forward_passes_per_s", "decode_step_seconds", "mean_decode_rows"}
    for name in ("on", "off"):
        assert fields <= set(roof["modes"][name]), f"reuse {name} lacks {fields - set(roof['modes'][name])}"
    on, off = roof["modes"]["on"], roof["modes"]["off"]
    assert on["decode_flop"] == off["decode_flop"], "both modes decode the same tokens from the same positions"
    assert on["prefill_flop"] < off["prefill_flop"], "reuse must cut the prefill FLOPs"
    calls = roof["shapes"]["bench model"]
    assert [c["rows"] for c in calls] == [1, 3] and all(fields <= set(c) for c in calls)
    assert calls[0]["mean_decode_rows"] == 1 and calls[1]["mean_decode_rows"] == 3
    assert "embedded default" not in roof["shapes"]
    assert {"fixed_seconds", "per_row_seconds", "fixed_frac"} <= set(roof["decode_step_split"]["bench model"])
    assert "float32 matmul peak" in to_markdown(result) and "ms fixed" in to_markdown(result)
    assert "roofline" not in run(replace(cfg, roofline=False))
