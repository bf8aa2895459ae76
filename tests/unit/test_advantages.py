"""Advantage estimators: hand-worked trees, the star-tree == GRPO identity, invariances, packing, registry."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.advantages import (
    ADVANTAGES,
    AdvantageConfig,
    TreeAdvantages,
    compute_advantages,
    nonzero_adv_token_frac,
    register_advantage,
    treepo_unwhitened,
)
from tracerl.core.tree import Segment, Tree

BUILT_IN = ("grpo", "treepo", "tree_grpo", "trace")
EXACT = AdvantageConfig(eps=0.0)  # hand-worked numbers without the eps in the denominator


# ------------------------------------------------------------------------------ builders
def star_tree(rewards, prompt_id="q") -> Tree:
    """Stage 1 only, one-turn rollouts: every root child is a leaf."""
    tree = Tree.new(prompt_id, "prompt")
    for r in rewards:
        tree.add_child(0, Segment.text_only("answer", "", 3, 0), reward=r)
    return tree


def chain_tree(rewards, lengths, prompt_id="q") -> Tree:
    """Stage 1 only, multi-turn rollouts: one unbranched chain of `length` turns per reward."""
    tree = Tree.new(prompt_id, "prompt")
    for r, length in zip(rewards, lengths):
        node = 0
        for _ in range(length - 1):
            node = tree.add_child(node, Segment.text_only("call", "obs", 2, 4))
        tree.add_child(node, Segment.text_only("answer", "", 1, 0), reward=r)
    return tree


def labelled(spec, prefix=""):
    """Nested spec (a float is a leaf reward, a list holds a node's children) -> [(label, body)] with unique labels."""
    return [(f"{prefix}/{i}", labelled(body, f"{prefix}/{i}") if isinstance(body, list) else body)
            for i, body in enumerate(spec)]


def shuffled(kids, rng: random.Random):
    kids = [(name, shuffled(body, rng) if isinstance(body, list) else body) for name, body in kids]
    rng.shuffle(kids)
    return kids


def build(kids, prompt_id="q") -> Tree:
    """A tree whose segments carry their label as policy text, so nodes match across sibling orders."""
    tree = Tree.new(prompt_id, "prompt")

    def grow(parent, kids):
        for name, body in kids:
            num_policy = 1 + len(name) % 3
            if isinstance(body, list):
                grow(tree.add_child(parent, Segment.text_only(name, "obs", num_policy, 2)), body)
            else:
                tree.add_child(parent, Segment.text_only(name, "", num_policy, 0), reward=body)

    grow(0, kids)
    return tree


def by_rollout(tree: Tree, adv: TreeAdvantages) -> dict[tuple[str, ...], np.ndarray]:
    """Rollout (as the labels along its path) -> its advantages: independent of node ids."""
    return {tuple(tree.nodes[i].segment.policy_text for i in path): adv.of(leaf)
            for leaf, path in zip(adv.leaf_ids, adv.paths)}


def two_level_tree(rewards=(0.0, 1.0, 0.0, 0.0)) -> Tree:
    """Root with 2 bare two-turn rollouts; the second was branched at depth 1 with 2 continuations.

        0 (root, n=4)
        |-- 1 (n=1) -- 2 leaf r=a
        `-- 3 (n=3) -- 4 leaf r=b   (bare)
                   |-- 5 leaf r=c   (continuation)
                   `-- 6 leaf r=d   (continuation)
    """
    a, b, c, d = rewards
    tree = Tree.new("q", "prompt")
    n1 = tree.add_child(0, Segment.text_only("search", "doc", 3, 5))
    tree.add_child(n1, Segment.text_only("answer", "", 2, 0), reward=a)
    n3 = tree.add_child(0, Segment.text_only("search", "doc", 4, 7))
    tree.add_child(n3, Segment.text_only("answer", "", 6, 0), reward=b)
    tree.add_child(n3, Segment.text_only("answer", "", 1, 0), reward=c, origin="continuation")
    tree.add_child(n3, Segment.text_only("answer", "", 1, 0), reward=d, origin="continuation")
    assert (n1, n3) == (1, 3)
    return tree


# rewards are binary or graded in [0, 1]; subnormal floats (5e-324) would only test float underflow
REWARD = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False))
SUBTREE = st.recursive(st.sampled_from([0.0, 1.0]), lambda kids: st.lists(kids, min_size=1, max_size=3),
                       max_leaves=10)
