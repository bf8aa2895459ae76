"""Posterior screening with branches (`samplers.PosteriorTree`, ours): its price of a continuation against hand
computation, which block each prompt gets, the budget it keeps to, and its trees in the one step."""

from types import SimpleNamespace

import numpy as np
import pytest

from tracerl.core.growth import drawn_from, grow_trees
from tracerl.core.ledger import make_prices
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.samplers import ROUND_SAMPLERS, Branches, Round, Seen, branch_ratio, posterior_ratio
from tracerl.core.step import run_step
from tracerl.core.tree import Segment, Tree


def branches(prompt, node, p, outcome, cost):
    return Branches(np.array(prompt), np.array(node), np.array(p, dtype=float), np.array(outcome),
                    np.array(cost, dtype=float))


def test_a_continuations_worth_is_the_hand_computed_one():
    """kappa 4 around p = 0.25 is Beta(1, 3): below an all-failed prefix two continuations hold a success with
    1 - E[(1 - theta)^2] = 1 - (3 * 4) / (4 * 5) = 0.4 (and the mirror case above an all-succeeded one). A full group
    (m = n = 8) pays only the continuations: 0.4 * (8 + 2) / (2 * 0.5) = 4. A group of m = 4 also expects a fill of
    0.4 * 4 fresh rollouts at 1: 0.4 * 10 / (1 + 1.6)."""
    found = branches([0, 1, 1], [3, 5, 6], [0.25, 0.75, 0.25], [0, 1, 0], [0.5, 0.5, 0.5])
    ratio, after = branch_ratio(found, kappa=4.0, k=2, n=8, rollouts=np.array([8, 4]), cost=np.ones(2))
    assert ratio.tolist() == pytest.approx([4.0, 4.0 / 2.6, 4.0 / 2.6])
    assert after.tolist() == pytest.approx([0.0, 1.6, 1.6])
    dearer, _ = branch_ratio(branches([0], [3], [0.25], [0], [1.0]), 4.0, 2, 8, np.array([8]), np.ones(1))
    assert dearer[0] == pytest.approx(2.0), "a continuation twice as dear is worth half as much per cost"


def test_the_rollouts_drawn_from_a_prefix_update_its_worth():
    """Beta(1, 3) updated with 3 failed draws from the prefix is Beta(1, 6): two continuations hold a success with
    1 - (6 * 7) / (7 * 8) = 0.25, so a full group's block is worth 0.25 * 10 / 1."""
    found = branches([0], [3], [0.25], [0], [0.5])
    found.rollouts, found.successes = np.array([3]), np.array([0])
    ratio, _ = branch_ratio(found, kappa=4.0, k=2, n=8, rollouts=np.array([8]), cost=np.ones(1))
    assert ratio[0] == pytest.approx(2.5)


def test_the_draws_from_a_prefix_are_the_leaves_below_it_that_started_at_or_above_it():
    """Root -> a -> b -> leaf (a fresh rollout, failed); two continuations from a (one ends at a leaf below a new
    node, one succeeded), one from b. Drawn from a: the fresh rollout and a's two continuations; from b: the fresh
    rollout and b's continuation, not a's (they left a by another node)."""
    turn = Segment.text_only("t", "", 1, 0)
    tree = Tree.new("q", "prompt")
    a = tree.add_child(0, turn)
    b = tree.add_child(a, turn)
    tree.add_child(b, turn, reward=0.0)
    c = tree.add_child(a, turn, origin="continuation", anchor_id=a)
    tree.add_child(c, turn, reward=0.0)
    tree.add_child(a, turn, reward=1.0, origin="continuation", anchor_id=a)
    tree.add_child(b, turn, reward=0.0, origin="continuation", anchor_id=b)
    assert drawn_from(tree, a) == (3, 1) and drawn_from(tree, b) == (2, 0)


def round_of(seen, **kw):
    cfg = AllocationConfig(rollouts_per_prompt=8, round_rollouts=2, prior_strength=4.0, **kw)
    return ROUND_SAMPLERS["posterior_tree"](cfg).grants(seen, np.random.default_rng(0))


def test_each_prompt_gets_its_best_block_and_the_round_keeps_to_the_budget():
    """Prompt 0: 8 fresh rollouts, all failed (no fresh block left), two prefixes; prompt 1: new; prompt 2: mixed by a
    continuation, 4 fresh (filled to 8); prompt 3: 2 fresh, failed, and a prefix with no chance of a success."""
    seen = Seen(p=np.array([0.1, 0.5, 0.5, 0.2]), cost=np.ones(4), order=np.arange(4), budget=100.0,
                rollouts=np.array([8, 0, 4, 2]), successes=np.array([0, 0, 0, 0]),
                tree_mixed=np.array([False, False, True, False]),
                branches=branches([0, 0, 3], [4, 2, 1], [0.25, 0.05, 0.0], [0, 0, 0], [0.5, 0.5, 0.5]))
    granted = round_of(seen)
    assert isinstance(granted, Round)
    assert granted.branches == [(0, 4, 2)], "the prefix more likely to flip, of the prompt with no fresh block left"
    fresh_block, fresh_ratio, _ = posterior_ratio(np.array([0.8]), np.array([3.2]), np.array([2]), np.array([0]), 8, 2,
                                                  np.ones(1))
    assert granted.fresh.tolist() == [0, 2, 4, int(fresh_block[0])], "prompt 3's p = 0 prefix loses to its probe"
    assert fresh_ratio[0] > 0
    tight = round_of(Seen(p=seen.p, cost=seen.cost, order=seen.order, budget=1.0, rollouts=seen.rollouts,
                          successes=seen.successes, tree_mixed=seen.tree_mixed, branches=seen.branches))
    assert tight.branches == [(0, 4, 2)] and not tight.fresh.any(), "a budget of 1 buys the best block only"


