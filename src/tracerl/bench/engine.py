"""`tracerl bench engine`: KV reuse on vs off on a tree-rollout workload, measured side by side in one run.

Workload (the shape of one TRACE step, on a tiny random Qwen3 built from the config): `num_prompts` prompts of
`prompt_tokens` tokens; `rollouts_per_prompt` bare rollouts each, turn by turn (`num_turns` turns of `turn_tokens`
policy tokens, an observation of `observation_tokens` random tokens after each turn but the last); then
`continuations_per_branch` continuations from every bare rollout's node at each depth in `branch_depths`, each run
to `num_turns` turns. Every engine call batches all live rollouts. No stop tokens, so both modes do exactly the same
amount of decoding and differ only in prefill.

Reported: prefill tokens computed and saved, the workload's shared-prefix fraction (prefix tokens an earlier call
already fed to the model, or another sample of the same prefix in the same call; a bound no engine can beat,
defined without looking at the engine), generated tokens/s in both modes and their ratio. It does not measure
quality: the model is random.

With `vllm=True` (`tracerl bench engine --vllm`, in an environment with the `vllm` extra) the same workload also
runs on `VLLMEngine` with the same weights, its prefix cache emptied before each timed run: generated tokens/s,
prefill tokens saved and hit rate from vLLM's own counters (`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`,
in tokens, whole KV blocks only, a prompt's last token never), and the shared-prefix fraction of the workload as
vLLM drew it (its samples differ from tracerl's engine's, so its rollouts, and their prefixes, do too).

Roofline (`roofline=True`, the default): the machine's float32 matmul peak, timed in the same run on the same torch
thread count (`gemm_peak`), beside the engine's achieved FLOP/s in prefill and in decode (`engine_flops`, counted
from the model's config and the engine's `stats`, timed by the engine's own prefill/decode split): for both modes of
the workload, for one call of `sweep_rows` rows on the bench's model, and for one call at the embedded default
policy's shape and evaluation batch (`EmbeddedConfig()`: its width, depth, heads and vocabulary, random weights,
`num_eval_prompts x eval_samples_per_prompt` rows). A decode step's time at 1 row against many rows splits it into
a fixed part (Python, per-op overheads) and a part that grows with the rows. Decode attention reads every cached key
and value once per token for a few FLOPs each, so the keys and values it reads are also set against the memory read
rate measured beside the peak. The FLOPs and bytes are useful ones (pads are computed but not counted), so the ratios
are a lower bound on what the hardware did.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from tracerl.engines import torch_threads
from tracerl.engines.tiny import tiny_qwen3
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.engine import SamplingParams


@dataclass(frozen=True)
class EngineBenchConfig:
    vocab_size: int = 1024  # tiny model's vocabulary
    hidden_size: int = 128  # tiny model's width
    num_layers: int = 4  # tiny model's depth
    num_heads: int = 4  # attention heads
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    num_prompts: int = 8  # prompts in the step
    prompt_tokens: int = 192  # tokens per prompt (system prompt + task)
    rollouts_per_prompt: int = 2  # bare rollouts per prompt (stage 1)
    num_turns: int = 4  # turns per rollout
    turn_tokens: int = 24  # policy tokens per turn
    observation_tokens: int = 32  # tokens the environment appends after each turn but the last
    branch_depths: tuple[int, ...] = (1, 2, 3)  # depths of the nodes that get continuations (1 .. num_turns-1)
    continuations_per_branch: int = 2  # continuations per branched node (stage 2)
    temperature: float = 1.0  # sampling temperature (same seeds in both modes)
    max_batch_size: int = 128  # engine rows per batch; at least the widest call, so reuse is not split by chunks
    cache_capacity_tokens: int = 1 << 17  # KV store size; large enough to hold the whole step
    repeats: int = 2  # timed runs per mode (alternating); the fastest counts
    num_threads: int = 1  # torch CPU threads during the run (0 = torch's default); OpenMP on tiny shapes on a
    # busy 2-core machine can be 10x slower with 2 threads than with 1
    seed: int = 0
    roofline: bool = True  # also time float32 matmuls for the machine's peak and report the engine's FLOP/s against it
    gemm_sizes: tuple[int, ...] = (256, 512, 1024, 2048)  # square float32 matmuls timed for the peak; the best counts
    sweep_rows: tuple[int, ...] = (1, 16, 64, 256)  # rows of the one-call shapes on the bench's model; the fewest
    # shows the fixed time of a decode step, the most how close a wide batch gets to the peak
    sweep_decode_tokens: int = 32  # decode steps per one-call shape on the bench's model
    eval_shape: bool = True  # also one call at the embedded default policy's shape and evaluation batch (random)
    eval_prefix_tokens: int = 256  # prefix tokens per row in that call (a question plus a few turns)
    vllm_block_size: int = 32  # with vllm=True: vLLM's KV block, the unit of its prefix-cache hits (CPU: x32)

    def __post_init__(self) -> None:
        if not self.branch_depths or not all(1 <= d < self.num_turns for d in self.branch_depths):
            raise ValueError(f"branch_depths={self.branch_depths} must be non-empty, within 1..num_turns-1="
                             f"{self.num_turns - 1}; raise num_turns or pick shallower depths")
        if min(self.num_prompts, self.prompt_tokens, self.rollouts_per_prompt, self.turn_tokens,
               self.continuations_per_branch, self.repeats, self.sweep_decode_tokens, self.eval_prefix_tokens) < 1:
            raise ValueError("num_prompts, prompt_tokens, rollouts_per_prompt, turn_tokens, continuations_per_branch, "
                             "repeats, sweep_decode_tokens and eval_prefix_tokens must all be >= 1")
        if self.roofline and (not self.gemm_sizes or not self.sweep_rows or min(*self.gemm_sizes,
                                                                                *self.sweep_rows) < 1):
            raise ValueError(f"gemm_sizes={self.gemm_sizes} and sweep_rows={self.sweep_rows} must be non-empty and "
                             f">= 1 with roofline=True; set roofline=false to skip the roofline")


def _observation(cfg: EngineBenchConfig, path: tuple[int, ...], turn: int) -> list[int]:
    """The environment's reply after `turn` on rollout `path`: fixed by the seed, the same in both modes."""
    rng = np.random.default_rng([cfg.seed, 7, *path, turn])
    return rng.integers(0, cfg.vocab_size, cfg.observation_tokens).tolist()


