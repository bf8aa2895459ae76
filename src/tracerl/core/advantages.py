"""Advantage estimators: a batch of rollout trees -> the advantage of every segment in every rollout.

Each root-to-leaf rollout is one training sample, so an advantage is indexed by (leaf l, node c on
l's path, c != root): the advantage the policy tokens of c's segment receive in rollout l.
`TreeAdvantages` stores these per rollout and derives the two forms a trainer packs a tree with:
`packed()` (per node, the sum over the leaves below it: first epoch, policy ratio 1) and
`segment_values()` (per node, the per-leaf terms kept apart: later epochs, where the clip is not
linear in the advantage).

Estimators form a registry with one signature, `fn(trees, config) -> list[TreeAdvantages]` (one per
tree, same order): `grpo`, `treepo`, `tree_grpo`, `trace` (docs/design.md, section 2) and `reinforce_ada`
(docs/allocation.md).
`register_advantage` adds more; `compute_advantages` is the one entry point.

This module does not see tokens or tensors (it only counts policy tokens for
`nonzero_adv_token_frac`), does not apply the loss or the clip, and drops nothing: a rollout whose
advantage is zero is returned like any other, the trainer decides what to do with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from tracerl.core.rules import check_fields, knob, raise_problems
from tracerl.core.tree import Tree


@dataclass(frozen=True)
class AdvantageConfig:
    eps: float = knob(1e-6, ge=0)  # added to the std before dividing, so a low-spread group cannot blow up
    std_ddof: int = knob(1, choices=(0, 1))  # 1 = unbiased std, as verl's and TRL's GRPO use (torch.std); 0 = population std
    norm_by_std: bool = True  # grpo, tree_grpo: divide by the group's std; False gives Dr.GRPO (no std bias)
    leave_one_out: bool = False  # trace: baseline Vhat(b) without leaf l's own reward (unbiased baseline)
    scale_by_root_std: bool = True  # trace: divide by the std of the prompt's leaf rewards (star tree == grpo)
    min_leaves: int = knob(2, ge=1)  # trace, treepo: a node serves as a baseline only with at least this many leaves
    treepo_whiten: str = knob("tokens", choices=("tokens", "leaves"))  # treepo: whiten over the batch's policy tokens (TreePO's code) or over leaves

    def __post_init__(self) -> None:
        problems = check_fields(self, "advantages.")
        if self.leave_one_out and self.min_leaves < 2:
            problems.append("advantages.leave_one_out=True needs min_leaves >= 2: a baseline without the leaf's "
                            "own reward needs another leaf; raise min_leaves or turn leave_one_out off")
        raise_problems(problems)


@dataclass(frozen=True, eq=False)  # eq=False: equality over tuples of arrays has no single truth value
class TreeAdvantages:
    """Per-rollout advantages of one tree: `values[i][k]` belongs to the segment of node `paths[i][k]`
    in the rollout ending at `leaf_ids[i]`."""

    prompt_id: str
    leaf_ids: tuple[int, ...]  # leaves in increasing id order
    paths: tuple[tuple[int, ...], ...]  # for each leaf: node ids from depth 1 to the leaf (root excluded)
    values: tuple[np.ndarray, ...]  # for each leaf: (len(path),) float advantage of each segment in that rollout

    def __post_init__(self) -> None:
        assert len(self.leaf_ids) == len(self.paths) == len(self.values), "one path and one value row per leaf"
        for leaf, path, row in zip(self.leaf_ids, self.paths, self.values):
            assert path and path[-1] == leaf, f"the path of leaf {leaf} must end at it, got {path}"
            assert row.shape == (len(path),), f"leaf {leaf}: {row.shape} values for a path of {len(path)} nodes"
            row.flags.writeable = False  # frozen all the way down: packed() and of() must agree forever

    @cached_property
    def _row_of_leaf(self) -> dict[int, int]:
        return {leaf: i for i, leaf in enumerate(self.leaf_ids)}

    def of(self, leaf_id: int) -> np.ndarray:
        """(len(path),) advantages of the rollout ending at `leaf_id`."""
        if leaf_id not in self._row_of_leaf:
            raise KeyError(f"node {leaf_id} is not a leaf of prompt {self.prompt_id!r}; leaves: {self.leaf_ids}")
        return self.values[self._row_of_leaf[leaf_id]]

    def segment_values(self) -> dict[int, np.ndarray]:
        """Node id -> (n_c,) advantages of its segment, one per leaf below it, leaves in `leaf_ids` order."""
        per_node: dict[int, list[float]] = {}
        for path, row in zip(self.paths, self.values):
            for node_id, adv in zip(path, row):
                per_node.setdefault(node_id, []).append(float(adv))
        return {node_id: np.array(per_node[node_id]) for node_id in sorted(per_node)}

    def packed(self) -> dict[int, float]:
        """Node id -> sum over the leaves below it of their advantage for its segment (the packed-tree form)."""
        return {node_id: float(row.sum()) for node_id, row in self.segment_values().items()}


AdvantageFn = Callable[[Sequence[Tree], AdvantageConfig], list[TreeAdvantages]]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding `fn(trees, config) -> list[TreeAdvantages]` to `ADVANTAGES` under `name`."""
    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered; pick another name "
                             f"or `del ADVANTAGES[{name!r}]` first to replace it")
        ADVANTAGES[name] = fn
        return fn
    return decorator


