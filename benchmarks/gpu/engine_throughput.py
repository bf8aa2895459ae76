"""Generated tokens/s and prefix-cache hit rate of tracerl's transformers engine and of a served engine (vLLM,
SGLang or `tracerl serve`), on the same tree-rollout workload, measured one after the other in one run.

Workload: `tracerl bench engine`'s (`tracerl.bench.engine.run_workload`), the call pattern of one TRACE step as the
ReAct driver issues it: every prompt gets `--rollouts` bare rollouts, turn by turn (each call batches all live
rollouts, an observation of random tokens follows each turn but the last); then `--continuations` continuations
from every bare rollout's node at depths 1..turns-1, each run to the last turn. Prompt and observation ids are
random ids of the model's vocabulary; no stop tokens (the server is sent `ignore_eos`), so every engine decodes
exactly the same number of tokens and differs only in speed and in how much prefill it skips.

Reported per engine: generated tokens, seconds, generated tokens/s and the prefix-cache hit rate, the share of the
prefix tokens the engine was asked to condition on that it did not compute again:
- transformers engine: from its own counters, `prefill_tokens_reused / (prefill_tokens_computed +
  prefill_tokens_reused)` (token-exact: the n samples of a prefix share one prefill, and a later prefix reuses
  the longest common prefix in its LRU store of keys/values);
- server: the increase of vLLM's Prometheus counters `vllm:prefix_cache_hits_total /
  vllm:prefix_cache_queries_total` at `{url}/metrics` over the timed run (vLLM V1 counts tokens, in whole KV blocks,
  and recomputes at least a prompt's last token). Where those names are absent, any counter pair whose names contain
  `prefix_cache` and end in `hits`/`queries` (not vLLM's `external_` ones) is used and named in the output; where
  none exists (SGLang exposes only a hit-rate gauge, `tracerl serve` no metrics at all) the hit rate is left empty.
Also the workload's shared-prefix fraction: the bound no engine can beat (see `tracerl.bench.engine`).

What it does not do: start or stop servers, check sample quality (the ids are random), or compare samples across
engines (their numerics differ). The server keeps its cache between runs, so every run draws fresh random prompts
unless `--seed` is given; with `--seed`, a second run against the same server reports a hit rate inflated by the
first.

    python benchmarks/gpu/engine_throughput.py --device cpu                       # smoke: tiny random model
    python benchmarks/gpu/engine_throughput.py --model models/Qwen3-0.6B --device cuda \
        --vllm-url http://127.0.0.1:8000 --num-prompts 16 --prompt-tokens 512 --turn-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from gpu_bench_common import (add_random_model_arg, check_device, device_name, model_dir_for, model_label,
                              profiled, quiet_transformers, software_versions)

PREFERRED_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
GENERATION_COUNTER = "vllm:generation_tokens_total"  # a cross-check: the server's count of the tokens it generated


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local Hugging Face model directory (default: a tiny random Qwen3, for a smoke run)")
    add_random_model_arg(p)
    p.add_argument("--device", default="cuda", help="torch device of the transformers engine: cuda or cpu")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=None,
                   help="the transformers engine's weights (default: float32 on CPU, the checkpoint's on a GPU)")
    p.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                   help="bfloat16: generate with a bfloat16 copy of the weights, as the trainer's engine does with "
                        "policy.precision=bfloat16")
    p.add_argument("--vllm-url", help="a running vLLM / SGLang / tracerl serve server with the same model, e.g. "
                                      "http://127.0.0.1:8000 (default: transformers engine only)")
    p.add_argument("--served-model-name", help="the model name the server expects (default: the first it lists)")
    p.add_argument("--n-mode", choices=("n", "repeat"), default="n",
                   help="'n' for vLLM and tracerl serve; 'repeat' for SGLang (one request per sample)")
    p.add_argument("--engines", default="", help="comma-separated subset of transformers,server (default: "
                                                 "transformers, plus server when --vllm-url is given); run them "
                                                 "separately when the GPU cannot hold vLLM and a second copy")
    w = p.add_argument_group("workload (the shape of one step)")
    w.add_argument("--num-prompts", type=int, default=8, help="prompts in the step")
    w.add_argument("--prompt-tokens", type=int, default=192, help="tokens per prompt")
    w.add_argument("--rollouts", type=int, default=2, help="bare rollouts per prompt (stage 1)")
    w.add_argument("--turns", type=int, default=4, help="turns per rollout")
    w.add_argument("--turn-tokens", type=int, default=24, help="tokens the policy generates per turn")
    w.add_argument("--observation-tokens", type=int, default=32, help="tokens the environment appends per turn")
    w.add_argument("--continuations", type=int, default=2, help="continuations per branched node (stage 2)")
    w.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    w.add_argument("--seed", type=int, help="seeds the random ids and sampling (default: drawn from the clock, so a "
                                            "server's cache holds nothing of this run's prompts)")
    e = p.add_argument_group("engines")
    e.add_argument("--max-batch-size", type=int, default=128,
                   help="transformers engine rows decoded together; lower it if the GPU runs out of memory")
    e.add_argument("--cache-tokens", type=int, default=1 << 17,
                   help="transformers engine KV store size in tokens (LRU); too small evicts prefixes and lowers "
                        "its hit rate (each token costs 2 x layers x kv_heads x head_dim numbers)")
    e.add_argument("--concurrency", type=int, default=64, help="requests in flight to the server")
    e.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default; 1 is fastest for "
                                                         "the tiny model on a busy 2-core machine)")
    e.add_argument("--profile", metavar="FILE",
                   help="run the transformers engine's workload under torch.profiler and write its operator table "
                        "(sorted by device time, then by host time) to FILE; the timing then includes the "
                        "profiler's overhead")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown table")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()] or (
        ["transformers", "server"] if args.vllm_url else ["transformers"])
    if set(names) - {"transformers", "server"}:
        p.error(f"--engines {args.engines!r}: use transformers, server or both")
    if "server" in names and not args.vllm_url:
        p.error("--engines server needs --vllm-url http://host:port of the running server")
    args.engines = names
    return args


# ---- Prometheus text ------------------------------------------------------------------------------------------


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over its label sets, from Prometheus' text exposition format."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            value = rest.rpartition("}")[2].split()
        else:
            name, *value = line.split()
        try:
            out[name] = out.get(name, 0.0) + float(value[0])
        except (IndexError, ValueError):
            continue  # not a sample line
    return out


def prefix_cache_counters(metrics: dict[str, float]) -> tuple[str, str] | None:
    """(hits counter, queries counter) names found in `metrics`: vLLM's own, else any prefix_cache pair."""
    if all(name in metrics for name in PREFERRED_COUNTERS):
        return PREFERRED_COUNTERS
    for hits in sorted(metrics):
        if "prefix_cache" not in hits or "external" in hits:
            continue
        for end in ("hits_total", "hits"):
            if hits.endswith(end):
                queries = hits[: -len(end)] + end.replace("hits", "queries")
                if queries in metrics:
                    return hits, queries
    return None