def run_workload(engine, cfg: EngineBenchConfig) -> list[tuple[list[list[int]], list[int], list]]:
    """Drive the tree-rollout workload through `engine`; returns each call's (prefixes, counts, completions)."""
    calls = []

    def generate(prefixes, counts):
        params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.turn_tokens, seed=cfg.seed + len(calls))
        out = engine.generate(prefixes, params, n=counts)
        calls.append((prefixes, counts, out))
        return out

    def advance(live):
        """One turn for every live rollout: {path: (sequence, turns done)} -> the same, one turn further."""
        out = generate([seq for seq, _ in live.values()], [1] * len(live))
        grown = {}
        for (path, (seq, done)), samples in zip(live.items(), out):
            seq = seq + samples[0].token_ids
            if done + 1 < cfg.num_turns:
                seq = seq + _observation(cfg, path, done + 1)
            grown[path] = (seq, done + 1)
        return grown

    rng = np.random.default_rng(cfg.seed)
    prompts = [rng.integers(0, cfg.vocab_size, cfg.prompt_tokens).tolist() for _ in range(cfg.num_prompts)]
    # stage 1: bare rollouts; the first turn samples rollouts_per_prompt continuations of each prompt
    first = generate(prompts, [cfg.rollouts_per_prompt] * len(prompts))
    live, nodes = {}, {}
    for i, (prompt, samples) in enumerate(zip(prompts, first)):
        for j, c in enumerate(samples):
            seq = prompt + c.token_ids + (_observation(cfg, (i, j), 1) if cfg.num_turns > 1 else [])
            live[(i, j)] = (seq, 1)
    while True:
        for path, (seq, done) in live.items():
            if done in cfg.branch_depths:
                nodes[(*path, done)] = seq
        live = {p: v for p, v in live.items() if v[1] < cfg.num_turns}
        if not live:
            break
        live = advance(live)
    # stage 2: continuations from the branched nodes, then every continuation runs to num_turns turns
    branch = list(nodes.items())
    out = generate([seq for _, seq in branch], [cfg.continuations_per_branch] * len(branch))
    live = {}
    for (node, seq), samples in zip(branch, out):
        depth = node[-1]
        for b, c in enumerate(samples):
            path = (*node, b)
            grown = seq + c.token_ids
            if depth + 1 < cfg.num_turns:
                grown = grown + _observation(cfg, path, depth + 1)
            live[path] = (grown, depth + 1)
    while live := {p: v for p, v in live.items() if v[1] < cfg.num_turns}:
        live = advance(live)
    return calls


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


