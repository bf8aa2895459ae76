"""A step's trees and their advantages -> training tensors, per rollout or packed.

Per rollout (`rollout_batch`): one row per root-to-leaf rollout, the prompt and every segment of the path laid
end to end, right-padded. A token shared by k rollouts is fed to the model k times.

Packed (`packed_batch`): one row per tree, every node's segment laid out once, in node id order (a parent
precedes its children, so every ancestor's tokens precede a node's own); or, with `split_depth` d > 0, one row
per depth-d subtree with its ancestors repeated (a smaller dense mask for more tokens). Two inputs make the causal
LM see, for each token, exactly the sequence it has in its rollout:
  - a tree attention mask, (B, 1, T, T) bool: token i attends to token j iff j's node is i's node or one of its
    ancestors, and j <= i. Siblings and cousins are invisible to each other;
  - position ids: a node's first token sits at the number of tokens on the path above it, so each token keeps
    the position it has in its rollout (rotary embeddings see the same offsets).
The next-token logits of a segment's first token come from the last token of the nearest non-empty ancestor,
which is not the token just before it in the row: `prev_index` (B, T) names, for every token, the row position
whose logits predict it (-1 for the prompt's first token), and `token_logprobs` gathers through it.

Each token keeps the per-leaf advantages of its node (`TreeAdvantages.segment_values`) as columns of a
(B, T, L) matrix over the row's leaves, with `leaf_mask` (B, T, L) True where the token is a policy token on
that leaf's rollout. Summing the clipped surrogate over columns gives exactly the per-rollout loss, also when
the ratio is not 1 (positive and negative advantages are clipped apart), and `weight` = `leaf_mask.sum(-1)` (the
number of rollouts a token belongs to) makes the normaliser count every rollout's tokens.

This module builds tensors only. It does not run the model or compute the loss (`tracerl.train.loss`), does not
split batches into micro-batches, and never puts two trees in one row (no bin-packing of small trees together).
The mask is dense: attention costs (row length)^2 whatever the tree's sparsity (see `tracerl bench pack`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from tracerl.core.advantages import TreeAdvantages
from tracerl.core.tree import Tree


@dataclass(frozen=True)
class RolloutBatch:
    """One row per rollout (trees in order, each tree's leaves in `TreeAdvantages.leaf_ids` order)."""

    input_ids: torch.Tensor  # (B, T) long, right-padded with pad_id
    attention_mask: torch.Tensor  # (B, T) long, 1 = real token
    logprobs_old: torch.Tensor  # (B, T) float, the sampling logprobs stored in the tree; 0 off policy tokens
    loss_mask: torch.Tensor  # (B, T) float, 1 = policy token of a segment; 0 = prompt, observation, padding
    advantages: torch.Tensor  # (B, T) float, the rollout's advantage of each segment on its policy tokens, else 0
    rollouts: tuple[tuple[int, int], ...]  # (tree index, leaf id) of each row

    @property
    def num_tokens(self) -> int:
        """Real tokens the model computes (padding excluded)."""
        return int(self.attention_mask.sum())

    @property
    def num_policy_tokens(self) -> int:
        """Trained tokens, each rollout counted separately: the token-mean normaliser."""
        return int(self.loss_mask.sum())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def to(self, device: torch.device | str) -> RolloutBatch:
        return _to(self, device)


@dataclass(frozen=True)
class PackedBatch:
    """Packed rows (one per tree by default); see the module docstring. L = the most leaves in any row."""

    input_ids: torch.Tensor  # (B, T) long, right-padded with pad_id
    token_mask: torch.Tensor  # (B, T) long, 1 = real token, 0 = padding
    attention_mask: torch.Tensor  # (B, 1, T, T) bool, True = query i may attend to key j (tree mask)
    position_ids: torch.Tensor  # (B, T) long, each token's position in its rollout
    prev_index: torch.Tensor  # (B, T) long, row position whose logits predict the token; -1 = none
    logprobs_old: torch.Tensor  # (B, T) float, the sampling logprobs stored in the tree; 0 off policy tokens
    loss_mask: torch.Tensor  # (B, T) float, 1 = policy token of a segment
    advantages: torch.Tensor  # (B, T, L) float, column l = the advantage of the token's segment in leaf l's rollout
    leaf_mask: torch.Tensor  # (B, T, L) bool, policy token on leaf l's rollout (False past the row's leaves)
    rows: tuple[tuple[int, tuple[int, ...]], ...]  # (tree index, leaf id of each column) of each row

    @property
    def weight(self) -> torch.Tensor:
        """(B, T) float: how many rollouts each token belongs to as a policy token (its normaliser weight)."""
        return self.leaf_mask.sum(-1).to(self.advantages.dtype)

    @property
    def summed_advantages(self) -> torch.Tensor:
        """(B, T) float: the sum over the leaves below a token's node (`TreeAdvantages.packed`), on policy tokens."""
        return (self.advantages * self.leaf_mask).sum(-1)

    @property
    def num_tokens(self) -> int:
        """Real tokens the model computes (padding excluded)."""
        return int(self.token_mask.sum())

    @property
    def num_policy_tokens(self) -> int:
        """Trained tokens, each rollout counted separately: the token-mean normaliser (same as per rollout)."""
        return int(self.leaf_mask.sum())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "prev_index": self.prev_index}

    def to(self, device: torch.device | str) -> PackedBatch:
        return _to(self, device)


