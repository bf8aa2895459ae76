"""The adaptive samplers held to independent re-implementations of their authors' code, on random inputs.

Each `reference_*` below is written from the reference's own loop (the file and lines are named), in its style and
with its data structures, not from tracerl's: DAPO from verl's `filter_groups` (verl-recipe dapo/dapo_ray_trainer.py,
`fit`), Reinforce-Ada from RLHFlow/Reinforce-Ada (verl/trainer/ppo/ray_trainer.py,
`_generate_multi_round_adaptive_downsampling`, and core_algos.py's global-statistics GRPO), SPEED from
Zanette-Labs/speed-rl (verl/trainer/ppo/data_controller.py), Pilot-Commit from databricks/pilot-commit
(recipe/pc/pc_ray_trainer.py `fit`, recipe/pc/replay_buffer.py `sample`) and KnapsackRL from liziniu/KnapsackRL
(verl/trainer/ppo/exploration_utils.py `sampling_budget_by_knapsack`, `solve_by_dp`). A prompt's rewards are drawn
up front (`R[u][j]`, its j-th sample's reward), so the reference and tracerl's sampler see the same outcomes; the
budget is made large enough that only the references' own stop rules bind (the budget's own rule is tested apart).
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.growth import grow_trees
from tracerl.core.ledger import make_prices
from tracerl.core.methods import METHODS, ROOT_POLICIES, AllocationConfig, get_method
from tracerl.core.samplers import (ROUND_SAMPLERS, Seen, knapsack_rl_counts, knapsack_rl_extra, knapsack_rl_value,
                                   take_in_order)
from tracerl.core.step import run_step
from tracerl.core.tree import Segment, Tree

SEEDS = range(40)


class Scripted:
    """A RolloutRunner whose j-th rollout of pool prompt u has reward R[u][j] (one turn, 5 tokens); node meta "j"."""

    def __init__(self, rewards):
        self.rewards, self.used = rewards, defaultdict(int)

    def _add(self, tree, u, k):
        for _ in range(k):
            j = self.used[u]
            self.used[u] += 1
            tree.add_child(0, Segment.text_only("a", "", 5, 0), reward=float(self.rewards[u][j]), origin="continuation",
                           anchor_id=0, meta={"j": j})
        return 5 * k

    def run_roots(self, prompt_indices, counts):
        trees, tokens = [], 0
        for u, m in zip(prompt_indices, counts):
            tree = Tree.new(str(u), f"prompt {u}", meta={"pool_index": int(u)})
            tokens += self._add(tree, int(u), int(m))
            trees.append(tree)
        return trees, tokens

    def run_continuations(self, requests):
        return sum(self._add(tree, tree.meta["pool_index"], int(k)) for tree, node_id, k in requests)


def config(**kw):
    base = dict(num_prompts=8, rollouts_per_prompt=4, pool_factor=8, max_rounds=50)
    base.update(kw)
    return AllocationConfig(**base)


def drive(name, cfg, rewards, order, budget=1e9, rng=None):
    """Run a round sampler the way growth does, on pre-drawn rewards: returns (kept {u: [j...]}, the kept trees, every
    sampled tree, the sampler)."""
    size = len(rewards)
    sampler = ROUND_SAMPLERS[name](cfg)
    seen = Seen(p=np.full(size, 0.5), cost=np.ones(size), order=np.asarray(order), budget=budget)
    runner, trees = Scripted(rewards), {}
    rng = rng or np.random.default_rng(0)
    for r in range(cfg.max_rounds):
        seen.round_index = r
        grants = sampler.grants(seen, rng)
        if not grants.any():
            break
        assert float(np.sum(grants * seen.cost)) <= seen.budget_left + 1e-9, "a round overspends"
        seen.budget_left -= float(np.sum(grants * seen.cost))
        for u in np.flatnonzero(grants):
            u = int(u)
            if u not in trees:
                trees[u] = runner.run_roots([u], [int(grants[u])])[0][0]
            else:
                runner.run_continuations([(trees[u], 0, int(grants[u]))])
            rs = trees[u].rewards()
            seen.rollouts[u], seen.successes[u] = len(rs), int(np.sum(rs > 0.5))
    kept = sampler.keep(dict(trees), seen, rng)
    return {u: [t.nodes[leaf].meta["j"] for leaf in t.leaves()] for u, t in kept.items()}, kept, trees, sampler


def draw_rewards(rng, size, length):
    p = rng.choice([0.0, 0.0, 1.0, 1.0, 0.1, 0.3, 0.5, 0.7, 0.9], size=size)
    return (rng.random((size, length)) < p[:, None]).astype(float)


# ------------------------------------------------------------------------------------------------------------ DAPO
def reference_dapo(order, R, n, gen_batch_size, train_batch_size, max_num_gen_batches):
    """verl's filter_groups loop: (kept prompt ids, raised) where `raised` is the ValueError's stop."""
    batch, num_prompt_in_batch, num_gen_batches, cursor = [], 0, 0, 0
    while cursor < len(order):
        new_batch = list(order[cursor: cursor + gen_batch_size])
        cursor += gen_batch_size
        num_gen_batches += 1
        kept_prompt_uids = [uid for uid in new_batch if np.std(R[uid][:n]) > 0 or n == 1]
        num_prompt_in_batch += len(kept_prompt_uids)
        batch += kept_prompt_uids
        if num_prompt_in_batch < train_batch_size:
            if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches:
                continue
            return batch, True
        return batch[:train_batch_size], False
    return batch, True


@pytest.mark.parametrize("seed", SEEDS)
def test_dapo_keeps_what_verls_filter_keeps(seed):
    rng = np.random.default_rng(seed)
    size, n = 96, int(rng.integers(2, 6))
    gen, train, max_gen = int(rng.integers(1, 12)), int(rng.integers(1, 16)), int(rng.integers(1, 12))
    R = draw_rewards(rng, size, n)
    order = rng.permutation(size)
    expected, raised = reference_dapo(order, R, n, gen, train, max_gen)
    cfg = config(rollouts_per_prompt=n, round_prompts=gen, keep_prompts=train, max_rounds=max_gen)
    kept, _, trees, _ = drive("dapo", cfg, R, order)
    assert sorted(kept) == sorted(expected)  # verl raises where `raised`; a fixed-budget step trains on what it kept
    assert all(len(js) == n for js in kept.values())
    assert len(trees) % gen == 0 or len(trees) == size, "whole generation batches are sampled"


def test_dapo_without_a_target_spends_the_budget_and_drops_uniform_groups():
    rng = np.random.default_rng(1)
    R = draw_rewards(rng, 64, 4)
    kept, _, trees, _ = drive("dapo", config(round_prompts=5), R, rng.permutation(64), budget=4 * 23)
    assert len(trees) == 23  # 4 full batches and 3 prompts of the fifth: prompts in order while n rollouts fit
    assert sorted(kept) == sorted(u for u in trees if 0 < R[u].sum() < 4)


# ---------------------------------------------------------------------------------------------------- Reinforce-Ada
def reference_reinforce_ada(R, uid_arr, final_keep_per_prompt, round_repeat, max_rounds, choice, threshold=0.5):
    """Reinforce-Ada's multi-round sampler: {uid: (kept sample numbers, total_pos, total_neg)}."""
    state = {uid: {"finished": False} for uid in uid_arr}
    pos_cache, neg_cache, used = defaultdict(list), defaultdict(list), defaultdict(int)
    selected, full = {}, {uid: [0, 0] for uid in uid_arr}

    def downsample_cache(uid, target_total):
        target_pos = min(target_total // 2, len(pos_cache[uid]))
        target_neg = min(target_total - target_pos, len(neg_cache[uid]))
        if target_pos + target_neg < target_total:
            if len(pos_cache[uid]) > target_pos:
                target_pos += min(len(pos_cache[uid]) - target_pos, target_total - (target_pos + target_neg))
            elif len(neg_cache[uid]) > target_neg:
                target_neg += min(len(neg_cache[uid]) - target_neg, target_total - (target_pos + target_neg))
        return pos_cache[uid][:target_pos] + neg_cache[uid][:target_neg]

    active = set(uid_arr)
    target_pos = target_neg = None
    for _ in range(max_rounds):
        if not active:
            break
        for uid in list(active):
            for _ in range(round_repeat):
                j = used[uid]
                used[uid] += 1
                if R[uid][j] > threshold:
                    pos_cache[uid].append(j)
                    full[uid][0] += 1
                else:
                    neg_cache[uid].append(j)
                    full[uid][1] += 1
            if choice == "balanced":
                target_pos = final_keep_per_prompt // 2
                target_neg = final_keep_per_prompt - target_pos
                if len(pos_cache[uid]) >= target_pos and len(neg_cache[uid]) >= target_neg:
                    selected[uid] = downsample_cache(uid, final_keep_per_prompt)
                    state[uid]["finished"] = True
            elif len(pos_cache[uid]) >= 1:
                selected[uid] = downsample_cache(uid, final_keep_per_prompt)
                state[uid]["finished"] = True
        active = {u for u in active if not state[u]["finished"]}
    for uid in [u for u in uid_arr if not state[u]["finished"]]:
        pos_num, neg_num = len(pos_cache[uid]), len(neg_cache[uid])
        n_rows = pos_num + neg_num
        take = min(final_keep_per_prompt, n_rows)
        if choice == "positive_focused":
            ratio = (pos_num / n_rows) if n_rows > 0 else 0.0
            target_pos = max(min(math.ceil(ratio * final_keep_per_prompt), take - 1), 1)
            target_neg = take - target_pos
        actual_pos, actual_neg = min(pos_num, target_pos), min(neg_num, target_neg)
        if actual_pos + actual_neg < take:
            if pos_num > actual_pos:
                actual_pos += min(pos_num - actual_pos, take - actual_pos - actual_neg)
            elif neg_num > actual_neg:
                actual_neg += min(neg_num - actual_neg, take - actual_pos - actual_neg)
        selected[uid] = pos_cache[uid][:actual_pos] + neg_cache[uid][:actual_neg]
    return {uid: (selected[uid], *full[uid]) for uid in uid_arr}


def reference_global_grpo(rewards, total_pos, total_neg, norm_adv_by_std, epsilon=1e-6):
    """core_algos' GRPO with global statistics: mean and unbiased std of total_pos ones and total_neg zeros."""
    labels = np.r_[np.ones(total_pos), np.zeros(total_neg)]
    if labels.size <= 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = labels.mean(), max(float(np.std(labels, ddof=1)), 1e-6)
    rewards = np.asarray(rewards, dtype=float)
    return (rewards - mean) / (std + epsilon) if norm_adv_by_std else rewards - mean


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rule", ["balanced", "positive"])
def test_reinforce_ada_groups_and_advantages_match_the_reference(seed, rule):
    rng = np.random.default_rng(seed)
    size, n = 12, int(rng.choice([2, 4, 6]))
    per_round, rounds = int(rng.integers(n, n + 5)), int(rng.integers(1, 5))  # the reference's round_repeat >= n
    R = draw_rewards(rng, size, per_round * rounds)
    cfg = config(rollouts_per_prompt=n, round_rollouts=per_round, max_rounds=rounds, round_prompts=size, ada_exit=rule)
    kept, groups, _, _ = drive("reinforce_ada", cfg, R, np.arange(size))
    expected = reference_reinforce_ada(R, list(range(size)), n, per_round, rounds,
                                       "balanced" if rule == "balanced" else "positive_focused")
    assert sorted(kept) == list(range(size)), "every prompt is trained on"
    norm = bool(rng.integers(0, 2))
    advs = compute_advantages("reinforce_ada", [groups[u] for u in range(size)], AdvantageConfig(norm_by_std=norm))
    for u in range(size):
        js, total_pos, total_neg = expected[u]
        assert sorted(kept[u]) == sorted(js)
        assert groups[u].meta["sampled_outcomes"] == [total_pos, total_neg]
        by_j = dict(zip(kept[u], (advs[u].of(leaf)[0] for leaf in groups[u].leaves())))
        want = reference_global_grpo([R[u][j] for j in js], total_pos, total_neg, norm)
        np.testing.assert_allclose([by_j[j] for j in js], want, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------------------------ SPEED
def reference_speed(order, R, n, n_continue, gen_batch_size, train_batch_size, max_num_gen_batches):
    """SPEED's DataController for one training step from an empty state: the batch's prompts in order, or None when
    it raises."""
    Q2, P, ready, gen_calls, cursor, used = [], [], [], 0, 0, defaultdict(int)
    while len(ready) < train_batch_size and (cursor < len(order) or Q2):
        gen_calls += 1
        if gen_calls >= max_num_gen_batches:
            return None
        D = list(order[cursor: cursor + gen_batch_size])
        cursor += gen_batch_size
        continued, Q2 = Q2, []
        for uid in D:  # screening: n responses
            acc = [R[uid][used[uid] + j] for j in range(n)]
            used[uid] += n
            if np.std(acc) > 0:
                Q2.append(uid)
                P.append(uid)
        for uid in continued:  # continuation: n_continue responses, no filter
            used[uid] += n_continue
            ready.append(uid)
    return [uid for uid in P if uid in ready][:train_batch_size]


@pytest.mark.parametrize("seed", SEEDS)
def test_speed_trains_the_groups_speed_trains(seed):
    rng = np.random.default_rng(seed)
    size, n = 400, int(rng.integers(2, 6))
    cont, gen, train = int(rng.integers(1, 9)), int(rng.integers(1, 10)), int(rng.integers(1, 12))
    R = draw_rewards(rng, size, n + cont)
    order = rng.permutation(size)
    expected = reference_speed(order, R, n, cont, gen, train, max_num_gen_batches=10_000)
    cfg = config(round_rollouts=n, commit_rollouts=cont, round_prompts=gen, keep_prompts=train, max_rounds=10_000)
    kept, groups, _, _ = drive("speed", cfg, R, order)
    assert sorted(kept) == sorted(expected)
    assert all(kept[u] == list(range(n + cont)) for u in kept), "the group: screening and continuation samples"


# ----------------------------------------------------------------------------------------------------- Pilot-Commit
def reference_pilot_commit(order, R, n_explore, n_commit, gen_batch_size, train_bsz, lower, upper, choose):
    """Pilot-Commit's fit loop for one step from an empty buffer: {uid: number of samples in its group}."""
    buffer, batch, in_batch, cursor, used = {}, {}, 0, 0, defaultdict(int)
    while in_batch < train_bsz and cursor < len(order):
        E = list(order[cursor: cursor + gen_batch_size])
        cursor += gen_batch_size
        commit = []
        if buffer:
            c = min(train_bsz - in_batch, len(buffer))
            commit = list(buffer) if len(buffer) <= c else choose(list(buffer), c)
            for uid in commit:
                del buffer[uid]
        for uid in E:
            acc = [R[uid][used[uid] + j] for j in range(n_explore)]
            used[uid] += n_explore
            if lower <= np.mean(acc) <= upper:
                buffer[uid] = acc
        for uid in commit:
            used[uid] += n_commit
            batch[uid] = n_explore + n_commit
        in_batch += len(commit)
    return batch


@pytest.mark.parametrize("seed", SEEDS)
def test_pilot_commit_commits_what_pilot_commit_commits(seed):
    rng = np.random.default_rng(seed)
    size, n = 400, int(rng.choice([4, 8]))
    commit, gen, train = int(rng.integers(1, 9)), int(rng.integers(1, 10)), int(rng.integers(1, 12))
    low, high = sorted(rng.choice([0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0], size=2))
    R = draw_rewards(rng, size, n + commit)
    order = rng.permutation(size)
    choice_rng = np.random.default_rng(seed + 1000)  # the same draws as the sampler's: rng.choice without replacement
    expected = reference_pilot_commit(order, R, n, commit, gen, train, low, high,
                                      lambda q, c: [q[j] for j in choice_rng.choice(len(q), size=c, replace=False)])
    cfg = config(round_rollouts=n, commit_rollouts=commit, round_prompts=gen, keep_prompts=train, pilot_low=low,
                 pilot_high=high, max_rounds=10_000)
    kept, _, _, _ = drive("pilot_commit", cfg, R, order, rng=np.random.default_rng(seed + 1000))
    assert sorted(kept) == sorted(expected)
    assert all(len(kept[u]) == expected[u] for u in kept), "the group: pilot and commit samples"


def test_pilot_window_includes_both_ends_and_speed_needs_both_outcomes():
    pc = ROUND_SAMPLERS["pilot_commit"](config(round_rollouts=8))
    assert [pc.passes(s, 8) for s in range(9)] == [False, True, True, True, True, True, True, False, False]
    speed = ROUND_SAMPLERS["speed"](config())
    assert [speed.passes(s, 4) for s in range(5)] == [False, True, True, True, False]


@pytest.mark.parametrize("name", ["speed", "pilot_commit"])
def test_a_prompt_that_passes_screening_can_always_pay_its_commit(name):
    for seed in range(30):
        rng = np.random.default_rng(seed)
        R = draw_rewards(rng, 200, 4 + 12)
        budget = float(rng.integers(16, 400))
        _, _, trees, sampler = drive(name, config(round_prompts=int(rng.integers(1, 20))), R, rng.permutation(200),
                                     budget=budget)
        assert sum(len(t.leaves()) for t in trees.values()) <= budget
        assert not sampler.queue and not sampler.screened, "a prompt that passed screening was left without its commit"
        assert all(len(t.leaves()) == 16 for u, t in trees.items() if u in sampler.committed)


# ------------------------------------------------------------------------------------------------------- KnapsackRL
def reference_knapsack(success_rates, n, min_n, max_n, alpha=0.9):
    """sampling_budget_by_knapsack (valid prompts, cost_estimation="probability", allow_fallback, negative_n and
    positive_n = min_n) with solve_by_dp's plain loops; raises ZeroDivisionError where the reference does."""
    batch_size = len(success_rates)
    total_budget = batch_size * n
    sampling_budget = [0] * batch_size
    costs, effective = [0.0] * batch_size, []
    for i, sr in enumerate(success_rates):
        if 0 < sr < 1:
            costs[i] = np.log(1 - alpha) / np.log(max(sr, 1 - sr))
            sampling_budget[i] += min_n
            effective.append(i)
        elif sr == 0:
            costs[i] = float("inf")
            sampling_budget[i] += min_n
        else:
            sampling_budget[i] += min_n
    left = total_budget - sum(sampling_budget)
    if left > 0 and not effective:
        zero = [i for i in range(batch_size) if success_rates[i] == 0]
        if zero:
            for idx, i in enumerate(zero):
                sampling_budget[i] += left // len(zero) + (1 if idx < left % len(zero) else 0)
        else:
            sampling_budget = [n] * batch_size
        return sampling_budget
    estimated = sum(int(min(max_n, costs[i])) for i in effective)
    if estimated < left:
        zero = [i for i in range(batch_size) if success_rates[i] == 0]
        candidates = zero if zero else [i for i in range(batch_size) if i not in effective]
        abundant = left - estimated
        budget_per_candidate, remainder = abundant // len(candidates), abundant % len(candidates)
        for idx, i in enumerate(candidates):
            sampling_budget[i] += budget_per_candidate + (1 if idx < remainder else 0)
        left = estimated
    extra_max = max_n - min_n
    extra = [0] * batch_size
    if left > 0:
        N = len(effective)
        dp = [[-math.inf] * (left + 1) for _ in range(N + 1)]
        dp[0][0] = 0.0
        choice = [[(-1, -1)] * (left + 1) for _ in range(N + 1)]
        for i in range(1, N + 1):
            sr = success_rates[effective[i - 1]]
            for w in range(left + 1):
                if dp[i - 1][w] > dp[i][w]:
                    dp[i][w], choice[i][w] = dp[i - 1][w], (0, 0)
                for k in range(1, min(extra_max + 1, w + 1)):
                    if dp[i - 1][w - k] == -math.inf:
                        continue
                    gain = (1 - sr ** (k + min_n) - (1 - sr) ** (k + min_n)) * sr * (1 - sr) ** 2
                    if dp[i - 1][w - k] + gain > dp[i][w]:
                        dp[i][w], choice[i][w] = dp[i - 1][w - k] + gain, (i - 1, k)
        usable = left
        while usable > 0 and dp[N][usable] == -math.inf:
            usable -= 1
        w = usable
        for i in range(N, 0, -1):
            item, k = choice[i][w]
            if k > 0:
                extra[effective[item]] += k
                w -= k
        rest = left - usable
        for idx in effective:
            extra[idx] += rest // len(effective)
        for i in range(rest % len(effective)):
            extra[effective[i]] += 1
    return [a + b for a, b in zip(sampling_budget, extra)]


@pytest.mark.parametrize("seed", range(150))
def test_knapsack_rl_counts_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    size, n, min_n = int(rng.integers(1, 9)), int(rng.integers(2, 7)), 2
    max_n = int(rng.integers(min_n + 1, 13))
    p = rng.choice(np.r_[0.0, 1.0, np.arange(1, 16) / 16], size=size)
    try:
        expected = reference_knapsack(p.tolist(), n, min_n, max_n)
    except ZeroDivisionError:  # every prompt in the programme and their need below the budget: ours skips the move
        expected = None
    got = knapsack_rl_counts(p, size * n, min_n, max_n)
    assert got.sum() == size * n
    if expected is not None:
        assert got.tolist() == expected


def test_knapsack_rl_value_is_the_papers():
    p, m = np.array([0.1, 0.5, 0.9]), np.array([2, 8, 16])
    np.testing.assert_allclose(knapsack_rl_value(p, m), (1 - p ** m - (1 - p) ** m) * p * (1 - p) ** 2)
    assert knapsack_rl_extra(np.array([0.5]), 2, 4, 0).tolist() == [0]


def test_knapsack_rl_preset_spends_grpos_rollouts_on_grpos_batch():
    cfg = config(pool_factor=4)
    p = np.random.default_rng(0).random(cfg.pool_size)
    counts = ROOT_POLICIES[METHODS["knapsack_rl"].root_policy](p, cfg.budget, cfg, np.random.default_rng(3))
    uniform = np.random.default_rng(3).permutation(cfg.pool_size)[: cfg.num_prompts]
    assert counts.sum() == cfg.budget and set(np.flatnonzero(counts)) <= set(uniform.tolist())
    assert counts[uniform].tolist() == knapsack_rl_counts(p[uniform], int(cfg.budget), cfg.m_min, cfg.m_max).tolist()


# ------------------------------------------------------------------------------------------------- in the one step
ROUND_METHODS = ["dapo", "reinforce_ada", "speed", "pilot_commit", "posterior"]


@pytest.mark.parametrize("unit", ["units", "tokens"])
@pytest.mark.parametrize("name", ROUND_METHODS + ["knapsack_rl"])
def test_each_sampler_spends_the_steps_budget_and_trains_on_what_it_kept(name, unit):
    from tracerl.core.simulator import SimConfig, Simulator

    cfg = AllocationConfig(num_prompts=16, rollouts_per_prompt=8, budget_unit=unit)
    sim = Simulator(SimConfig(num_prompts=512), seed=0)
    prices = make_prices(cfg)
    oracle = SimpleNamespace(predict=lambda hs: np.array([h.meta.get("true_p", 0.5) if h.meta else 0.5 for h in hs]),
                             update=lambda *a: {})
    for step in range(3):
        pool = sim.set_pool(np.arange(cfg.pool_size) + step * cfg.pool_size)
        result = run_step(get_method(name), cfg, pool, sim, np.random.default_rng(step), predictor=oracle,
                          prices=prices)
        ledger, m, grown = result.ledger, result.metrics, result.growth
        assert ledger.budget_spent <= ledger.budget + 1e-6
        assert ledger.budget_spent >= 0.75 * ledger.budget, "most of the budget is spent"
        assert m["alloc/budget_used"] == pytest.approx(ledger.budget_spent / ledger.budget)
        assert ("alloc/tokens_of_budget" in m) == (unit == "tokens")
        sampled = sum(len(t.leaves()) for t in grown.trees)
        assert m["alloc/units_root"] == sampled == grown.root_counts.sum()
        assert m["rollout/num_rollouts"] == sum(len(t.leaves()) for t in result.trees)
        assert len(result.advantages) == len(result.trees)
        if name in ROUND_METHODS:
            assert m["alloc/rollouts_sampled"] == sampled and sum(
                m[f"alloc/round{r}_rollouts"] for r in range(1, m["alloc/rounds"] + 1)) == sampled
            assert sum(m[f"alloc/round{r}_tokens"] for r in range(1, m["alloc/rounds"] + 1)) == m["rollout/tokens"]
            assert all(n.origin in ("prompt", "bare") for t in grown.trees for n in t.nodes), "rounds are fresh"
        if name == "posterior":
            assert all(0 < sum(t.rewards() > 0.5) < len(t.leaves()) for t in result.trees), "it keeps mixed groups"
        if name in ("dapo", "speed", "pilot_commit"):
            assert all(t.is_mixed() for t in result.trees) or name != "dapo"
            assert {t.prompt_id for t in result.trees} <= {t.prompt_id for t in grown.trees}


def test_growth_runs_a_sampler_as_the_rules_say():
    """grow_trees on a scripted runner keeps what `drive` keeps with the step's order (its first draw)."""
    rng = np.random.default_rng(5)
    cfg = config(num_prompts=6, round_prompts=3, keep_prompts=4)
    R = draw_rewards(rng, cfg.pool_size, 4)
    pool = [SimpleNamespace(prompt_id=str(u), text="", meta={}) for u in range(cfg.pool_size)]
    prices = make_prices(cfg)
    grown = grow_trees(get_method("dapo"), cfg, pool, None, Scripted(R), prices.ledger(), np.random.default_rng(9),
                       prices)
    kept, _, _, _ = drive("dapo", cfg, R, np.random.default_rng(9).permutation(cfg.pool_size), budget=cfg.budget)
    assert sorted(int(t.prompt_id) for t in grown.kept) == sorted(kept)


def test_take_in_order_stops_at_the_first_prompt_that_does_not_fit():
    assert take_in_order(np.array([2, 0, 1]), np.array([1.0, 5.0, 2.0]), 3.5).tolist() == [2, 0]
    assert take_in_order(np.array([1, 0]), np.array([1.0, 5.0]), 3.0).tolist() == []


def test_round_sampler_knobs_are_checked_at_load():
    with pytest.raises(ValueError, match="pilot_low"):
        AllocationConfig(pilot_low=0.8, pilot_high=0.5)
    with pytest.raises(ValueError, match="ada_exit"):
        AllocationConfig(ada_exit="sometimes")

