"""A grown tree as verl rows: one row per leaf (a root-to-leaf rollout), in plain lists.

Row j of a tree is stored by the worker under verl's key `{uid}_{j}_0` (session j, one output):
- `prompt_ids`: the root's exact token ids;
- `response_ids`: every segment on the path after the root, concatenated (policy tokens, then observation tokens
  of each turn), exactly as sampled and inserted;
- `response_mask`: 1 on policy tokens, 0 on observation tokens (verl's convention);
- `logprobs`: the sampling logprobs (0.0 on observation tokens);
- `advantages`: per token, the tree advantage of that token's segment in this rollout (tracerl's
  `TreeAdvantages.of(leaf)`), 0 on observation tokens;
- `reward`: the leaf's reward.

A leaf with no tokens after the prompt (a bare rollout whose generation failed) gets one filler token with mask 0,
so it is still a row, is counted, and carries no loss. Nothing here imports torch or verl.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracerl.core.advantages import TreeAdvantages
from tracerl.core.tree import Tree


@dataclass(frozen=True)
class LeafRow:
    leaf_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    advantages: list[float]
    reward: float
    finish_reason: str
    depth: int  # policy turns on the path

    def token_scores(self, kind: str) -> list[float]:
        """What verl's `rm_scores` carries: per-token advantages, or the reward on the last token ("reward")."""
        if kind == "advantages":
            return list(self.advantages)
        scores = [0.0] * len(self.response_ids)
        scores[-1] = self.reward
        return scores


def leaf_rows(tree: Tree, advantages: TreeAdvantages | None, filler_token_id: int) -> list[LeafRow]:
    """One `LeafRow` per leaf of `tree`, in leaf-id order (the order of `TreeAdvantages.leaf_ids`)."""
    prompt_ids = list(tree.root.segment.token_ids)
    if not prompt_ids:
        raise ValueError(f"tree {tree.prompt_id!r} has an untokenized root; verl rows need the prompt's token ids")
    rows = []
    for leaf in tree.leaves():
        path = tree.path(leaf)[1:]
        values = advantages.of(leaf) if advantages is not None else np.zeros(len(path))
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        advs: list[float] = []
        for node_id, adv in zip(path, values):
            seg = tree.nodes[node_id].segment
            ids += seg.token_ids
            mask += seg.mask
            logprobs += seg.logprobs
            advs += [float(adv) if m else 0.0 for m in seg.mask]
        if not ids:
            ids, mask, logprobs, advs = [filler_token_id], [0], [0.0], [0.0]
        node = tree.nodes[leaf]
        rows.append(LeafRow(leaf, prompt_ids, ids, mask, logprobs, advs, float(node.reward), node.finish_reason,
                            depth=len(path)))
    return rows


def plain(value):
    """numpy arrays and scalars inside a verl row (parquet columns come back as arrays) as Python values."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def tracerl_row(values: dict) -> dict:
    """A verl dataset row (RLHFDataset fields: `raw_prompt`, `data_source`, `reward_model`, `extra_info`) in
    tracerl's row format (`prompt` is the message list), which tracerl's domains reset their environments from."""
    if "raw_prompt" not in values:
        raise ValueError("the verl batch has no `raw_prompt` column; set data.return_raw_chat=True so the TRACE "
                         "worker gets the chat messages (tracerl's environments start from them)")
    return {"data_source": plain(values.get("data_source", "")), "prompt": plain(values["raw_prompt"]),
            "reward_model": plain(values.get("reward_model", {})), "extra_info": plain(values.get("extra_info", {}))}
