"""The GPU benchmark scripts (benchmarks/gpu/) run end to end on CPU with a tiny random model.

They are meant for a GPU machine, where nobody runs the test suite first; these tests make sure that what reaches
that machine runs and reports sane figures: the transformers engine and a real `tracerl serve` on loopback (with a
vLLM-style /metrics endpoint added) for engine_throughput, one math training step for train_step_math.
"""

import importlib
import itertools
import sys
from pathlib import Path

import pytest

from helpers import free_port, thread_server

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("reasoning_gym")

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
SMALL = ["--num-prompts", "2", "--prompt-tokens", "24", "--rollouts", "2", "--turns", "3", "--turn-tokens", "4",
         "--observation-tokens", "5", "--continuations", "2", "--seed", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(GPU_DIR))
    try:
        yield {name: importlib.import_module(name)
               for name in ("gpu_bench_common", "engine_throughput", "train_step_math")}
    finally:
        sys.path.remove(str(GPU_DIR))


@pytest.fixture(scope="module")
def model_dir(scripts, tmp_path_factory):
    return scripts["gpu_bench_common"].build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def served(model_dir):
    """`tracerl serve`'s app over the tiny model in a uvicorn thread, plus a /metrics route in vLLM's format whose
    counters grow by 300 hits and 400 queries (and 1,000 generated tokens) between two reads."""
    from fastapi.responses import PlainTextResponse

    from tracerl.serve import create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    app = create_app(engine, name, tokenizer)
    reads = itertools.count()

    @app.get("/metrics")
    def metrics():
        k = next(reads)
        return PlainTextResponse(
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{name}"}} {100 + 300 * k}.0\n'
            f'vllm:prefix_cache_hits_created{{engine="0",model_name="{name}"}} 1.7e9\n'
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="{name}"}} {1000 + 400 * k}.0\n'
            f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="{name}"}} 5.0\n'
            f"vllm:generation_tokens_total {1000 * k}.0\n")

    with thread_server(app) as url:
        yield url


def test_engine_throughput_transformers_and_server(scripts, model_dir, served, capsys):
    result = scripts["engine_throughput"].main(["--model", str(model_dir), "--device", "cpu", "--vllm-url", served,
                                                *SMALL])
    rows = {r["engine"]: r for r in result["engines"]}
    assert set(rows) == {"transformers", "server"}
    w = result["workload"]
    # 2 prompts x 2 rollouts x 3 turns = 12 turns; 2 continuations from each of the 8 nodes at depths 1 and 2 = 16
    # turns, and 8 more to finish those from depth 1: 36 turns of 4 tokens
    assert rows["transformers"]["generated_tokens"] == rows["server"]["generated_tokens"] == 36 * 4
    assert all(r["generated_tokens_per_s"] > 0 for r in rows.values())
    hit = rows["transformers"]["prefix_cache_hit_rate"]
    assert 0 < hit <= w["shared_prefix_frac"] + 1e-9, f"engine hit rate {hit} beyond the workload's bound"
    assert rows["server"]["prefix_cache_hit_rate"] == pytest.approx(300 / 400), rows["server"]
    assert "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total" in rows["server"]["hit_rate_from"]
    assert rows["server"]["server_generation_tokens"] == 1000
    table = capsys.readouterr().out
    assert table.count("\n| transformers (float32 weights, float32 compute) |") == 1 and "| server |" in table
    assert "CPU" in table


def test_engine_throughput_profile_writes_the_operator_tables(scripts, model_dir, tmp_path):
    path = tmp_path / "profile.txt"
    result = scripts["engine_throughput"].main(["--model", str(model_dir), "--device", "cpu", "--profile", str(path),
                                                *SMALL])
    assert result["engines"][0]["generated_tokens"] == 36 * 4  # the same workload, profiled
    text = path.read_text()
    assert "sorted by self_cpu_time_total" in text and "sorted by cpu_time_total" in text
    assert "aten::" in text  # the forwards' operators were recorded
    row = result["engines"][0]
    assert row["kv_bytes_per_token"] > 0 and row["kv_store_gib_max"] > 0 and row["kv_batch_gib_max"] > 0


def test_kv_bytes_per_token_of_the_sized_model(scripts):
    import torch
    from transformers import Qwen3Config

    mod, common = scripts["engine_throughput"], scripts["gpu_bench_common"]
    config = Qwen3Config(**common.QWEN3_0_6B)
    # 2 (keys, values) x 28 layers x 8 key/value heads x 128 dims x 4 bytes
    assert mod.kv_bytes_per_token(config, torch.float32) == 229_376
    assert mod.kv_bytes_per_token(config, torch.bfloat16) == 114_688