def shared_prefix_tokens(calls) -> tuple[int, int]:
    """(total prefix tokens over all samples, tokens of them already fed to the model before) for a workload.

    A sample's prefix tokens count as shared when an earlier sample of the same prefix in the same call exists
    (all of them), else up to the longest common prefix with a sequence fed in an earlier call (a prefix plus its
    output but the output's last token, which was sampled, never fed), minus the prefix's last token, which must be
    fed to get the next token's logits.
    """
    fed: list[np.ndarray] = []
    total = shared = 0
    for prefixes, counts, out in calls:
        for p, count in zip(prefixes, counts):
            if count == 0:
                continue
            arr = np.asarray(p)
            best = max((_lcp(arr, f) for f in fed), default=0)
            total += count * len(p)
            shared += min(best, len(p) - 1) + (count - 1) * len(p)
        fed += [np.asarray(p + c.token_ids[:-1]) for p, samples in zip(prefixes, out) for c in samples]
    return total, shared


def run(cfg: EngineBenchConfig = EngineBenchConfig(), *, vllm: bool = False) -> dict:
    """Both transformers modes, and with `vllm` the in-process vLLM engine on the same weights (see the docstring)."""
    with torch_threads(cfg.num_threads):
        model = tiny_qwen3(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
                           cfg.seed, max_position_embeddings=8192)
        result = _run(cfg, model)
        if cfg.roofline:
            result["roofline"] = roofline(cfg, model, result["modes"])
        if vllm:
            result["vllm"] = run_vllm(cfg, model)
            result["vllm_speed_ratio"] = (result["vllm"]["generated_tokens_per_s"]
                                          / result["modes"]["on"]["generated_tokens_per_s"])
        return result


def run_vllm(cfg: EngineBenchConfig, model: torch.nn.Module) -> dict:
    """The workload on `VLLMEngine` with `model`'s weights: the fastest of `cfg.repeats` runs, each from an empty
    prefix cache, with vLLM's prefix-cache counters over that run."""
    from tracerl.engines.vllm_engine import VLLMEngine

    longest = cfg.prompt_tokens + cfg.num_turns * (cfg.turn_tokens + cfg.observation_tokens)
    best: dict = {}
    with VLLMEngine.from_model(model, max_model_len=longest + 64, block_size=cfg.vllm_block_size,
                               max_num_seqs=cfg.max_batch_size, seed=cfg.seed) as engine:
        engine.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=4, seed=0))  # first-call overheads
        for _ in range(cfg.repeats):
            engine.clear_cache()
            before = dict(engine.stats)
            t0 = time.perf_counter()
            calls = run_workload(engine, cfg)
            seconds = time.perf_counter() - t0
            if not best or seconds < best["seconds"]:
                delta = {k: engine.stats[k] - before[k] for k in
                         ("generated_tokens", "prefix_cache_queries", "prefix_cache_hits", "num_requests")}
                total, shared = shared_prefix_tokens(calls)
                best = dict(delta, seconds=seconds, generated_tokens_per_s=delta["generated_tokens"] / seconds,
                            prefill_tokens_saved=delta["prefix_cache_hits"],
                            hit_rate=delta["prefix_cache_hits"] / max(1, delta["prefix_cache_queries"]),
                            prefix_tokens=total, shared_prefix_frac=shared / total, block_size=cfg.vllm_block_size)
    best["hit_rate_over_bound"] = best["hit_rate"] / best["shared_prefix_frac"]
    return best


