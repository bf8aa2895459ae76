"""The adaptive samplers users switch on elsewhere, as presets of the one step: DAPO's dynamic sampling, Reinforce-Ada,
SPEED and Pilot-Commit decide in rounds; KnapsackRL's allocation is a stage-1 policy. Beside them, ours: posterior
screening, rounds chosen by a Beta posterior around the predictor, priced per expected token, and its variant whose
probes may be continuations from the prefixes of the step's own trees.

A **round sampler** grants each round's fresh rollouts from what the step's earlier rounds showed. Growth runs the
rounds (`tracerl.core.growth.grow_in_rounds`): it asks `grants(seen, rng)` for the next round's rollouts per pool
prompt (all zero ends the step's sampling), charges the ledger, samples them (a prompt's later rounds are more
rollouts from the same root), updates `seen`, and at the end asks `keep(trees, seen, rng)` for the groups the update
trains on. Every sampled rollout is paid for and stays in the step's record, the predictor's targets and the prices;
only the kept groups reach the policy gradient. A sampler never grants what the budget cannot pay: each takes its
prompts in its own order while their rollouts still fit (`take_in_order`), so every method spends the same budget
per step, in units or in expected tokens.

Each sampler is held to its authors' code by an independent re-implementation in the tests
(`tests/unit/test_samplers.py`); `docs/allocation.md` gives the formulas, the sources and where a step of fixed
budget makes us depart from them. A success is a reward above 0.5 throughout, as `Tree.mixed` counts it.

Pure numpy; a sampler holds its state for one step only (growth builds a new one per step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracerl.core.tree import Tree


def take_in_order(order: np.ndarray, each: np.ndarray, budget: float) -> np.ndarray:
    """The prompts of `order`, in that order, while their costs `each` (indexed by prompt) still fit in `budget`."""
    order = np.asarray(order, dtype=np.int64)
    fits = np.cumsum(np.asarray(each, dtype=float)[order]) <= budget + 1e-9
    return order[: int(np.argmin(fits)) if not fits.all() else len(order)]


@dataclass
class Branches:
    """A round's continuation candidates: the prefixes of the step's trees whose leaves agree, of prompts whose tree
    is not yet mixed (`tracerl.core.growth.intermediate_nodes`), each with its predicted success and its price."""

    prompt: np.ndarray  # (Y,) pool index of the candidate's prompt
    node: np.ndarray  # (Y,) its node id in that prompt's tree
    p: np.ndarray  # (Y,) the predictor's success probability from the prefix
    outcome: np.ndarray  # (Y,) the shared outcome of the leaves below it (1: all succeeded, 0: all failed)
    cost: np.ndarray  # (Y,) budget cost of one continuation from it
    rollouts: np.ndarray = field(default=None)  # (Y,) rollouts drawn from it: leaves below it anchored at or above it
    successes: np.ndarray = field(default=None)  # (Y,) of them with reward > 0.5

    def __post_init__(self) -> None:
        self.rollouts = np.zeros(len(self.prompt), dtype=np.int64) if self.rollouts is None else self.rollouts
        self.successes = np.zeros(len(self.prompt), dtype=np.int64) if self.successes is None else self.successes


@dataclass
class Round:
    """What a branching sampler grants in one round: fresh rollouts per pool prompt, and continuations as (pool
    index, node id, count)."""

    fresh: np.ndarray
    branches: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class Seen:
    """What a round sampler knows before each round: the pool's predictions and prices, the step's random order over
    the pool (the order a data loader would hand the prompts out), and the fresh rollouts and successes sampled so far."""

    p: np.ndarray  # (P,) predicted success probability (0.5 where the method reads none)
    cost: np.ndarray  # (P,) budget cost of one fresh rollout of each prompt
    order: np.ndarray  # (P,) a random permutation of the pool, drawn once per step
    budget: float  # the step's budget in the prices' unit
    budget_left: float | None = None  # what is left of it before this round (None: all of it)
    round_index: int = 0  # 0 for the first round
    rollouts: np.ndarray = field(default=None)  # (P,) fresh rollouts sampled so far
    successes: np.ndarray = field(default=None)  # (P,) of them with reward > 0.5
    tree_mixed: np.ndarray = field(default=None)  # (P,) the prompt's tree holds both outcomes, continuations counted
    branches: Branches | None = None  # the prefixes a branching sampler may continue (growth fills them in)

    def __post_init__(self) -> None:
        size = len(self.p)
        self.rollouts = np.zeros(size, dtype=np.int64) if self.rollouts is None else self.rollouts
        self.successes = np.zeros(size, dtype=np.int64) if self.successes is None else self.successes
        self.tree_mixed = np.zeros(size, dtype=bool) if self.tree_mixed is None else self.tree_mixed
        self.budget_left = self.budget if self.budget_left is None else self.budget_left

    def mixed(self, i: int) -> bool:
        """Whether prompt i's rollouts hold both a success and a failure (a group of one counts as mixed, as in
        verl's filter: its advantage is not all-equal by construction)."""
        return self.rollouts[i] == 1 or 0 < self.successes[i] < self.rollouts[i]


