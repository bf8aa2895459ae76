"""Success predictors V(h) -> p: the probability that a rollout continued from prefix h succeeds.

The predictor only steers budget (docs/design.md, section 2); it never touches the policy gradient. Each
step it is scored on the step's fresh nodes (see `calibration`), then updated on
`(h_y, Vhat(y), weight n_y)`: the node's backed-up success rate, weighted by its number of leaves,
with weighted binary cross-entropy. All predictors share one interface (`Predictor`) and a registry by name
(`PREDICTORS`: name -> "module:attr", resolved on first use; `make_predictor`), so the allocator can be run with any
of them, the oracle and the torch heads of `tracerl.predictors` included, and nothing registers on import.

* `HashedLogisticPredictor` ("hashed_logistic", the default): logistic regression over
  `HashedFeatures`, Adam with L2, refit each update on a bounded FIFO replay window so it tracks a
  moving policy, with online Platt recalibration on its own out-of-sample predictions.
* `ConstantPredictor` ("constant"): a fixed p, or the running weighted mean of the targets.
* `OraclePredictor` ("oracle"): the true p from a simulator; nothing to learn, nothing to save.

Deliberately not here: torch heads (`tracerl.predictors`, named in `PREDICTORS`), files (see
`tracerl.io.files.state`), metric namespacing (callers log keys under `predictor/`).
"""

from __future__ import annotations

import math
import importlib
from typing import Any, Callable, Sequence

import numpy as np

from tracerl.core.calibration import platt_fit
from tracerl.core.features import HashedFeatures, SparseBatch, StateFeatures
from tracerl.core.history import History

P_MIN, P_MAX = 1e-4, 1 - 1e-4  # predictions are clipped here: a predictor is never certain
CAL_LOGIT_CLIP = 8.0  # recalibration reads logits clipped to +-8 (p in [3e-4, 0.9997]): a few extreme ones cannot
#                       dominate the (a, b) fit