def _run(cfg: EngineBenchConfig, model: torch.nn.Module) -> dict:
    warm = TransformersEngine(model, max_batch_size=cfg.max_batch_size)
    warm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=4, seed=0))  # first-call overheads out of the timing

    modes: dict[str, dict] = {}
    outputs: dict[str, list] = {}
    for rep in range(cfg.repeats):
        for name in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            engine = TransformersEngine(model, max_batch_size=cfg.max_batch_size,
                                        cache_capacity_tokens=cfg.cache_capacity_tokens, reuse_kv=name == "on")
            t0 = time.perf_counter()
            calls = run_workload(engine, cfg)
            seconds = time.perf_counter() - t0
            if name not in modes or seconds < modes[name]["seconds"]:
                modes[name] = dict(engine.stats, seconds=seconds,
                                   generated_tokens_per_s=engine.stats["generated_tokens"] / seconds)
                outputs[name] = calls
    on, off = modes["on"], modes["off"]
    total, shared = shared_prefix_tokens(outputs["on"])

    def ids(calls):
        return [c.token_ids for _, _, out in calls for s in out for c in s]

    same = sum(a == b for a, b in zip(ids(outputs["on"]), ids(outputs["off"])))
    return {
        "workload": {"num_calls": len(outputs["on"]), "num_samples": len(ids(outputs["on"])),
                     "prefix_tokens": total, "shared_prefix_tokens": shared, "shared_prefix_frac": shared / total,
                     "generated_tokens": on["generated_tokens"]},
        "modes": modes,
        "prefill_tokens_saved": off["prefill_tokens_computed"] - on["prefill_tokens_computed"],
        "prefill_cut_frac": 1 - on["prefill_tokens_computed"] / off["prefill_tokens_computed"],
        "speed_ratio": on["generated_tokens_per_s"] / off["generated_tokens_per_s"],
        "samples_identical_frac": same / max(1, len(ids(outputs["on"]))),
        "torch_threads": torch.get_num_threads(),
        "config": asdict(cfg),
    }


def to_markdown(result: dict) -> str:
    on, off, w = result["modes"]["on"], result["modes"]["off"], result["workload"]
    rows = [("prefill tokens computed", off["prefill_tokens_computed"], on["prefill_tokens_computed"]),
            ("prefill tokens reused", off["prefill_tokens_reused"], on["prefill_tokens_reused"]),
            ("generated tokens", off["generated_tokens"], on["generated_tokens"]),
            ("forward passes", off["forward_passes"], on["forward_passes"]),
            ("seconds", off["seconds"], on["seconds"]),
            ("generated tokens/s", off["generated_tokens_per_s"], on["generated_tokens_per_s"])]

    def fmt(v):
        return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"

    lines = ["| measure | reuse off | reuse on |", "|---|---|---|"]
    lines += [f"| {name} | {fmt(a)} | {fmt(b)} |" for name, a, b in rows]
    verdict = "meets" if result["prefill_cut_frac"] >= w["shared_prefix_frac"] - 1e-9 else "MISSES"
    lines += ["",
              (f"workload: {w['num_calls']} calls, {w['num_samples']} samples, {w['prefix_tokens']:,} prefix "
               f"tokens, shared-prefix fraction {w['shared_prefix_frac']:.3f}"),
              (f"prefill tokens saved {result['prefill_tokens_saved']:,} (cut {result['prefill_cut_frac']:.3f}, "
               f"{verdict} the shared-prefix bound); speed ratio on/off {result['speed_ratio']:.2f}x; identical "
               f"samples {result['samples_identical_frac']:.3f}; torch threads {result['torch_threads']}")]
    if "roofline" in result:
        lines += ["", *roofline_markdown(result["roofline"])]
    if "vllm" in result:
        lines += ["", *engines_table(result)]
    return "\n".join(lines)