TREE_SPEC = st.lists(SUBTREE, min_size=1, max_size=4)
CONFIGS = [AdvantageConfig(), AdvantageConfig(std_ddof=0), AdvantageConfig(eps=0.0),
           AdvantageConfig(norm_by_std=False, scale_by_root_std=False)]


# ------------------------------------------------------------------------------ grpo
def test_grpo_hand_worked():
    tree = chain_tree([1.0, 0.0, 0.0, 1.0, 1.0], [1, 2, 3, 1, 2])
    # mean 0.6; squared deviations 0.16 * 3 + 0.36 * 2 = 1.2 -> unbiased var 1.2 / 4 = 0.3, population 1.2 / 5 = 0.24
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    cases = [(EXACT, (r - 0.6) / math.sqrt(0.3)),
             (AdvantageConfig(eps=0.0, std_ddof=0), (r - 0.6) / math.sqrt(0.24)),
             (AdvantageConfig(norm_by_std=False), r - 0.6)]
    for config, expected in cases:
        (adv,) = compute_advantages("grpo", [tree], config)
        for i, leaf in enumerate(adv.leaf_ids):
            assert len(adv.of(leaf)) == tree.nodes[leaf].depth, "one advantage per segment of the rollout"
            np.testing.assert_allclose(adv.of(leaf), expected[i], rtol=1e-12, err_msg=f"{config}: leaf {leaf}")


def test_grpo_single_leaf_group_gets_zero_not_its_reward():
    (adv,) = compute_advantages("grpo", [star_tree([1.0])])
    assert adv.values[0].tolist() == [0.0], "a one-leaf group has no contrast (verl would give r = 1)"


# ------------------------------------------------------------------------------ star tree == grpo
@settings(max_examples=80, deadline=None)
@given(rewards=st.lists(REWARD, min_size=2, max_size=16), config_index=st.integers(0, len(CONFIGS) - 1))
def test_star_tree_trace_and_tree_grpo_equal_grpo_exactly(rewards, config_index):
    config = CONFIGS[config_index]
    tree = star_tree(rewards)
    (reference,) = compute_advantages("grpo", [tree], config)
    for name in ("trace", "tree_grpo"):
        (adv,) = compute_advantages(name, [tree], config)
        assert adv.leaf_ids == reference.leaf_ids and adv.paths == reference.paths
        for got, want in zip(adv.values, reference.values):
            assert np.array_equal(got, want), f"{name} != grpo on a star tree {rewards} with {config}: {got} vs {want}"


@settings(max_examples=50, deadline=None)
@given(data=st.lists(st.tuples(REWARD, st.integers(1, 4)), min_size=2, max_size=10))
def test_unbranched_multi_turn_rollouts_trace_equals_grpo(data):
    # Without stage 2 every intermediate node has one leaf, so each segment's baseline is the root.
    tree = chain_tree([r for r, _ in data], [length for _, length in data])
    (reference,) = compute_advantages("grpo", [tree])
    (adv,) = compute_advantages("trace", [tree])
    for got, want in zip(adv.values, reference.values):
        assert np.array_equal(got, want), f"trace != grpo without branching: {got} vs {want}"


@settings(max_examples=50, deadline=None)
@given(rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16))
def test_star_tree_treepo_is_grpo_up_to_whitening_rounding(rewards):
    tree = star_tree(rewards)
    (reference,) = compute_advantages("grpo", [tree])
    (adv,) = compute_advantages("treepo", [tree], AdvantageConfig(treepo_whiten="leaves"))
    np.testing.assert_allclose(np.concatenate(adv.values), np.concatenate(reference.values), atol=1e-9)


