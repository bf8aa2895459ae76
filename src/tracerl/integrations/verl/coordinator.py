"""The run's success predictor, shared by the manager (stage 1) and the workers (stage 2), as one Ray actor, and
the step's measures from the trees it collects.

verl's manager runs in the trainer's process and its workers are separate Ray actors, and V1's
`generate_sequences` returns nothing: trees never come back through verl. So one `TraceCoordinator` actor holds
the predictor. The manager asks it for the batch's root probabilities; workers ask it for prefix probabilities
while they expand, and hand it each finished tree (`observe`). At the start of the next training batch the
manager calls `flush`: the predictor is scored on the buffered trees' nodes *before* it learns from them
(`predictor/brier`, `ece`, `auc`), then updated on their natural backup targets, as tracerl's own trainer does
each step; and the trees' spend and measures are computed with the step's own names (`spent_ledger`,
`tracerl.core.metrics`): `alloc/units_root`, `alloc/units_prefix`, `alloc/tokens_root`, `alloc/tokens_prefix`,
`alloc/effective_ratio`, `alloc/informative_*`, `rollout/units`, `rollout/tokens`. The last flushed step's trees
stay readable (`trees`) for logging, export and tests.

The actor lives in a process of its own, so it builds its own copy of the run's domain (`task_domain`, from plain
settings) to hand the predictor the domain's state features, as the trainer does.

Plain Python + numpy; the manager wraps it with `ray.remote`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.history import History
from tracerl.core.ledger import BudgetLedger, Prices, make_prices
from tracerl.core.predictor import make_predictor
from tracerl.core.step import learn, measure
from tracerl.core.tree import Tree
from tracerl.integrations.verl.config import TraceVerlConfig, task_domain


def spent_ledger(trees: Sequence[Tree], prices: Prices) -> BudgetLedger:
    """A ledger charged with what the trees' rollouts spent, by kind as the trainer's step charges it: "root" for
    each fresh rollout (a leaf whose rollout started at the root, failed ones included), "prefix" for each
    continuation at the prices' cost from its anchor; tokens are the policy tokens the nodes of each kind hold."""
    charges = []  # (kind, rollouts, cost, tokens) per tree and kind
    for tree in trees:
        leaves = [tree.nodes[i] for i in tree.leaves()]
        anchors = [leaf.anchor_id for leaf in leaves if leaf.anchor_id != 0]
        fresh = prices.fresh([tree.prompt_id])
        num_fresh = len(leaves) - len(anchors)
        tokens = {kind: sum(sum(n.segment.mask) for n in tree.nodes[1:] if n.origin == origin)
                  for kind, origin in (("root", "bare"), ("prefix", "continuation"))}
        charges.append(("root", num_fresh, num_fresh * (1.0 if fresh is None else float(fresh[0])), tokens["root"]))
        costs = prices.continuation(tree, anchors)
        charges.append(("prefix", len(anchors), prices.cost(np.ones(len(anchors)), costs), tokens["prefix"]))
    ledger = prices.ledger(sum(cost for _, _, cost, _ in charges))
    for kind, num, cost, tokens in charges:
        ledger.charge(ledger.rollout_units(num, continuation=kind == "prefix"), tokens=tokens, kind=kind, cost=cost)
    return ledger


def step_metrics(trees: Sequence[Tree], config: TraceVerlConfig) -> dict[str, float]:
    """The measures `tracerl.core.step.run_step` logs, from trees grown by verl's workers: the spend by kind, the
    informative and mixed counts over it (advantages per tree, as the workers computed them)."""
    ledger = spent_ledger(trees, make_prices(config.allocation))
    options = AdvantageConfig(**config.advantage_options)
    name = config.advantage_name
    advs = [compute_advantages(name, [tree], options)[0] for tree in trees]
    _, measured = measure(trees, advs, ledger, name, options)  # tracerl.core.step's, the trainer's own
    return {**{key: float(value) for key, value in measured.items()}, "alloc/num_trees": float(len(trees))}


class TraceCoordinator:
    def __init__(self, config: TraceVerlConfig, task: dict[str, Any]):
        """`config`: the run's tracerl section; `task`: verl's task settings (`config.task_settings`), from which
        the domain (and its state features) is built here, in the actor's own process."""
        self.config = config
        domain = task_domain(task, config.domain, config.domain_options)
        self.predictor = make_predictor(config.predictor.name, seed=config.seed, state_features=domain.state_features,
                                        **config.predictor.options)
        self.pending: dict[str, dict[str, Any]] = {}  # uid -> tree dict, since the last flush
        self.flushed: dict[str, dict[str, Any]] = {}  # the last flush's trees
        self.counters: Counter[str] = Counter()  # summed over the run
        self.num_updates = 0

    def ping(self) -> bool:
        return True

    def predict(self, histories: Sequence[History]) -> np.ndarray:
        return np.asarray(self.predictor.predict(list(histories)), dtype=float)

    def observe(self, uid: str, tree: dict[str, Any], counters: dict[str, int]) -> None:
        """A finished tree (as `Tree.to_dict`) and the rollout counters of growing it."""
        self.pending[uid] = tree
        self.counters.update(counters)

    def flush(self) -> dict[str, float]:
        """Score the predictor on the pending trees, update it on them, and return the metrics with the trees'
        spend and measures."""
        if not self.pending:
            return {}
        trees = [Tree.from_dict(t) for t in self.pending.values()]
        metrics: dict[str, float] = {"predictor/num_trees": float(len(trees))}
        learned = learn(self.predictor, trees)  # tracerl.core.step's, the trainer's own
        metrics.update(learned.metrics)
        metrics.update(step_metrics(trees, self.config))
        self.num_updates += learned.scored is not None
        self.flushed, self.pending = self.pending, {}
        return metrics

    def trees(self, pending: bool = True) -> dict[str, dict[str, Any]]:
        """uid -> tree dict: the trees not yet flushed (default), or those of the last flush."""
        return dict(self.pending if pending else self.flushed)

    def stats(self) -> dict[str, Any]:
        return {"counters": dict(self.counters), "num_updates": self.num_updates,
                "predictor_state": self.predictor.state_dict()}