def check_targets(histories: Sequence[History], targets, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """Validate update inputs: targets in [0, 1], weights >= 0 (default 1), one of each per history."""
    num = len(histories)
    targets = np.asarray(targets, dtype=float)
    weights = np.ones(num) if weights is None else np.asarray(weights, dtype=float)
    if targets.shape != (num,) or weights.shape != (num,):
        raise ValueError(f"got {num} histories, targets of shape {targets.shape}, weights of shape "
                         f"{weights.shape}; pass one target (Vhat) and one weight (leaf count) per history")
    if not (np.all(np.isfinite(targets)) and np.all(np.isfinite(weights))):
        raise ValueError("targets or weights contain NaN/inf; drop nodes with no leaves yet (Vhat undefined) "
                         "before updating the predictor")
    if np.any((targets < 0) | (targets > 1)):
        raise ValueError(f"targets must be success rates in [0, 1], got min {targets.min():.4g}, "
                         f"max {targets.max():.4g}")
    if np.any(weights < 0):
        raise ValueError("weights must be >= 0 (use each node's number of leaves n_y)")
    return targets, weights


def weighted_bce(p: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> float:
    """sum_i w_i * -(t_i log p_i + (1 - t_i) log(1 - p_i)) / sum_i w_i (NaN for zero total weight)."""
    total = weights.sum()
    if total <= 0:
        return float("nan")
    p = np.clip(p, P_MIN, P_MAX)
    return float(-np.sum(weights * (targets * np.log(p) + (1 - targets) * np.log1p(-p))) / total)


class Predictor:
    """Interface of every success predictor. Subclasses set `name` and implement the five methods; their constructor
    takes `seed` (every draw they make comes from it), and `state_features` when `reads_state_features`."""

    name: str = ""
    reads_state_features: bool = False  # whether the constructor takes the domain's `state_features` hook

    def predict(self, histories: Sequence[History]) -> np.ndarray:
        """(len(histories),) success probabilities in [P_MIN, P_MAX]."""
        raise NotImplementedError

    def update(self, histories: Sequence[History], targets, weights=None) -> dict[str, float]:
        """Fit on backed-up targets Vhat in [0, 1] with weights n_y (weighted BCE); returns training metrics."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Constructor kwargs (JSON-friendly) that rebuild this predictor via `make_predictor(name, **config)`."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Learned state: JSON-friendly scalars, lists, dicts and numpy arrays only."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))


def adam_step(param: np.ndarray, m: np.ndarray, v: np.ndarray, grad: np.ndarray, lr: float, t: int,
              beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
    """One Adam step (Kingma & Ba 2015), in place on `param`, `m`, `v`; `t` >= 1 counts steps for bias correction.

    m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  param -= lr * m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps).
    """
    m[...] = beta1 * m + (1 - beta1) * grad
    v[...] = beta2 * v + (1 - beta2) * grad * grad
    param -= lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)


class HashedLogisticPredictor(Predictor):
    """p = sigmoid(w . x(h)), x = HashedFeatures; weighted BCE + L2 on the text weights, Adam, FIFO replay.

    Each `update` appends the new samples to the replay window (dropping the oldest past
    `replay_size`), then runs `num_epochs` shuffled passes of mini-batches over the whole window with
    the step size decaying linearly from `lr` to 0, so each refit settles near the regularised optimum
    on the current window instead of jittering by ~lr (which showed up as ECE). The defaults
    (lr 0.1, l2 1e-2) were the best-calibrated of a small grid on synthetic known-logistic tasks.
    Before any update the model predicts `prior` (the bias starts at logit(prior), all else at 0).
    Memory: the window holds ~12 bytes per distinct n-gram per sample (8192 samples of 1,500
    distinct n-grams is ~150 MB; lower `replay_size` for very long transcripts).

    num_buckets, ngram, feature_seed, norm_ngrams: the featuriser (see HashedFeatures).
    state_buckets: columns for the domain's state features (`state_features`, the domain's hook: multihop's hops
        remaining and whether the last search failed), exempt from L2 like the structural ones; 0 = text only.
        On multihop trees hashed n-grams alone rank prefixes barely better than chance (AUC 0.47-0.56): what decides
        success is how far the chain got, which no n-gram states (docs/predictors.md has the measurements).
    prior: prediction before any data; set it to the pool's expected success rate if known.
    lr: Adam step size; lower it for smoother, slower-moving predictions.
    l2: L2 penalty on the hashed text weights (the 5 structural ones are exempt); raise it if it overfits.
    replay_size: non-root samples kept; smaller tracks the policy faster, larger gives lower variance.
    root_replay_size: bare-prompt samples kept in a window of their own (0 = they share `replay_size`).
        Roots are ~5% of a step's nodes and are all stage 1 reads; in a shared FIFO, the evidence on prompts
        that stage 1 stopped selecting (because they looked hopeless or trivial) ages out within a few steps,
        their predictions drift back to the middle, and budget is wasted on them again.
    root_head: predict bare prompts (depth 0) with a second weight vector fit on the root window only.
        The shared model spends its capacity on the many prefix samples, and its root predictions come out
        squeezed towards the middle; stage 1 reads only root predictions, so it gets a head of its own
        (in `tracerl bench alloc`, seeds 0-4, it lifts trace from 0.884-0.890 to 0.90-0.91 of the oracle). Needs
        `root_replay_size` > 0.
    root_num_epochs: passes of the root head over the root window per update. Roots are one sample per prompt, so
        the head sees few mini-batches; with `num_epochs` passes it underfits (in `tracerl bench alloc`, seeds
        0-4: 2 passes gave trace 0.897 of the oracle, 6 gave 0.909, 10 gave 0.911).
    recalibrate: pass each head's logit z through p = sigmoid(a z + b), with (a, b) refit every update
        (`calibration.platt_fit`) on the newest `calibration_window` (z, Vhat, n) triples the head produced *before*
        it learned from them, i.e. on its own out-of-sample predictions. On transcripts from a real policy the
        hashed text weights memorise the prompts of the window, and on the next step's new prompts the raw
        predictions miss the success rate by a wide margin (multihop, 12 steps of the embedded policy: raw Brier
        0.32 and ECE 0.26, worse than a constant; recalibrated 0.246 and 0.085). Where the raw model is already
        calibrated (the simulator) (a, b) stays near (1, 0). a > 0 keeps the ranking; a -> 0 when z carries no signal.
    calibration_window: (z, Vhat, n) triples kept per head for the recalibration fit.
    calibration_ridge: pull of (a, b) towards (1, 0), in samples (see `platt_fit`).
    num_epochs: passes over the window per update.
    batch_size: samples per mini-batch.
    seed: seeds the shuffling generator (its state is saved, so a resumed run continues identically).
    """

    name = "hashed_logistic"
    reads_state_features = True

    def __init__(self, num_buckets: int = 2**14, ngram: tuple[int, int] = (1, 2), feature_seed: int = 0,
                 norm_ngrams: int = 64, prior: float = 0.5, lr: float = 0.1, l2: float = 1e-2,
                 replay_size: int = 8192, root_replay_size: int = 4096, root_head: bool = True, root_num_epochs: int = 6,
                 recalibrate: bool = True, calibration_window: int = 2048, calibration_ridge: float = 1.0,
                 num_epochs: int = 2, batch_size: int = 256, seed: int = 0, state_buckets: int = 4096,
                 state_features: StateFeatures | None = None):
        if not 0 < prior < 1:
            raise ValueError(f"prior={prior}; use a probability strictly between 0 and 1 (default 0.5)")
        if lr <= 0 or l2 < 0:
            raise ValueError(f"lr={lr}, l2={l2}; use lr > 0 and l2 >= 0")
        if replay_size < 1 or root_replay_size < 0 or num_epochs < 1 or root_num_epochs < 1 or batch_size < 1:
            raise ValueError(f"replay_size={replay_size}, num_epochs={num_epochs}, root_num_epochs={root_num_epochs}, "
                             f"batch_size={batch_size}; each must be >= 1")
        if calibration_window < 1 or calibration_ridge <= 0:
            raise ValueError(f"calibration_window={calibration_window}, calibration_ridge={calibration_ridge}; use a "
                             "window >= 1 and a ridge > 0 (or recalibrate=False)")
        if root_head and root_replay_size < 1:
            raise ValueError("root_head=True needs root_replay_size >= 1 (the root head fits on the root window); "
                             "set root_head=False to predict roots with the shared model")
        self.features = HashedFeatures(num_buckets=num_buckets, ngram=tuple(ngram), seed=feature_seed,
                                       norm_ngrams=norm_ngrams, state_buckets=state_buckets,
                                       state_features=state_features)
        self.prior, self.lr, self.l2 = float(prior), float(lr), float(l2)
        self.replay_size, self.num_epochs, self.batch_size = int(replay_size), int(num_epochs), int(batch_size)
        self.root_num_epochs = int(root_num_epochs)
        self.root_replay_size, self.root_head = int(root_replay_size), bool(root_head)
        self.recalibrate, self.calibration_window = bool(recalibrate), int(calibration_window)
        self.calibration_ridge = float(calibration_ridge)
        self.seed = int(seed)
        num_cols = self.features.num_cols
        self.bias_col = self.features.column("bias")
        self.heads = {"shared": _Head(num_cols, self.bias_col, self.prior)}
        if self.root_head:
            self.heads["root"] = _Head(num_cols, self.bias_col, self.prior)
        self.l2_mask = np.ones(num_cols)  # 0 on the structural and state columns: they cannot memorise samples
        self.l2_mask[self.features.num_buckets:] = 0.0
        self.rng = np.random.default_rng(self.seed)
        self.replay_x = SparseBatch(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                                    0, num_cols)
        self.replay_targets = np.zeros(0)
        self.replay_weights = np.zeros(0)
        self.replay_is_root = np.zeros(0, dtype=bool)

    # ------------------------------------------------------------------ Predictor
    def predict(self, histories: Sequence[History]) -> np.ndarray:
        """p_i = clip(sigmoid(a z_i + b), P_MIN, P_MAX), z_i = sum_j w_j x_ij of the row's head ((a, b) = (1, 0)
        without recalibration)."""
        z, heads = self._logits(self.features.transform(histories), histories)
        p = np.empty(len(histories))
        for name, rows in heads.items():
            head = self.heads[name]
            if self.recalibrate:
                p[rows] = _sigmoid(head.cal_a * np.clip(z[rows], -CAL_LOGIT_CLIP, CAL_LOGIT_CLIP) + head.cal_b)
            else:
                p[rows] = _sigmoid(z[rows])
        return np.clip(p, P_MIN, P_MAX)

    def update(self, histories: Sequence[History], targets, weights=None) -> dict[str, float]:
        """Append (x(h), Vhat, n) to the replay window and refit; returns loss_new (BCE on the new samples
        before fitting), loss (BCE over the window after fitting), replay_size, num_samples."""
        targets, weights = check_targets(histories, targets, weights)
        loss_new = weighted_bce(self.predict(histories), targets, weights)
        x_new = self.features.transform(histories)
        if self.recalibrate:  # the logits of samples the heads have not learned from yet
            z, heads = self._logits(x_new, histories)
            for name, rows in heads.items():
                self.heads[name].recalibrate(z[rows], targets[rows], weights[rows], self.calibration_window,
                                             self.calibration_ridge)
        is_root = np.array([h.depth == 0 for h in histories], dtype=bool) if self.root_replay_size \
            else np.zeros(len(histories), dtype=bool)
        self._append(x_new, targets, weights, is_root)
        self._fit(self.heads["shared"], np.arange(self.replay_x.num_rows), self.num_epochs)
        if self.root_head:
            self._fit(self.heads["root"], np.flatnonzero(self.replay_is_root), self.root_num_epochs)
        loss = weighted_bce(self._predict_x(self.replay_x, self.heads["shared"]), self.replay_targets,
                            self.replay_weights)
        return {"loss": loss, "loss_new": loss_new, "replay_size": float(self.replay_x.num_rows),
                "num_samples": float(len(targets))}

    def config(self) -> dict[str, Any]:
        return {"num_buckets": self.features.num_buckets, "ngram": list(self.features.ngram),
                "feature_seed": self.features.seed, "norm_ngrams": self.features.norm_ngrams,
                "state_buckets": self.features.state_buckets, "prior": self.prior, "lr": self.lr, "l2": self.l2,
                "replay_size": self.replay_size,
                "root_replay_size": self.root_replay_size, "root_head": self.root_head,
                "root_num_epochs": self.root_num_epochs, "recalibrate": self.recalibrate,
                "calibration_window": self.calibration_window, "calibration_ridge": self.calibration_ridge,
                "num_epochs": self.num_epochs, "batch_size": self.batch_size, "seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        x = self.replay_x
        return {
            **{f"{name}/{key}": value for name, head in self.heads.items() for key, value in head.state().items()},
            "rng": self.rng.bit_generator.state,
            "replay_rows": x.rows.copy(), "replay_cols": x.cols.copy(), "replay_values": x.values.copy(),
            "replay_num_rows": x.num_rows, "replay_targets": self.replay_targets.copy(),
            "replay_weights": self.replay_weights.copy(), "replay_is_root": self.replay_is_root.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        num_cols = self.features.num_cols
        for name, head in self.heads.items():
            if f"{name}/weights" not in state:
                raise ValueError(f"state has no {name!r} head; build the predictor with the saved config "
                                 "(root_head) before loading its state")
            if np.shape(state[f"{name}/weights"]) != (num_cols,):
                raise ValueError(f"state has {np.shape(state[f'{name}/weights'])} weights but this predictor has "
                                 f"{num_cols} columns; build it with the saved config (num_buckets) first")
            head.load({key: state[f"{name}/{key}"] for key in head.state()})
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self.replay_x = SparseBatch(np.asarray(state["replay_rows"], np.int32),
                                    np.asarray(state["replay_cols"], np.int32),
                                    np.asarray(state["replay_values"], np.float32),
                                    int(state["replay_num_rows"]), num_cols)
        self.replay_targets = np.array(state["replay_targets"], dtype=float)
        self.replay_weights = np.array(state["replay_weights"], dtype=float)
        self.replay_is_root = np.array(state["replay_is_root"], dtype=bool)

    # ------------------------------------------------------------------ internals
    def _logits(self, x: SparseBatch, histories: Sequence[History]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Raw logits z (len(histories),) and the rows each head predicts: bare prompts go to the root head
        when there is one, everything else to the shared head."""
        z = x.dot(self.heads["shared"].weights)
        if not self.root_head:
            return z, {"shared": np.arange(len(histories))}
        is_root = np.array([h.depth == 0 for h in histories], dtype=bool)
        roots = np.flatnonzero(is_root)
        if len(roots):
            z[roots] = x.take(roots).dot(self.heads["root"].weights)
        return z, {"shared": np.flatnonzero(~is_root), "root": roots}

    def _predict_x(self, x: SparseBatch, head: "_Head") -> np.ndarray:
        """The head's raw (uncalibrated) probabilities: what its fit minimises the BCE of."""
        return np.clip(_sigmoid(x.dot(head.weights)), P_MIN, P_MAX)

    def _fit(self, head: "_Head", rows: np.ndarray, num_epochs: int) -> None:
        """`num_epochs` shuffled mini-batch passes of `head` over the window rows `rows`, lr decaying to 0."""
        num = len(rows)
        if num == 0:
            return
        num_batches = -(-num // self.batch_size)
        total_steps = num_epochs * num_batches
        for epoch in range(num_epochs):
            order = rows[self.rng.permutation(num)]
            for b in range(num_batches):
                # lr decays linearly to 0 within the update: the refit settles near the window's optimum
                lr = self.lr * (1 - (epoch * num_batches + b) / total_steps)
                self._step(head, order[b * self.batch_size:(b + 1) * self.batch_size], lr)

    def _append(self, x_new: SparseBatch, targets: np.ndarray, weights: np.ndarray, is_root: np.ndarray) -> None:
        """FIFO per window: keep the newest `root_replay_size` roots and the newest `replay_size` others."""
        x = SparseBatch.concat([self.replay_x, x_new])
        targets = np.concatenate([self.replay_targets, targets])
        weights = np.concatenate([self.replay_weights, weights])
        is_root = np.concatenate([self.replay_is_root, is_root])
        keep = np.ones(len(targets), dtype=bool)
        for members, size in ((is_root, self.root_replay_size), (~is_root, self.replay_size)):
            rows = np.flatnonzero(members)
            keep[rows[: max(0, len(rows) - size)]] = False
        if not keep.all():
            rows = np.flatnonzero(keep)
            x, targets, weights, is_root = x.take(rows), targets[rows], weights[rows], is_root[rows]
        self.replay_x, self.replay_targets, self.replay_weights, self.replay_is_root = x, targets, weights, is_root

    def _step(self, head: "_Head", idx: np.ndarray, lr: float) -> None:
        """One Adam step of `head` on the mini-batch `idx` of the replay window.

        grad = X_b^T (s * (p - t)) / sum(s) + l2 * w (text columns only), with s the sample weights.
        """
        s = self.replay_weights[idx]
        total = s.sum()
        if total <= 0:
            return
        x = self.replay_x.take(idx)
        p = _sigmoid(x.dot(head.weights))
        grad = x.rdot(s * (p - self.replay_targets[idx]) / total) + self.l2 * self.l2_mask * head.weights
        head.num_steps += 1
        adam_step(head.weights, head.adam_m, head.adam_v, grad, lr, head.num_steps)


class _Head:
    """One logistic weight vector with its Adam moments; the bias starts at logit(prior), all else at 0.
    Plus its Platt recalibration (a, b) and the window of out-of-sample (z, Vhat, n) it is fit on."""

    def __init__(self, num_cols: int, bias_col: int, prior: float):
        self.weights = np.zeros(num_cols)
        self.weights[bias_col] = math.log(prior / (1 - prior))
        self.adam_m = np.zeros(num_cols)
        self.adam_v = np.zeros(num_cols)
        self.num_steps = 0  # Adam steps taken (for bias correction)
        self.cal_a, self.cal_b = 1.0, 0.0
        self.cal_z, self.cal_t, self.cal_w = np.zeros(0), np.zeros(0), np.zeros(0)

    def recalibrate(self, z: np.ndarray, targets: np.ndarray, weights: np.ndarray, window: int, ridge: float) -> None:
        """Append out-of-sample triples (FIFO, newest `window` kept) and refit (a, b)."""
        self.cal_z = np.concatenate([self.cal_z, np.clip(z, -CAL_LOGIT_CLIP, CAL_LOGIT_CLIP)])[-window:]
        self.cal_t = np.concatenate([self.cal_t, targets])[-window:]
        self.cal_w = np.concatenate([self.cal_w, weights])[-window:]
        self.cal_a, self.cal_b = platt_fit(self.cal_z, self.cal_t, self.cal_w, ridge=ridge)

    def state(self) -> dict[str, Any]:
        return {"weights": self.weights.copy(), "adam_m": self.adam_m.copy(), "adam_v": self.adam_v.copy(),
                "num_steps": self.num_steps, "cal_a": self.cal_a, "cal_b": self.cal_b, "cal_z": self.cal_z.copy(),
                "cal_t": self.cal_t.copy(), "cal_w": self.cal_w.copy()}

    def load(self, state: dict[str, Any]) -> None:
        self.weights = np.array(state["weights"], dtype=float)
        self.adam_m = np.array(state["adam_m"], dtype=float)
        self.adam_v = np.array(state["adam_v"], dtype=float)
        self.num_steps = int(state["num_steps"])
        self.cal_a, self.cal_b = float(state["cal_a"]), float(state["cal_b"])
        self.cal_z, self.cal_t, self.cal_w = (np.array(state[k], dtype=float) for k in ("cal_z", "cal_t", "cal_w"))


class ConstantPredictor(Predictor):
    """Predicts `p`; with `track_mean`, the weighted mean of all targets seen so far (an ablation baseline).

    p_pred = sum_i n_i Vhat_i / sum_i n_i over every update (p before any data with positive weight).
    """

    name = "constant"

    def __init__(self, p: float = 0.5, track_mean: bool = False, seed: int = 0):  # seed: nothing here is random
        if not 0 <= p <= 1:
            raise ValueError(f"p={p}; use a probability in [0, 1]")
        self.p, self.track_mean = float(p), bool(track_mean)
        self.sum_weighted_targets = 0.0
        self.sum_weights = 0.0

    def current(self) -> float:
        if self.track_mean and self.sum_weights > 0:
            return self.sum_weighted_targets / self.sum_weights
        return self.p

    def predict(self, histories: Sequence[History]) -> np.ndarray:
        return np.full(len(histories), float(np.clip(self.current(), P_MIN, P_MAX)))

    def update(self, histories: Sequence[History], targets, weights=None) -> dict[str, float]:
        targets, weights = check_targets(histories, targets, weights)
        loss_new = weighted_bce(self.predict(histories), targets, weights)
        self.sum_weighted_targets += float(np.sum(weights * targets))
        self.sum_weights += float(np.sum(weights))
        return {"loss_new": loss_new, "p": self.current(), "num_samples": float(len(targets))}

    def config(self) -> dict[str, Any]:
        return {"p": self.p, "track_mean": self.track_mean}

    def state_dict(self) -> dict[str, Any]:
        return {"sum_weighted_targets": self.sum_weighted_targets, "sum_weights": self.sum_weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sum_weighted_targets = float(state["sum_weighted_targets"])
        self.sum_weights = float(state["sum_weights"])


class OraclePredictor(Predictor):
    """The true success probability from `lookup(histories) -> (n,) array`, e.g. a simulator's meta["true_p"].

    For the `trace-oracle` ablation: the allocation's upper bound with a perfect predictor. It learns
    nothing and cannot be saved (the lookup is code, not state).
    """

    name = "oracle"

    def __init__(self, lookup: Callable[[Sequence[History]], np.ndarray], seed: int = 0):  # seed: nothing random
        if not callable(lookup):
            raise ValueError("OraclePredictor needs lookup=callable(histories) -> array of true p, "
                             "e.g. lambda hs: [h.meta['true_p'] for h in hs]")
        self.lookup = lookup

    def predict(self, histories: Sequence[History]) -> np.ndarray:
        p = np.asarray(self.lookup(histories), dtype=float)
        if p.shape != (len(histories),) or not np.all((p >= 0) & (p <= 1)):
            raise ValueError(f"the oracle lookup must return one probability in [0, 1] per history; got shape "
                             f"{p.shape} for {len(histories)} histories (NaN or out-of-range values fail too)")
        return np.clip(p, P_MIN, P_MAX)

    def update(self, histories: Sequence[History], targets, weights=None) -> dict[str, float]:
        return {}

    def config(self) -> dict[str, Any]:
        raise ValueError("the oracle predictor cannot be saved or rebuilt from a config: its lookup is a "
                         "function; rebuild it with OraclePredictor(lookup) in code")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# name -> "module:attr" of its class, imported on first use (the torch heads need the `neural` extra)
PREDICTORS: dict[str, str] = {
    "hashed_logistic": "tracerl.core.predictor:HashedLogisticPredictor",
    "constant": "tracerl.core.predictor:ConstantPredictor",
    "oracle": "tracerl.core.predictor:OraclePredictor",
    "minilm_head": "tracerl.predictors.encoder_head:EncoderHeadPredictor",
    "lm_value": "tracerl.predictors.lm_value:LMValuePredictor",
}


def predictor_class(name: str) -> type[Predictor]:
    """The class registered as `name`; ValueError naming the choices, or ImportError naming the extra to install."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known predictors: {', '.join(sorted(PREDICTORS))}")
    module, attr = PREDICTORS[name].split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as err:
        raise ImportError(f"predictor {name!r} needs torch and transformers: pip install -e '.[neural]' "
                          f"({err})") from err


def make_predictor(name: str, *, seed: int = 0, state_features: StateFeatures | None = None,
                   **options: Any) -> Predictor:
    """Build the predictor `name` with `seed`, the domain's `state_features` hook (for those that read it) and its
    constructor options, e.g. `make_predictor("constant", p=0.3)`. The one way every caller builds a predictor."""
    cls = predictor_class(name)
    if cls.reads_state_features:
        options["state_features"] = state_features
    return cls(seed=seed, **options)