# ------------------------------------------------------------------------------ hand-worked two-level tree
def test_trace_two_level_tree_hand_worked():
    tree = two_level_tree((0.0, 1.0, 0.0, 0.0))
    # Vhat: root 1/4 (n=4), node 1: 0 (n=1), node 3: 1/3 (n=3).
    # Segments of 1 and 3 come from the root -> baseline Vhat(root) = 1/4.
    # Segment of 2 comes from node 1 (n=1 < 2) -> falls back to the root: 0 - 1/4.
    # Segments of 4, 5, 6 come from node 3 (n=3) -> baseline 1/3.
    raw = {2: [-1 / 4, -1 / 4], 4: [3 / 4, 2 / 3], 5: [-1 / 4, -1 / 3], 6: [-1 / 4, -1 / 3]}
    (adv,) = compute_advantages("trace", [tree], AdvantageConfig(scale_by_root_std=False))
    assert adv.leaf_ids == (2, 4, 5, 6) and adv.paths == ((1, 2), (3, 4), (3, 5), (3, 6))
    for leaf, expected in raw.items():
        np.testing.assert_allclose(adv.of(leaf), expected, rtol=1e-12, err_msg=f"leaf {leaf}")

    # Root std of [0, 1, 0, 0], unbiased: squared deviations 3 * 1/16 + 9/16 = 3/4, / 3 = 1/4 -> std 1/2.
    (scaled,) = compute_advantages("trace", [tree], EXACT)
    for leaf, expected in raw.items():
        np.testing.assert_allclose(scaled.of(leaf), np.array(expected) / 0.5, rtol=1e-12, err_msg=f"leaf {leaf}")

    # Leave-one-out: root baseline without r_l is (1 - r_l) / 3, node 3's is (1 - r_l) / 2.
    loo = {2: [0 - 1 / 3, 0 - 1 / 3], 4: [1 - 0, 1 - 0], 5: [0 - 1 / 3, 0 - 1 / 2], 6: [0 - 1 / 3, 0 - 1 / 2]}
    (adv,) = compute_advantages("trace", [tree], AdvantageConfig(leave_one_out=True, scale_by_root_std=False))
    for leaf, expected in loo.items():
        np.testing.assert_allclose(adv.of(leaf), expected, rtol=1e-12, err_msg=f"leave-one-out, leaf {leaf}")

    # min_leaves=4: only the root qualifies, so every segment's baseline is the root (grpo without std).
    (adv,) = compute_advantages("trace", [tree], AdvantageConfig(min_leaves=4, scale_by_root_std=False))
    np.testing.assert_allclose(adv.of(4), [3 / 4, 3 / 4], rtol=1e-12)
    # min_leaves=1: the segment of leaf 2 is judged against node 1 itself (Vhat 0, one leaf) -> 0.
    (adv,) = compute_advantages("trace", [tree], AdvantageConfig(min_leaves=1, scale_by_root_std=False))
    np.testing.assert_allclose(adv.of(2), [-1 / 4, 0.0], rtol=1e-12, atol=1e-15)


def test_trace_packed_hand_worked():
    tree = two_level_tree((0.0, 1.0, 0.0, 0.0))
    (adv,) = compute_advantages("trace", [tree], AdvantageConfig(scale_by_root_std=False))
    packed = adv.packed()
    # node 3: 3/4 - 1/4 - 1/4 = 1/4 = n_3 (Vhat(3) - Vhat(root)) = 3 (1/3 - 1/4)
    assert packed[3] == pytest.approx(0.25, abs=1e-12)
    assert packed[1] == pytest.approx(-0.25, abs=1e-12) and packed[2] == pytest.approx(-0.25, abs=1e-12)
    assert packed[4] == pytest.approx(2 / 3, abs=1e-12) and packed[5] == pytest.approx(-1 / 3, abs=1e-12)
    np.testing.assert_allclose(adv.segment_values()[3], [3 / 4, -1 / 4, -1 / 4], rtol=1e-12)


def test_treepo_two_level_tree_hand_worked():
    tree = two_level_tree((0.0, 1.0, 0.0, 0.0))
    # Ancestors with n >= 2: the root (Vhat 1/4) for every leaf, node 3 (Vhat 1/3) for leaves 4, 5, 6.
    # leaf 2: 0 - 1/4;  leaf 4: mean(1 - 1/3, 1 - 1/4) = 17/24;  leaves 5, 6: mean(-1/3, -1/4) = -7/24
    raw = np.array([-1 / 4, 17 / 24, -7 / 24, -7 / 24])
    np.testing.assert_allclose(treepo_unwhitened(tree, AdvantageConfig()), raw, rtol=1e-12)
    # min_leaves=1: node 1 (Vhat 0) joins for leaf 2 -> mean(0 - 0, 0 - 1/4); the leaf itself is never an ancestor.
    loose = treepo_unwhitened(tree, AdvantageConfig(min_leaves=1))
    np.testing.assert_allclose(loose, [-1 / 8, 17 / 24, -7 / 24, -7 / 24], rtol=1e-12)
    # Whitened over the batch (here one tree); the raw mean is -1/32.
    mean = (-6 / 24 + 17 / 24 - 14 / 24) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 3)
    (adv,) = compute_advantages("treepo", [tree], AdvantageConfig(eps=0.0, treepo_whiten="leaves"))
    for leaf, a in zip(adv.leaf_ids, raw):
        np.testing.assert_allclose(adv.of(leaf), [(a - mean) / std] * 2, rtol=1e-12, err_msg=f"leaf {leaf}")


