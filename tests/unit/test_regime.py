"""Regime shares: the per-prompt success histogram and its all-fail / mixed / all-success split, by question type."""

import pytest

from tracerl.bench.regime import to_markdown
from tracerl.core.regime import regime_by_group, regime_shares


def test_shares_split_prompts_by_their_group_outcome():
    per_prompt = [0.0, 0.0, 1 / 8, 0.5, 7 / 8, 1.0]
    out = regime_shares(per_prompt, 8)
    assert out["histogram"] == [2, 1, 0, 0, 1, 0, 0, 1, 1]
    assert (out["all_fail"], out["mixed"], out["all_success"]) == pytest.approx((2 / 6, 3 / 6, 1 / 6))
    assert out["mean_success"] == pytest.approx(sum(per_prompt) / 6)


def test_a_prompt_with_a_partial_reward_is_mixed_not_all_success():
    out = regime_shares([0.999, 1.0], 8)
    assert out["mixed"] == 0.5 and out["all_success"] == 0.5


def test_groups_follow_the_rows_question_types():
    rows = [{"extra_info": {"hops": h, "answerable": a}} for h, a in [(1, True), (1, True), (5, False), (5, True)]]
    out = regime_by_group([1.0, 0.5, 0.0, 0.25], rows, 4)
    assert out["overall"]["num_prompts"] == 4
    assert out["groups"]["hops=1"]["all_success"] == 0.5 and out["groups"]["hops=1"]["mixed"] == 0.5
    assert out["groups"]["hops=5"]["all_fail"] == 0.5
    assert out["groups"]["answerable=False"]["num_prompts"] == 1
    table = to_markdown(out)
    assert "| hops=5 | 2 | 50.0% | 50.0% | 0.0% |" in table


def test_bad_input_raises_with_the_fix():
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        regime_shares([1.5], 8)
    with pytest.raises(ValueError, match="n >= 1"):
        regime_shares([0.5], 0)


def test_built_in_domains_are_split_by_their_question_type():
    """Function-calling rows carry their template (`task`), math rows their generator: both are groups."""
    rows = [{"extra_info": {"task": "balance"}}, {"extra_info": {"task": "transfer"}},
            {"extra_info": {"generator": "products"}}, {"extra_info": {"generator": "products"}}]
    out = regime_by_group([1.0, 0.0, 0.5, 1.0], rows, 8)
    assert set(out["groups"]) == {"task=balance", "task=transfer", "generator=products"}
    assert out["groups"]["generator=products"]["num_prompts"] == 2
    assert out["groups"]["generator=products"]["mixed"] == 0.5