def compute_advantages(name: str, trees: Sequence[Tree], config: AdvantageConfig | None = None) -> list[TreeAdvantages]:
    """Run the estimator registered as `name` on `trees`; one `TreeAdvantages` per tree, same order."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGES))}")
    trees = list(trees)
    out = ADVANTAGES[name](trees, config or AdvantageConfig())
    if len(out) != len(trees):
        raise ValueError(f"advantage estimator {name!r} returned {len(out)} results for {len(trees)} trees; "
                         "it must return one TreeAdvantages per tree, in order")
    return out


# ---------------------------------------------------------------------------------------- helpers
def _std(x: np.ndarray, ddof: int) -> float:
    """Standard deviation; 0.0 where it is undefined (no more than ddof values)."""
    return float(np.std(x, ddof=ddof)) if x.size > ddof else 0.0


def _no_contrast(rewards: np.ndarray) -> bool:
    # Checked exactly rather than left to the formula: with std ~ 0 the eps division would turn a
    # rounding error in (r - mean) into an advantage of ~1e-10 instead of 0. A spread too small for its square to be
    # a float (rewards ~1e-300 one ulp apart) has std 0: no contrast either, or eps=0 would divide by zero.
    return rewards.size < 2 or bool(np.ptp(rewards) == 0) or float(np.std(rewards)) == 0.0


def _group_advantages(rewards: np.ndarray, mean: float, config: AdvantageConfig) -> np.ndarray:
    """One GRPO group: (r - mean) / (std + eps), or r - mean without norm_by_std; 0 when the group has no contrast."""
    if _no_contrast(rewards):
        return np.zeros_like(rewards)
    centred = rewards - mean
    return centred / (_std(rewards, config.std_ddof) + config.eps) if config.norm_by_std else centred


def _rollout_paths(tree: Tree) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    leaf_ids = tuple(tree.leaves())
    assert 0 not in leaf_ids, f"prompt {tree.prompt_id!r}: the root is a leaf; a rollout needs at least one turn"
    return leaf_ids, tuple(tuple(tree.path(leaf)[1:]) for leaf in leaf_ids)


def _broadcast(tree: Tree, leaf_advantages: np.ndarray) -> TreeAdvantages:
    """Give every segment of rollout l the same advantage A_l (the flattened-tree estimators)."""
    leaf_ids, paths = _rollout_paths(tree)
    values = tuple(np.full(len(path), adv, dtype=float) for path, adv in zip(paths, leaf_advantages))
    return TreeAdvantages(tree.prompt_id, leaf_ids, paths, values)


# ---------------------------------------------------------------------------------------- estimators
@register_advantage("grpo")
def grpo(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """GRPO (DeepSeekMath, arXiv 2402.03300): the prompt's leaves are one group,
    A_l = (r_l - mean) / (std + eps)  (r_l - mean when norm_by_std is False, Dr.GRPO, arXiv 2503.20783),
    broadcast to every segment of rollout l. A group of one leaf, or of equal rewards, gets A = 0: there is no
    contrast. (verl returns A = r for a one-leaf group, taking mean 0 and std 1; we do not.)"""
    out = []
    for tree in trees:
        rewards = tree.rewards()
        mean = tree.backup().vhat[0]  # the group mean, computed as `trace` does: star trees agree bit for bit
        out.append(_broadcast(tree, _group_advantages(rewards, mean, config)))
    return out


def treepo_unwhitened(tree: Tree, config: AdvantageConfig) -> np.ndarray:
    """TreePO's per-leaf advantage before batch whitening, in leaf id order:
    A_l = mean over proper ancestors a of l (root included) with n_a >= min_leaves of (r_l - Vhat(a)); 0 if none.
    A tree whose rewards are all equal gets exactly 0 (every Vhat is r; rounding must not leave 1e-17 behind)."""
    backup, leaf_ids = tree.backup(), tree.leaves()
    out = np.zeros(len(leaf_ids))
    if _no_contrast(tree.rewards()):
        return out
    for i, leaf in enumerate(leaf_ids):
        reward = tree.nodes[leaf].reward
        gaps = [reward - backup.vhat[a] for a in tree.path(leaf)[:-1] if backup.num_leaves[a] >= config.min_leaves]
        out[i] = float(np.mean(gaps)) if gaps else 0.0
    return out


def _rollout_policy_tokens(tree: Tree) -> np.ndarray:
    """(L,) policy tokens of each rollout (leaf id order): its response tokens with mask 1."""
    num_policy = [node.segment.num_policy_tokens for node in tree.nodes]
    return np.array([sum(num_policy[i] for i in tree.path(leaf)[1:]) for leaf in tree.leaves()], dtype=float)


@register_advantage("treepo")
def treepo(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """TreePO (arXiv 2508.17445): `treepo_unwhitened` per leaf, then whitened over the batch, broadcast to all
    segments of the rollout. As TreePO's released code does (verl's `masked_whiten` over the response mask), the
    whitening is over the batch's policy *tokens*: with w_l the policy tokens of rollout l,
        mean = sum_l w_l A_l / W,  var = sum_l w_l (A_l - mean)^2 / (W - std_ddof),  W = sum_l w_l,
        A = (A - mean) / (sqrt(var) + eps),
    so long rollouts weigh more. treepo_whiten="leaves" weighs every rollout 1 (the earlier tracerl variant; also
    used when the trees carry no token counts). Differs from TreePO's code only in where eps goes (TreePO:
    rsqrt(var + 1e-8)). All-equal A gives exactly 0; a constant-reward tree in a batch with others gets
    -mean/std, not 0 (batch whitening)."""
    raw = [treepo_unwhitened(tree, config) for tree in trees]
    flat = np.concatenate(raw) if raw else np.zeros(0)
    if _no_contrast(flat):
        return [_broadcast(tree, np.zeros_like(a)) for tree, a in zip(trees, raw)]
    weights = np.concatenate([_rollout_policy_tokens(t) for t in trees]) if config.treepo_whiten == "tokens" \
        else np.ones(flat.size)
    total = float(weights.sum())
    if total <= config.std_ddof:  # no token counts: every rollout weighs the same
        weights, total = np.ones(flat.size), float(flat.size)
    mean = float(np.sum(weights * flat) / total)
    var = float(np.sum(weights * (flat - mean) ** 2) / (total - config.std_ddof))
    denom = np.sqrt(var) + config.eps
    return [_broadcast(tree, (a - mean) / denom) for tree, a in zip(trees, raw)]


def treepo_before_whitening(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """`treepo` without its batch whitening: `treepo_unwhitened` broadcast to every segment of the rollout."""
    return [_broadcast(tree, treepo_unwhitened(tree, config)) for tree in trees]


# estimators that whiten over the whole batch -> the same estimator before that whitening (what carries contrast)
BEFORE_BATCH_WHITENING: dict[str, AdvantageFn] = {"treepo": treepo_before_whitening}


@register_advantage("reinforce_ada")
def reinforce_ada(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """Reinforce-Ada (arXiv 2510.04996) with its global statistics: a downsampled group's baseline comes from every
    rollout its prompt sampled, `tree.meta["sampled_outcomes"] = [successes, failures]` (`samplers.ReinforceAda`):
    mean = successes / all, std over those 0/1 outcomes (std_ddof), A_l = (r_l - mean) / (std + eps), or r_l - mean
    when norm_by_std is False (the paper's recommendation; the reference code defaults to the std), broadcast to
    every segment. Outcomes that all agree give A = 0 (the reference: r - mean, 0 for 0/1 rewards). A tree without
    the counts is its own sample: `grpo`."""
    out = []
    for tree in trees:
        counts = tree.meta.get("sampled_outcomes")
        if counts is None:
            out += grpo([tree], config)
            continue
        successes, failures = int(counts[0]), int(counts[1])
        outcomes = np.r_[np.ones(successes), np.zeros(failures)]
        rewards = tree.rewards()
        if _no_contrast(outcomes) or rewards.size == 0:
            out.append(_broadcast(tree, np.zeros_like(rewards)))
            continue
        centred = rewards - successes / outcomes.size
        values = centred / (_std(outcomes, config.std_ddof) + config.eps) if config.norm_by_std else centred
        out.append(_broadcast(tree, values))
    return out


@register_advantage("tree_grpo")
def tree_grpo(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """Tree-GRPO (arXiv 2509.21240), adapted: a prompt's "trees" are the subtrees under each root child (a bare
    rollout with the continuations branched from it). A_l = GRPO over the leaves of l's subtree (intra-tree)
    + GRPO over all the prompt's leaves (inter-tree), each term as in `grpo` (one-leaf group -> 0), broadcast to
    all segments of l. On a star tree every subtree is one leaf, so this equals `grpo`."""
    out = []
    for tree in trees:
        backup, rewards = tree.backup(), tree.rewards()
        inter = _group_advantages(rewards, backup.vhat[0], config)
        leaf_ids, paths = _rollout_paths(tree)
        subtree_of_leaf = np.array([path[0] for path in paths], dtype=np.int64)
        intra = np.zeros_like(rewards)
        for top in tree.children[0]:
            members = subtree_of_leaf == top
            intra[members] = _group_advantages(rewards[members], backup.vhat[top], config)
        out.append(_broadcast(tree, intra + inter))
    return out


@register_advantage("trace")
def trace(trees: Sequence[Tree], config: AdvantageConfig) -> list[TreeAdvantages]:
    """TRACE (arXiv 2606.11119): the segment of node c, generated from y = parent(c), gets in rollout l
        A = (r_l - Vhat(b)) / (std_root + eps),
    b = the deepest of y and its ancestors with n_b >= min_leaves (A = 0 if none). With leave_one_out, Vhat(b)
    becomes (n_b Vhat(b) - r_l) / (n_b - 1); without scale_by_root_std there is no division. A segment is
    judged against the best estimate of the value of the prefix it was generated from, so the packed
    advantage of node c is n_c (Vhat(c) - Vhat(b)) / scale. On a star tree b = root: exactly `grpo`."""
    out = []
    for tree in trees:
        backup, rewards = tree.backup(), tree.rewards()
        leaf_ids, paths = _rollout_paths(tree)
        denom = _std(rewards, config.std_ddof) + config.eps if config.scale_by_root_std else 1.0
        constant = _no_contrast(rewards)  # every Vhat equals r: all zero, without rounding noise over eps
        values = []
        for reward, path in zip(rewards, paths):
            row = np.zeros(len(path))
            values.append(row)
            if constant:
                continue
            full = (0, *path)
            # n only shrinks going down a path, so the nodes with n >= min_leaves are a prefix of it.
            last_baseline = int(np.sum(backup.num_leaves[list(full)] >= config.min_leaves)) - 1
            for k in range(len(path)):  # segment of full[k + 1], generated from full[k]
                j = min(k, last_baseline)
                if j < 0:
                    continue
                b = full[j]
                if config.leave_one_out:
                    baseline = (backup.reward_sum[b] - reward) / (backup.num_leaves[b] - 1)
                else:
                    baseline = backup.vhat[b]
                row[k] = (reward - baseline) / denom
        out.append(TreeAdvantages(tree.prompt_id, leaf_ids, paths, tuple(values)))
    return out


# ---------------------------------------------------------------------------------------- measures
def nonzero_adv_token_frac(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages], atol: float = 1e-12) -> float:
    """Share of trained policy tokens (mask 1) whose advantage is non-zero (|A| > atol). Each rollout counts
    separately, so a shared segment counts once per leaf below it. 0.0 when there are no policy tokens."""
    num_nonzero, num_total = nonzero_adv_token_counts(trees, advantages, atol)
    return num_nonzero / num_total if num_total else 0.0


def nonzero_adv_token_counts(trees: Sequence[Tree], advantages: Sequence[TreeAdvantages],
                             atol: float = 1e-12) -> tuple[int, int]:
    """(policy tokens with |A| > atol, all policy tokens), each rollout counted separately."""
    if len(trees) != len(advantages):
        raise ValueError(f"{len(trees)} trees but {len(advantages)} advantage results; pass them in matching order")
    num_total = num_nonzero = 0
    for tree, adv in zip(trees, advantages):
        assert tree.prompt_id == adv.prompt_id, f"tree {tree.prompt_id!r} paired with advantages of {adv.prompt_id!r}"
        num_policy = [node.segment.num_policy_tokens for node in tree.nodes]
        for path, row in zip(adv.paths, adv.values):
            for node_id, value in zip(path, row):
                num_total += num_policy[node_id]
                num_nonzero += num_policy[node_id] if abs(value) > atol else 0
    return num_nonzero, num_total
