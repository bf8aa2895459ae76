"""The shared step: the ledger's per-kind split is what was sampled, the pool cycles and resumes, budgets in
tokens are spent within their cap and change nothing when unused."""

from dataclasses import replace

import numpy as np
import pytest

from tracerl.core.ledger import TokenEstimate, TokenPrices, make_ledger, make_prices
from tracerl.core.methods import METHODS, AllocationConfig, get_method
from tracerl.core.metrics import ratios
from tracerl.core.predictor import OraclePredictor
from tracerl.core.simulator import SimConfig, Simulator
from tracerl.core.step import PromptPool, Sampler, run_step

CONFIG = AllocationConfig(num_prompts=8, rollouts_per_prompt=4, pool_factor=4, m_max=8)
ORACLE = OraclePredictor(lambda hs: np.array([h.meta["true_p"] for h in hs]))


def step(name, config=CONFIG, seed=0, prices=None):
    sim = Simulator(SimConfig(num_prompts=256), seed=seed)
    pool = sim.set_pool(np.arange(config.pool_size))
    return run_step(get_method(name), config, pool, sim, np.random.default_rng(seed), predictor=ORACLE,
                    prices=prices)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_logged_split_is_what_was_granted(name):
    result = step(name)
    m, trees = result.metrics, result.growth.trees  # every sampled tree (a round sampler trains on some of them)
    roots = sum(t.root.num_granted for t in trees)
    continuations = sum(n.num_granted for t in trees for n in t.nodes[1:])
    assert m["alloc/units_root"] == roots
    assert m["alloc/num_continuations"] == continuations
    assert m["alloc/units_prefix"] == pytest.approx(continuations * CONFIG.continuation_cost)
    assert m["alloc/units_root"] + m["alloc/units_prefix"] == pytest.approx(m["rollout/units"])
    assert m["alloc/tokens_root"] + m.get("alloc/tokens_prefix", 0) == m["rollout/tokens"]
    assert m["rollout/units"] <= CONFIG.budget + 1e-9
    for key in ratios(result.counts):  # every measure is logged, whatever the measures module adds
        assert f"alloc/{key}" in m
    assert m["alloc/stage1_value"] >= 0.0


def test_stage1_value_is_the_objective_of_the_grants():
    from tracerl.core.allocation import root_value

    result = step("trace")
    g = result.growth
    assert result.metrics["alloc/stage1_value"] == pytest.approx(float(np.sum(root_value(g.p_pool, g.root_counts))))
    assert result.metrics["alloc/stage1_value"] > 0


def test_pool_cycles_every_prompt_then_reshuffles_and_resumes():
    pool = PromptPool(10, 4, np.random.default_rng(0))
    first = [pool.next() for _ in range(2)]
    assert len(set(np.concatenate(first).tolist())) == 8, "one pass never repeats a prompt"
    state = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in pool.state_dict().items()}
    third = pool.next()  # 8 + 4 > 10: a new order
    again = PromptPool(10, 4, np.random.default_rng(99))
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.next(), third)
    assert PromptPool(3, 8, np.random.default_rng(0)).next().size == 3, "a pool never exceeds the data"


@pytest.mark.parametrize("name", ["grpo", "pcl", "treepo", "trace", "trace-uniform-prefix", "trace-uniform"])
def test_token_budget_is_spent_within_budget(name):
    config = replace(CONFIG, budget_unit="tokens", token_budget=20_000, default_rollout_tokens=300)
    prices = make_prices(config)
    assert isinstance(prices, TokenPrices)
    for s in range(3):  # the estimate learns from each step
        result = step(name, config, seed=s, prices=prices)
        m = result.metrics
        assert m["alloc/cost_root"] + m.get("alloc/cost_prefix", 0.0) <= 20_000 + 1e-6
        assert m["alloc/cost_root"] > 0 and m["rollout/units"] > 0
    assert prices.tokens.total[1] > 0 and prices.tokens.per_prompt


def test_token_cap_stops_stage2():
    capped = step("trace", replace(CONFIG, token_cap=1))  # the bare rollouts alone pass the cap
    assert capped.metrics["alloc/num_continuations"] == 0
    assert step("trace").metrics["alloc/num_continuations"] > 0


