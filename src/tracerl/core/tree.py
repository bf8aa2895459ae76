"""Rollout trees: every node grown from one prompt in one training step.

A node is the state after a turn; its segment holds the tokens that turn added to its parent's
prefix (policy tokens, mask 1, then observation tokens, mask 0). The root is the bare prompt
(depth 0, all mask 0). A leaf is a finished node and carries the reward. A rollout is a
root-to-leaf path, a continuation is a rollout started from an intermediate node.

Node ids are positions in `Tree.nodes` and a child always has a larger id than its parent, so a
reverse scan visits children before parents (backup is one pass, no recursion).

This module is plain Python + numpy. It does not tokenize, sample, or touch files: the driver
builds trees, `to_json`/`from_json` give a lossless text form for whoever writes them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator, Sequence

import numpy as np

from tracerl.core.history import History

FINISH_REASONS = ("answer", "max_turns", "max_tokens", "error")


@dataclass
class Segment:
    """Tokens one turn adds to its parent's prefix, exactly as the engine and environment produced them."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampling logprob; 0.0 on observation tokens
    mask: list[int] = field(default_factory=list)  # 1 = policy token (trainable), 0 = inserted by the environment
    policy_text: str = ""
    observation_text: str = ""

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.logprobs) == len(self.mask)):
            raise ValueError(
                f"segment lengths differ: {len(self.token_ids)} token ids, {len(self.logprobs)} logprobs, "
                f"{len(self.mask)} mask entries; give one logprob and one mask entry per token"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_policy_tokens(self) -> int:
        return int(sum(self.mask))

    @classmethod
    def text_only(cls, policy_text: str = "", observation_text: str = "", num_policy_tokens: int = 0,
                  num_observation_tokens: int = 0) -> "Segment":
        """A segment whose token ids are placeholders (zeros): for simulators and tests that count tokens only."""
        n = num_policy_tokens + num_observation_tokens
        return cls([0] * n, [0.0] * n, [1] * num_policy_tokens + [0] * num_observation_tokens,
                   policy_text, observation_text)


@dataclass
class Node:
    node_id: int
    parent_id: int | None
    depth: int
    segment: Segment
    reward: float | None = None  # set on leaves only
    finish_reason: str | None = None  # one of FINISH_REASONS, leaves only
    tool_error: bool = False  # the observation of this turn reports a tool or format error
    origin: str = "bare"  # "prompt", "bare" (stage-1 rollout) or "continuation" (stage-2 rollout)
    anchor_id: int = 0  # the node the rollout that created this node started from (0 = the root)
    p_pred: float | None = None  # predictor's success probability when this node was an anchor candidate
    expand_reason: str | None = None  # why budget was spent here: "root", "predictor", "uniform", "random", ...
    num_granted: int = 0  # rollouts granted with this node as anchor (stage-1 m at the root, stage-2 K elsewhere)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_leaf(self) -> bool:
        return self.reward is not None


@dataclass(frozen=True)
class Backup:
    """Backup targets: `vhat[y]` = mean reward of the leaves below y (NaN if none yet), `num_leaves[y]` = n_y."""

    vhat: np.ndarray  # (N,) float
    num_leaves: np.ndarray  # (N,) int
    reward_sum: np.ndarray  # (N,) float


class Tree:
    """All nodes grown from one prompt in one step. Build with `Tree.new`, grow with `add_child`."""

    def __init__(self, prompt_id: str, nodes: list[Node], meta: dict[str, Any] | None = None):
        self.prompt_id = prompt_id
        self.nodes = nodes
        self.meta = dict(meta or {})
        self.children: list[list[int]] = [[] for _ in nodes]
        for node in nodes[1:]:
            assert node.parent_id is not None and node.parent_id < node.node_id, "parents must precede children"
            self.children[node.parent_id].append(node.node_id)

    @classmethod
    def new(cls, prompt_id: str, prompt: Segment | str, meta: dict[str, Any] | None = None) -> "Tree":
        segment = prompt if isinstance(prompt, Segment) else Segment(observation_text=prompt)
        if segment.num_policy_tokens:
            raise ValueError("the prompt segment must have mask 0 everywhere: prompt tokens are never trained")
        root = Node(node_id=0, parent_id=None, depth=0, segment=segment, origin="prompt")
        return cls(prompt_id, [root], meta)

    # ------------------------------------------------------------------ growth
    def add_child(self, parent_id: int, segment: Segment, *, reward: float | None = None,
                  finish_reason: str | None = None, tool_error: bool = False, origin: str = "bare",
                  anchor_id: int | None = None, meta: dict[str, Any] | None = None) -> int:
        """Append the node after one turn taken from `parent_id`; pass `reward` to make it a leaf.

        `anchor_id`: where this node's rollout started; pass it for the first node of a continuation
        (its parent), later nodes of the same rollout inherit it from their parent."""
        parent = self.nodes[parent_id]
        assert not parent.is_leaf, f"node {parent_id} is a leaf (finished); a turn cannot follow it"
        if anchor_id is None:
            anchor_id = 0 if parent_id == 0 else parent.anchor_id
        assert anchor_id in self.path(parent_id), f"anchor {anchor_id} is not on the path to node {parent_id}"
        node = Node(node_id=len(self.nodes), parent_id=parent_id, depth=parent.depth + 1, segment=segment,
                    tool_error=tool_error, origin=origin, anchor_id=anchor_id, meta=dict(meta or {}))
        self.nodes.append(node)
        self.children.append([])
        self.children[parent_id].append(node.node_id)
        if reward is not None:
            self.finish(node.node_id, reward, finish_reason or "answer")
        return node.node_id

    def finish(self, node_id: int, reward: float, finish_reason: str = "answer") -> None:
        """Mark `node_id` as a leaf with its outcome reward."""
        assert finish_reason in FINISH_REASONS, f"unknown finish reason {finish_reason!r}; use one of {FINISH_REASONS}"
        assert not self.children[node_id], f"node {node_id} has children and cannot be a leaf"
        node = self.nodes[node_id]
        node.reward = float(reward)
        node.finish_reason = finish_reason

    def add_failed_leaves(self, node_id: int, count: int, error: str, origin: str = "continuation") -> None:
        """`count` failed leaves (finish_reason "error", reward 0, no tokens) under `node_id`: rollouts owed whose
        generation failed (a server error, a timeout, a lost worker) are data, counted as failures."""
        for _ in range(count):
            self.add_child(node_id, Segment(observation_text=f"error: rollout failed: {error}"[:500]),
                           reward=0.0, finish_reason="error", origin=origin, anchor_id=node_id)

    def append_nodes(self, raw_nodes: list[dict[str, Any]]) -> None:
        """Append nodes given as `to_dict` node dicts (grown elsewhere: a Ray worker); their ids must continue."""
        for raw in raw_nodes:
            node = Node(**{**raw, "segment": Segment(**raw["segment"])})
            assert node.node_id == len(self.nodes), f"node {node.node_id} does not continue a tree of {len(self.nodes)}"
            self.nodes.append(node)
            self.children.append([])
            self.children[node.parent_id].append(node.node_id)

    def keep_rollouts(self, leaf_ids: Sequence[int]) -> "Tree":
        """A new tree holding only the rollouts ending at `leaf_ids` (the nodes on their paths, renumbered in order;
        parents, anchors and everything else of a node kept). A sampler that downsamples a prompt's group trains on
        it; the tree it came from keeps every rollout for the predictor and the record."""
        keep = sorted({i for leaf in leaf_ids for i in self.path(int(leaf))} | {0})
        for leaf in leaf_ids:
            if not self.nodes[int(leaf)].is_leaf:
                raise ValueError(f"node {leaf} of prompt {self.prompt_id!r} is not a leaf")
        new_id = {old: new for new, old in enumerate(keep)}
        nodes = [replace(self.nodes[old], node_id=new_id[old], meta=dict(self.nodes[old].meta),
                         parent_id=None if self.nodes[old].parent_id is None else new_id[self.nodes[old].parent_id],
                         anchor_id=new_id[self.nodes[old].anchor_id]) for old in keep]
        return Tree(self.prompt_id, nodes, self.meta)

    def truncate(self, num_nodes: int) -> None:
        """Drop every node from `num_nodes` on (a failed call's partial growth)."""
        del self.nodes[num_nodes:]
        self.children = [[c for c in kids if c < num_nodes] for kids in self.children[:num_nodes]]

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def leaves(self) -> list[int]:
        return [node.node_id for node in self.nodes if node.is_leaf]

    def rewards(self) -> np.ndarray:
        return np.array([self.nodes[i].reward for i in self.leaves()], dtype=float)

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root to `node_id`, both included."""
        out = [node_id]
        while (parent := self.nodes[out[-1]].parent_id) is not None:
            out.append(parent)
        return out[::-1]

    def leaves_below(self, node_id: int) -> list[int]:
        stack, out = [node_id], []
        while stack:
            i = stack.pop()
            if self.nodes[i].is_leaf:
                out.append(i)
            stack.extend(self.children[i])
        return sorted(out)

    def backup(self) -> Backup:
        """Vhat(y) = sum_c n_c Vhat(c) / n_y over children c; a leaf's Vhat is its reward."""
        num = len(self.nodes)
        reward_sum = np.zeros(num)
        num_leaves = np.zeros(num, dtype=np.int64)
        for node in reversed(self.nodes):
            if node.is_leaf:
                reward_sum[node.node_id] += node.reward
                num_leaves[node.node_id] += 1
            if node.parent_id is not None:
                reward_sum[node.parent_id] += reward_sum[node.node_id]
                num_leaves[node.parent_id] += num_leaves[node.node_id]
        with np.errstate(invalid="ignore", divide="ignore"):
            vhat = np.where(num_leaves > 0, reward_sum / np.maximum(num_leaves, 1), np.nan)
        return Backup(vhat=vhat, num_leaves=num_leaves, reward_sum=reward_sum)

    def natural_backup(self) -> Backup:
        """Unbiased success targets: like `backup`, but leaf l counts at node y only if l's rollout started
        at y or above it (y lies between l's anchor and l).

        Stage 2 picks where to branch from the outcomes below a node, so the continuations under y are not a
        fair sample of rollouts through y's ancestors: an all-fail tree branched where success looked likely
        would lift its root's Vhat above the root's true success rate. A rollout continued from a node at or
        above y passes through y as an unselected sample, so these targets estimate P(success | prefix y),
        which is what the predictor is asked for. (Advantages keep `backup`: every leaf is a sample there.)"""
        num = len(self.nodes)
        reward_sum = np.zeros(num)
        num_leaves = np.zeros(num, dtype=np.int64)
        for node in self.nodes:
            if not node.is_leaf:
                continue
            i = node.node_id
            while True:
                reward_sum[i] += node.reward
                num_leaves[i] += 1
                if i == node.anchor_id:
                    break
                i = self.nodes[i].parent_id
        with np.errstate(invalid="ignore", divide="ignore"):
            vhat = np.where(num_leaves > 0, reward_sum / np.maximum(num_leaves, 1), np.nan)
        return Backup(vhat=vhat, num_leaves=num_leaves, reward_sum=reward_sum)

    def mixed(self, backup: Backup | None = None) -> np.ndarray:
        """(N,) bool: the node's leaves hold at least one success and one failure (reward threshold 0.5)."""
        b = backup or self.backup()
        num_success = self._count_below(lambda r: r > 0.5)
        return (num_success > 0) & (num_success < b.num_leaves)

    def is_mixed(self) -> bool:
        return bool(self.mixed()[0])

    def _count_below(self, predicate) -> np.ndarray:
        counts = np.zeros(len(self.nodes), dtype=np.int64)
        for node in reversed(self.nodes):
            if node.is_leaf and predicate(node.reward):
                counts[node.node_id] += 1
            if node.parent_id is not None:
                counts[node.parent_id] += counts[node.node_id]
        return counts

    def prefix_token_ids(self, node_id: int) -> list[int]:
        """The exact token ids of the prefix ending at `node_id` (prompt included)."""
        return [t for i in self.path(node_id) for t in self.nodes[i].segment.token_ids]

    def history(self, node_id: int) -> History:
        """What the success predictor reads about the prefix ending at `node_id`."""
        path = self.path(node_id)
        parts = []
        for i in path:
            seg = self.nodes[i].segment
            parts.extend(t for t in (seg.policy_text, seg.observation_text) if t)
        return History(
            text="\n".join(parts),
            depth=self.nodes[node_id].depth,
            num_tool_errors=sum(self.nodes[i].tool_error for i in path),
            num_tokens=sum(self.nodes[i].segment.num_tokens for i in path[1:]),
            prompt_id=self.prompt_id,
            meta=dict(self.nodes[node_id].meta),
        )

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return {"prompt_id": self.prompt_id, "meta": self.meta, "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Tree":
        nodes = []
        for raw in data["nodes"]:
            raw = dict(raw)
            raw["segment"] = Segment(**raw["segment"])
            nodes.append(Node(**raw))
        return cls(data["prompt_id"], nodes, data.get("meta"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Tree":
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tree) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"Tree(prompt_id={self.prompt_id!r}, nodes={len(self.nodes)}, leaves={len(self.leaves())}, "
                f"mixed={self.is_mixed()})")
