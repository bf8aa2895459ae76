"""The stage-2 report on hand-built trees: every count and ratio checked against numbers worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from tracerl.cli import main
from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.ledger import BudgetLedger
from tracerl.core.metrics import raw_advantages, step_counts
from tracerl.core.tree import Segment, Tree
from tracerl.io.files.runlog import write_trees
from tracerl.core.tally import Tally, creator_leaves, p_bin, rollouts, summarize_run
from tracerl.report.stage2 import across_seeds, read_run, report, seed_mean, write_report


def seg(policy_tokens: int) -> Segment:
    return Segment.text_only("act", "obs", num_policy_tokens=policy_tokens, num_observation_tokens=2)


def mixed_tree() -> Tree:
    """Two failed fresh rollouts (7 and 5 sampled tokens), then two continuations from node 1 (depth 1, p 0.3):
    one success (2 tokens), one failure (6 tokens). Mixed, so every rollout is informative under trace."""
    tree = Tree.new("mixed", "question")
    tree.add_child(0, seg(3))  # 1
    tree.add_child(1, seg(4), reward=0.0)  # 2
    tree.add_child(0, seg(5), reward=0.0)  # 3
    tree.add_child(1, seg(2), reward=1.0, origin="continuation", anchor_id=1)  # 4
    tree.add_child(1, seg(6), reward=0.0, origin="continuation", anchor_id=1)  # 5
    tree.root.num_granted, tree.root.p_pred = 2, 0.5
    tree.nodes[1].num_granted, tree.nodes[1].p_pred = 2, 0.3
    return tree


def all_fail_tree() -> Tree:
    """Two failed fresh rollouts (6 and 3 tokens), two failed continuations from node 2 (depth 2, p 0.9) of 4 and
    1 tokens, the first of two turns: no contrast anywhere, so nothing is informative."""
    tree = Tree.new("fail", "question")
    tree.add_child(0, seg(2))  # 1
    tree.add_child(1, seg(2))  # 2
    tree.add_child(2, seg(2), reward=0.0)  # 3
    tree.add_child(0, seg(3), reward=0.0)  # 4
    tree.add_child(2, seg(3), origin="continuation", anchor_id=2)  # 5
    tree.add_child(5, seg(1), reward=0.0, origin="continuation")  # 6
    tree.add_child(2, seg(1), reward=0.0, origin="continuation", anchor_id=2)  # 7
    tree.root.num_granted = 2
    tree.nodes[2].num_granted, tree.nodes[2].p_pred = 2, 0.9
    return tree


def counts(t: Tally) -> tuple:
    return (t.num_rollouts, t.num_informative, t.units, t.informative_units, t.sampled_tokens,
            t.informative_sampled_tokens)


@pytest.mark.parametrize("estimator", ["trace", "grpo", "treepo"])
def test_counts_by_origin_depth_and_p_match_hand_counts(estimator):
    items = rollouts([mixed_tree(), all_fail_tree()], estimator, AdvantageConfig(), prices=BudgetLedger(1.0))
    summary = summarize_run(items)
    assert set(summary["origin"]) == {"fresh", "continuation"}
    # fresh: 4 rollouts at 1 unit; the mixed tree's two (7 + 5 tokens) informative, the all-fail tree's (6 + 3) not
    assert counts(summary["origin"]["fresh"]) == (4, 2, 4.0, 2.0, 21, 12)
    # continuations at 0.5 units: the mixed tree's (2 + 6 tokens) informative, the all-fail tree's (4 + 1) not
    assert counts(summary["origin"]["continuation"]) == (4, 2, 2.0, 1.0, 13, 8)
    # flips: of the mixed tree's two, the success (anchor's rollout failed, p 0.3); the all-fail tree's none (p 0.9)
    assert summary["origin"]["continuation"].ratios() == {"informative_units_per_unit": 0.5,
                                                          "informative_sampled_tokens_per_token": 8 / 13,
                                                          "flip_rate": 0.25, "predicted_flip_rate": 0.6}
    assert summary["origin"]["fresh"].ratios()["informative_sampled_tokens_per_token"] == 12 / 21
    assert math.isnan(summary["origin"]["fresh"].ratios()["flip_rate"])  # a fresh rollout has no anchor outcome
    assert {k: counts(t) for k, t in summary["depth"].items()} == {1: (2, 2, 1.0, 1.0, 8, 8), 2: (2, 0, 1.0, 0.0, 5, 0)}
    assert {k: counts(t) for k, t in summary["p"].items()} == {"[0.2, 0.4)": (2, 2, 1.0, 1.0, 8, 8),
                                                               "[0.8, 1.0]": (2, 0, 1.0, 0.0, 5, 0)}
    assert {k: (t.ratios()["flip_rate"], t.ratios()["predicted_flip_rate"]) for k, t in summary["depth"].items()} == {
        1: (0.5, pytest.approx(0.3)), 2: (0.0, pytest.approx(0.9))}
    assert set(summary["outcome"]) == {"failed"} and summary["outcome"]["failed"].num_judged == 4


def two_round_tree() -> Tree:
    """A fresh success through node 1 (p 0.8 there); a round-1 continuation from node 1 fails, through node 3
    (p 0.4 there); a round-2 continuation from node 3 fails too. Node 1's rollout succeeded, node 3's failed."""
    tree = Tree.new("rounds", "question")
    tree.add_child(0, seg(2))  # 1
    tree.add_child(1, seg(2), reward=1.0)  # 2: the fresh rollout, success
    tree.add_child(1, seg(2), origin="continuation", anchor_id=1)  # 3
    tree.add_child(3, seg(2), reward=0.0, origin="continuation")  # 4: round 1, failure
    tree.add_child(3, seg(2), reward=0.0, origin="continuation", anchor_id=3)  # 5: round 2, failure
    tree.nodes[1].p_pred, tree.nodes[3].p_pred = 0.8, 0.4
    return tree


def test_a_continuation_is_judged_against_the_rollout_that_created_its_anchor():
    tree = two_round_tree()
    assert creator_leaves(tree) == {1: 2, 2: 2, 3: 4, 4: 4, 5: 5}
    items = rollouts([tree], "trace", AdvantageConfig(), prices=BudgetLedger(1.0))
    judged = sorted((r.anchor_depth, r.anchor_outcome, r.flipped, round(r.p_flip, 9)) for r in items if r.continuation)
    # from node 1 (its rollout succeeded): the failure flipped it, predicted 1 - 0.8; from node 3 (created by the
    # failed round-1 continuation): the failure did not, predicted 0.4
    assert judged == [(1, 1, True, 0.2), (2, 0, False, 0.4)]
    summary = summarize_run(items)
    assert {k: t.num_flipped for k, t in summary["outcome"].items()} == {"succeeded": 1, "failed": 0}


def test_totals_agree_with_the_step_metrics():
    """Summed over every rollout, the report's informative units and tokens are the step metrics' own."""
    trees = [mixed_tree(), all_fail_tree()]
    config = AdvantageConfig()
    for estimator in ("trace", "treepo"):
        advantages = compute_advantages(estimator, trees, config)
        prices = BudgetLedger(6.0, continuation_cost=0.25)
        step = step_counts(trees, advantages, 6.0, 34, prices=prices,
                           raw_advantages=raw_advantages(estimator, trees, advantages, config))
        items = rollouts(trees, estimator, config, prices=prices)
        assert rollouts(trees, estimator, config, prices=prices, advantages=advantages) == items  # the trainer's call
        assert sum(r.informative for r in items) == step["num_informative_rollouts"]
        assert sum(r.units for r in items if r.informative) == step["informative_units"]
        assert sum(r.sampled_tokens for r in items if r.informative) == step["num_informative_sampled_tokens"]
        assert sum(r.sampled_tokens for r in items) == 34  # every policy token sampled once, with its own rollout


def test_p_bins():
    assert [p_bin(p) for p in (0.0, 0.19, 0.2, 0.5, 0.8, 1.0, None)] == [
        "[0.0, 0.2)", "[0.0, 0.2)", "[0.2, 0.4)", "[0.4, 0.6)", "[0.8, 1.0]", "[0.8, 1.0]", "none"]


def test_seed_mean_is_the_t_interval_over_seeds_and_skips_undefined_seeds():
    e = seed_mean([0.2, 0.4, float("nan")])
    assert e.per_seed == (0.2, 0.4)
    assert e.mean == pytest.approx(0.3)
    # sd 0.1414, se 0.1, t(1 dof) 12.706
    assert (e.lo, e.hi) == (pytest.approx(0.3 - 1.2706), pytest.approx(0.3 + 1.2706))
    one = seed_mean([0.25])
    assert one.mean == 0.25 and math.isnan(one.lo) and math.isnan(one.hi)


def test_across_seeds_pairs_continuation_and_fresh_per_seed():
    trees = [mixed_tree(), all_fail_tree()]
    seed_a = summarize_run(rollouts(trees, "trace", AdvantageConfig(), BudgetLedger(1.0)))
    seed_b = summarize_run(rollouts(trees[:1], "trace", AdvantageConfig(), BudgetLedger(1.0)))  # the mixed tree only
    pooled = across_seeds([seed_a, seed_b])
    fresh = pooled["tables"]["origin"]["fresh"]
    assert fresh["num_seeds"] == 2
    assert counts(fresh["counts"]) == (6, 4, 6.0, 4.0, 33, 24)  # seed a's (4, 2, ...) plus seed b's (2, 2, ...)
    assert fresh["informative_units_per_unit"].per_seed == (0.5, 1.0)
    assert pooled["tables"]["depth"][2]["num_seeds"] == 1  # only seed a has a depth-2 anchor
    tokens = pooled["paired"]["informative_sampled_tokens_per_token"]
    assert tokens.per_seed == pytest.approx((8 / 13 - 12 / 21, 1.0 - 1.0))
    assert tokens.mean == pytest.approx((8 / 13 - 12 / 21) / 2)
    assert tokens.lo < tokens.mean < tokens.hi


def write_run(path, continuation_cost, steps):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "trace", "allocation": {
        "continuation_cost": continuation_cost}, "advantages": {"min_leaves": 2}}))
    for step in steps:
        write_trees(path, step, {"step": step, "method": "trace", "pool": [],
                                 "trees": [mixed_tree().to_dict(), all_fail_tree().to_dict()]})


def test_a_run_directory_is_read_with_its_own_price_and_every_step(tmp_path):
    write_run(tmp_path / "trace-seed0", 0.25, steps=(1, 2))
    run = read_run(tmp_path / "trace-seed0")
    assert run["num_steps"] == 2 and run["continuation_cost"] == 0.25
    summary = summarize_run(run["rollouts"])
    assert counts(summary["origin"]["continuation"]) == (8, 4, 2.0, 1.0, 26, 16)  # two steps, 0.25 units each
    assert counts(summary["origin"]["fresh"]) == (8, 4, 8.0, 4.0, 42, 24)


def test_runs_of_one_name_from_several_builds_are_named_by_their_folder(tmp_path):
    """One seed of many builds (build5/trace-seed0, build6/trace-seed0): each row says which build it is."""
    for build in ("build5", "build6"):
        write_run(tmp_path / build / "trace-seed0", 0.5, steps=(1,))
    found = report([tmp_path / "build5" / "trace-seed0", tmp_path / "build6" / "trace-seed0"])
    assert [run["name"] for run in found["runs"]] == ["build5/trace-seed0", "build6/trace-seed0"]
    assert [run["name"] for run in report([tmp_path / "build5" / "trace-seed0"])["runs"]] == ["trace-seed0"]


def test_cli_writes_the_markdown(tmp_path, capsys):
    write_run(tmp_path / "a", 0.5, steps=(1,))
    write_run(tmp_path / "b", 0.5, steps=(1, 2))
    out = tmp_path / "stage2.md"
    assert main(["bench", "stage2", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out == write_report([tmp_path / "a", tmp_path / "b"])
    assert ("| continuation | 2 | 0.500 [0.500, 0.500] | 0.615 [0.615, 0.615] | 0.250 [0.250, 0.250] | "
            "0.600 [0.600, 0.600] | 12 | 6 | 6 | 3 | 39 | 24 | 3 |") in text
    assert "| [0.8, 1.0] | 2 | 0.000 [0.000, 0.000] |" in text


def test_a_run_without_trees_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"method": "trace"}))
    with pytest.raises(ValueError, match="save_trees"):
        read_run(tmp_path)


def uniform_tree(name: str, rewards: list[float]) -> Tree:
    """A prompt's group of fresh rollouts only (a uniform method's tree), one 2-token turn each."""
    tree = Tree.new(name, "question")
    for r in rewards:
        tree.add_child(0, seg(2), reward=r)
    tree.root.num_granted = len(rewards)
    return tree


def test_fresh_rollouts_are_tallied_by_the_grant_of_their_prompt():
    """A grant is the fresh rollouts in a prompt's tree, however many continuations it also holds."""
    trees = [mixed_tree(), all_fail_tree(), uniform_tree("three", [1.0, 0.0, 0.0]),
             uniform_tree("three-fail", [0.0, 0.0, 0.0])]
    summary = summarize_run(rollouts(trees, "trace", AdvantageConfig(), prices=BudgetLedger(1.0)))
    # grant 2: the mixed tree's two fresh rollouts (informative, 7 + 5 tokens) and the all-fail tree's (6 + 3, not)
    # grant 3: the mixed group's three (2 tokens each, informative), the all-fail group's three (not)
    assert {k: counts(t) for k, t in summary["grant"].items()} == {2: (4, 2, 4.0, 2.0, 21, 12),
                                                                   3: (6, 3, 6.0, 3.0, 12, 6)}
    assert sum(t.num_rollouts for t in summary["grant"].values()) == summary["origin"]["fresh"].num_rollouts


