"""Posterior screening (`samplers.PosteriorScreening`, ours): its Beta arithmetic against sampling, the order and
size of its blocks, its budget, and that a better prior makes it keep more of what it samples."""

import numpy as np
import pytest

from tracerl.core.methods import get_method
from tracerl.core.samplers import ROUND_SAMPLERS, Seen, beta_moment, posterior_ratio
from test_samplers import config, draw_rewards, drive  # the scripted drive of tests/unit/test_samplers.py


def test_beta_moments_are_the_sampled_ones():
    rng = np.random.default_rng(1)
    for a, b, k in [(2.0, 2.0, 4), (0.4, 3.6, 3), (7.5, 1.5, 1), (1.0, 1.0, 0), (1.2, 6.8, 2)]:
        sampled = np.mean(rng.beta(a, b, size=2_000_000) ** k)
        assert beta_moment(np.array([a]), np.array([b]), k)[0] == pytest.approx(sampled, rel=0.02), (a, b, k)


def test_the_chance_a_probe_turns_a_group_mixed_is_what_sampling_says():
    rng = np.random.default_rng(0)
    cases = [(0, 0, 4), (4, 0, 4), (3, 3, 2), (0, 0, 2)]  # (rollouts, successes, probe)
    a, b = np.full(4, 1.2), np.full(4, 2.8)  # kappa 4 around p = 0.3
    block, ratio, after = posterior_ratio(a, b, np.array([c[0] for c in cases]), np.array([c[1] for c in cases]),
                                          n=8, probe=4, cost=np.ones(4))
    for i, (m, s, _) in enumerate(cases):
        theta = rng.beta(a[i] + s, b[i] + m - s, size=200_000)
        draws = rng.random((200_000, block[i])) < theta[:, None]
        wins = draws.sum(axis=1)
        mixed = (wins > 0) & (wins < block[i]) if m == 0 else ((wins > 0) if s == 0 else (wins < block[i]))
        q = mixed.mean()
        assert ratio[i] == pytest.approx(q * 8 / (block[i] + q * (8 - m - block[i])), abs=0.01), cases[i]
        assert after[i] == pytest.approx(q * (8 - m - block[i]), abs=0.05)


def test_a_mixed_group_is_filled_to_n_and_a_full_one_asks_for_nothing():
    block, ratio, after = posterior_ratio(np.full(3, 2.0), np.full(3, 2.0), np.array([4, 8, 3]), np.array([2, 4, 3]),
                                          n=8, probe=4, cost=np.array([2.0, 1.0, 1.0]))
    assert block.tolist() == [4, 0, 4] and ratio[0] == pytest.approx(0.5) and ratio[1] == 0 and after[0] == 0
    _, cheap, _ = posterior_ratio(np.full(2, 2.0), np.full(2, 2.0), np.zeros(2, int), np.zeros(2, int), 8, 4,
                                  np.array([1.0, 2.0]))
    assert cheap[1] == pytest.approx(cheap[0] / 2), "a prompt twice as dear is worth half as much per cost"


@pytest.mark.parametrize("seed", range(20))
def test_it_keeps_mixed_groups_and_never_plans_a_probe_it_cannot_commit(seed):
    rng = np.random.default_rng(seed)
    cfg = config(num_prompts=6, rollouts_per_prompt=8, round_rollouts=4, max_rounds=10)
    R = draw_rewards(rng, cfg.pool_size, 16)
    kept, groups, trees, _ = drive("posterior", cfg, R, rng.permutation(cfg.pool_size), budget=float(cfg.budget))
    assert all(0 < sum(R[u][j] > 0.5 for j in js) < len(js) for u, js in kept.items())
    assert sum(len(t.leaves()) for t in trees.values()) <= cfg.budget
    assert all(len(t.leaves()) <= 8 for t in trees.values()), "no group passes n"


def test_a_truer_prior_keeps_more_of_what_it_samples():
    """The same pools and rewards, with the prompts' true p as the predictor or a flat 0.5: the true prior pilots
    the prompts that turn mixed, so a larger share of the sampled rollouts is kept (40 pools)."""
    shares = {"true": [], "flat": []}
    for seed in range(40):
        rng = np.random.default_rng(seed)
        size = 64
        p = rng.choice([0.0, 0.05, 0.3, 0.5, 0.7, 0.95, 1.0], size=size)
        R = (rng.random((size, 16)) < p[:, None]).astype(float)
        order = rng.permutation(size)
        cfg = config(num_prompts=6, rollouts_per_prompt=8, round_rollouts=4, max_rounds=10)
        for name, prior in (("true", p), ("flat", np.full(size, 0.5))):
            sampler = ROUND_SAMPLERS["posterior"](cfg)
            seen = Seen(p=prior, cost=np.ones(size), order=order, budget=float(cfg.budget))
            used = np.zeros(size, dtype=int)
            for r in range(cfg.max_rounds):
                grants = sampler.grants(seen, rng)
                if not grants.any():
                    break
                seen.budget_left -= float(grants.sum())
                used += grants
                seen.rollouts = used.copy()
                seen.successes = np.array([int(R[u, : used[u]].sum()) for u in range(size)])
            kept = [u for u in range(size) if 0 < seen.successes[u] < seen.rollouts[u]]
            shares[name].append(sum(used[kept]) / max(1, used.sum()))
    assert np.mean(shares["true"]) > np.mean(shares["flat"]) + 0.2, shares  # 0.99 against 0.51 when written


def test_it_is_a_method_of_the_one_step():
    method = get_method("posterior")
    assert method.in_rounds and method.predictor == "learned" and method.prefix_policy is None
