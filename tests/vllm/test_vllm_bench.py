"""`tracerl bench engine --vllm`: the tree workload on a real vLLM beside tracerl's engine, and vLLM's own
prefix-cache counters measured against the workload's shared-prefix bound."""

from vllm_support import skip_without_vllm

skip_without_vllm()

from tracerl.bench.engine import EngineBenchConfig, run, to_markdown


def test_vllm_prefix_cache_hits_reach_90_percent_of_the_shared_prefix_fraction():
    cfg = EngineBenchConfig(num_layers=2, num_prompts=4, prompt_tokens=128, repeats=1, roofline=False)
    result = run(cfg, vllm=True)
    v = result["vllm"]
    assert v["prefix_cache_queries"] == v["prefix_tokens"]  # vLLM queries every sample's whole prefix, as counted
    assert v["generated_tokens"] == result["workload"]["generated_tokens"]  # no stop tokens: the same decoding work
    assert v["shared_prefix_frac"] > 0.5  # a tree workload: most prefix tokens were seen before
    assert v["hit_rate"] >= 0.9 * v["shared_prefix_frac"], (
        f"vLLM's prefix-cache hit rate {v['hit_rate']:.3f} is below 90% of the shared-prefix fraction "
        f"{v['shared_prefix_frac']:.3f}")
    assert v["hit_rate"] <= v["shared_prefix_frac"] + 1e-9  # no cache can beat the bound
    table = to_markdown(result)
    assert "| vLLM, prefix caching (blocks of 32) |" in table and "vLLM / transformers" in table