def scrape(client, base_url: str) -> tuple[dict[str, float] | None, str]:
    """The server's metrics, or None and why not."""
    import httpx

    url = f"{base_url}/metrics"
    try:
        response = client.get(url, timeout=10)
    except httpx.TransportError as err:
        return None, f"GET {url} failed ({type(err).__name__})"
    if response.status_code != 200:
        return None, f"GET {url} answered HTTP {response.status_code} (no Prometheus metrics)"
    return parse_prometheus(response.text), url


# ---- the two engines --------------------------------------------------------------------------------------------


def token_range(model_dir: str) -> int:
    """Ids the workload may use: below the tokenizer's size (vLLM refuses ids the tokenizer does not know) and
    the model's vocabulary."""
    from transformers import AutoConfig, AutoTokenizer

    vocab = int(AutoConfig.from_pretrained(model_dir).get_text_config(decoder=True).vocab_size)
    try:
        return min(vocab, len(AutoTokenizer.from_pretrained(model_dir)))
    except (OSError, ValueError):  # a directory with weights only
        return vocab


def kv_bytes_per_token(config, dtype) -> int:
    """Bytes of keys and values one token takes in every layer of a full-attention model."""
    import torch

    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def longest_sequence(args: argparse.Namespace) -> int:
    """Tokens of the workload's longest sequence: the prompt, every turn and the observations between them."""
    return args.prompt_tokens + args.turns * args.turn_tokens + (args.turns - 1) * args.observation_tokens


