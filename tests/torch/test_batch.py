"""Training batches from trees: the per-rollout rows and the packed rows describe the same rollouts.

Every packed check reads a rollout back out of the packed tensors (follow `prev_index` from the leaf, look at what
the leaf's last token may attend to) and compares it with `Tree.prefix_token_ids`, which knows nothing of packing.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tracerl.core.tree import Segment, Tree
from helpers import random_advantages  # noqa: E402
from tracerl.train.batch import packed_batch, rollout_batch

VOCAB = 50


def irregular_tree(prompt_id: str, seed: int) -> Tree:
    """Branches at depths 1 and 2, leaves at depths 1 to 3, a segment with no policy tokens, a final turn
    without observation, random lengths and token ids, distinct sampling logprobs."""
    rng = np.random.default_rng(seed)

    def seg(num_policy: int, num_obs: int) -> Segment:
        n = num_policy + num_obs
        return Segment(rng.integers(1, VOCAB, n).tolist(), (-rng.random(n) - 0.1).tolist(),
                       [1] * num_policy + [0] * num_obs)

    def r(lo, hi):
        return int(rng.integers(lo, hi))

    tree = Tree.new(prompt_id, seg(0, r(3, 7)))
    a = tree.add_child(0, seg(r(2, 5), r(1, 4)))
    b = tree.add_child(0, seg(r(2, 5), r(1, 4)))
    tree.add_child(0, seg(r(2, 6), 0), reward=1.0)  # a one-turn rollout
    a1 = tree.add_child(a, seg(r(2, 5), r(1, 4)), origin="continuation", anchor_id=a)
    a2 = tree.add_child(a, seg(0, r(2, 4)), origin="continuation", anchor_id=a)  # an observation-only turn
    tree.add_child(a1, seg(r(1, 5), 0), reward=0.0)
    tree.add_child(a1, seg(r(1, 5), 0), reward=1.0)
    tree.add_child(a2, seg(r(1, 5), 0), reward=1.0)
    tree.add_child(a, seg(r(1, 5), 0), reward=0.0)
    b1 = tree.add_child(b, seg(r(2, 5), r(1, 3)))
    tree.add_child(b1, seg(r(1, 5), 0), reward=0.0)
    return tree


@pytest.fixture(scope="module")
def step():
    trees = [irregular_tree(f"p{i}", seed=i) for i in range(3)]
    return trees, [random_advantages(t, seed=10 + i) for i, t in enumerate(trees)]


def test_rollout_rows_hold_each_rollout_with_its_segment_advantages(step):
    trees, advs = step
    batch = rollout_batch(trees, advs, pad_id=-7)
    assert len(batch.rollouts) == sum(len(a.leaf_ids) for a in advs) == batch.input_ids.shape[0]
    for row, (t, leaf) in enumerate(batch.rollouts):
        tree, adv = trees[t], advs[t]
        ids = tree.prefix_token_ids(leaf)
        n = len(ids)
        assert batch.input_ids[row, :n].tolist() == ids, f"row {row} is not the rollout ending at leaf {leaf}"
        assert (batch.input_ids[row, n:] == -7).all() and batch.attention_mask[row].sum() == n, "bad right padding"
        want_mask, want_adv, want_lp = [], [], []
        for node_id in tree.path(leaf):
            seg = tree.nodes[node_id].segment
            value = 0.0 if node_id == 0 else adv.of(leaf)[adv.paths[adv.leaf_ids.index(leaf)].index(node_id)]
            want_mask += seg.mask
            want_adv += [value * m for m in seg.mask]
            want_lp += [lp * m for lp, m in zip(seg.logprobs, seg.mask)]
        assert batch.loss_mask[row, :n].tolist() == want_mask, "loss mask must be 1 exactly on policy tokens"
        np.testing.assert_allclose(batch.advantages[row, :n].numpy(), want_adv, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(batch.logprobs_old[row, :n].numpy(), want_lp, rtol=1e-6)
        assert batch.loss_mask[row, n:].sum() == 0 and batch.advantages[row, n:].abs().sum() == 0


@pytest.mark.parametrize("split_depth", [0, 1, 2, 5])
def test_packed_rows_reproduce_every_rollout(step, split_depth):
    trees, advs = step
    batch = packed_batch(trees, advs, split_depth=split_depth)
    seen = set()
    for row, (t, leaves) in enumerate(batch.rows):
        tree, adv = trees[t], advs[t]
        n = int(batch.token_mask[row].sum())
        ids, prev = batch.input_ids[row].tolist(), batch.prev_index[row].tolist()
        attend = batch.attention_mask[row, 0]  # (T, T)
        for col, leaf in enumerate(leaves):
            seen.add((t, leaf))
            want = tree.prefix_token_ids(leaf)
            # the leaf's last token: its chain of predecessors spells the rollout, positions count down from the end
            chain, i = [], max(j for j in range(n) if batch.leaf_mask[row, j, col])
            while i >= 0:
                chain.append(i)
                i = prev[i]
            chain = chain[::-1]
            assert [ids[j] for j in chain] == want, f"tree {t} leaf {leaf}: prev_index does not spell the rollout"
            assert batch.position_ids[row, chain].tolist() == list(range(len(want))), "positions are not rollout's"
            assert torch.nonzero(attend[chain[-1]]).flatten().tolist() == chain, (
                f"tree {t} leaf {leaf}: the last token must attend to exactly its rollout's tokens")
            policy = [j for j in chain if batch.loss_mask[row, j]]
            assert torch.nonzero(batch.leaf_mask[row, :, col]).flatten().tolist() == policy, "leaf mask off path"
            row_adv = adv.of(leaf)
            want_adv = [row_adv[list(adv.paths[adv.leaf_ids.index(leaf)]).index(nid)]
                        for nid in tree.path(leaf)[1:] for m in tree.nodes[nid].segment.mask if m]
            np.testing.assert_allclose(batch.advantages[row, policy, col].numpy(), want_adv, rtol=1e-6, atol=1e-7)
    assert seen == {(t, leaf) for t, a in enumerate(advs) for leaf in a.leaf_ids}, "a rollout is missing"
    assert batch.num_policy_tokens == rollout_batch(trees, advs).num_policy_tokens, "normaliser differs"


def test_packed_tree_lays_each_node_once_with_summed_advantages_and_leaf_counts(step):
    trees, advs = step
    batch = packed_batch(trees, advs)
    assert batch.input_ids.shape[0] == len(trees)
    for row, (tree, adv) in enumerate(zip(trees, advs)):
        n = int(batch.token_mask[row].sum())
        assert batch.input_ids[row, :n].tolist() == [t for node in tree for t in node.segment.token_ids]
        backup, packed = tree.backup(), adv.packed()
        want_weight, want_sum = [], []
        for node in tree:
            for m in node.segment.mask:
                want_weight.append(backup.num_leaves[node.node_id] * m)
                want_sum.append(packed.get(node.node_id, 0.0) * m)
        assert batch.weight[row, :n].tolist() == want_weight, "weight must be the number of leaves below the node"
        np.testing.assert_allclose(batch.summed_advantages[row, :n].numpy(), want_sum, rtol=1e-5, atol=1e-6)
    rows = rollout_batch(trees, advs)
    want_rollout = sum(len(trees[t].prefix_token_ids(leaf)) for t, leaf in rows.rollouts)
    want_packed = sum(node.segment.num_tokens for tree in trees for node in tree)
    assert rows.num_tokens == want_rollout and batch.num_tokens == want_packed < want_rollout, (
        f"packed computes {batch.num_tokens} tokens, per rollout {rows.num_tokens}; expected {want_packed} "
        f"< {want_rollout}")


def test_split_rows_trade_tokens_for_shorter_rows(step):
    trees, advs = step
    whole, split = packed_batch(trees, advs), packed_batch(trees, advs, split_depth=1)
    per_rollout = rollout_batch(trees, advs)
    assert split.input_ids.shape[0] == sum(len(t.children[0]) for t in trees), "one row per depth-1 node"
    assert whole.num_tokens < split.num_tokens < per_rollout.num_tokens
    assert split.input_ids.shape[1] < whole.input_ids.shape[1]


def test_mismatched_or_promptless_inputs_are_refused(step):
    trees, advs = step
    with pytest.raises(ValueError, match="matching order"):
        packed_batch(trees, advs[:2])
    with pytest.raises(AssertionError, match="paired with"):
        rollout_batch(trees[:2], advs[1:])
    bare = Tree.new("q", "a prompt without tokens")
    bare.add_child(0, Segment([3, 4], [-1.0, -1.0], [1, 1]), reward=1.0)
    with pytest.raises(ValueError, match="no prompt tokens"):
        packed_batch([bare], [random_advantages(bare, 0)])
