"""The run's success predictor, shared by the manager (stage 1) and the workers (stage 2), as one Ray actor.

verl's manager runs in the trainer's process and its workers are separate Ray actors, and V1's
`generate_sequences` returns nothing: trees never come back through verl. So one `TraceCoordinator` actor holds
the predictor. The manager asks it for the batch's root probabilities; workers ask it for prefix probabilities
while they expand, and hand it each finished tree (`observe`). At the start of the next training batch the
manager calls `flush`: the predictor is scored on the buffered trees' nodes *before* it learns from them
(`predictor/brier`, `ece`, `auc`), then updated on their natural backup targets, as tracerl's own trainer does
each step. The last flushed step's trees stay readable (`trees`) for logging, export and tests.

Plain Python + numpy; the manager wraps it with `ray.remote`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.core.predictor import make_predictor
from tracerl.core.step import learn
from tracerl.core.tree import Tree


class TraceCoordinator:
    def __init__(self, predictor: str, predictor_options: dict[str, Any] | None = None):
        self.predictor = make_predictor(predictor, **dict(predictor_options or {}))
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
        """Score the predictor on the pending trees, update it on them, and return the metrics."""
        if not self.pending:
            return {}
        trees = [Tree.from_dict(t) for t in self.pending.values()]
        metrics: dict[str, float] = {"predictor/num_trees": float(len(trees))}
        learned = learn(self.predictor, trees)  # tracerl.core.step's, the trainer's own
        metrics.update(learned.metrics)
        self.num_updates += learned.scored is not None
        self.flushed, self.pending = self.pending, {}
        return metrics

    def trees(self, pending: bool = True) -> dict[str, dict[str, Any]]:
        """uid -> tree dict: the trees not yet flushed (default), or those of the last flush."""
        return dict(self.pending if pending else self.flushed)

    def stats(self) -> dict[str, Any]:
        return {"counters": dict(self.counters), "num_updates": self.num_updates,
                "predictor_state": self.predictor.state_dict()}