def run_transformers(model_dir: str, cfg, args: argparse.Namespace) -> tuple[dict, list]:
    import torch

    from tracerl.bench.engine import run_workload
    from tracerl.engines.transformers_engine import TransformersEngine
    from tracerl.io.rollout.engine import SamplingParams
    from tracerl.train.policy import compute_dtype

    compute = compute_dtype(args.precision)  # as policy.precision maps it
    loaded = TransformersEngine.from_pretrained(model_dir, device=args.device, max_batch_size=1, dtype=args.dtype,
                                                compute_dtype=compute)
    loaded.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=4, seed=0))  # first-call overheads out of the timing
    model = loaded.model
    del loaded  # its compute_dtype copy, if any: the timed engine makes its own
    engine = TransformersEngine(model, device=args.device, max_batch_size=args.max_batch_size,
                                cache_capacity_tokens=args.cache_tokens, compute_dtype=compute)
    per_token = kv_bytes_per_token(model.config, compute or next(model.parameters()).dtype)
    kv = {"kv_bytes_per_token": per_token, "kv_store_gib_max": args.cache_tokens * per_token / 2**30,
          "kv_batch_gib_max": args.max_batch_size * longest_sequence(args) * per_token / 2**30}
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        with profiled(args.profile, cuda):
            calls = run_workload(engine, cfg)
    except torch.OutOfMemoryError:
        raise SystemExit(
            f"engine_throughput: the GPU ran out of memory. Keys and values take {per_token:,} bytes a token here: "
            f"the store up to {kv['kv_store_gib_max']:.1f} GiB (--cache-tokens {args.cache_tokens}) and a batch up "
            f"to {kv['kv_batch_gib_max']:.1f} GiB (--max-batch-size {args.max_batch_size} rows of up to "
            f"{longest_sequence(args)} tokens), beside the weights; lower --max-batch-size or --cache-tokens") from None
    seconds = time.perf_counter() - t0
    s = engine.stats
    requested = s["prefill_tokens_computed"] + s["prefill_tokens_reused"]
    dtype = next(engine.model.parameters()).dtype
    return {
        "engine": "transformers", "device": device_name(args.device), "dtype": str(dtype).removeprefix("torch."),
        "precision": args.precision,
        "generated_tokens": s["generated_tokens"], "seconds": seconds,
        "generated_tokens_per_s": s["generated_tokens"] / seconds,
        "prefix_cache_hit_rate": s["prefill_tokens_reused"] / requested if requested else None,
        "hit_rate_from": "engine counters: prefill_tokens_reused / (computed + reused)",
        "prefill_tokens_computed": s["prefill_tokens_computed"], "prefill_tokens_reused": s["prefill_tokens_reused"],
        "cache_evictions": s["cache_evictions"], "forward_passes": s["forward_passes"],
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, **kv,
    }, calls


def check_server(client, base_url: str, wanted_name: str | None) -> tuple[str, int | None]:
    """(served model name, its max_model_len if listed); SystemExit with one line naming the URL if it is not up."""
    import httpx

    url = f"{base_url}/v1/models"
    try:
        response = client.get(url, timeout=10)
        response.raise_for_status()
        models = response.json()["data"]
    except httpx.TransportError as err:
        raise SystemExit(f"engine_throughput: no server answers at {base_url} ({type(err).__name__}: {err}); start "
                         f"it first (benchmarks/gpu/README.md) or drop --vllm-url") from None
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"engine_throughput: {url} did not list models ({err}); is {base_url} an OpenAI-compatible "
                         f"server (vLLM, SGLang, tracerl serve)?") from None
    names = [m.get("id") for m in models if isinstance(m, dict)]
    name = wanted_name or (names[0] if names else None)
    if name is None or name not in names:
        raise SystemExit(f"engine_throughput: {base_url} serves {names}, not {name!r}; pass --served-model-name")
    entry = next(m for m in models if m.get("id") == name)
    return name, entry.get("max_model_len")


def run_server(base_url: str, cfg, args: argparse.Namespace, longest: int) -> tuple[dict, list]:
    import httpx

    from tracerl.bench.engine import run_workload
    from tracerl.engines.openai_engine import OpenAIEngine
    from tracerl.io.rollout.engine import SamplingParams

    base_url = base_url.rstrip("/").removesuffix("/v1")
    with httpx.Client() as client:
        name, max_len = check_server(client, base_url, args.served_model_name)
        if max_len and longest > max_len:
            raise SystemExit(f"engine_throughput: the workload's longest sequence is {longest} tokens but {base_url} "
                             f"serves {name!r} with max_model_len={max_len}; lower --prompt-tokens/--turns/"
                             f"--turn-tokens or raise the server's --max-model-len")
        with OpenAIEngine(base_url, name, n_mode=args.n_mode, max_concurrency=args.concurrency) as engine:
            engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=cfg.seed + 99_991))  # warm-up
            before, source = scrape(client, base_url)
            warm_tokens = engine.stats["generated_tokens"]
            t0 = time.perf_counter()
            calls = run_workload(engine, cfg)
            seconds = time.perf_counter() - t0
            generated = engine.stats["generated_tokens"] - warm_tokens
        after = None
        if before is not None:
            time.sleep(1.0)  # vLLM's API process updates its counters from the engine's stats a moment after
            after, source = scrape(client, base_url)
    row = {"engine": "server", "device": f"server at {base_url} ({name})", "generated_tokens": generated,
           "seconds": seconds, "generated_tokens_per_s": generated / seconds, "prefix_cache_hit_rate": None,
           "hit_rate_from": source}
    if before is not None and after is not None:
        pair = prefix_cache_counters(after)
        if pair is None:
            row["hit_rate_from"] = f"{source} has no prefix-cache hit/query counters"
        else:
            hits, queries = (after[k] - before.get(k, 0.0) for k in pair)
            row["prefix_cache_hit_rate"] = hits / queries if queries > 0 else None
            row["hit_rate_from"] = f"{pair[0]} / {pair[1]} at {source}"
            row["server_prefix_cache_hits"], row["server_prefix_cache_queries"] = hits, queries
        if GENERATION_COUNTER in after:
            row["server_generation_tokens"] = after[GENERATION_COUNTER] - before.get(GENERATION_COUNTER, 0.0)
    return row, calls