def _to(batch, device):
    """The same batch with every tensor on `device`."""
    return replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in fields(batch)
                             if isinstance(getattr(batch, f.name), torch.Tensor)})


def _check_pair(tree: Tree, adv: TreeAdvantages) -> None:
    if not tree.root.segment.num_tokens:
        raise ValueError(f"prompt {tree.prompt_id!r} has no prompt tokens: the first policy token would have no "
                         "context to be scored from; build the tree with the tokenized prompt as its root segment")
    assert tree.prompt_id == adv.prompt_id, f"tree {tree.prompt_id!r} paired with advantages of {adv.prompt_id!r}"
    assert tuple(tree.leaves()) == adv.leaf_ids, (
        f"prompt {tree.prompt_id!r}: advantages cover leaves {adv.leaf_ids}, the tree has {tree.leaves()}; "
        "were the advantages computed on another version of the tree?")


def _pad(rows: list[list], value, dtype: torch.dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype).reshape(len(rows), width)


def rollout_batch(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], pad_id: int = 0,
                  dtype: torch.dtype = torch.float32) -> RolloutBatch:
    """Rows = rollouts: ids of prompt + each segment on the path; advantage A_l[c] on the policy tokens of c."""
    if len(trees) != len(advantages):
        raise ValueError(f"{len(trees)} trees but {len(advantages)} advantage results; pass them in matching order")
    ids, logprobs, mask, adv, refs = [], [], [], [], []
    for index, (tree, tree_adv) in enumerate(zip(trees, advantages)):
        _check_pair(tree, tree_adv)
        root = tree.root.segment
        for leaf, path, values in zip(tree_adv.leaf_ids, tree_adv.paths, tree_adv.values):
            row_ids, row_lp, row_mask = list(root.token_ids), [0.0] * root.num_tokens, [0] * root.num_tokens
            row_adv = [0.0] * root.num_tokens
            for node_id, value in zip(path, values):
                seg = tree.nodes[node_id].segment
                row_ids += seg.token_ids
                row_lp += [lp if m else 0.0 for lp, m in zip(seg.logprobs, seg.mask)]
                row_mask += seg.mask
                row_adv += [float(value) if m else 0.0 for m in seg.mask]
            ids.append(row_ids), logprobs.append(row_lp), mask.append(row_mask), adv.append(row_adv)
            refs.append((index, leaf))
    return RolloutBatch(
        input_ids=_pad(ids, pad_id, torch.long),  # (B, T)
        attention_mask=_pad([[1] * len(r) for r in ids], 0, torch.long),  # (B, T)
        logprobs_old=_pad(logprobs, 0.0, dtype),  # (B, T)
        loss_mask=_pad(mask, 0, dtype),  # (B, T)
        advantages=_pad(adv, 0.0, dtype),  # (B, T)
        rollouts=tuple(refs),
    )


def _row_groups(adv: TreeAdvantages, split_depth: int) -> list[list[int]]:
    """Leaf columns grouped by their ancestor at `split_depth` (0 = the root: the whole tree in one row)."""
    groups: dict[int, list[int]] = {}
    for col, path in enumerate(adv.paths):
        key = path[min(split_depth, len(path)) - 1] if split_depth > 0 else 0
        groups.setdefault(key, []).append(col)
    return list(groups.values())


