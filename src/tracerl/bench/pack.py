"""`tracerl bench pack`: one policy-loss step per rollout vs packed (tree attention mask), side by side in one run.

Workload (the shape of one TRACE step, random tokens on a tiny random Qwen3 built from the config): `num_prompts`
trees, each a prompt of `prompt_tokens` tokens, `rollouts_per_prompt` bare rollouts of `num_turns` turns
(`policy_tokens` policy tokens, then `observation_tokens` observation tokens after every turn but the last), and
`continuations_per_branch` continuations from the node at each depth in `branch_depths` of the first
`branched_rollouts` bare rollouts, each run to `num_turns` turns. Rewards are random, advantages are `trace`'s.

Layouts: per rollout, and packed with each `split_depths` entry (0 = one row per tree). Per layout it reports the
tokens the model computes (real and padded), the attention scores (B * T * T: the dense tree mask costs the square
of the row length), and per attention implementation the best of `repeats` forward+backward timings, wall clock and
this process's CPU time (layouts alternate within a repeat), the speedup over per rollout in CPU time (on a shared
machine the wall clock also measures the neighbours; with one thread CPU time is the work done) and, as a check,
the relative difference of the loss and the largest relative difference of any parameter's gradient to per
rollout. It does not measure learning.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from tracerl.engines import torch_threads
from tracerl.core.advantages import compute_advantages
from tracerl.core.tree import Segment, Tree
from tracerl.engines.tiny import tiny_qwen3
from tracerl.train.batch import packed_batch, rollout_batch
from tracerl.train.loss import batch_policy_loss


@dataclass(frozen=True)
class PackBenchConfig:
    vocab_size: int = 1024  # tiny model's vocabulary
    hidden_size: int = 128  # tiny model's width
    num_layers: int = 4  # tiny model's depth
    num_heads: int = 4  # attention heads
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    num_prompts: int = 8  # trees in the step (one packed row each)
    prompt_tokens: int = 64  # tokens per prompt
    rollouts_per_prompt: int = 4  # bare rollouts per prompt (stage 1)
    num_turns: int = 4  # turns per rollout
    policy_tokens: int = 32  # policy tokens per turn
    observation_tokens: int = 16  # observation tokens after each turn but the last (48 tokens a turn)
    branch_depths: tuple[int, ...] = (1, 2)  # depths of the branched nodes (1 .. num_turns-1)
    branched_rollouts: int = 2  # bare rollouts per prompt whose nodes at branch_depths get continuations
    continuations_per_branch: int = 2  # continuations per branched node (stage 2)
    split_depths: tuple[int, ...] = (0, 1)  # packed layouts timed: 0 = one row per tree, d = one row per depth-d node
    attn_implementations: tuple[str, ...] = ("sdpa",)  # those that take the packed 4D mask: "sdpa", "eager"
    repeats: int = 2  # timed steps per layout (alternating); the fastest counts
    num_threads: int = 1  # torch CPU threads during the run (0 = torch's default)
    seed: int = 0

    def __post_init__(self) -> None:
        if not all(1 <= d < self.num_turns for d in self.branch_depths):
            raise ValueError(f"branch_depths={self.branch_depths} must lie within 1..num_turns-1="
                             f"{self.num_turns - 1}; raise num_turns or pick shallower depths")
        if self.branched_rollouts > self.rollouts_per_prompt:
            raise ValueError(f"branched_rollouts={self.branched_rollouts} exceeds rollouts_per_prompt="
                             f"{self.rollouts_per_prompt}; lower it")
        if min(self.num_prompts, self.prompt_tokens, self.rollouts_per_prompt, self.num_turns, self.repeats) < 1:
            raise ValueError("num_prompts, prompt_tokens, rollouts_per_prompt, num_turns and repeats must be >= 1")


def synthetic_trees(cfg: PackBenchConfig) -> list[Tree]:
    """The workload's trees: random token ids and sampling logprobs, random 0/1 rewards."""
    rng = np.random.default_rng(cfg.seed)

    def segment(last_turn: bool) -> Segment:
        num_obs = 0 if last_turn else cfg.observation_tokens
        n = cfg.policy_tokens + num_obs
        logprobs = np.where(np.arange(n) < cfg.policy_tokens, -rng.exponential(2.0, n), 0.0)
        return Segment(rng.integers(0, cfg.vocab_size, n).tolist(), logprobs.tolist(),
                       [1] * cfg.policy_tokens + [0] * num_obs)

    def grow(tree: Tree, node_id: int, depth: int, origin: str) -> list[int]:
        """Run a rollout from `node_id` (at `depth`) to num_turns turns; returns the node ids it added."""
        added = []
        for turn in range(depth + 1, cfg.num_turns + 1):
            last = turn == cfg.num_turns
            anchor = node_id if not added and origin == "continuation" else None
            node_id = tree.add_child(node_id, segment(last), origin=origin, anchor_id=anchor,
                                     reward=float(rng.random() < 0.5) if last else None)
            added.append(node_id)
        return added

    trees = []
    for p in range(cfg.num_prompts):
        prompt = rng.integers(0, cfg.vocab_size, cfg.prompt_tokens).tolist()
        tree = Tree.new(f"p{p}", Segment(prompt, [0.0] * len(prompt), [0] * len(prompt)))
        bare = [grow(tree, 0, 0, "bare") for _ in range(cfg.rollouts_per_prompt)]
        for nodes in bare[: cfg.branched_rollouts]:
            for depth in cfg.branch_depths:
                for _ in range(cfg.continuations_per_branch):
                    grow(tree, nodes[depth - 1], depth, "continuation")
        trees.append(tree)
    return trees


