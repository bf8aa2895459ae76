"""The pure parts of the verl integration: stage 1 over a batch, leaf rows, config checks, the failure runner."""

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

from omegaconf import OmegaConf  # noqa: E402

from tracerl.core.advantages import compute_advantages  # noqa: E402
from tracerl.core.tree import Segment, Tree  # noqa: E402
from tracerl.integrations.verl import (FailSafeRunner, TraceVerlConfig, check_verl_config, leaf_rows,  # noqa: E402
                                       plan_batch)
from tracerl.integrations.verl.engine import RolloutTimeout  # noqa: E402


@pytest.mark.parametrize("method", ["trace", "trace-root-only", "grpo", "treepo"])
def test_plan_stays_within_budget_and_is_never_all_zero(method):
    config = TraceVerlConfig(method=method, m_min=3)
    rng = np.random.default_rng(0)
    for trial in range(50):
        p = rng.uniform(0, 1, size=int(rng.integers(1, 12)))
        if trial % 5 == 0:
            p[:] = 1e-6  # a predictor sure that nothing succeeds: the knapsack alone would select nothing
        plan = plan_batch(p, config, rollout_n=4, rng=rng)
        assert plan.counts.any(), f"{method}: an all-zero batch would make verl's sync sampler raise"
        assert plan.counts.sum() + plan.prefix_units.sum() <= 4 * len(p) + 1e-9, "over the GRPO-equal budget"
        assert set(plan.counts.tolist()) <= {0} | set(range(3, 17)), plan.counts
        assert not plan.prefix_units[plan.counts == 0].any(), "a filtered prompt gets no stage-2 budget"


def test_knapsack_filters_prompts_with_no_expected_contrast():
    p = np.array([0.5, 0.5, 0.999, 0.001])
    plan = plan_batch(p, TraceVerlConfig(m_min=2, m_max=4), 2, np.random.default_rng(0))
    assert plan.counts.tolist()[2:] == [0, 0] and plan.counts[:2].all() and not plan.forced


def star_tree(rewards, prompt=(1, 2, 3)):
    tree = Tree.new("p", Segment(list(prompt), [0.0] * len(prompt), [0] * len(prompt)))
    for i, r in enumerate(rewards):
        mid = tree.add_child(0, Segment([10 + i, 11, 99], [-0.5, -0.4, 0.0], [1, 1, 0]))
        tree.add_child(mid, Segment([20 + i, 21], [-0.3, -0.2], [1, 1]), reward=r)
    return tree


def test_leaf_rows_are_root_to_leaf_paths_with_masked_observations():
    tree = star_tree([1.0, 0.0, 0.0])
    adv = compute_advantages("trace", [tree])[0]
    rows = leaf_rows(tree, adv, filler_token_id=7)
    assert [r.leaf_id for r in rows] == tree.leaves()
    first = rows[0]
    assert first.prompt_ids == [1, 2, 3] and first.response_ids == [10, 11, 99, 20, 21]
    assert first.response_mask == [1, 1, 0, 1, 1] and first.logprobs == [-0.5, -0.4, 0.0, -0.3, -0.2]
    a = float(adv.of(first.leaf_id)[0])
    assert a > 0 and first.advantages == [a, a, 0.0, a, a]
    assert first.token_scores("reward") == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_a_failed_bare_rollout_is_a_row_with_one_masked_filler_token():
    tree = Tree.new("p", Segment([1, 2], [0.0, 0.0], [0, 0]))
    tree.add_child(0, Segment(observation_text="error"), reward=0.0, finish_reason="error")
    (row,) = leaf_rows(tree, None, filler_token_id=7)
    assert row.response_ids == [7] and row.response_mask == [0] and row.advantages == [0.0]
    assert row.finish_reason == "error" and row.reward == 0.0


class _Driver:
    """A driver stand-in whose rollouts always time out after growing one node (partial growth)."""

    def __init__(self):
        self.tree = Tree.new("p", Segment([1], [0.0], [0]))

    def run_roots(self, indices, counts):
        if any(counts):
            self.tree.add_child(0, Segment([5], [-1.0], [1]))
            raise RolloutTimeout("too slow")
        return [self.tree], 0

    def run_continuations(self, requests):
        for tree, node_id, _ in requests:
            tree.add_child(node_id, Segment([6], [-1.0], [1]))
        raise ConnectionError("replica gone")


def test_failsafe_runner_records_failed_leaves_and_counts_them():
    runner = FailSafeRunner(_Driver())
    (tree,), tokens = runner.run_roots([0], [3])
    assert tokens == 0 and [tree.nodes[i].finish_reason for i in tree.leaves()] == ["error"] * 3
    ok = Tree.new("q", Segment([1], [0.0], [0]))
    mid = ok.add_child(0, Segment([4], [-1.0], [1]))
    ok.add_child(mid, Segment([5], [-1.0], [1]), reward=1.0)
    size = len(ok)
    assert runner.run_continuations([(ok, mid, 2)]) == 0
    assert len(ok) == size + 2, "the failed call's partial growth is dropped, then 2 failed leaves are added"
    assert runner.counters == {"rollout/engine_timeouts": 1, "rollout/engine_errors": 1, "rollout/failed_rollouts": 5}
    with pytest.raises(AssertionError):
        FailSafeRunner(type("Bug", (), {"run_roots": lambda self, i, c: (_ for _ in ()).throw(AssertionError())})()
                       ).run_roots([0], [1])


def test_bad_settings_raise_with_the_fix():
    with pytest.raises(ValueError, match="unknown key"):
        TraceVerlConfig.from_mapping({"mehtod": "trace"})
    with pytest.raises(ValueError, match="rm_scores"):
        TraceVerlConfig(rm_scores="tokens")
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        TraceVerlConfig().allocation(8, 1)
    with pytest.raises(ValueError, match="max_tokens_per_rollout"):
        TraceVerlConfig(max_tokens_per_rollout=5000).limits(4096)
    verl = OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False}})
    with pytest.raises(ValueError, match="adv_estimator=tracerl_tree"):
        check_verl_config(verl, TraceVerlConfig())
    check_verl_config(verl, TraceVerlConfig(rm_scores="reward"))
    verl.algorithm.adv_estimator, verl.algorithm.use_kl_in_reward = "tracerl_tree", True
    with pytest.raises(ValueError, match="use_kl_in_reward=false"):
        check_verl_config(verl, TraceVerlConfig())


def test_budget_shape_knobs_reach_the_allocation():
    """stage2_width and branch_width are verl-section keys that tracerl's allocation actually uses."""
    alloc = TraceVerlConfig.from_mapping({"stage2_width": 2, "branch_width": 3}).allocation(8, 4)
    assert (alloc.stage2_width, alloc.branch_width) == (2, 3)
    with pytest.raises(ValueError, match="stage2_width"):
        TraceVerlConfig(stage2_width=6, k_max=4).allocation(8, 4)