def _pack_row(tree: Tree, adv: TreeAdvantages, cols: list[int]) -> dict:
    """One row: the union of the rollouts of leaf columns `cols`, each node once, in node id order."""
    for col in cols:
        path = adv.paths[col]
        assert tuple(tree.path(path[-1])[1:]) == tuple(path), f"prompt {tree.prompt_id!r}: bad path {path}"
    nodes = sorted({0}.union(*(adv.paths[c] for c in cols)))  # parents precede children (Tree invariant)
    local = {node_id: k for k, node_id in enumerate(nodes)}
    start, last = {}, {}  # first row position of a node's segment; last row position on the path root..node
    depth_offset = {}  # tokens on the path above the node = position of its first token
    ids, logprobs, mask, node_of, positions, prev = [], [], [], [], [], []
    for i in nodes:
        seg, p = tree.nodes[i].segment, tree.nodes[i].parent_id
        start[i] = len(ids)
        above = -1 if p is None else last[p]
        depth_offset[i] = 0 if p is None else depth_offset[p] + tree.nodes[p].segment.num_tokens
        for k in range(seg.num_tokens):
            prev.append(above if k == 0 else start[i] + k - 1)
            positions.append(depth_offset[i] + k)
        ids += seg.token_ids
        logprobs += [lp if m else 0.0 for lp, m in zip(seg.logprobs, seg.mask)]
        mask += seg.mask
        node_of += [local[i]] * seg.num_tokens
        last[i] = len(ids) - 1 if seg.num_tokens else above
    ancestor = torch.zeros(len(nodes), len(nodes), dtype=torch.bool)  # [u, v]: v is u or an ancestor of u
    for i in nodes:
        ancestor[local[i], [local[a] for a in tree.path(i)]] = True
    on_path = torch.zeros(len(nodes), len(cols), dtype=torch.bool)  # [u, l]: u's segment is on leaf l's rollout
    node_adv = torch.zeros(len(nodes), len(cols), dtype=torch.float64)  # [u, l]: its advantage there
    for j, col in enumerate(cols):
        rows = [local[i] for i in adv.paths[col]]
        on_path[rows, j] = True
        node_adv[rows, j] = torch.tensor([float(v) for v in adv.values[col]], dtype=torch.float64)
    return {"ids": ids, "logprobs": logprobs, "mask": mask, "node_of": node_of, "positions": positions,
            "prev": prev, "ancestor": ancestor, "on_path": on_path, "node_adv": node_adv}


def packed_batch(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], pad_id: int = 0,
                 dtype: torch.dtype = torch.float32, split_depth: int = 0) -> PackedBatch:
    """Packed rows with the tree attention mask and rollout positions (module doc).

    `split_depth` = 0: one row per tree. d > 0: one row per node at depth d (a leaf above d is its own group),
    holding the subtree below it plus its ancestors, which are then computed once per row: more tokens, but the
    dense (T, T) mask shrinks with the square of the row length. Either way each (token, leaf) term is carried by
    exactly one row, so the loss and its gradient do not change."""
    if len(trees) != len(advantages):
        raise ValueError(f"{len(trees)} trees but {len(advantages)} advantage results; pass them in matching order")
    if split_depth < 0:
        raise ValueError(f"split_depth={split_depth} must be >= 0 (0 = one row per tree)")
    packs, refs = [], []
    for index, (tree, tree_adv) in enumerate(zip(trees, advantages)):
        _check_pair(tree, tree_adv)
        for cols in _row_groups(tree_adv, split_depth):
            packs.append(_pack_row(tree, tree_adv, cols))
            refs.append((index, tuple(tree_adv.leaf_ids[c] for c in cols)))
    num_rows = len(packs)
    width = max((len(p["ids"]) for p in packs), default=0)
    num_cols = max((p["on_path"].shape[1] for p in packs), default=0)
    attention = torch.zeros(num_rows, 1, width, width, dtype=torch.bool)  # (B, 1, T, T)
    advantages_t = torch.zeros(num_rows, width, num_cols, dtype=dtype)  # (B, T, L)
    leaf_mask = torch.zeros(num_rows, width, num_cols, dtype=torch.bool)  # (B, T, L)
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # (T, T)
    for row, p in enumerate(packs):
        n, cols = len(p["ids"]), p["on_path"].shape[1]
        node_of = torch.tensor(p["node_of"], dtype=torch.long)  # (n,)
        attention[row, 0, :n, :n] = p["ancestor"][node_of][:, node_of] & causal[:n, :n]
        pad = torch.arange(n, width)
        attention[row, 0, pad, pad] = True  # padding attends to itself: no empty row
        policy = torch.tensor(p["mask"], dtype=torch.bool)[:, None]  # (n, 1)
        leaf_mask[row, :n, :cols] = p["on_path"][node_of] & policy
        advantages_t[row, :n, :cols] = (p["node_adv"][node_of] * leaf_mask[row, :n, :cols]).to(dtype)
    return PackedBatch(
        input_ids=_pad([p["ids"] for p in packs], pad_id, torch.long),  # (B, T)
        token_mask=_pad([[1] * len(p["ids"]) for p in packs], 0, torch.long),  # (B, T)
        attention_mask=attention,
        position_ids=_pad([p["positions"] for p in packs], 0, torch.long),  # (B, T)
        prev_index=_pad([p["prev"] for p in packs], -1, torch.long),  # (B, T)
        logprobs_old=_pad([p["logprobs"] for p in packs], 0.0, dtype),  # (B, T)
        loss_mask=_pad([p["mask"] for p in packs], 0, dtype),  # (B, T)
        advantages=advantages_t,
        leaf_mask=leaf_mask,
        rows=tuple(refs),
    )
