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
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from tracerl.engines import torch_threads
from tracerl.engines.tiny import tiny_qwen3
from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.engine import SamplingParams


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
    vllm_block_size: int = 32  # with vllm=True: vLLM's KV block, the unit of its prefix-cache hits (CPU: x32)

    def __post_init__(self) -> None:
        if not self.branch_depths or not all(1 <= d < self.num_turns for d in self.branch_depths):
            raise ValueError(f"branch_depths={self.branch_depths} must be non-empty, within 1..num_turns-1="
                             f"{self.num_turns - 1}; raise num_turns or pick shallower depths")
        if min(self.num_prompts, self.prompt_tokens, self.rollouts_per_prompt, self.turn_tokens,
               self.continuations_per_branch, self.repeats) < 1:
            raise ValueError("num_prompts, prompt_tokens, rollouts_per_prompt, turn_tokens, "
                             "continuations_per_branch and repeats must all be >= 1")


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