class RoundSampler:
    """A sampler that decides in rounds: `grants` before each round, `keep` after the last. One that `branches` is
    shown each round's continuation candidates (`Seen.branches`) and may grant a `Round` instead of fresh counts."""

    source = ""  # the reference this sampler follows (docs/allocation.md)
    branches = False

    def __init__(self, config: Any):
        self.config = config

    def grants(self, seen: Seen, rng: np.random.Generator) -> np.ndarray:
        """(P,) fresh rollouts per pool prompt for the next round; all zero ends the step's sampling."""
        raise NotImplementedError

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        """The training group of each kept prompt (pool index -> tree); a prompt left out is dropped from the update."""
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------------------ DAPO
class DynamicSampling(RoundSampler):
    """DAPO's dynamic sampling as verl's `algorithm.filter_groups` runs it: generation batches of `round_prompts`
    prompts in the data loader's order, n rollouts each; a group is kept when its rewards are not all equal; batches
    continue until `keep_prompts` groups are kept (the first ones in generation order; the surplus is dropped), the
    budget cannot pay for another prompt, or `max_rounds` batches have run (verl raises there; a step of fixed budget
    trains on what it kept)."""

    source = "DAPO (arXiv 2503.14476), verl algorithm.filter_groups"

    def __init__(self, config: Any):
        super().__init__(config)
        self.n = config.rollouts_per_prompt
        self.batch = config.round_prompts or config.num_prompts
        self.target = config.keep_prompts
        self.granted: list[int] = []  # prompts in generation order

    def _kept(self, seen: Seen) -> list[int]:
        kept = [i for i in self.granted if seen.mixed(i)]
        return kept if self.target is None else kept[: self.target]

    def grants(self, seen: Seen, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(len(seen.p), dtype=np.int64)
        if self.target is not None and len(self._kept(seen)) >= self.target:
            return out
        fresh = np.array([i for i in seen.order if seen.rollouts[i] == 0], dtype=np.int64)[: self.batch]
        take = take_in_order(fresh, self.n * seen.cost, seen.budget_left)
        out[take] = self.n
        self.granted += take.tolist()
        return out

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        return {i: trees[i] for i in self._kept(seen)}


# ---------------------------------------------------------------------------------------------------- Reinforce-Ada
def ada_exits(successes: int, rollouts: int, n: int, rule: str) -> bool:
    """Reinforce-Ada's exit rule after a whole round: at least n/2 successes and n - n/2 failures ("balanced"), or
    one success ("positive")."""
    if rule == "balanced":
        return successes >= n // 2 and rollouts - successes >= n - n // 2
    return successes >= 1


def ada_group(rewards: list[float], n: int, rule: str, exited: bool) -> list[int]:
    """Reinforce-Ada's training group from one prompt's rewards in generation order: positions of the first-sampled
    successes, then failures (positives first, as the reference concatenates them). At exit: n/2 successes and the
    rest failures, filled from the successes if the failures run short, else from the failures. A prompt that never
    exited keeps min(n, all) samples: n/2 and n - n/2 ("balanced") or successes in proportion, at least one and at
    most all but one ("positive"), then the same fill."""
    pos = [j for j, r in enumerate(rewards) if r > 0.5]
    neg = [j for j, r in enumerate(rewards) if not r > 0.5]
    take = n if exited else min(n, len(rewards))
    if exited:
        want_pos = min(n // 2, len(pos))
        want_neg = min(n - want_pos, len(neg))
    else:
        if rule == "positive":
            ratio = len(pos) / len(rewards) if rewards else 0.0
            target_pos = max(min(math.ceil(ratio * n), take - 1), 1)
            target_neg = take - target_pos
        else:
            target_pos, target_neg = n // 2, n - n // 2
        want_pos, want_neg = min(len(pos), target_pos), min(len(neg), target_neg)
    if want_pos + want_neg < take:  # one side tops up: the successes if they have spare, else the failures
        if len(pos) > want_pos:
            want_pos += min(len(pos) - want_pos, take - want_pos - want_neg)
        elif len(neg) > want_neg:
            want_neg += min(len(neg) - want_neg, take - want_pos - want_neg)
    return pos[:want_pos] + neg[:want_neg]


class ReinforceAda(RoundSampler):
    """Reinforce-Ada: `round_prompts` prompts (the data loader's next ones), each sampled `round_rollouts` at a time
    until it meets the exit rule (`ada_exit`) after a whole round, or `max_rounds` rounds have run, or the budget
    cannot pay its next round (prompts in order while theirs fit). Every prompt is trained on, with a group of n
    (`ada_group`); its baseline comes from all its samples (`advantages.reinforce_ada`, from
    `tree.meta["sampled_outcomes"]`)."""

    source = "Reinforce-Ada (arXiv 2510.04996), RLHFlow/Reinforce-Ada"

    def __init__(self, config: Any):
        super().__init__(config)
        self.n, self.per_round, self.rule = config.rollouts_per_prompt, config.round_rollouts, config.ada_exit
        self.num_prompts = config.round_prompts or max(1, config.num_prompts // 2)
        self.batch: np.ndarray | None = None
        self.exited: set[int] = set()

    def grants(self, seen: Seen, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(len(seen.p), dtype=np.int64)
        if self.batch is None:
            self.batch = take_in_order(seen.order[: self.num_prompts], self.per_round * seen.cost, seen.budget_left)
        self.exited |= {int(i) for i in self.batch
                        if seen.rollouts[i] and ada_exits(seen.successes[i], seen.rollouts[i], self.n, self.rule)}
        active = np.array([i for i in self.batch if int(i) not in self.exited], dtype=np.int64)
        out[take_in_order(active, self.per_round * seen.cost, seen.budget_left)] = self.per_round
        return out

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        self.exited |= {i for i in trees if ada_exits(seen.successes[i], seen.rollouts[i], self.n, self.rule)}
        out = {}
        for i, tree in trees.items():
            leaves = tree.leaves()
            rewards = [tree.nodes[leaf].reward for leaf in leaves]
            group = tree.keep_rollouts([leaves[j] for j in ada_group(rewards, self.n, self.rule, i in self.exited)])
            successes = sum(r > 0.5 for r in rewards)
            group.meta["sampled_outcomes"] = [int(successes), len(rewards) - int(successes)]
            out[i] = group
        return out


# --------------------------------------------------------------------------------------------- SPEED, Pilot-Commit
class ScreenThenCommit(RoundSampler):
    """Screen new prompts with `round_rollouts` rollouts each, commit `commit_rollouts` more to those that pass, in
    the next round beside the next screening batch (SPEED and Pilot-Commit both generate the two in one call). The
    group is the screening and the committed rollouts together; prompts that fail screening are dropped. A round
    commits first, then screens at most `round_prompts` new prompts in the data loader's order while the budget can
    pay for their screening and their commit both, so no prompt that passes is left without its commit. The rounds
    stop once `keep_prompts` groups are committed, nothing more fits, or after `max_rounds`."""

    def __init__(self, config: Any):
        super().__init__(config)
        self.screen, self.commit = config.round_rollouts, config.commit_rollouts
        self.batch, self.target = config.round_prompts or config.num_prompts, config.keep_prompts
        self.screened: list[int] = []  # screened prompts not yet judged, in screening order
        self.queue: list[int] = []  # passed, waiting for their commit
        self.committed: list[int] = []  # in commit order

    def passes(self, successes: int, rollouts: int) -> bool:
        raise NotImplementedError

    def pick(self, queue: list[int], need: int | None, rng: np.random.Generator) -> list[int]:
        """Which waiting prompts this round commits to, in order (all of them, first come first)."""
        return list(queue)

    def grants(self, seen: Seen, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(len(seen.p), dtype=np.int64)
        self.queue += [i for i in self.screened if self.passes(int(seen.successes[i]), int(seen.rollouts[i]))]
        self.screened = []
        need = None if self.target is None else self.target - len(self.committed)
        if need is not None and need <= 0:
            return out
        commit = take_in_order(np.array(self.pick(self.queue, need, rng), dtype=np.int64), self.commit * seen.cost,
                               seen.budget_left)
        out[commit] = self.commit
        self.committed += commit.tolist()
        committed = set(commit.tolist())
        self.queue = [i for i in self.queue if i not in committed]
        left = seen.budget_left - float(np.sum(out * seen.cost))
        fresh = np.array([i for i in seen.order if seen.rollouts[i] == 0], dtype=np.int64)[: self.batch]
        screen = take_in_order(fresh, (self.screen + self.commit) * seen.cost, left)
        out[screen] = self.screen
        self.screened = screen.tolist()
        return out

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        kept = self.committed if self.target is None else self.committed[: self.target]
        return {i: trees[i] for i in kept}


class Speed(ScreenThenCommit):
    """SPEED-RL: a prompt passes screening when its rewards are not all equal (0 < successes < screening rollouts);
    every waiting prompt is committed, first screened first."""

    source = "SPEED-RL (arXiv 2506.09016), Zanette-Labs/speed-rl"

    def passes(self, successes: int, rollouts: int) -> bool:
        return 0 < successes < rollouts


class PilotCommit(ScreenThenCommit):
    """Pilot-Commit: a prompt passes its pilot when pilot_low <= pilot accuracy <= pilot_high (both ends included);
    a round commits to at most the groups still needed, all waiting prompts when they are fewer, else a random
    choice of them."""

    source = "Pilot-Commit, databricks/pilot-commit"

    def passes(self, successes: int, rollouts: int) -> bool:
        accuracy = successes / rollouts
        return self.config.pilot_low <= accuracy <= self.config.pilot_high

    def pick(self, queue: list[int], need: int | None, rng: np.random.Generator) -> list[int]:
        if need is None or len(queue) <= need:
            return list(queue)
        return [queue[j] for j in rng.choice(len(queue), size=need, replace=False)]


# ------------------------------------------------------------------------------------------- posterior screening
def beta_moment(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """E[theta^k] for theta ~ Beta(a, b): prod_{j < k} (a + j) / (a + b + j); 1 for k = 0."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    out = np.ones(np.broadcast(a, b).shape)
    for j in range(k):
        out = out * (a + j) / (a + b + j)
    return out


def posterior_ratio(a: np.ndarray, b: np.ndarray, rollouts: np.ndarray, successes: np.ndarray, n: int, probe: int,
                    cost: np.ndarray, mixed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each prompt, the rollouts its next block asks for, the expected informative rollouts per unit of expected
    cost that block leads to, and the expected cost still to come after it (a commit, if it turns mixed).

    theta_i ~ Beta(a_i + s_i, b_i + m_i - s_i) after m_i rollouts with s_i successes. A mixed group short of n is filled
    to n: n - m informative rollouts for as many rollouts (ratio 1 / cost). A group not yet mixed gets a block of
    k = min(probe, n - m) more; it turns mixed with q = 1 - E[(1 - theta)^k] (all failed so far; a new prompt: 1 -
    E[theta^k] - E[(1 - theta)^k]) or 1 - E[theta^k] (all succeeded), and is then filled to n, so the block leads to
    q n informative rollouts for an expected k + q (n - m - k) rollouts. A group of n or more asks for nothing.
    `mixed` (P,) marks more groups as mixed (a tree whose continuations disagree with its fresh rollouts)."""
    m, s = np.asarray(rollouts, dtype=np.int64), np.asarray(successes, dtype=np.int64)
    post_a, post_b = a + s, b + (m - s)
    mixed = ((s > 0) & (s < m)) | (False if mixed is None else np.asarray(mixed, dtype=bool))
    block = np.where(m >= n, 0, np.where(mixed, n - m, np.minimum(probe, n - m))).astype(np.int64)
    q = np.zeros(len(m))
    for k in np.unique(block[~mixed & (block > 0)]):
        sel = ~mixed & (block == k)
        fail_all = 1.0 - beta_moment(post_b[sel], post_a[sel], int(k))  # some success among k
        succ_all = 1.0 - beta_moment(post_a[sel], post_b[sel], int(k))  # some failure among k
        q[sel] = np.where(m[sel] == 0, fail_all + succ_all - 1.0, np.where(s[sel] == 0, fail_all, succ_all))
    q = np.clip(q, 0.0, 1.0)
    after = np.where(mixed, 0.0, q * np.maximum(n - m - block, 0)) * cost  # the commit it may lead to
    value = np.where(mixed, block, q * n)
    spend = block * cost + after
    ratio = np.where(block > 0, value / np.maximum(spend, 1e-12), 0.0)
    return block, ratio, after


def buy_best_first(ratio: np.ndarray, price: np.ndarray, after: np.ndarray, seen: Seen) -> list[int]:
    """The prompts whose blocks a round buys: best `ratio` first (ties in the data loader's order, `seen.order`), each
    while the budget left pays its `price` and the expected costs `after` of it and of every block bought before it;
    none with a ratio of 0 or less."""
    rank = np.empty(len(ratio), dtype=np.int64)
    rank[seen.order] = np.arange(len(ratio))
    bought, left, reserved = [], seen.budget_left, 0.0
    for i in np.lexsort((rank, -ratio)):
        if ratio[i] <= 0:
            break
        if price[i] + reserved + after[i] <= left + 1e-9:
            bought.append(int(i))
            left, reserved = left - price[i], reserved + after[i]
    return bought


class PosteriorScreening(RoundSampler):
    """Screening in rounds by posterior value per expected cost (ours; docs/allocation.md): each prompt's success
    probability starts as Beta(kappa p, kappa (1 - p)) around the predictor's p (kappa = `prior_strength`) and is
    updated with every rollout the step samples. Each round grants one block per prompt, best `posterior_ratio`
    first: a mixed group is filled to n, any other prompt is probed with `round_rollouts` more (fewer if that would
    pass n); a probe is granted only while the budget can also pay the commit it is expected to lead to. Rounds stop
    when nothing fits or after `max_rounds`; the mixed groups are kept (a group of all-equal rewards has no
    advantage)."""

    source = "ours: SPEED-RL's screen-then-commit with a Beta prior around the predictor, priced in expected tokens"

    def __init__(self, config: Any):
        super().__init__(config)
        self.n, self.probe, self.kappa = config.rollouts_per_prompt, config.round_rollouts, config.prior_strength

    def grants(self, seen: Seen, rng: np.random.Generator) -> np.ndarray:
        p = np.clip(seen.p, 0.01, 0.99)
        block, ratio, after = posterior_ratio(self.kappa * p, self.kappa * (1 - p), seen.rollouts, seen.successes,
                                              self.n, self.probe, seen.cost)
        out = np.zeros(len(p), dtype=np.int64)
        bought = buy_best_first(ratio, block * seen.cost, after, seen)
        out[bought] = block[bought]
        return out

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        return {i: tree for i, tree in trees.items() if 0 < seen.successes[i] < seen.rollouts[i]}


def branch_ratio(branches: Branches, kappa: float, k: int, n: int, rollouts: np.ndarray, cost: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For each candidate prefix, the expected informative rollouts per unit of expected cost of `k` continuations
    from it, and the expected cost still to come after them.

    theta_y ~ Beta(kappa p_y + s_y, kappa (1 - p_y) + m_y - s_y): a prior around the predictor's p from the prefix,
    updated with the m_y rollouts already drawn from it (the one that made it, and the continuations from it), s_y of
    them successes, so a prefix whose continuations keep failing is offered at a falling price-worth. Below a prefix
    whose leaves all failed, the k continuations flip the tree's outcome with q = 1 - E[(1 - theta)^k]; below one
    whose leaves all succeeded, q = 1 - E[theta^k]. A flipped tree is mixed and is then filled to n fresh rollouts:
    its n fresh and k continued leaves all carry signal, so the block leads to q (n + k) informative rollouts for
    k c_y + q (n - m) c (c_y a continuation's price, c a fresh rollout's, m the fresh rollouts so far)."""
    p = np.clip(branches.p, 0.01, 0.99)
    a, b = kappa * p + branches.successes, kappa * (1 - p) + branches.rollouts - branches.successes
    some_success = 1.0 - beta_moment(b, a, k)
    some_failure = 1.0 - beta_moment(a, b, k)
    q = np.clip(np.where(branches.outcome > 0, some_failure, some_success), 0.0, 1.0)
    after = q * np.maximum(n - rollouts[branches.prompt], 0) * cost[branches.prompt]
    ratio = q * (n + k) / np.maximum(k * branches.cost + after, 1e-12)
    return ratio, after


class PosteriorTree(PosteriorScreening):
    """Posterior screening whose probes may also be continuations (ours; docs/allocation.md, "Posterior screening with
    branches"): each round, a prompt whose tree is not yet mixed is offered its fresh probe (`posterior_ratio`) and
    `round_rollouts` continuations from each prefix whose leaves agree (`branch_ratio`); it gets the one worth more
    per expected cost, and the round's blocks are bought best first while the budget also pays their expected fills.
    The training group is the prompt's whole tree, kept when its leaves hold both outcomes."""

    source = ("ours: posterior screening in which stage 2's continuations compete with fresh rollouts, round by round, "
              "per expected token")
    branches = True

    def grants(self, seen: Seen, rng: np.random.Generator) -> Round:
        p = np.clip(seen.p, 0.01, 0.99)
        block, ratio, after = posterior_ratio(self.kappa * p, self.kappa * (1 - p), seen.rollouts, seen.successes,
                                              self.n, self.probe, seen.cost, mixed=seen.tree_mixed)
        price, branch_at = block * seen.cost, np.full(len(p), -1)
        found = seen.branches
        if found is not None and len(found.prompt):
            b_ratio, b_after = branch_ratio(found, self.kappa, self.probe, self.n, seen.rollouts, seen.cost)
            for y in np.lexsort((found.node, found.prompt, -b_ratio)):  # best first; ties by prompt, then node
                i = int(found.prompt[y])
                if b_ratio[y] > ratio[i] and branch_at[i] < 0 and not seen.tree_mixed[i]:
                    branch_at[i], ratio[i], after[i] = y, b_ratio[y], b_after[y]
                    price[i] = self.probe * found.cost[y]
        out, branched = np.zeros(len(p), dtype=np.int64), []
        for i in buy_best_first(ratio, price, after, seen):
            if branch_at[i] >= 0:
                branched.append((i, int(found.node[branch_at[i]]), self.probe))
            else:
                out[i] = block[i]
        return Round(out, branched)

    def keep(self, trees: dict[int, Tree], seen: Seen, rng: np.random.Generator) -> dict[int, Tree]:
        return {i: tree for i, tree in trees.items() if seen.tree_mixed[i]}


ROUND_SAMPLERS: dict[str, type[RoundSampler]] = {
    "dapo": DynamicSampling, "reinforce_ada": ReinforceAda, "speed": Speed, "pilot_commit": PilotCommit,
    "posterior": PosteriorScreening, "posterior_tree": PosteriorTree,
}


# ------------------------------------------------------------------------------------------------------ KnapsackRL
def knapsack_rl_value(p, m) -> np.ndarray:
    """KnapsackRL's value of m rollouts of a prompt with success probability p: (1 - p^m - (1-p)^m) p (1-p)^2."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    return (1.0 - p ** m - (1.0 - p) ** m) * p * (1.0 - p) ** 2


def knapsack_rl_extra(p: np.ndarray, min_n: int, max_extra: int, budget: int) -> np.ndarray:
    """KnapsackRL's exact-capacity dynamic programme: extra rollouts k_i in {0, 1, ..., max_extra} for prompts with
    0 < p_i < 1 (each already holds min_n) maximising sum over k_i > 0 of V(p_i, min_n + k_i) with sum k_i = budget, or
    the largest feasible sum below it, the rest spread evenly (lower index first). Ties keep the smaller k_i."""
    p = np.asarray(p, dtype=float)
    out = np.zeros(len(p), dtype=np.int64)
    if budget <= 0 or not len(p):
        return out
    ks = np.arange(max_extra + 1)
    dp = np.full(budget + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((len(p), budget + 1), dtype=np.int64)
    for i, pi in enumerate(p):
        gain = np.where(ks > 0, knapsack_rl_value(pi, min_n + ks), 0.0)
        shifted = np.full((budget + 1, len(ks)), -np.inf)  # shifted[w, k] = dp[w - k] + gain[k]
        for k in ks[: budget + 1]:
            shifted[k:, k] = dp[: budget + 1 - k] + gain[k]
        choice[i] = np.argmax(shifted, axis=1)  # the first maximum: the smallest k on ties
        dp = shifted[np.arange(budget + 1), choice[i]]
    usable = budget
    while usable > 0 and dp[usable] == -np.inf:
        usable -= 1
    w = usable
    for i in range(len(p) - 1, -1, -1):
        out[i] = choice[i, w] if w >= 0 else 0
        w -= out[i]
    rest = budget - usable
    if rest > 0:
        out += rest // len(p)
        out[: rest % len(p)] += 1
    return out


def knapsack_rl_counts(p: np.ndarray, total: int, min_n: int = 2, max_n: int = 128, alpha: float = 0.9) -> np.ndarray:
    """KnapsackRL's rollouts per prompt of a batch with success estimates `p`, summing to `total`: min_n each; the
    rest by `knapsack_rl_extra` over the prompts with 0 < p < 1, except that when their estimated need,
    sum_i min(max_n, ln(1 - alpha) / ln(max(p_i, 1 - p_i))) (each rounded down), is below it, the surplus goes evenly
    to the prompts with p = 0 (else to every prompt outside the programme) first. With no prompt in 0 < p < 1 the
    rest goes to the p = 0 prompts, or n = total / len each when there are none."""
    p = np.asarray(p, dtype=float)
    size = len(p)
    counts = np.full(size, min_n, dtype=np.int64)
    effective = np.flatnonzero((p > 0) & (p < 1))
    rest = int(total - counts.sum())
    zero = np.flatnonzero(p == 0)
    if rest > 0 and not len(effective):
        if len(zero):
            counts[zero] += rest // len(zero)
            counts[zero[: rest % len(zero)]] += 1
        else:
            counts[:] = total // size
        return counts
    with np.errstate(divide="ignore"):
        need = sum(int(min(max_n, math.log(1 - alpha) / math.log(max(p[i], 1 - p[i])))) for i in effective)
    others = zero if len(zero) else np.setdiff1d(np.arange(size), effective)
    if need < rest and len(others):  # (the reference divides by zero when every prompt is in the programme)
        surplus = rest - need
        counts[others] += surplus // len(others)
        counts[others[: surplus % len(others)]] += 1
        rest = need
    counts[effective] += knapsack_rl_extra(p[effective], min_n, max_n - min_n, rest)
    return counts