def test_treepo_whitens_over_the_whole_batch():
    trees = [two_level_tree((0.0, 1.0, 0.0, 0.0)), star_tree([1.0, 0.0], prompt_id="q2")]
    raw = np.concatenate([treepo_unwhitened(t, AdvantageConfig()) for t in trees])  # star: +1/2, -1/2
    np.testing.assert_allclose(raw[4:], [0.5, -0.5])
    expected = (raw - raw.mean()) / raw.std(ddof=1)
    results = compute_advantages("treepo", trees, AdvantageConfig(eps=0.0, treepo_whiten="leaves"))
    got = np.concatenate([[row[0] for row in adv.values] for adv in results])  # first segment of each rollout
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def masked_whiten(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """verl's `masked_whiten` (what TreePO's code calls on per-token advantages), in numpy, eps left out:
    masked mean, masked variance with Bessel's correction over the mask's tokens."""
    mean = (values * mask).sum() / mask.sum()
    var = ((values - mean) ** 2 * mask).sum() / mask.sum() * mask.sum() / (mask.sum() - 1)
    return (values - mean) / np.sqrt(var)


def test_treepo_whitens_over_policy_tokens_like_treepos_code():
    trees = [two_level_tree((0.0, 1.0, 0.0, 0.0)), chain_tree([1.0, 0.0, 0.0], [1, 3, 2], prompt_id="q2")]
    raw = [treepo_unwhitened(t, AdvantageConfig()) for t in trees]
    # one row per rollout, its policy tokens (mask 1) holding the rollout's raw advantage, padded with mask 0
    per_rollout = []
    for tree, a in zip(trees, raw):
        for leaf, value in zip(tree.leaves(), a):
            n = sum(tree.nodes[i].segment.num_policy_tokens for i in tree.path(leaf)[1:])
            per_rollout.append((value, n))
    width = max(n for _, n in per_rollout)
    values = np.array([[v] * width for v, _ in per_rollout])
    mask = np.array([[1.0] * n + [0.0] * (width - n) for _, n in per_rollout])
    expected = masked_whiten(values, mask)[:, 0]
    results = compute_advantages("treepo", trees, EXACT)
    got = np.concatenate([[row[0] for row in adv.values] for adv in results])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    leaves = compute_advantages("treepo", trees, AdvantageConfig(eps=0.0, treepo_whiten="leaves"))
    assert not np.allclose(np.concatenate([[r[0] for r in a.values] for a in leaves]), got), \
        "rollouts of different lengths: token and leaf weighting must differ"


def test_graded_constant_reward_gives_exactly_zero_for_every_estimator():
    tree = two_level_tree((0.7, 0.7, 0.7, 0.7))  # Vhat = 0.7 only up to rounding
    for name in BUILT_IN:
        for adv in compute_advantages(name, [tree], EXACT):
            assert all(np.all(row == 0.0) for row in adv.values), f"{name} on constant 0.7 gave {adv.values}"


def test_tree_grpo_two_level_tree_hand_worked():
    tree = two_level_tree((0.0, 1.0, 0.0, 0.0))
    # inter-tree, over [0, 1, 0, 0]: mean 1/4, std 1/2 -> [-1/2, 3/2, -1/2, -1/2]
    # intra-tree: subtree of node 1 = {leaf 2} -> 0; subtree of node 3 = [1, 0, 0]: mean 1/3,
    #   unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3 -> [2/3, -1/3, -1/3] * sqrt(3)
    s3 = math.sqrt(3)
    expected = {2: -0.5, 4: 1.5 + 2 / 3 * s3, 5: -0.5 - s3 / 3, 6: -0.5 - s3 / 3}
    (adv,) = compute_advantages("tree_grpo", [tree], EXACT)
    for leaf, a in expected.items():
        np.testing.assert_allclose(adv.of(leaf), [a, a], rtol=1e-12, err_msg=f"leaf {leaf}")


# ------------------------------------------------------------------------------ invariants
@settings(max_examples=30, deadline=None)
@given(specs=st.lists(TREE_SPEC, min_size=1, max_size=3),
       constants=st.lists(st.sampled_from([0.0, 1.0, 0.7, 0.1, 1 / 3]), min_size=3, max_size=3))
def test_constant_rewards_give_zero_advantages_everywhere(specs, constants):
    """Binary or graded, one constant per tree: every estimator gives exactly 0 (no rounding noise whitened up)."""
    def constant(spec, c):
        return [constant(s, c) if isinstance(s, list) else c for s in spec]

    trees = [build(labelled(constant(spec, c)), prompt_id=f"q{i}") for i, (spec, c) in enumerate(zip(specs, constants))]
    configs = [AdvantageConfig(), AdvantageConfig(leave_one_out=True), AdvantageConfig(std_ddof=0, eps=0.0),
               AdvantageConfig(norm_by_std=False, scale_by_root_std=False, min_leaves=1),
               AdvantageConfig(eps=0.0, treepo_whiten="leaves")]
    for name in BUILT_IN:
        for config in configs:
            for adv in compute_advantages(name, trees, config):
                for row in adv.values:
                    assert np.all(row == 0.0), f"{name} with {config} on constant rewards gave {row}"
            assert nonzero_adv_token_frac(trees, compute_advantages(name, trees, config)) == 0.0


@settings(max_examples=40, deadline=None)
@given(spec=TREE_SPEC, seed=st.integers(0, 2**32 - 1))
def test_advantages_are_invariant_to_sibling_order(spec, seed):
    kids = labelled(spec)
    tree = build(kids)
    permuted = build(shuffled(kids, random.Random(seed)))
    for name in BUILT_IN:
        for config in (AdvantageConfig(), AdvantageConfig(leave_one_out=True)):
            (a,) = compute_advantages(name, [tree], config)
            (b,) = compute_advantages(name, [permuted], config)
            want, got = by_rollout(tree, a), by_rollout(permuted, b)
            assert want.keys() == got.keys()
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-12,
                                           err_msg=f"{name}: rollout {key} changed with sibling order")


