"""The pure parts of the verl integration: the nested config sections, stage 1 over a batch, the spend measured
from trees, leaf rows, config checks, the failure runner."""

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

from omegaconf import OmegaConf  # noqa: E402

from tracerl.core.advantages import compute_advantages  # noqa: E402
from tracerl.core.ledger import make_prices  # noqa: E402
from tracerl.core.methods import AllocationConfig  # noqa: E402
from tracerl.core.tree import Segment, Tree  # noqa: E402
from tracerl.integrations.verl import (FailSafeRunner, TraceVerlConfig, check_verl_config, leaf_rows,  # noqa: E402
                                       plan_batch)
from tracerl.integrations.verl.coordinator import spent_ledger, step_metrics  # noqa: E402
from tracerl.integrations.verl.engine import RolloutTimeout  # noqa: E402
from tracerl.io.files.config import from_dict  # noqa: E402
from tracerl.train.config import PredictorConfig, TrainConfig  # noqa: E402


def section(num_prompts=8, rollout_n=4, **values):
    """A `tracerl:` section as verl's config would hold it, for a batch of `num_prompts` at `rollout.n`."""
    return TraceVerlConfig.from_mapping(values, num_prompts=num_prompts, rollout_n=rollout_n)


def ids(num):
    return [f"multihop:train:{i}" for i in range(num)]


@pytest.mark.parametrize("method", ["trace", "trace-root-only", "grpo", "treepo"])
def test_plan_stays_within_budget_and_is_never_all_zero(method):
    config = section(method=method, allocation={"m_min": 3})
    rng = np.random.default_rng(0)
    for trial in range(50):
        p = rng.uniform(0, 1, size=int(rng.integers(1, 12)))
        if trial % 5 == 0:
            p[:] = 1e-6  # a predictor sure that nothing succeeds: the knapsack alone would select nothing
        plan = plan_batch(p, ids(len(p)), config, rng)
        assert plan.counts.any(), f"{method}: an all-zero batch would make verl's sync sampler raise"
        assert plan.counts.sum() + plan.prefix_budget.sum() <= 4 * len(p) + 1e-9, "over the GRPO-equal budget"
        assert set(plan.counts.tolist()) <= {0} | set(range(3, 17)), plan.counts
        assert not plan.prefix_budget[plan.counts == 0].any(), "a filtered prompt gets no stage-2 budget"


def test_knapsack_filters_prompts_with_no_expected_contrast():
    p = np.array([0.5, 0.5, 0.999, 0.001])
    plan = plan_batch(p, ids(4), section(rollout_n=2, allocation={"m_min": 2, "m_max": 4}), np.random.default_rng(0))
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
        section(mehtod="trace")
    with pytest.raises(ValueError, match="rm_scores"):
        section(rm_scores="tokens")
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        section(rollout_n=1)
    with pytest.raises(ValueError, match="max_tokens_per_rollout"):
        section(max_tokens_per_rollout=5000).limits(4096)
    verl = OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False}})
    with pytest.raises(ValueError, match="adv_estimator=tracerl_tree"):
        check_verl_config(verl, section())
    check_verl_config(verl, section(rm_scores="reward"))
    verl.algorithm.adv_estimator, verl.algorithm.use_kl_in_reward = "tracerl_tree", True
    with pytest.raises(ValueError, match="use_kl_in_reward=false"):
        check_verl_config(verl, section())


def test_allocation_and_predictor_sections_are_tracerl_train_s_own():
    """The nested sections are parsed by tracerl's loader: the same fields, defaults, checks and messages as the
    `allocation` and `predictor` sections of `tracerl train`; only the step's size comes from verl."""
    values = {"m_min": 3, "m_max": 5, "root_share": 0.5, "continuation_cost": 0.25, "expand_rounds": 3, "k_max": 6,
              "stage2_width": 2, "branch_width": 3, "root_value": "knapsack_rl"}
    alloc = section(num_prompts=16, rollout_n=8, allocation=values).allocation
    train = from_dict(TrainConfig, {"allocation": {**values, "num_prompts": 16, "rollouts_per_prompt": 8,
                                                   "pool_factor": 1}}).allocation
    assert alloc == train, "verl's allocation is the one tracerl train builds from the same values"
    assert section().predictor == TrainConfig().predictor == PredictorConfig(), "the trainer's predictor defaults"
    assert section(predictor={"name": "constant", "options": {"p": 0.3}}).predictor.options == {"p": 0.3}
    for bad, where in (({"m_max": 1}, "m_max=1 < m_min=2"), ({"k_max": 1, "stage2_width": 2}, "k_max=1"),
                       ({"root_value": "best"}, "root_value")):
        with pytest.raises(ValueError, match=where) as verl_error:
            section(allocation=bad)
        with pytest.raises(ValueError) as train_error:
            from_dict(TrainConfig, {"allocation": bad}, where="")
        assert str(train_error.value).split("invalid allocation config: ")[1] in str(verl_error.value), \
            "the verl section reports tracerl train's own message"
    with pytest.raises(ValueError, match="oracle exists only in the simulator"):
        section(predictor={"name": "oracle"})
    with pytest.raises(ValueError, match="run.seed"):
        section(predictor={"options": {"seed": 3}})