# ---- main -------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    from tracerl.bench.engine import EngineBenchConfig, shared_prefix_tokens
    from tracerl.engines import torch_threads

    if "transformers" in args.engines:
        check_device(args.device)
    quiet_transformers()
    seed = args.seed if args.seed is not None else time.time_ns() % 2**31
    with tempfile.TemporaryDirectory(prefix="tracerl-tiny-") as tmp, torch_threads(args.threads):
        model_dir = model_dir_for(args, tmp)
        if not (Path(model_dir) / "config.json").is_file():
            raise SystemExit(f"--model {model_dir!r} is not a local Hugging Face model directory (no config.json); "
                             f"download one first, e.g. to models/Qwen3-0.6B (benchmarks/gpu/README.md)")
        cfg = EngineBenchConfig(vocab_size=token_range(model_dir), num_prompts=args.num_prompts,
                                prompt_tokens=args.prompt_tokens, rollouts_per_prompt=args.rollouts,
                                num_turns=args.turns, turn_tokens=args.turn_tokens,
                                observation_tokens=args.observation_tokens,
                                branch_depths=tuple(range(1, args.turns)), continuations_per_branch=args.continuations,
                                temperature=args.temperature, seed=seed)
        longest = longest_sequence(args)
        rows, calls = [], None
        if "transformers" in args.engines:
            row, calls = run_transformers(model_dir, cfg, args)
            rows.append(row)
        if "server" in args.engines:
            row, server_calls = run_server(args.vllm_url, cfg, args, longest)
            rows.append(row)
            calls = calls or server_calls
    total, shared = shared_prefix_tokens(calls)
    return {
        "model": model_label(args),
        "device": device_name(args.device) if "transformers" in args.engines else None,
        "workload": {"num_calls": len(calls), "num_samples": sum(len(s) for _, _, out in calls for s in out),
                     "prefix_tokens": total, "shared_prefix_tokens": shared, "shared_prefix_frac": shared / total,
                     "longest_sequence_tokens": longest, "seed": seed,
                     "shape": {k: getattr(cfg, k) for k in ("num_prompts", "prompt_tokens", "rollouts_per_prompt",
                                                            "num_turns", "turn_tokens", "observation_tokens",
                                                            "branch_depths", "continuations_per_branch")}},
        "engines": rows,
        "versions": software_versions(),
    }


def to_markdown(result: dict) -> str:
    def rate(v):
        return "-" if v is None else f"{v:.3f}"

    lines = [f"model: {result['model']}; device: {result['device'] or 'server only'}",
             "",
             "| engine | device | generated tokens | seconds | generated tokens/s | prefix-cache hit rate | "
             "hit rate from |",
             "|---|---|---|---|---|---|---|"]
    for r in result["engines"]:
        name = r["engine"] + (f" ({r['dtype']} weights, {r['precision']} compute)" if "precision" in r else "")
        peak = r.get("peak_gpu_memory_gib")
        device = r["device"] + ("" if peak is None else f", peak {peak:.2f} GiB")
        lines.append(f"| {name} | {device} | {r['generated_tokens']:,} | {r['seconds']:.2f} | "
                     f"{r['generated_tokens_per_s']:,.0f} | {rate(r['prefix_cache_hit_rate'])} | "
                     f"{r['hit_rate_from']} |")
    w = result["workload"]
    lines += ["", (f"workload: {w['num_calls']} calls, {w['num_samples']} samples, {w['prefix_tokens']:,} prefix "
                   f"tokens, shared-prefix fraction {w['shared_prefix_frac']:.3f} (the best hit rate possible), seed "
                   f"{w['seed']}; torch {result['versions']['torch']}, transformers "
                   f"{result['versions']['transformers']}")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=1) if args.json else to_markdown(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