def test_token_estimate_falls_back_to_the_run_mean_then_the_default():
    from tracerl.core.tree import Segment, Tree

    def two_turns(pid, first, second):
        tree = Tree.new(pid, "q")
        turn = tree.add_child(0, Segment.text_only("x", "o", first, 0))
        tree.add_child(turn, Segment.text_only("y", "", second, 0), reward=1.0)
        return tree, turn

    est = TokenEstimate(100)
    a, turn = two_turns("a", 15, 20)
    assert est.rollout(["a"]).tolist() == [100.0]
    assert est.continuation(a, [turn]).tolist() == [100.0], "nothing seen: a fresh rollout's expected length"
    est.observe([a])
    assert est.rollout(["a", "b"]).tolist() == [35.0, 35.0]
    b, _ = two_turns("b", 5, 40)
    est.observe([b])
    assert est.rollout(["a", "b", "c"]).tolist() == [35.0, 45.0, 40.0]
    # after a depth-1 node rollouts took (20 + 40) / 2 = 30 more tokens; prompt a runs 35 / 40 of the mean
    assert est.continuation(a, [turn]).tolist() == [pytest.approx(30 * 35 / 40)]
    cont = a.add_child(turn, Segment.text_only("z", "", 500, 0), reward=0.0, origin="continuation", anchor_id=turn)
    est.observe([a])  # learns from the fresh rollout again, never from the continuation
    assert cont and est.rollout(["a"]).tolist() == [35.0]
    again = TokenEstimate(1)
    again.load_state_dict(est.state_dict())
    assert again.continuation(a, [turn]).tolist() == est.continuation(a, [turn]).tolist()


def test_ledger_from_config():
    ledger = make_ledger(replace(CONFIG, budget_unit="tokens", token_budget=500, token_cap=900))
    assert (ledger.budget, ledger.token_cap, ledger.unit) == (500.0, 900, "tokens")
    assert make_ledger(CONFIG).budget == CONFIG.budget
    assert make_ledger(replace(CONFIG, budget_unit="tokens", default_rollout_tokens=10)).budget == CONFIG.budget * 10


def test_sampler_resumes_what_an_uninterrupted_sampler_samples():
    """Two samplers with one seed: one steps 4 times; the other steps twice, is saved through its state_dict into a
    third, which steps twice more. Pools, grants, trees and predictor state agree, in units and in tokens."""
    import json

    from tracerl.core.predictor import make_predictor
    from tracerl.io.files.state import load_state, save_state

    for config in (CONFIG, replace(CONFIG, budget_unit="tokens", token_budget=9_000)):
        def sampler():
            return Sampler(get_method("trace"), config, 256, seed=5, predictor=make_predictor("hashed_logistic",
                                                                                               seed=5))

        def run(s, steps, sim):
            out = []
            for _ in range(steps):
                result = s.step(sim)
                out.append(([h.prompt_id for h in result.pool], result.growth.root_counts.tolist(),
                            [t.to_json() for t in result.trees], result.metrics["rollout/tokens"]))
            return out

        whole = run(sampler(), 4, Simulator(SimConfig(num_prompts=256), seed=1))
        sim = Simulator(SimConfig(num_prompts=256), seed=1)
        first = sampler()
        head = run(first, 2, sim)
        saved = json.loads(json.dumps(first.state_dict(), default=lambda a: a.tolist()))
        resumed = sampler()
        resumed.load_state_dict(saved)
        assert head + run(resumed, 2, sim) == whole, f"budget_unit={config.budget_unit}"


def test_skipping_pools_moves_only_the_pools_cursor():
    """`skip_pools(n)` leaves the next step on the pool n steps would have reached, with the allocation RNG, the
    prices and the predictor as they were: the draws of `tracerl bench alignment` differ by their pool alone."""
    def sampler():
        return Sampler(get_method("grpo"), CONFIG, 256, seed=3)

    stepped, skipped = sampler(), sampler()
    rng_before = skipped.rng.bit_generator.state
    for _ in range(3):
        stepped.pool.next()
    skipped.skip_pools(3)
    np.testing.assert_array_equal(skipped.pool.next(), stepped.pool.next())
    assert skipped.rng.bit_generator.state == rng_before, "skipping a pool drew from the allocation RNG"
    assert skipped.prices.state_dict() == sampler().prices.state_dict()


def test_bench_alloc_takes_set_and_runs_in_tokens(capsys):
    import json

    from tracerl.cli import main

    args = ["bench", "alloc", "--methods", "grpo,trace", "--steps", "3", "--warmup", "1", "--json",
            "--set", "allocation.budget_unit=tokens", "--set", "stage1_num_prompts=1000", "--set", "stage1_budget=100"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["allocation"]["budget_unit"] == "tokens"
    assert set(result["methods"]) == {"grpo", "trace"}
    assert main(["bench", "alloc", "--set", "allocation.m_min=1"]) == 2
    assert "allocation.m_min=1 must be >= 2" in capsys.readouterr().err