def engines_table(result: dict) -> list[str]:
    """tracerl's engine (reuse on and off) beside vLLM: tokens/s, prefill tokens saved, cache hit rate."""
    on, off, v, w = result["modes"]["on"], result["modes"]["off"], result["vllm"], result["workload"]

    def hit_rate(mode):
        return mode["prefill_tokens_reused"] / max(1, mode["prefill_tokens_reused"] + mode["prefill_tokens_computed"])

    rows = [("transformers, KV reuse on", on["generated_tokens_per_s"], on["prefill_tokens_reused"], hit_rate(on),
             w["shared_prefix_frac"]),
            ("transformers, KV reuse off", off["generated_tokens_per_s"], off["prefill_tokens_reused"], hit_rate(off),
             w["shared_prefix_frac"]),
            (f"vLLM, prefix caching (blocks of {v['block_size']})", v["generated_tokens_per_s"],
             v["prefill_tokens_saved"], v["hit_rate"], v["shared_prefix_frac"])]
    lines = ["| engine | generated tokens/s | prefill tokens saved | cache hit rate | shared-prefix fraction |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {tps:,.0f} | {saved:,} | {rate:.3f} | {frac:.3f} |" for name, tps, saved, rate, frac in rows]
    lines += ["", (f"vLLM / transformers (reuse on) generated tokens/s: {result['vllm_speed_ratio']:.2f}x; vLLM's hit "
                   f"rate is {v['hit_rate_over_bound']:.3f} of its workload's shared-prefix fraction")]
    return lines


# ---- roofline: the machine's matmul peak and the engine's FLOP/s against it -----------------------------------------

def flops_per_token(config) -> dict[str, int]:
    """Matmul FLOPs of one token through a Qwen3-style decoder (a transformers config), in three terms.

    With width h, L layers, H query heads and Hkv key/value heads of size d, MLP width I, vocabulary V:
    `dense` = 2 L (h H d + 2 h Hkv d + H d h + 3 h I)   (q, k, v, o projections and the gated MLP, 2 FLOPs a weight)
    `lm_head` = 2 h V                                    (only for a token whose logits are computed)
    `attention_per_key` = 4 L H d                        (q.k and the weighted sum of v, per key the token attends to)
    Norms, rotary embeddings, softmax and sampling are left out (a few FLOPs per number, not per weight).
    """
    h, heads = config.hidden_size, config.num_attention_heads
    d = getattr(config, "head_dim", None) or h // heads
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    per_layer = h * heads * d + 2 * h * kv_heads * d + heads * d * h + 3 * h * config.intermediate_size
    return {"dense": 2 * layers * per_layer, "lm_head": 2 * h * config.vocab_size,
            "attention_per_key": 4 * layers * heads * d}


def engine_flops(stats: dict, config) -> dict[str, int]:
    """Useful FLOPs of a `TransformersEngine`'s work so far (`flops_per_token` terms x its `stats`):

    prefill = dense x prefill_tokens_computed + lm_head x prefill_rows + attention_per_key x prefill_attention_pairs
    decode = (dense + lm_head) x decode_tokens_fed + attention_per_key x decode_attention_pairs
    """
    f = flops_per_token(config)
    return {"prefill": (f["dense"] * stats["prefill_tokens_computed"] + f["lm_head"] * stats["prefill_rows"]
                        + f["attention_per_key"] * stats["prefill_attention_pairs"]),
            "decode": ((f["dense"] + f["lm_head"]) * stats["decode_tokens_fed"]
                       + f["attention_per_key"] * stats["decode_attention_pairs"])}


