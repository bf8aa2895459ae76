import numpy as np
import pytest

from tracerl.core.growth import grow_trees, intermediate_nodes
from tracerl.core.ledger import make_prices, split_whole
from tracerl.core.methods import METHODS, AllocationConfig, get_method, pcl_roots, uniform_roots
from tracerl.core.simulator import SimConfig, Simulator
from tracerl.core.tree import Segment, Tree

CONFIG = AllocationConfig(num_prompts=8, rollouts_per_prompt=4, pool_factor=4, m_max=8)


def oracle(histories):
    return np.array([h.meta["true_p"] for h in histories])


def one_step(method_name, config=CONFIG, seed=0):
    sim = Simulator(SimConfig(num_prompts=256), seed=seed)
    pool = sim.set_pool(np.arange(config.pool_size))
    prices = make_prices(config)
    ledger = prices.ledger()
    grown = grow_trees(get_method(method_name), config, pool, oracle, sim, ledger, np.random.default_rng(seed), prices)
    return grown, ledger


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_spends_within_budget_and_builds_consistent_trees(name):
    grown, ledger = one_step(name)
    method = get_method(name)
    assert ledger.units_spent <= CONFIG.budget + 1e-9
    assert len(grown.trees) == len(grown.selected) > 0
    bare = sum(t.root.num_granted for t in grown.trees)
    continuations = sum(n.num_granted for t in grown.trees for n in t.nodes[1:])
    assert bare == grown.root_counts.sum()
    assert ledger.units_spent == pytest.approx(bare + CONFIG.continuation_cost * continuations)
    for tree in grown.trees:
        assert len(tree.leaves()) == tree.root.num_granted + sum(n.num_granted for n in tree.nodes[1:])
        assert all(len(tree.children[n.node_id]) > 0 for n in tree.nodes if not n.is_leaf)
    if method.prefix_policy is None:
        assert continuations == 0
    else:
        assert continuations > 0, f"{name} spent nothing on stage 2"
        assert ledger.units_spent > CONFIG.budget - CONFIG.branch_width * CONFIG.continuation_cost - 1e-9


