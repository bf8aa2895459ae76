"""What sampling costs, in one room: the budget units, the continuation cost, the token estimate, the prices that
stage 1 and stage 2 ask for, and the per-step ledger that refuses to overspend.

A step's budget is counted in one of two units (docs/design.md, section 1, "budget"):

- "units" (`UnitPrices`): trajectory units, a fresh rollout 1 and a continuation `continuation_cost` (0.5 by
  default); the step holds `AllocationConfig.budget` of them (what GRPO spends on num_prompts x n rollouts);
- "tokens" (`TokenPrices`): expected sampled tokens, a fresh rollout priced at its prompt's past length and a
  continuation at what rollouts still took after a node of its depth (`TokenEstimate`); the step holds
  `token_budget` tokens (or budget x default_rollout_tokens), so methods compare at equal sampled tokens by
  construction.

Growth (`tracerl.core.growth`) asks a `Prices` object four questions, whatever the unit: the cost of one fresh
rollout per prompt (`fresh`), of one continuation from given nodes (`continuation`), what a grant takes from the
budget (`cost`), and how stage 2's budget is handed out (`prefix_budgets` across prompts after stage 1, a `Purse`
per round). Trajectory units are counted in both modes, for the measures. A new cost rule (a per-turn cost, a
prefill discount) is a new `Prices` subclass here; growth does not change.

Deliberately not here: which prompts or prefixes get budget (tracerl.core.allocation and the method presets), and
sampling itself.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import numpy as np

from tracerl.core.allocation import _budget, _whole, split_budget
from tracerl.core.tree import Tree

CONTINUATION_COST = 0.5  # default budget units of one continuation (a fresh rollout costs 1); written only here
BUDGET_UNITS = ("units", "tokens")  # what a step's budget counts: trajectory units or expected sampled tokens


class BudgetExceeded(RuntimeError):
    """A charge would spend more than the ledger holds."""


class BudgetLedger:
    """One step's budget and what was spent of it: trajectory units (fresh rollout 1, continuation
    `continuation_cost`), sampled tokens, and the cost charged against the budget, per kind ("root", "prefix",
    "eval", ...).

    `budget` is in `unit`: "units" charges each rollout its trajectory units; "tokens" charges each rollout its
    *expected* sampled tokens (`charge(..., cost=...)`), while units are still counted for the measures.
    `token_cap` caps the tokens actually sampled: once reached, every further charge is refused. Refuses to
    overspend the budget."""

    def __init__(self, budget: float, token_cap: int | None = None,
                 continuation_cost: float = CONTINUATION_COST, *, unit: str = "units"):
        self.budget = _budget(budget, "budget")
        self.token_cap = None if token_cap is None else _whole(token_cap, "token_cap")
        if not (math.isfinite(continuation_cost) and continuation_cost > 0):
            raise ValueError(f"continuation_cost={continuation_cost} must be a finite number > 0")
        if unit not in BUDGET_UNITS:
            raise ValueError(f"unit={unit!r}; use one of {BUDGET_UNITS}")
        self.continuation_cost = float(continuation_cost)
        self.unit = unit
        self._units = 0.0
        self._cost = 0.0  # charged against the budget, in `unit` (equals _units when unit == "units")
        self._tokens = 0
        self._by_kind: dict[str, dict[str, float]] = {}

    def rollout_cost(self, continuation: bool) -> float:
        """Units of one rollout: 1.0 fresh, `continuation_cost` when it continues a prefix."""
        return self.continuation_cost if continuation else 1.0

    def rollout_price(self, tree: Tree, leaf: int) -> tuple[float, int]:
        """(trajectory units, sampled policy tokens) of the rollout ending at `leaf`: `rollout_cost` of its kind (fresh
        when anchored at the root, else a continuation) and the policy tokens of the nodes below its anchor, the
        tokens it sampled itself. Every measure that prices a rollout asks this."""
        anchor = tree.nodes[leaf].anchor_id
        path = tree.path(leaf)
        own = path[path.index(anchor) + 1:]
        return self.rollout_cost(anchor != 0), sum(tree.nodes[i].segment.num_policy_tokens for i in own)

    def rollout_units(self, num_rollouts: float, continuation: bool) -> float:
        """Trajectory units of `num_rollouts` rollouts of one kind."""
        return float(num_rollouts) * self.rollout_cost(continuation)

    @property
    def units_spent(self) -> float:
        return self._units

    @property
    def tokens_spent(self) -> int:
        return self._tokens

    @property
    def budget_spent(self) -> float:
        """What has been charged against the budget, in `unit`."""
        return self._cost

    @property
    def budget_left(self) -> float:
        """What is left of the budget, in `unit`."""
        return max(0.0, self.budget - self._cost)

    @property
    def spent_by_kind(self) -> dict[str, dict[str, float]]:
        return {k: dict(v) for k, v in self._by_kind.items()}

    def split(self) -> dict[str, float]:
        """The spend by kind as flat metric values: `units_root`, `tokens_prefix`, ... (and `cost_*` in tokens)."""
        out = {}
        for kind, entry in self._by_kind.items():
            for key, value in entry.items():
                out[f"{key}_{kind}"] = value
        return out

    def _tokens_exhausted(self) -> bool:
        return self.token_cap is not None and self._tokens >= self.token_cap

    def can_afford(self, cost: float) -> bool:
        """Whether a charge of `cost` (in the budget's unit) fits and the token cap is not used up."""
        return self._cost + cost <= self.budget + 1e-9 and not self._tokens_exhausted()

    def charge(self, units: float, *, tokens: int = 0, kind: str = "root", cost: float | None = None) -> None:
        """Spend `units` trajectory units (and record `tokens`) under `kind`. `cost` is what it takes from the
        budget, in `unit`: `units` by default, required when unit == "tokens" (the expected sampled tokens).
        BudgetExceeded if the cost does not fit or the token cap is already used up."""
        if not (math.isfinite(units) and units >= 0):
            raise ValueError(f"units={units} must be a finite number >= 0")
        if cost is None:
            if self.unit != "units":
                raise ValueError(f"a ledger budgeted in {self.unit} needs the charge's cost in {self.unit}")
            cost = units
        if not (math.isfinite(cost) and cost >= 0):
            raise ValueError(f"cost={cost} must be a finite number >= 0")
        tokens = _whole(tokens, "tokens")
        if self._cost + cost > self.budget + 1e-9:
            raise BudgetExceeded(f"{kind} charge of {cost} {self.unit} exceeds the budget: "
                                 f"{self.budget_left} of {self.budget} {self.unit} left")
        if self._tokens_exhausted():
            raise BudgetExceeded(f"{kind} charge of {cost} {self.unit} refused: the token cap is used up "
                                 f"({self._tokens} of {self.token_cap} tokens spent)")
        self._units += float(units)
        self._cost += float(cost)
        self._record(kind, float(units), tokens, float(cost))

    def charge_tokens(self, tokens: int, kind: str = "root") -> None:
        """Record tokens generated (known only afterwards). Never refuses: the tokens are already spent."""
        self._record(kind, 0.0, _whole(tokens, "tokens"), 0.0)

    def _record(self, kind: str, units: float, tokens: int, cost: float) -> None:
        entry = self._by_kind.setdefault(str(kind), {"units": 0.0, "tokens": 0})
        entry["units"] += units
        entry["tokens"] += tokens
        if self.unit != "units":
            entry["cost"] = entry.get("cost", 0.0) + cost
        self._tokens += tokens

    def state_dict(self) -> dict:
        return {"budget": self.budget, "token_cap": self.token_cap, "continuation_cost": self.continuation_cost,
                "unit": self.unit, "units_spent": self._units, "budget_spent": self._cost,
                "tokens_spent": self._tokens, "by_kind": self.spent_by_kind}

    @classmethod
    def from_state_dict(cls, d: dict) -> BudgetLedger:
        ledger = cls(d["budget"], d["token_cap"], d["continuation_cost"], unit=d.get("unit", "units"))
        ledger._units = float(d["units_spent"])
        ledger._cost = float(d.get("budget_spent", d["units_spent"]))
        ledger._tokens = int(d["tokens_spent"])
        ledger._by_kind = {k: {key: (int(x) if key == "tokens" else float(x)) for key, x in v.items()}
                           for k, v in d["by_kind"].items()}
        return ledger


class TokenEstimate:
    """Expected sampled tokens of a rollout, for budgets in tokens, learned from fresh (stage-1) rollouts only (a
    continuation's root-to-leaf length is biased: it passed through the node stage 2 chose). A fresh rollout of a
    prompt: the running mean of that prompt's past fresh rollout lengths, else the running mean over all prompts,
    else `default` before any rollout is seen. A continuation from a node at depth d: the running mean, over past
    fresh rollouts, of the tokens they still took after their depth-d node, scaled by the prompt's expected length
    over the overall mean (remaining length is not the mean length minus the prefix: a rollout still going at depth
    d tends to go on); before any depth-d node is seen, a fresh rollout's expected length (an overestimate rather
    than a budget overrun). A length counts the tokens after the prompt (policy and observation)."""

    def __init__(self, default: float):
        self.default = float(default)
        self.per_prompt: dict[str, list[float]] = {}  # prompt id -> [sum of lengths, count]
        self.total = [0.0, 0.0]
        self.after_depth: dict[int, list[float]] = {}  # depth d -> [sum of tokens after a depth-d node, count]

    def _overall(self) -> float:
        return self.total[0] / self.total[1] if self.total[1] else self.default

    def rollout(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """(P,) expected tokens of one fresh rollout of each prompt."""
        overall = self._overall()
        return np.array([s / n if n else overall
                         for s, n in (self.per_prompt.get(pid, (0.0, 0.0)) for pid in prompt_ids)], dtype=float)

    def continuation(self, tree: Tree, node_ids: Sequence[int]) -> np.ndarray:
        """(Y,) expected tokens of one continuation from each node of `tree`."""
        full = float(self.rollout([tree.prompt_id])[0])
        scale = full / self._overall()
        out = []
        for y in node_ids:
            seen = self.after_depth.get(tree.nodes[y].depth)
            out.append(scale * seen[0] / seen[1] if seen and seen[1] else full)
        return np.maximum(np.asarray(out, dtype=float), 1.0)

    def observe(self, trees: Sequence[Tree]) -> None:
        """Learn from every fresh rollout (root-to-leaf path started at the root) of the step's trees."""
        for tree in trees:
            entry = self.per_prompt.setdefault(tree.prompt_id, [0.0, 0.0])
            for leaf in tree.leaves():
                if tree.nodes[leaf].anchor_id != 0:
                    continue
                lengths = [float(tree.nodes[i].segment.num_tokens) for i in tree.path(leaf)[1:]]
                entry[0] += sum(lengths)
                entry[1] += 1
                self.total[0] += sum(lengths)
                self.total[1] += 1
                after = np.cumsum(lengths[::-1])[::-1]  # tokens from each node of the path to the leaf
                for depth in range(1, len(lengths)):  # the nodes above the leaf, at depths 1 .. len - 1
                    seen = self.after_depth.setdefault(depth, [0.0, 0.0])
                    seen[0] += float(after[depth])
                    seen[1] += 1

    def state_dict(self) -> dict:
        return {"default": self.default, "per_prompt": self.per_prompt, "total": self.total,
                "after_depth": {str(d): v for d, v in self.after_depth.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.default = float(state["default"])
        self.per_prompt = {k: [float(a), float(b)] for k, (a, b) in state["per_prompt"].items()}
        self.total = [float(x) for x in state["total"]]
        self.after_depth = {int(d): [float(a), float(b)] for d, (a, b) in state.get("after_depth", {}).items()}


def split_whole(total: int, weights: np.ndarray) -> np.ndarray:
    """Split `total` whole items in proportion to `weights` (largest remainder, ties to lower index)."""
    weights = np.asarray(weights, dtype=float)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: total - int(out.sum())]] += 1
    return out


class Purse:
    """Stage 2's budget over its rounds, one entry per group (a prompt, or one for all prompts): what is left, what
    a round may spend, and what a round's grants took. In trajectory units it holds whole granules (the
    continuations a prefix policy grants at a time, times their cost), so no round splits one."""

    def __init__(self, budgets: np.ndarray, granule_cost: float | None):
        self.granule_cost = granule_cost  # None: a continuous budget (tokens)
        if granule_cost is None:
            self.left = np.asarray(budgets, dtype=float).copy()
        else:
            self.left = np.array([int(b / granule_cost + 1e-9) for b in budgets], dtype=np.int64)

    def pooled(self) -> Purse:
        """One group holding every group's budget (stage2_mode="global")."""
        self.left = self.left.sum(keepdims=True)
        return self

    def round_budget(self, group: int, rounds_left: int, costs: np.ndarray) -> float:
        """What group may spend this round, in the budget's unit (0: nothing): an even share of what is left over
        the remaining rounds, rounded up to whole granules; in tokens at least the cheapest candidate."""
        if self.granule_cost is not None:
            return max(math.ceil(self.left[group] / rounds_left), 0) * self.granule_cost
        if self.left[group] <= 0:
            return 0.0
        return float(min(self.left[group], max(self.left[group] / rounds_left, float(np.min(costs)))))

    def spend(self, group: int, grants: np.ndarray, costs: np.ndarray, granule: int) -> None:
        """Take a round's grants (continuations per candidate, at `costs` each) from group's budget."""
        if self.granule_cost is not None:
            self.left[group] -= int(math.ceil(np.sum(grants) / granule))
        else:
            self.left[group] -= float(np.sum(grants * costs))


class Prices(Protocol):
    """What growth asks about costs, whatever the unit (`UnitPrices`, `TokenPrices`)."""

    unit: str  # what the budget counts: one of BUDGET_UNITS
    budget: float  # a step's budget, in `unit`

    def ledger(self, budget: float | None = None) -> BudgetLedger: ...

    def fresh(self, prompt_ids: Sequence[str]) -> np.ndarray | None: ...

    def continuation(self, tree: Tree, node_ids: Sequence[int]) -> np.ndarray: ...

    def cost(self, grants: np.ndarray, costs: np.ndarray) -> float: ...

    def prefix_budgets(self, left: float, counts: np.ndarray, fresh_cost: np.ndarray, granule: int) -> np.ndarray: ...

    def purse(self, budgets: np.ndarray, granule: int) -> Purse: ...

    def observe(self, trees: Sequence[Tree]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class UnitPrices:
    """Prices in trajectory units: a fresh rollout 1, a continuation `continuation_cost`."""

    unit = "units"

    def __init__(self, budget: float, continuation_cost: float = CONTINUATION_COST, token_cap: int | None = None):
        self.budget = float(budget)
        self.continuation_cost = float(continuation_cost)
        self.token_cap = token_cap

    def ledger(self, budget: float | None = None) -> BudgetLedger:
        """A fresh ledger holding `budget` (a step's budget by default) in this unit."""
        return BudgetLedger(self.budget if budget is None else budget, self.token_cap, self.continuation_cost,
                            unit=self.unit)

    def fresh(self, prompt_ids: Sequence[str]) -> np.ndarray | None:
        """(P,) cost of one fresh rollout of each prompt; None when every one costs 1 (the stage-1 solvers then
        take their integer path)."""
        return None

    def continuation(self, tree: Tree, node_ids: Sequence[int]) -> np.ndarray:
        """(Y,) cost of one continuation from each node of `tree`."""
        return np.full(len(node_ids), self.continuation_cost)

    def cost(self, grants: np.ndarray, costs: np.ndarray) -> float:
        """What `grants` continuations at `costs` each take from the budget."""
        return float(np.sum(grants)) * self.continuation_cost

    def prefix_budgets(self, left: float, counts: np.ndarray, fresh_cost: np.ndarray, granule: int) -> np.ndarray:
        """Stage 2's budget (`left` after stage 1) across the selected prompts, in proportion to their stage-1
        grants `counts`, in whole granules of `granule` continuations."""
        unit = granule * self.continuation_cost
        return split_whole(int(left // unit + 1e-9), counts) * unit

    def purse(self, budgets: np.ndarray, granule: int) -> Purse:
        return Purse(budgets, granule * self.continuation_cost)

    def observe(self, trees: Sequence[Tree]) -> None:
        """Learn from a step's trees (nothing to learn in units)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class TokenPrices(UnitPrices):
    """Prices in expected sampled tokens (`TokenEstimate`, learned over the run); units still counted."""

    unit = "tokens"

    def __init__(self, budget: float, continuation_cost: float = CONTINUATION_COST, token_cap: int | None = None,
                 default_rollout_tokens: float = 256):
        super().__init__(budget, continuation_cost, token_cap)
        self.tokens = TokenEstimate(default_rollout_tokens)

    def fresh(self, prompt_ids: Sequence[str]) -> np.ndarray:
        return self.tokens.rollout(prompt_ids)

    def continuation(self, tree: Tree, node_ids: Sequence[int]) -> np.ndarray:
        return self.tokens.continuation(tree, node_ids)

    def cost(self, grants: np.ndarray, costs: np.ndarray) -> float:
        return float(np.sum(grants * costs))

    def prefix_budgets(self, left: float, counts: np.ndarray, fresh_cost: np.ndarray, granule: int) -> np.ndarray:
        """In proportion to what the prompts' stage-1 grants cost."""
        return split_budget(left, counts * fresh_cost)

    def purse(self, budgets: np.ndarray, granule: int) -> Purse:
        return Purse(budgets, None)

    def observe(self, trees: Sequence[Tree]) -> None:
        self.tokens.observe(trees)

    def state_dict(self) -> dict[str, Any]:
        return {"rollout_tokens": self.tokens.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rollout_tokens" in state:
            self.tokens.load_state_dict(state["rollout_tokens"])


def make_prices(config: Any) -> Prices:
    """The prices of `config` (an `AllocationConfig`; not imported, since the method presets import this module):
    its budget unit, step budget, continuation cost and token cap, read here only."""
    if config.budget_unit == "units":
        return UnitPrices(config.budget, config.continuation_cost, config.token_cap)
    budget = float(config.token_budget or config.budget * config.default_rollout_tokens)
    return TokenPrices(budget, config.continuation_cost, config.token_cap, config.default_rollout_tokens)


def make_ledger(config: Any, budget: float | None = None) -> BudgetLedger:
    """A ledger of `config`'s unit holding `budget` (a step's budget by default)."""
    return make_prices(config).ledger(budget)