def test_invariance_check_sees_a_different_tree():
    # Guard for the test above: the rollout keys do tell two different reward assignments apart.
    kids = labelled([[1.0, 0.0], 0.0])
    other = labelled([[0.0, 1.0], 0.0])
    (a,), (b,) = compute_advantages("trace", [build(kids)]), compute_advantages("trace", [build(other)])
    assert not np.allclose(by_rollout(build(kids), a)[("/0", "/0/0")], by_rollout(build(other), b)[("/0", "/0/0")])


@settings(max_examples=60, deadline=None)
@given(spec=TREE_SPEC, min_leaves=st.integers(2, 4))
def test_trace_packed_equals_n_times_value_gap(spec, min_leaves):
    tree = build(labelled(spec))
    config = AdvantageConfig(min_leaves=min_leaves)
    (adv,) = compute_advantages("trace", [tree], config)
    backup = tree.backup()
    rewards = tree.rewards()
    scale = np.std(rewards, ddof=1) + config.eps if len(rewards) > 1 else config.eps
    packed, per_leaf = adv.packed(), adv.segment_values()
    for c in range(1, len(tree)):
        b = tree.nodes[c].parent_id  # deepest of parent(c) and its ancestors with enough leaves
        while b is not None and backup.num_leaves[b] < min_leaves:
            b = tree.nodes[b].parent_id
        gap = 0.0 if b is None else backup.num_leaves[c] * (backup.vhat[c] - backup.vhat[b]) / scale
        assert packed[c] == pytest.approx(gap, abs=1e-9), f"node {c}: packed {packed[c]} != n_c (Vhat(c) - Vhat(b))"
        assert len(per_leaf[c]) == backup.num_leaves[c], "one per-leaf term for each leaf below the node"
        assert per_leaf[c].tolist() == [adv.of(l)[adv.paths[adv.leaf_ids.index(l)].index(c)]
                                        for l in tree.leaves_below(c)]


def test_trees_without_leaves_give_empty_results():
    bare = Tree.new("q", "prompt")
    unfinished = Tree.new("q2", "prompt")
    unfinished.add_child(0, Segment.text_only("search", "doc", 2, 2))
    for name in BUILT_IN:
        for adv in compute_advantages(name, [bare, unfinished]):
            assert adv.leaf_ids == () and adv.paths == () and adv.values == () and adv.packed() == {}
    assert nonzero_adv_token_frac([bare], compute_advantages("trace", [bare])) == 0.0


