"""`tracerl bench logits`: the update's forward+backward with the logits of every position against only those that
predict a policy token (`token_logprobs`'s `needed`, through `logits_to_keep`), side by side in one run.

Workload: `tracerl bench pack`'s synthetic agent step (random tokens and rewards, `trace`'s advantages), per rollout,
on a tiny random Qwen3 with Qwen3's 151,936-token vocabulary, where the (B, T, V) logits are most of the step's
memory: each rollout a prompt, then turns of policy tokens with an observation after every turn but the last. Each
variant runs in a fresh process, so that its peak resident memory is its own. Per variant: the logit rows computed,
the float32 bytes of one (rows, V) logits tensor, the best of `repeats` forward+backward timings (wall clock and CPU
time), the process's peak resident memory above what it held before the first step, and, for kept logits, the
relative difference of the loss and the largest relative difference of any parameter's gradient to all logits. It
does not measure learning.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from dataclasses import asdict

import torch

from tracerl.bench.pack import PackBenchConfig, relative_differences, synthetic_trees
from tracerl.core.advantages import compute_advantages
from tracerl.engines import torch_threads
from tracerl.engines.tiny import tiny_qwen3
from tracerl.train.batch import rollout_batch
from tracerl.train.loss import batch_logprobs, packed_policy_loss, token_logprobs

QWEN3_VOCAB = 151_936
DEFAULT = PackBenchConfig(vocab_size=QWEN3_VOCAB, hidden_size=64, num_layers=2, num_prompts=2, prompt_tokens=128,
                          rollouts_per_prompt=4, num_turns=3, policy_tokens=32, observation_tokens=64,
                          branch_depths=(1,), branched_rollouts=0, split_depths=(), repeats=2)
VARIANTS = ("all", "kept")  # logits at every position; only where a policy token is predicted


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _measure(cfg: PackBenchConfig, variant: str) -> dict:
    """One variant in this process: its timings, peak memory above the baseline, loss and gradients."""
    with torch_threads(cfg.num_threads):
        trees = synthetic_trees(cfg)
        batch = rollout_batch(trees, compute_advantages("trace", trees))
        model = tiny_qwen3(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
                           cfg.seed, max_position_embeddings=8192)
        rows = []  # the logits' sequence length of every forward

        def logits_rows(_module, _inputs, output):
            rows.append(output.logits.shape[0] * output.logits.shape[1])

        model.register_forward_hook(logits_rows)
        baseline = _peak_rss_bytes()
        wall = cpu = float("inf")
        for _ in range(cfg.repeats):
            model.zero_grad(set_to_none=True)
            t0, c0 = time.perf_counter(), time.process_time()
            new = batch_logprobs(model, batch) if variant == "kept" else token_logprobs(model, **batch.model_inputs())
            loss, _ = packed_policy_loss(new, batch.logprobs_old, batch.advantages.unsqueeze(-1),
                                         (batch.loss_mask > 0).unsqueeze(-1))
            loss.backward()
            wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        return {"logit_rows": rows[-1], "logits_bytes": rows[-1] * cfg.vocab_size * 4,
                "seconds": wall, "cpu_seconds": cpu, "peak_rss_above_baseline": _peak_rss_bytes() - baseline,
                "loss": loss.item(), "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                "tokens": batch.num_tokens, "padded_tokens": int(batch.input_ids.numel()),
                "policy_tokens": batch.num_policy_tokens}


def run(cfg: PackBenchConfig = DEFAULT) -> dict:
    spawn = multiprocessing.get_context("spawn")
    results = {}
    for variant in VARIANTS:
        with spawn.Pool(1) as pool:
            results[variant] = pool.apply(_measure, (cfg, variant))
    ref = results["all"]
    for variant, row in results.items():
        row["loss_rel_diff"], row["grad_max_rel_diff"] = relative_differences(row["loss"], row["grads"], ref["loss"],
                                                                              ref["grads"])
    for row in results.values():
        del row["grads"]
    return {"variants": results, "config": asdict(cfg)}


def to_markdown(result: dict) -> str:
    rows, ref = result["variants"], result["variants"]["all"]
    names = {"all": "every position", "kept": "positions that predict a policy token"}
    lines = ["| logits at | logit rows | one logits tensor, float32 | fwd+bwd s, wall / CPU | CPU vs every position "
             "| peak memory above start | memory vs every position | loss / grad rel. diff |",
             "|---|---|---|---|---|---|---|---|"]
    for variant, row in rows.items():
        lines.append(f"| {names[variant]} | {row['logit_rows']:,} | {row['logits_bytes'] / 2**20:,.0f} MiB | "
                     f"{row['seconds']:.2f} / {row['cpu_seconds']:.2f} | "
                     f"{ref['cpu_seconds'] / row['cpu_seconds']:.2f}x | "
                     f"{row['peak_rss_above_baseline'] / 2**20:,.0f} MiB | "
                     f"{ref['peak_rss_above_baseline'] / max(row['peak_rss_above_baseline'], 1):.2f}x | "
                     f"{row['loss_rel_diff']:.1e} / {row['grad_max_rel_diff']:.1e} |")
    cfg = result["config"]
    lines += ["", f"workload: {cfg['num_prompts'] * cfg['rollouts_per_prompt']} rollouts (one row each) of "
              f"{ref['padded_tokens'] // (cfg['num_prompts'] * cfg['rollouts_per_prompt']):,} tokens, "
              f"{ref['policy_tokens']:,} policy tokens; vocabulary {cfg['vocab_size']:,}, hidden "
              f"{cfg['hidden_size']}, {cfg['num_layers']} layers; torch threads {cfg['num_threads']}; the best of "
              f"{cfg['repeats']} steps"]
    return "\n".join(lines)
