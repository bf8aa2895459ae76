"""BudgetLedger: refuses to overspend, keeps kinds apart, survives a JSON round trip; the prices growth asks."""

from __future__ import annotations

import json

import pytest

from tracerl.core.ledger import BudgetExceeded, BudgetLedger


def test_charges_add_up_and_overspending_is_refused():
    ledger = BudgetLedger(10.0)
    ledger.charge(6.0, tokens=600, kind="root")
    ledger.charge(3.5, kind="prefix")
    assert ledger.units_spent == 9.5 and ledger.budget_left == 0.5
    assert ledger.can_afford(0.5) and not ledger.can_afford(0.6)
    with pytest.raises(BudgetExceeded, match=r"1\.0 units.*0\.5 of 10\.0 units left"):
        ledger.charge(1.0, kind="prefix")
    assert ledger.units_spent == 9.5  # a refused charge changes nothing
    ledger.charge(0.5 + 1e-12)  # float noise is tolerated
    assert ledger.budget_left == 0.0


def test_rollout_cost():
    ledger = BudgetLedger(4.0, continuation_cost=0.25)
    assert ledger.rollout_cost(continuation=False) == 1.0
    assert ledger.rollout_cost(continuation=True) == 0.25


def test_kinds_are_tracked_separately():
    ledger = BudgetLedger(100.0)
    ledger.charge(8.0, kind="root")
    ledger.charge_tokens(1200, kind="root")
    ledger.charge(2.0, tokens=40, kind="prefix")
    ledger.charge(1.0, kind="eval")
    ledger.charge_tokens(7, kind="custom")
    assert ledger.spent_by_kind == {
        "root": {"units": 8.0, "tokens": 1200},
        "prefix": {"units": 2.0, "tokens": 40},
        "eval": {"units": 1.0, "tokens": 0},
        "custom": {"units": 0.0, "tokens": 7},
    }
    assert ledger.tokens_spent == 1247 and ledger.units_spent == 11.0
    ledger.spent_by_kind["root"]["units"] = -1  # a copy: the ledger is not changed through it
    assert ledger.spent_by_kind["root"]["units"] == 8.0


def test_token_cap():
    ledger = BudgetLedger(100.0, token_cap=1000)
    ledger.charge(1.0, tokens=900)
    ledger.charge_tokens(300)  # tokens are counted after the fact, never refused
    assert ledger.tokens_spent == 1200
    assert not ledger.can_afford(1.0)
    with pytest.raises(BudgetExceeded, match="token"):
        ledger.charge(1.0)


def test_state_dict_round_trip_is_exact_and_json_safe():
    ledger = BudgetLedger(33.3, token_cap=10 ** 6, continuation_cost=0.3)
    for i in range(7):
        ledger.charge(0.1 * (i + 1), tokens=13 * i, kind=("root", "prefix")[i % 2])
    state = json.loads(json.dumps(ledger.state_dict()))
    again = BudgetLedger.from_state_dict(state)
    assert again.state_dict() == ledger.state_dict()
    assert again.units_spent == ledger.units_spent and again.budget_left == ledger.budget_left
    with pytest.raises(BudgetExceeded):
        again.charge(again.budget_left + 0.1)


@pytest.mark.parametrize("kwargs, name", [
    (dict(budget=-1.0), "budget"),
    (dict(budget=float("nan")), "budget"),
    (dict(budget=5.0, token_cap=-3), "token_cap"),
    (dict(budget=5.0, continuation_cost=0.0), "continuation_cost"),
])
def test_bad_ledger_settings(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BudgetLedger(**kwargs)


def test_bad_charges():
    ledger = BudgetLedger(5.0)
    with pytest.raises(ValueError, match="units"):
        ledger.charge(-1.0)
    with pytest.raises(ValueError, match="tokens"):
        ledger.charge(1.0, tokens=-5)
    with pytest.raises(ValueError, match="tokens"):
        ledger.charge_tokens(2.5)


def test_prices_answer_growth_in_either_unit():
    """Units: fresh rollouts cost 1 (None: the solvers' integer path), continuations their cost, stage 2's budget
    is split in whole granules by grants. Tokens: the token estimate prices both, and the split follows cost."""
    import numpy as np

    from tracerl.core.ledger import TokenPrices, UnitPrices, make_prices
    from tracerl.core.methods import AllocationConfig
    from tracerl.core.tree import Segment, Tree

    config = AllocationConfig(num_prompts=4, rollouts_per_prompt=4, continuation_cost=0.25)
    units = make_prices(config)
    assert isinstance(units, UnitPrices) and not isinstance(units, TokenPrices)
    assert units.budget == 16 and units.fresh(["a", "b"]) is None
    tree = Tree.new("a", "q")
    node = tree.add_child(0, Segment.text_only("x", "o", 10, 3))
    tree.add_child(node, Segment.text_only("y", "", 20, 0), reward=1.0)
    assert units.continuation(tree, [node]).tolist() == [0.25]
    assert units.cost(np.array([3, 1]), np.array([0.25, 0.25])) == 1.0
    # 5 units left, granules of 2 continuations (0.5 units): 10 granules split 2:1:1 -> 5, 3, 2 (largest remainder)
    assert units.prefix_budgets(5.0, np.array([4, 2, 2]), np.ones(3), granule=2).tolist() == [2.5, 1.5, 1.0]
    purse = units.purse(np.array([2.5, 1.0]), granule=2)
    assert purse.left.tolist() == [5, 2] and purse.round_budget(0, 2, np.ones(1)) == 1.5  # ceil(5 / 2) granules
    purse.spend(0, np.array([2, 2, 1]), np.full(3, 0.25), granule=2)
    assert purse.left.tolist() == [2, 2], "a round's 5 continuations take 3 whole granules"

    tokens = make_prices(AllocationConfig(num_prompts=4, rollouts_per_prompt=4, budget_unit="tokens",
                                          default_rollout_tokens=100))
    assert isinstance(tokens, TokenPrices) and tokens.budget == 1600
    assert tokens.fresh(["a"]).tolist() == [100.0], "nothing seen yet: the default"
    tokens.observe([tree])
    # a length counts policy and observation tokens: 10 + 3 at depth 1, then 20 to the leaf
    assert tokens.fresh(["a"]).tolist() == [33.0] and tokens.continuation(tree, [node]).tolist() == [20.0]
    assert tokens.prefix_budgets(90.0, np.array([1, 2]), np.array([10.0, 10.0]), granule=1).tolist() == [30.0, 60.0]
    again = make_prices(AllocationConfig(num_prompts=4, rollouts_per_prompt=4, budget_unit="tokens"))
    again.load_state_dict(json.loads(json.dumps(tokens.state_dict())))
    assert again.fresh(["a"]).tolist() == [33.0]