def test_a_uniform_methods_run_is_read_with_its_fresh_rollouts_only(tmp_path):
    run_dir = tmp_path / "pcl-seed0"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"method": "pcl"}))
    write_trees(run_dir, 1, {"step": 1, "method": "pcl", "pool": [], "trees": [
        uniform_tree("a", [1.0, 0.0, 1.0, 1.0]).to_dict(), uniform_tree("b", [0.0] * 4).to_dict()]})
    text = write_report([run_dir])
    assert "| fresh | 1 | 0.500 | 0.500 | n/a | n/a | 8 | 4 | 8 | 4 | 16 | 8 | 0 |" in text
    assert "| 4 | 1 | 0.500 | 0.500 | n/a | n/a | 8 | 4 | 8 | 4 | 16 | 8 | 0 |" in text  # the grant table
    assert "| informative_sampled_tokens_per_token | 0 | n/a | n/a | n/a |" in text  # nothing to pair


def test_a_run_whose_trees_are_not_kept_is_read_from_its_rollout_records(tmp_path):
    """The trainer writes every step's rollouts in columns; with only step 1's trees kept (an archive), the report
    reads those records and gives what the trees gave, table for table."""
    from tracerl.core.ledger import make_prices
    from tracerl.core.methods import AllocationConfig
    from tracerl.core.tally import from_columns, to_columns
    from tracerl.io.files.runlog import write_rollouts

    full, kept = tmp_path / "full", tmp_path / "kept"
    for run in (full, kept):
        write_run(run, 0.25, steps=(1, 2, 3))
        prices = make_prices(AllocationConfig(continuation_cost=0.25)).ledger()
        items = rollouts([two_round_tree(), mixed_tree(), all_fail_tree()], "trace", AdvantageConfig(min_leaves=2),
                         prices)
        assert from_columns(json.loads(json.dumps(to_columns(items)))) == items  # exact through JSON
        for step in (1, 2, 3):
            write_rollouts(run, step, to_columns(rollouts([mixed_tree(), all_fail_tree()], "trace",
                                                          AdvantageConfig(min_leaves=2), prices)))
    for step in (2, 3):
        (kept / "trees" / f"step-{step:06d}.json.gz").unlink()
    a, b = read_run(full), read_run(kept)
    assert a["num_steps"] == b["num_steps"] == 3 and a["rollouts"] == b["rollouts"]
    assert write_report([full]).replace("full", "kept") == write_report([kept])
    with pytest.raises(ValueError, match="not written by to_columns"):
        from_columns({"continuation": []})