def kv_read_bytes(stats: dict, config, itemsize: int = 4) -> int:
    """Bytes of cached keys and values decode attention reads: decode_attention_pairs x 2 L Hkv d x itemsize (one
    query token reads every key and value it attends to once per layer; transformers' SDPA path packs the query
    heads of a group onto their key/value head at one query token, so keys are not repeated). Pads not counted."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return stats["decode_attention_pairs"] * 2 * config.num_hidden_layers * config.num_key_value_heads * d * itemsize


def gemm_peak(sizes: tuple[int, ...], repeats: int = 3) -> dict:
    """Float32 `torch.mm` FLOP/s (2 n^3 per n x n product) on the current torch thread count, best of `repeats`
    per size; `flop_per_s` is the best size's, the peak the engine is held against. `read_bytes_per_s`: a sum over
    256 MB of float32, the rate memory feeds one reduction (the bound for decode attention, which does 4 d FLOPs
    per query head for the 8 d bytes of one key and value: one FLOP per byte at two query heads per key/value head)."""
    gen = torch.Generator().manual_seed(0)
    by_size = {}
    for n in sizes:
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)  # (n, n) each
        out = torch.mm(a, b)  # first call: allocation and thread start-up out of the timing
        best = float("inf")
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
        by_size[str(n)] = 2 * n ** 3 / best
    x = torch.randn(64 << 20, generator=gen)  # 256 MB, well past any cache
    x.sum()
    read = float("inf")
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        x.sum()
        read = min(read, time.perf_counter() - t0)
    return {"flop_per_s": max(by_size.values()), "by_size": by_size, "torch_threads": torch.get_num_threads(),
            "read_bytes_per_s": x.numel() * x.element_size() / read}


def achieved(stats: dict, config, seconds: float, peak: dict) -> dict:
    """Prefill and decode FLOP/s of one engine's `stats` against `peak`, forward passes/s and time per decode step.

    Every chunk of rows samples once per forward pass (once after its prefill, once after each decode forward), so
    a decode step's time is decode_seconds / forward_passes."""
    flops = engine_flops(stats, config)
    decode_forwards = stats["forward_passes"] - stats["prefill_forward_passes"]
    out = {"prefill_flop": flops["prefill"], "decode_flop": flops["decode"]}
    for phase in ("prefill", "decode"):
        rate = flops[phase] / max(stats[f"{phase}_seconds"], 1e-12)
        out.update({f"{phase}_seconds": stats[f"{phase}_seconds"], f"{phase}_flop_per_s": rate,
                    f"{phase}_peak_frac": rate / peak["flop_per_s"]})
    kv_rate = kv_read_bytes(stats, config) / max(stats["decode_seconds"], 1e-12)
    out.update(decode_kv_bytes_per_s=kv_rate, decode_kv_read_frac=kv_rate / peak["read_bytes_per_s"],
               forward_passes_per_s=stats["forward_passes"] / seconds,
               decode_step_seconds=stats["decode_seconds"] / max(stats["forward_passes"], 1),
               mean_decode_rows=stats["decode_tokens_fed"] / max(decode_forwards, 1))
    return out


def one_call(model: torch.nn.Module, rows: int, prefix_tokens: int, decode_tokens: int, cfg: EngineBenchConfig,
             peak: dict) -> dict:
    """One `generate` call of `rows` distinct prefixes of one length (no pads, no store), fastest of `cfg.repeats`."""
    vocab = model.config.vocab_size
    rng = np.random.default_rng([cfg.seed, 11, rows])
    prefixes = [rng.integers(0, vocab, prefix_tokens).tolist() for _ in range(rows)]
    params = SamplingParams(temperature=cfg.temperature, max_tokens=decode_tokens, seed=cfg.seed)
    best: dict = {}
    for _ in range(cfg.repeats):
        engine = TransformersEngine(model, max_batch_size=rows, cache_capacity_tokens=0, reuse_kv=False)
        t0 = time.perf_counter()
        engine.generate(prefixes, params)
        seconds = time.perf_counter() - t0
        if not best or seconds < best["seconds"]:
            best = dict(achieved(engine.stats, model.config, seconds, peak), rows=rows, prefix_tokens=prefix_tokens,
                        decode_tokens=decode_tokens, seconds=seconds,
                        generated_tokens_per_s=engine.stats["generated_tokens"] / seconds)
    return best