def test_stage2_per_prompt_respects_each_prompts_share():
    grown, ledger = one_step("trace")
    total = int((CONFIG.budget - grown.root_counts.sum()) // CONFIG.continuation_cost)
    share = split_whole(total, grown.root_counts[grown.selected])
    used = [sum(n.num_granted for n in t.nodes[1:]) for t in grown.trees]
    assert all(u <= s for u, s in zip(used, share)), (used, share.tolist())


def test_stage2_only_expands_unmixed_intermediate_nodes_for_trace():
    grown, _ = one_step("trace", AllocationConfig(num_prompts=8, rollouts_per_prompt=4, expand_rounds=1))
    for tree in grown.trees:
        for node in tree.nodes[1:]:
            if node.num_granted:
                assert not node.is_leaf and node.expand_reason == "predictor" and node.p_pred is not None
                first = [c for c in tree.children[node.node_id] if tree.nodes[c].origin == "bare"]
                assert first, "an expanded node must come from a bare rollout in round 1"


def test_global_stage2_mode_spends_the_same_budget():
    config = AllocationConfig(num_prompts=8, rollouts_per_prompt=4, stage2_mode="global")
    grown, ledger = one_step("trace", config)
    assert ledger.units_spent <= config.budget + 1e-9
    assert grown.num_prefix_anchors > 0


def test_same_seed_same_trees():
    a, _ = one_step("trace", seed=3)
    b, _ = one_step("trace", seed=3)
    assert [t.to_json() for t in a.trees] == [t.to_json() for t in b.trees]


def test_split_whole_is_proportional_and_exact():
    out = split_whole(10, np.array([2, 2, 4, 0]))
    assert out.tolist() == [3, 2, 5, 0] or out.sum() == 10 and out[3] == 0
    assert split_whole(7, np.array([1, 1, 1])).tolist() == [3, 2, 2]
    assert split_whole(0, np.array([1, 2])).tolist() == [0, 0]


def test_intermediate_nodes_skip_mixed_when_asked():
    tree = Tree.new("p", "q")
    a = tree.add_child(0, Segment.text_only("a", "o", 1, 1))
    tree.add_child(a, Segment.text_only("x", "", 1, 0), reward=1.0)
    tree.add_child(a, Segment.text_only("y", "", 1, 0), reward=0.0)
    b = tree.add_child(0, Segment.text_only("b", "o", 1, 1))
    tree.add_child(b, Segment.text_only("z", "", 1, 0), reward=1.0)
    c = tree.add_child(0, Segment.text_only("c", "o", 1, 1))
    tree.add_child(c, Segment.text_only("w", "", 1, 0), reward=0.0)
    assert intermediate_nodes(tree, "all")[0] == [a, b, c]
    ids, outcome = intermediate_nodes(tree, "unmixed")
    assert ids == [b, c] and outcome.tolist() == [1, 0]
    assert intermediate_nodes(tree, "failed")[0] == [c]


def test_trace_failed_branches_only_from_prefixes_whose_rollouts_all_failed():
    grown, _ = one_step("trace-failed", AllocationConfig(num_prompts=8, rollouts_per_prompt=4, expand_rounds=1))
    anchors = [(tree, node) for tree in grown.trees for node in tree.nodes[1:] if node.num_granted]
    assert anchors, "stage 2 branched somewhere"
    for tree, node in anchors:  # with one stage-2 round, the rollouts below an anchor before it are the bare ones
        before = [tree.nodes[leaf].reward for leaf in tree.leaves_below(node.node_id)
                  if tree.nodes[leaf].origin == "bare"]
        assert before and max(before) <= 0.5, "an anchor of trace-failed had a successful rollout below it"


def test_root_policies():
    rng = np.random.default_rng(0)
    p = np.array([0.9, 0.5, 0.1, 0.45, 0.6, 0.0])
    config = AllocationConfig(num_prompts=2, rollouts_per_prompt=4)
    assert pcl_roots(p, 8.0, config, rng).tolist() == [0, 4, 0, 4, 0, 0]
    counts = uniform_roots(p, 8.0, config, rng)
    assert sorted(counts.tolist()) == [0, 0, 0, 0, 4, 4]


def test_bad_allocation_config_names_the_fix():
    with pytest.raises(ValueError, match="m_max=2 < m_min=3"):
        AllocationConfig(m_min=3, m_max=2)
    with pytest.raises(ValueError, match="root_value"):
        AllocationConfig(root_value="nope")
    with pytest.raises(ValueError, match="budget_unit"):
        AllocationConfig(budget_unit="tokenz")
    with pytest.raises(ValueError, match="unknown method 'gpro'"):
        get_method("gpro")


def test_simulator_is_a_martingale():
    """The oracle's p at a node is the success rate of rollouts continued from it."""
    sim = Simulator(SimConfig(num_prompts=64), seed=1)
    sim.set_pool(np.arange(64))
    (tree,), _ = sim.run_roots([5], [1])
    node = tree.path(tree.leaves()[0])[1]
    p_node = tree.nodes[node].meta["true_p"]
    sim.run_continuations([(tree, node, 4000)])
    rewards = [tree.nodes[i].reward for i in tree.leaves_below(node)]
    assert abs(np.mean(rewards) - p_node) < 4 * np.sqrt(p_node * (1 - p_node) / len(rewards)) + 1e-3


def test_stage2_width_grants_whole_groups_by_the_same_objective():
    """stage2_width w: every prefix gets a multiple of w, the groups chosen to maximise sum 1 - q^K (brute force),
    and a whole step grants only whole groups within budget."""
    import itertools

    from tracerl.core.methods import predictor_prefixes

    config = AllocationConfig(num_prompts=8, rollouts_per_prompt=4, stage2_width=3, k_max=None)
    p, outcome, cost = np.array([0.5, 0.9, 0.2, 0.6]), np.array([0, 0, 1, 1]), np.full(4, 0.5)
    q = np.where(outcome == 1, p, 1 - p)
    grants = predictor_prefixes(p, outcome, 4.5, config, np.random.default_rng(0), cost)  # 9 continuations: 3 groups
    assert np.all(grants % 3 == 0) and grants.sum() * 0.5 <= 4.5
    best = max((g for g in itertools.product(range(4), repeat=4) if sum(g) * 1.5 <= 4.5),
               key=lambda g: float(np.sum(1 - q ** (3 * np.array(g)))))
    assert np.sum(1 - q ** grants) == pytest.approx(np.sum(1 - q ** (3 * np.array(best))))
    capped = predictor_prefixes(p, outcome, 4.5, AllocationConfig(num_prompts=8, rollouts_per_prompt=4,
                                                                   stage2_width=3, k_max=5),
                                np.random.default_rng(0), cost)
    assert capped.max() <= 3  # k_max 5 holds one group of 3
    grown, ledger = one_step("trace", config)
    for tree in grown.trees:
        assert all(n.num_granted % 3 == 0 for n in tree.nodes[1:])
    assert any(n.num_granted for t in grown.trees for n in t.nodes[1:])
    assert ledger.units_spent <= config.budget + 1e-9
    with pytest.raises(ValueError, match="stage2_width"):
        AllocationConfig(stage2_width=6, k_max=4)