def test_a_mixed_tree_is_never_branched_and_is_what_it_keeps():
    seen = Seen(p=np.array([0.5, 0.5]), cost=np.ones(2), order=np.arange(2), budget=100.0,
                rollouts=np.array([8, 8]), successes=np.array([0, 8]), tree_mixed=np.array([True, False]),
                branches=branches([0, 1], [1, 1], [0.4, 0.4], [0, 1], [0.5, 0.5]))
    granted = round_of(seen)
    assert [b[0] for b in granted.branches] == [1] and not granted.fresh.any()
    sampler = ROUND_SAMPLERS["posterior_tree"](AllocationConfig())
    assert list(sampler.keep({0: "tree0", 1: "tree1"}, seen, np.random.default_rng(0))) == [0]


def bad_sampler(second_round):
    """A branching sampler whose first round samples prompt 0 fresh and whose second grants `second_round(seen)`."""

    class Bad:
        branches = True

        def __init__(self, config):
            pass

        def grants(self, seen, rng):
            return Round(np.zeros(len(seen.p), dtype=np.int64), second_round(seen)) if seen.round_index else \
                Round(np.array([2] + [0] * (len(seen.p) - 1)), [])

    return Bad


@pytest.mark.parametrize("second_round, error", [
    (lambda seen: [(0, 99, 1)], "not offered"),
    (lambda seen: [(int(seen.branches.prompt[0]), int(seen.branches.node[0]), 0)], "whole number >= 1"),
], ids=["unoffered prefix", "zero continuations"])
def test_a_continuation_grant_growth_did_not_offer_is_refused(monkeypatch, second_round, error):
    from tracerl.core.simulator import SimConfig, Simulator

    monkeypatch.setitem(ROUND_SAMPLERS, "posterior_tree", bad_sampler(second_round))
    cfg = AllocationConfig(num_prompts=4, rollouts_per_prompt=4)
    sim = Simulator(SimConfig(num_prompts=64), seed=0)
    prices = make_prices(cfg)
    with pytest.raises(ValueError, match=error):
        grow_trees(get_method("posterior-tree"), cfg, sim.set_pool(np.arange(cfg.pool_size)), lambda hs: np.full(
            len(hs), 0.5), sim, prices.ledger(), np.random.default_rng(0), prices)


@pytest.mark.parametrize("unit", ["units", "tokens"])
def test_it_spends_the_steps_budget_and_trains_whole_mixed_trees(unit):
    from tracerl.core.simulator import SimConfig, Simulator

    cfg = AllocationConfig(num_prompts=16, rollouts_per_prompt=8, budget_unit=unit)
    sim = Simulator(SimConfig(num_prompts=512), seed=0)
    prices = make_prices(cfg)
    oracle = SimpleNamespace(predict=lambda hs: np.array([h.meta.get("true_p", 0.5) if h.meta else 0.5 for h in hs]),
                             update=lambda *a: {})
    continued = 0
    for step in range(3):
        pool = sim.set_pool(np.arange(cfg.pool_size) + step * cfg.pool_size)
        result = run_step(get_method("posterior-tree"), cfg, pool, sim, np.random.default_rng(step), predictor=oracle,
                          prices=prices)
        ledger, m, grown = result.ledger, result.metrics, result.growth
        assert ledger.budget_spent <= ledger.budget + 1e-6
        assert ledger.budget_spent >= 0.75 * ledger.budget, "most of the budget is spent"
        assert all(t.is_mixed() for t in result.trees), "whole trees whose leaves hold both outcomes"
        fresh = sum(1 for t in grown.trees for leaf in t.leaves() if t.nodes[leaf].anchor_id == 0)
        branched = sum(1 for t in grown.trees for leaf in t.leaves() if t.nodes[leaf].anchor_id != 0)
        assert fresh == grown.root_counts.sum() and branched == grown.num_continuations
        assert all(len([leaf for leaf in t.leaves() if t.nodes[leaf].anchor_id == 0]) <= 8 for t in grown.trees)
        assert sum(n for n, _ in grown.rounds) == fresh + branched
        assert all(t.nodes[n.anchor_id].expand_reason == "posterior_tree" for t in grown.trees for n in t.nodes
                   if n.anchor_id != 0)
        continued += branched
    assert continued > 0, "some budget went to continuations"


def test_it_is_a_method_of_the_one_step():
    """(verl refuses it with the reason, as every round sampler: tests/verl/test_verl_units.py.)"""
    method = get_method("posterior-tree")
    assert method.in_rounds and method.advantage == "trace" and method.prefix_policy is None