def run(cfg: PackBenchConfig = PackBenchConfig()) -> dict:
    with torch_threads(cfg.num_threads):
        return _run(cfg)


def _step(model, batch) -> tuple[tuple[float, float], float, dict[str, torch.Tensor]]:
    """((wall seconds, this process's CPU seconds), loss, gradients) of one forward+backward."""
    model.zero_grad(set_to_none=True)
    t0, c0 = time.perf_counter(), time.process_time()
    loss, _ = batch_policy_loss(model, batch)
    loss.backward()
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    return seconds, loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def relative_differences(loss: float, grads: dict[str, torch.Tensor], ref_loss: float,
                         ref_grads: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(|loss - ref_loss| / |ref_loss|, the largest over parameters of max |grad - ref| / max |ref|): how far one
    variant's step is from the reference's."""
    return (abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
            max(float((ref_grads[n] - grads[n]).abs().max() / ref_grads[n].abs().max().clamp(min=1e-30))
                for n in ref_grads))


def _layout_name(split_depth: int) -> str:
    return "packed" if split_depth == 0 else f"packed, split at depth {split_depth}"


def _run(cfg: PackBenchConfig) -> dict:
    trees = synthetic_trees(cfg)
    advantages = compute_advantages("trace", trees)
    batches = {"per rollout": rollout_batch(trees, advantages)}
    batches.update({_layout_name(d): packed_batch(trees, advantages, split_depth=d) for d in cfg.split_depths})
    layouts = {name: {"rows": int(b.input_ids.shape[0]), "tokens": b.num_tokens,
                      "padded_tokens": int(b.input_ids.numel()), "policy_tokens": b.num_policy_tokens,
                      "attention_scores": int(b.input_ids.shape[0] * b.input_ids.shape[1] ** 2)}
               for name, b in batches.items()}
    model = tiny_qwen3(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.seed,
                       max_position_embeddings=8192)
    for impl in cfg.attn_implementations:
        model.set_attn_implementation(impl)
        wall = {name: float("inf") for name in batches}
        cpu = dict(wall)
        losses, grads = {}, {}
        for name, batch in batches.items():  # warm-up: first-call overheads out of the timing
            _, losses[name], grads[name] = _step(model, batch)
        order = list(batches)
        for rep in range(cfg.repeats):
            for name in (order if rep % 2 == 0 else order[::-1]):
                (w, c), _, _ = _step(model, batches[name])
                wall[name], cpu[name] = min(wall[name], w), min(cpu[name], c)
        ref_loss, ref_grads = losses["per rollout"], grads["per rollout"]
        for name in batches:
            layouts[name][f"seconds_{impl}"] = wall[name]
            layouts[name][f"cpu_seconds_{impl}"] = cpu[name]
            layouts[name][f"speedup_{impl}"] = cpu["per rollout"] / cpu[name]
            (layouts[name][f"loss_rel_diff_{impl}"],
             layouts[name][f"grad_max_rel_diff_{impl}"]) = relative_differences(losses[name], grads[name], ref_loss,
                                                                                 ref_grads)
    return {
        "workload": {"num_trees": len(trees), "num_rollouts": sum(len(a.leaf_ids) for a in advantages),
                     "num_nodes": sum(len(t) for t in trees)},
        "layouts": layouts,
        "torch_threads": torch.get_num_threads(),
        "config": asdict(cfg),
    }


def to_markdown(result: dict) -> str:
    impls = result["config"]["attn_implementations"]
    base = result["layouts"]["per rollout"]
    header = ["layout", "rows", "tokens computed", "tokens incl. padding", "attention scores (B*T*T)"]
    header += [f"fwd+bwd s, wall / CPU ({impl})" for impl in impls] + [f"speedup, CPU ({impl})" for impl in impls]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in result["layouts"].items():
        fewer = "" if row is base else f" ({base['tokens'] / row['tokens']:.2f}x fewer)"
        cells = [name, f"{row['rows']:,}", f"{row['tokens']:,}{fewer}",
                 f"{row['padded_tokens']:,}", f"{row['attention_scores']:,}"]
        cells += [f"{row[f'seconds_{impl}']:.2f} / {row[f'cpu_seconds_{impl}']:.2f}" for impl in impls]
        cells += [f"{row[f'speedup_{impl}']:.2f}x" for impl in impls]
        lines.append("| " + " | ".join(cells) + " |")
    w = result["workload"]
    checks = "; ".join(f"{name} ({impl}): loss {row[f'loss_rel_diff_{impl}']:.1e}, "
                       f"grad {row[f'grad_max_rel_diff_{impl}']:.1e}"
                       for name, row in result["layouts"].items() if name != "per rollout" for impl in impls)
    workload = (f"workload: {w['num_trees']} trees, {w['num_rollouts']} rollouts, {w['num_nodes']} nodes, "
                f"{base['policy_tokens']:,} policy tokens (the normaliser, the same in every layout); "
                f"torch threads {result['torch_threads']}")
    lines += ["", workload, f"relative difference to per rollout (max over parameters for the gradient): {checks}"]
    return "\n".join(lines)