@pytest.mark.parametrize("key, verl_key", [("num_prompts", "data.train_batch_size"),
                                           ("rollouts_per_prompt", "actor_rollout_ref.rollout.n"),
                                           ("pool_factor", "data.train_batch_size")])
def test_the_step_size_is_verl_s_and_setting_it_names_verl_s_key(key, verl_key):
    alloc = section(num_prompts=6, rollout_n=3).allocation
    assert (alloc.num_prompts, alloc.rollouts_per_prompt, alloc.pool_factor, alloc.budget) == (6, 3, 1, 18.0)
    with pytest.raises(ValueError, match=f"tracerl.allocation.{key} is set by verl's {verl_key}"):
        section(allocation={key: 2})


def test_flat_keys_and_what_verl_workers_cannot_do_raise_with_the_fix():
    with pytest.raises(ValueError, match="tracerl.allocation.m_min"):
        section(m_min=3)
    with pytest.raises(ValueError, match="tracerl.predictor.options"):
        section(predictor_options={"l2": 1.0})
    with pytest.raises(ValueError, match="budget_unit='tokens' is not offered on verl"):
        section(allocation={"budget_unit": "tokens"})
    with pytest.raises(ValueError, match="token_cap=100"):
        section(allocation={"token_cap": 100})
    with pytest.raises(ValueError, match="stage2_mode='global'"):
        section(allocation={"stage2_mode": "global"})


def test_budget_shape_knobs_reach_stage_one_and_two():
    """root_share and continuation_cost from the nested section change what stage 1 leaves for stage 2."""
    p = np.full(8, 0.5)
    plans = {share: plan_batch(p, ids(8), section(method="trace", allocation={"root_share": share,
                                                                             "continuation_cost": cost}),
                               np.random.default_rng(0))
             for share, cost in ((0.75, 0.5), (0.5, 0.25))}
    assert plans[0.75].counts.sum() <= 24 and plans[0.5].counts.sum() <= 16, "root_share of the 32-unit budget"
    assert plans[0.5].prefix_budget.sum() > plans[0.75].prefix_budget.sum()
    assert (plans[0.5].prefix_budget[plans[0.5].counts > 0] % 0.25 == 0).all(), "whole continuations at 0.25"


def test_spend_from_trees_charges_fresh_rollouts_one_and_continuations_their_cost():
    tree = star_tree([1.0, 0.0, 0.0])  # 3 fresh rollouts of 4 policy tokens each (one observation token between)
    mid = tree.children[0][0]
    for k in range(2):  # two continuations from the first rollout's middle node, 2 policy tokens each
        tree.add_child(mid, Segment([30 + k, 31], [-0.1, -0.1], [1, 1]), reward=float(k), origin="continuation",
                       anchor_id=mid)
    config = section(allocation={"continuation_cost": 0.25})
    ledger = spent_ledger([tree], make_prices(config.allocation))
    assert ledger.split() == {"units_root": 3.0, "tokens_root": 12, "units_prefix": 0.5, "tokens_prefix": 4}
    metrics = step_metrics([tree], config)
    assert metrics["alloc/units_prefix"] == 0.5 and metrics["rollout/units"] == 3.5
    assert metrics["alloc/effective_ratio"] == 1.0 and metrics["rollout/num_rollouts"] == 5
    assert metrics["alloc/informative_rollout_frac"] > 0


def test_round_samplers_are_refused_with_the_reason_and_knapsack_rl_runs():
    """The manager plans a step once before verl samples it: a sampler that decides in rounds cannot run there."""
    for name in ("dapo", "reinforce_ada", "speed", "pilot_commit", "posterior", "posterior-tree"):
        with pytest.raises(ValueError, match="filter_groups"):
            TraceVerlConfig(AllocationConfig(), method=name)
    for name in ("knapsack_rl", "trace-failed"):
        assert TraceVerlConfig(AllocationConfig(), method=name).method == name
