import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.tree import Segment, Tree


def two_level_tree() -> Tree:
    """root -> a (-> a1 r=1, a2 r=0), root -> b r=0."""
    tree = Tree.new("p0", "What is 2 + 2?", meta={"domain": "math"})
    a = tree.add_child(0, Segment([5, 6, 7], [-0.1, -0.2, 0.0], [1, 1, 0], "think", "obs"), tool_error=True)
    tree.add_child(a, Segment([8], [-0.3], [1], "<answer>4</answer>"), reward=1.0)
    tree.add_child(a, Segment([9], [-1.5], [1], "<answer>5</answer>"), reward=0.0, origin="continuation")
    tree.add_child(0, Segment([10, 11], [-0.7, -0.9], [1, 1], "<answer>3</answer>"), reward=0.0)
    return tree


def test_backup_targets_and_leaf_counts():
    backup = two_level_tree().backup()
    np.testing.assert_allclose(backup.vhat, [1 / 3, 0.5, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(backup.num_leaves, [3, 2, 1, 1, 1])


def test_mixed_nodes_and_paths():
    tree = two_level_tree()
    assert tree.mixed().tolist() == [True, True, False, False, False]
    assert tree.path(3) == [0, 1, 3]
    assert tree.leaves() == [2, 3, 4]
    assert tree.leaves_below(1) == [2, 3]
    assert tree.prefix_token_ids(3) == [5, 6, 7, 9]


def test_history_reads_the_prefix_text_and_structure():
    history = two_level_tree().history(1)
    assert history.text == "What is 2 + 2?\nthink\nobs"
    assert (history.depth, history.num_tool_errors, history.num_tokens) == (1, 1, 3)


def test_json_round_trip_is_lossless():
    tree = two_level_tree()
    tree.nodes[1].p_pred = 0.123456789012345
    tree.nodes[1].num_granted = 2
    again = Tree.from_json(tree.to_json())
    assert again == tree
    assert again.to_json() == tree.to_json()
    assert again.nodes[2].segment.logprobs == [-0.3]
    assert json.loads(tree.to_json())["nodes"][3]["origin"] == "continuation"


def test_bad_segments_and_growth_are_refused():
    with pytest.raises(ValueError, match="lengths differ"):
        Segment([1, 2], [0.0], [1, 1])
    with pytest.raises(ValueError, match="mask 0"):
        Tree.new("p", Segment([1], [0.0], [1]))
    tree = two_level_tree()
    with pytest.raises(AssertionError, match="leaf"):
        tree.add_child(2, Segment())


@st.composite
def random_trees(draw):
    tree = Tree.new("p", "prompt")
    open_nodes = [0]
    for _ in range(draw(st.integers(1, 30))):
        parent = draw(st.sampled_from(open_nodes))
        done = draw(st.booleans())
        node = tree.add_child(parent, Segment.text_only("a", "o", draw(st.integers(0, 5)), draw(st.integers(0, 5))),
                              reward=float(draw(st.integers(0, 1))) if done else None)
        if not done:
            open_nodes.append(node)
    return tree


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_round_trip_and_backup_consistency_on_random_trees(tree):
    assert Tree.from_json(tree.to_json()) == tree
    backup = tree.backup()
    for node in tree.nodes:
        below = tree.leaves_below(node.node_id)
        assert backup.num_leaves[node.node_id] == len(below)
        if below:
            assert backup.vhat[node.node_id] == pytest.approx(np.mean([tree.nodes[i].reward for i in below]))


def test_keep_rollouts_keeps_their_paths_renumbered_and_nothing_else():
    tree = two_level_tree()
    leaves = tree.leaves()  # [2, 3, 4]: a1, a2 (a continuation anchored at a), b
    kept = tree.keep_rollouts([leaves[1], leaves[2]])
    assert [n.segment.policy_text for n in kept.nodes] == ["", "think", "<answer>5</answer>", "<answer>3</answer>"]
    assert [n.parent_id for n in kept.nodes] == [None, 0, 1, 0]
    assert kept.rewards().tolist() == [0.0, 0.0] and kept.children == [[1, 3], [2], [], []]
    assert kept.nodes[2].origin == "continuation" and kept.nodes[2].anchor_id == tree.nodes[3].anchor_id
    assert kept.meta == tree.meta and kept.meta is not tree.meta
    assert len(tree) == 5, "the tree it came from is unchanged"
    with pytest.raises(ValueError, match="not a leaf"):
        tree.keep_rollouts([1])