def test_engine_throughput_names_a_server_that_does_not_answer(scripts):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit, match=f"no server answers at {url}"):
        scripts["engine_throughput"].main(["--device", "cpu", "--engines", "server", "--vllm-url", url, *SMALL])


def test_prefix_cache_counters_fall_back_to_other_names(scripts):
    mod = scripts["engine_throughput"]
    metrics = mod.parse_prometheus('sglang:prefix_cache_hits{a="x y}"} 3\nsglang:prefix_cache_queries 4 1700000\n'
                                   "other:prefix_cache_usage 0.5\n# HELP sglang:prefix_cache_hits hits\n")
    assert metrics == {"sglang:prefix_cache_hits": 3.0, "sglang:prefix_cache_queries": 4.0,
                       "other:prefix_cache_usage": 0.5}
    assert mod.prefix_cache_counters(metrics) == ("sglang:prefix_cache_hits", "sglang:prefix_cache_queries")
    assert mod.prefix_cache_counters({"sglang:cache_hit_rate": 0.4}) is None


def test_train_step_math_smoke(scripts, capsys, tmp_path):
    profile = tmp_path / "host-profile.txt"  # the step under cProfile: where its host time goes
    result = scripts["train_step_math"].main(["--device", "cpu", "--threads", "1", "--host-profile", str(profile)])
    s, t = result["seconds"], result["tokens"]
    assert result["model_device"] == "cpu" and result["config"]["method"] == "trace"
    assert t["num_rollouts"] >= 2 and t["generated_tokens"] > 0
    assert t["policy_tokens_trained"] > 0 and result["num_trained_trees"] >= 1, "the smoke step trained nothing"
    assert 0 <= result["kv_reuse_hit_rate"] <= 1
    assert s["step"] >= s["rollout"] + s["train"] > 0 and s["other"] >= -1e-6
    assert result["peak_gpu_memory_gib"] is None
    assert "| whole step |" in capsys.readouterr().out
    text = profile.read_text()
    assert "sorted by tottime" in text and "sorted by cumulative" in text
    assert "train_step" in text and "_generate_rows" in text  # the step and the engine's decoding, by name


def test_train_step_math_sets_the_device_only_where_the_config_has_it(scripts, monkeypatch):
    mod = scripts["train_step_math"]
    args = mod.parse_args(["--device", "cuda"])
    monkeypatch.setattr(mod, "policy_has_device_setting", lambda: True)
    overrides, note = mod.config_overrides(args, "m", "out")
    assert "policy.device=cuda" in overrides and note is None
    monkeypatch.setattr(mod, "policy_has_device_setting", lambda: False)
    overrides, note = mod.config_overrides(args, "m", "out")
    assert not any(o.startswith("policy.device") for o in overrides) and "CPU figures" in note


def test_a_sized_random_model_has_the_real_shapes_and_runs_a_bfloat16_step(scripts, monkeypatch, tmp_path):
    from transformers import AutoConfig

    common = scripts["gpu_bench_common"]
    config = AutoConfig.from_pretrained(common.build_sized_model_dir(
        tmp_path / "full-config", "qwen3-0.6b", num_hidden_layers=1))  # the rest as Qwen3-0.6B's config.json
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.tie_word_embeddings) == (
        151_936, 1024, 3072, 16, 8, 128, True)
    # the step itself on the same vocabulary, shrunk elsewhere so that it runs in seconds on a CPU
    shrunk = {**common.QWEN3_0_6B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    monkeypatch.setitem(common.SIZES, "qwen3-0.6b", shrunk)
    small = ["allocation.num_prompts=2", "allocation.rollouts_per_prompt=2", "data.max_turns=2",
             "data.max_tokens_per_turn=8", "data.num_train_prompts=16", "run.eval_prompts=2", "optim.kl_coef=0.01",
             "policy.precision=bfloat16"]
    result = scripts["train_step_math"].main(["--random-model", "qwen3-0.6b", "--device", "cpu", "--threads", "1",
                                              *[a for s in small for a in ("--set", s)]])
    assert result["model"].startswith("qwen3-0.6b architecture, random weights")
    assert (result["dtype"], result["precision"]) == ("float32", "bfloat16")
    assert result["config"]["max_tokens_per_turn"] == 8, "the smoke overrides must not replace a sized model's step"
    assert result["num_trained_trees"] >= 1 and result["tokens"]["generated_tokens"] > 0
    with pytest.raises(SystemExit, match="--model or --random-model"):
        scripts["train_step_math"].main(["--model", "x", "--random-model", "qwen3-0.6b", "--device", "cpu"])