def step_split(calls: list[dict]) -> dict:
    """A decode step's time as fixed + per_row x rows, from the calls with the fewest and the most rows; `fixed_frac`
    is the fixed part's share of a step at the most rows."""
    low, high = min(calls, key=lambda c: c["rows"]), max(calls, key=lambda c: c["rows"])
    per_row = max((high["decode_step_seconds"] - low["decode_step_seconds"]) / max(high["rows"] - low["rows"], 1),
                  0.0)  # timing noise on tiny shapes can make it negative
    fixed = min(max(low["decode_step_seconds"] - per_row * low["rows"], 0.0), high["decode_step_seconds"])
    return {"fixed_seconds": fixed, "per_row_seconds": per_row, "rows": high["rows"],
            "fixed_frac": fixed / high["decode_step_seconds"]}


def roofline(cfg: EngineBenchConfig, model: torch.nn.Module, modes: dict) -> dict:
    """The peak, the workload's modes against it, and the one-call shapes (see the module docstring)."""
    from tracerl.policy.embedded_config import EmbeddedConfig

    peak = gemm_peak(cfg.gemm_sizes)
    result = {"peak": peak, "modes": {name: achieved(m, model.config, m["seconds"], peak) for name, m in modes.items()}}
    shapes = {"bench model": [one_call(model, r, cfg.prompt_tokens, cfg.sweep_decode_tokens, cfg, peak)
                              for r in sorted(set(cfg.sweep_rows))]}
    if cfg.eval_shape:
        e = EmbeddedConfig()
        small = tiny_qwen3(e.vocab_size, e.hidden_size, e.num_layers, e.num_heads, e.num_kv_heads, e.seed,
                           max_position_embeddings=8192)
        small_rows = sorted({1, e.num_eval_prompts * e.eval_samples_per_prompt})
        TransformersEngine(small).generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=4, seed=0))  # warm
        shapes["embedded default"] = [one_call(small, r, cfg.eval_prefix_tokens, e.max_tokens_per_turn, cfg, peak)
                                      for r in small_rows]
    result["shapes"] = shapes
    result["decode_step_split"] = {name: step_split(calls) for name, calls in shapes.items() if len(calls) > 1}
    return result


def roofline_markdown(roof: dict) -> list[str]:
    """The peak, then one row per piece of work: FLOP/s and KV bytes/s against the peak, decode step time, rows."""
    peak = roof["peak"]
    lines = [f"float32 matmul peak {peak['flop_per_s'] / 1e9:.1f} GFLOP/s on {peak['torch_threads']} torch thread(s) "
             f"(n x n: " + ", ".join(f"{n}: {v / 1e9:.1f}" for n, v in peak["by_size"].items()) + f"); memory read "
             f"{peak['read_bytes_per_s'] / 1e9:.1f} GB/s", "",
             "| work | rows | prefill GFLOP/s | of peak | decode GFLOP/s | of peak | decode KV read GB/s | of read "
             "bandwidth | ms per decode step | mean decode rows | forward passes/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [(f"workload, reuse {name}", "tree", a) for name, a in roof["modes"].items()]
    rows += [(f"one call, {shape}, prefix {c['prefix_tokens']}, {c['decode_tokens']} steps", c["rows"], c)
             for shape, calls in roof["shapes"].items() for c in calls]
    lines += [f"| {name} | {r} | {a['prefill_flop_per_s'] / 1e9:.2f} | {a['prefill_peak_frac']:.3f} | "
              f"{a['decode_flop_per_s'] / 1e9:.2f} | {a['decode_peak_frac']:.3f} | "
              f"{a['decode_kv_bytes_per_s'] / 1e9:.2f} | {a['decode_kv_read_frac']:.3f} | "
              f"{a['decode_step_seconds'] * 1e3:.2f}"
              f" | {a['mean_decode_rows']:.1f} | {a['forward_passes_per_s']:.1f} |" for name, r, a in rows]
    for shape, split in roof["decode_step_split"].items():
        lines += ["", (f"decode step, {shape}: {split['fixed_seconds'] * 1e3:.2f} ms fixed + "
                       f"{split['per_row_seconds'] * 1e6:.1f} us per row; the fixed part is "
                       f"{split['fixed_frac']:.2f} of a step at {split['rows']} rows")]
    return lines