def test_of_rejects_a_non_leaf_and_values_are_read_only():
    (adv,) = compute_advantages("trace", [two_level_tree()])
    with pytest.raises(KeyError, match="not a leaf"):
        adv.of(3)
    with pytest.raises(ValueError):
        adv.of(4)[0] = 1.0


# ------------------------------------------------------------------------------ nonzero_adv_token_frac
def test_nonzero_adv_token_frac_counts_each_rollouts_tokens():
    #   0 -- 1 (3 policy, 5 obs) -- 2 leaf r=1 (2 policy)
    #   `-- 3 (4 policy, 7 obs) -- 4 leaf r=0 (6 policy)
    #                           `-- 5 leaf r=0 (1 policy, continuation)
    tree = Tree.new("q", "prompt")
    n1 = tree.add_child(0, Segment.text_only("a", "o", 3, 5))
    tree.add_child(n1, Segment.text_only("b", "", 2, 0), reward=1.0)
    n3 = tree.add_child(0, Segment.text_only("c", "o", 4, 7))
    tree.add_child(n3, Segment.text_only("d", "", 6, 0), reward=0.0)
    tree.add_child(n3, Segment.text_only("e", "", 1, 0), reward=0.0, origin="continuation")
    # trace: segments 4 and 5 are judged against Vhat(3) = 0 -> zero; all others against the root (1/3) -> non-zero.
    # Policy tokens per rollout: leaf 2: 3 + 2 (all non-zero); leaf 4: 4 (non-zero) + 6; leaf 5: 4 (non-zero) + 1.
    advantages = compute_advantages("trace", [tree])
    assert nonzero_adv_token_frac([tree], advantages) == pytest.approx((5 + 4 + 4) / (5 + 10 + 5))
    # grpo broadcasts each leaf's non-zero advantage to its whole rollout.
    assert nonzero_adv_token_frac([tree], compute_advantages("grpo", [tree])) == 1.0
    with pytest.raises(ValueError, match="2 trees but 1"):
        nonzero_adv_token_frac([tree, tree], advantages)


# ------------------------------------------------------------------------------ registry and config
def test_custom_estimator_registers_with_the_same_signature():
    name = "test_constant_half"

    def constant_half(trees, config):
        out = []
        for tree in trees:
            leaves = tuple(tree.leaves())
            paths = tuple(tuple(tree.path(leaf)[1:]) for leaf in leaves)
            out.append(TreeAdvantages(tree.prompt_id, leaves, paths, tuple(np.full(len(p), 0.5) for p in paths)))
        return out

    register_advantage(name)(constant_half)
    try:
        assert ADVANTAGES[name] is constant_half
        (adv,) = compute_advantages(name, [two_level_tree()])
        assert adv.packed()[3] == pytest.approx(1.5), "three leaves below node 3, 0.5 each"
        with pytest.raises(ValueError, match="already registered"):
            register_advantage(name)(constant_half)
    finally:
        del ADVANTAGES[name]


def test_unknown_estimator_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'.*grpo.*trace"):
        compute_advantages("gae", [two_level_tree()])


def test_estimator_returning_wrong_count_is_caught():
    register_advantage("test_broken")(lambda trees, config: [])
    try:
        with pytest.raises(ValueError, match="returned 0 results for 1 trees"):
            compute_advantages("test_broken", [two_level_tree()])
    finally:
        del ADVANTAGES["test_broken"]


def test_built_in_estimators_are_registered():
    assert set(BUILT_IN) <= set(ADVANTAGES)


@pytest.mark.parametrize("kwargs, fix", [
    ({"leave_one_out": True, "min_leaves": 1}, "raise min_leaves"),
    ({"eps": -1.0}, "must be >= 0"),
    ({"std_ddof": 2}, "std_ddof=2 must be one of 0, 1"),
    ({"min_leaves": 0}, "must be >= 1"),
])
def test_bad_config_raises_with_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        AdvantageConfig(**kwargs)


def test_a_spread_below_float_resolution_is_no_contrast_even_without_eps():
    # rewards one ulp apart near 1e-300: their std underflows to 0, which eps=0 would divide by
    tiny = star_tree([1e-300, float(np.nextafter(1e-300, 1.0))])
    with np.errstate(divide="raise", invalid="raise"):
        for name in ("grpo", "trace", "tree_grpo", "treepo"):
            (adv,) = compute_advantages(name, [tiny], AdvantageConfig(eps=0.0))
            assert all(np.array_equal(v, np.zeros_like(v)) for v in adv.values), (name, adv.values)
