"""A one-hidden-layer success predictor over hashed features ("hashed_mlp").

    p = clip(sigmoid(w . x + w2 . relu(x W1)), P_MIN, P_MAX),    x = HashedFeatures(h)

The linear skip `w . x` is exactly `HashedLogisticPredictor`'s model, so logistic regression is the
special case w2 = 0 (which is also the initial state: before any update the model predicts `prior`).
The constant `bias` feature column plays the role of both biases (its row of W1 is b1, its entry of
w is b2). Why a hidden layer: in agent transcripts the meaning of a signal depends on where the
rollout stands. On the simulator the hidden success probability moves as s' = s + d (1 - s) or
s (1 - d), so an up-move raises logit(p) by log(1 + d (1 - s) / s) - log(1 - d): about 2.3 at s = 0.05,
0.4 at s = 0.95 (d = 0.3). A logistic model over counts has one weight per word and cannot represent
that interaction of prompt and turn features.

Training reuses `HashedLogisticPredictor` unchanged: the same FIFO replay windows (roots apart), the
same shuffled mini-batch refit with a linearly decaying step size, the same `adam_step`. Only the
model (`_predict_x`) and the mini-batch step (`_step`) differ. The first layer stays sparse: a
mini-batch's few distinct columns are gathered into a small dense (rows, distinct columns) block,
so products are BLAS calls and no (N, num_cols) matrix is ever built. Adam on W1 is lazy (as in
TensorFlow's LazyAdam): only the rows of columns present in the mini-batch are updated, their L2
included, which keeps a step's cost independent of `num_buckets`.

Deliberately not here: deeper networks, embeddings of the policy's tokens, GPU (see the torch heads).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracerl.core.features import SparseBatch
from tracerl.core.predictor import (P_MAX, P_MIN, PREDICTORS, HashedLogisticPredictor, _sigmoid, adam_step)

BLOCK_ROWS = 256  # rows per dense block in the first layer: bounds a block at 256 x distinct columns floats


def compact(x: SparseBatch) -> tuple[np.ndarray, np.ndarray]:
    """(dense (num_rows, U), cols (U,)): x restricted to its U distinct columns, so x @ W == dense @ W[cols]."""
    cols, inverse = np.unique(x.cols, return_inverse=True)
    flat = x.rows.astype(np.int64) * cols.size + inverse
    dense = np.bincount(flat, weights=x.values, minlength=x.num_rows * cols.size)
    return dense.reshape(x.num_rows, cols.size), cols


def row_blocks(x: SparseBatch, block_rows: int = BLOCK_ROWS):
    """Yield (start, stop, rows start..stop-1 of x as a batch), slicing the sorted entries (no copy of the rest)."""
    indptr = x.indptr
    for start in range(0, x.num_rows, block_rows):
        stop = min(start + block_rows, x.num_rows)
        lo, hi = indptr[start], indptr[stop]
        yield start, stop, SparseBatch(x.rows[lo:hi] - np.int32(start), x.cols[lo:hi], x.values[lo:hi],
                                       stop - start, x.num_cols)


class HashedMLPPredictor(HashedLogisticPredictor):
    """p = sigmoid(w . x + w2 . relu(x W1)): logistic regression plus `num_hidden` ReLU units, same replay refit.

    Takes every `HashedLogisticPredictor` option (featuriser, prior, lr, l2, replay windows, epochs,
    batch size, seed) with the same meaning, plus:

    num_hidden: ReLU units; more can fit more interactions, each costs 8 bytes x 3 (weight, Adam m, v)
        per feature column (64 units over 2**14 buckets is ~25 MB of state).
    hidden_lr: Adam step size of W1 and w2 (decays with `lr` within an update); the hidden layer needs
        a smaller step than the linear part, whose features are sparse and each seen rarely.
    hidden_l2: L2 penalty on W1's text rows and on w2; raise it if the hidden layer overfits.
    init_std: std of W1's initial entries (w2 starts at 0, so the first prediction is the prior);
        the default gives pre-activations of order 1 for rows of ~norm_ngrams n-grams.
    The initial W1 is drawn from `seed` (a generator of its own, so the shuffling stream is the
    logistic model's).
    """

    name = "hashed_mlp"
    _HIDDEN_STATE = ("hidden_weights", "hidden_adam_m", "hidden_adam_v",
                     "output_weights", "output_adam_m", "output_adam_v")  # saved next to the logistic state

    def __init__(self, num_hidden: int = 32, hidden_lr: float = 0.01, hidden_l2: float = 1e-3,
                 init_std: float = 0.1, **kwargs: Any):
        super().__init__(**kwargs)
        if num_hidden < 1 or hidden_lr <= 0 or hidden_l2 < 0 or init_std <= 0:
            raise ValueError(f"num_hidden={num_hidden}, hidden_lr={hidden_lr}, hidden_l2={hidden_l2}, "
                             f"init_std={init_std}; use num_hidden >= 1, hidden_lr > 0, hidden_l2 >= 0, init_std > 0")
        self.num_hidden, self.hidden_lr = int(num_hidden), float(hidden_lr)
        self.hidden_l2, self.init_std = float(hidden_l2), float(init_std)
        init_rng = np.random.default_rng((self.seed, 1))
        num_cols = self.features.num_cols
        self.hidden_weights = init_rng.normal(0.0, self.init_std, size=(num_cols, self.num_hidden))  # W1
        self.hidden_weights[self.bias_col] = 0.0  # b1 starts at 0
        self.hidden_adam_m = np.zeros((num_cols, self.num_hidden))
        self.hidden_adam_v = np.zeros((num_cols, self.num_hidden))
        self.output_weights = np.zeros(self.num_hidden)  # w2
        self.output_adam_m = np.zeros(self.num_hidden)
        self.output_adam_v = np.zeros(self.num_hidden)

    # ------------------------------------------------------------------ Predictor
    def config(self) -> dict[str, Any]:
        return {**super().config(), "num_hidden": self.num_hidden, "hidden_lr": self.hidden_lr,
                "hidden_l2": self.hidden_l2, "init_std": self.init_std}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **{k: getattr(self, k).copy() for k in self._HIDDEN_STATE}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        want = (self.features.num_cols, self.num_hidden)
        if np.shape(state["hidden_weights"]) != want:
            raise ValueError(f"state has hidden weights of shape {np.shape(state['hidden_weights'])} but this "
                             f"predictor has {want}; build it with the saved config (num_buckets, num_hidden) first")
        super().load_state_dict(state)
        for key in self._HIDDEN_STATE:
            setattr(self, key, np.array(state[key], dtype=float))

    # ------------------------------------------------------------------ internals
    def _predict_x(self, x: SparseBatch) -> np.ndarray:
        z = x.dot(self.weights)
        for start, stop, block in row_blocks(x):
            dense, cols = compact(block)
            z[start:stop] += np.maximum(dense @ self.hidden_weights[cols], 0.0) @ self.output_weights
        return np.clip(_sigmoid(z), P_MIN, P_MAX)

    def _step(self, idx: np.ndarray, lr: float) -> None:
        """One Adam step on the mini-batch `idx` of the replay window (backprop through one ReLU layer).

        With g = s * (p - t) / sum(s) (s the sample weights), a = x W1 (restricted to the batch's columns):
        grad w = X^T g + l2 w,  grad w2 = relu(a)^T g + hidden_l2 w2,
        grad W1 = X^T ((g w2^T) * [a > 0]) + hidden_l2 W1 (text rows only; structural rows are exempt).
        """
        s = self.replay_weights[idx]
        total = s.sum()
        if total <= 0:
            return
        x = self.replay_x.take(idx)
        dense, cols = compact(x)  # (B, U), (U,)
        w1 = self.hidden_weights[cols]  # (U, H)
        pre = dense @ w1  # (B, H)
        act = np.maximum(pre, 0.0)
        p = _sigmoid(x.dot(self.weights) + act @ self.output_weights)
        g = s * (p - self.replay_targets[idx]) / total  # (B,)
        grad = x.rdot(g) + self.l2 * self.l2_mask * self.weights
        grad_out = act.T @ g + self.hidden_l2 * self.output_weights
        delta = np.outer(g, self.output_weights) * (pre > 0)  # (B, H)
        grad_w1 = dense.T @ delta + self.hidden_l2 * self.l2_mask[cols, None] * w1  # (U, H)
        self.num_steps += 1
        t, hidden_lr = self.num_steps, self.hidden_lr * lr / self.lr  # the hidden step decays with lr
        adam_step(self.weights, self.adam_m, self.adam_v, grad, lr, t)
        adam_step(self.output_weights, self.output_adam_m, self.output_adam_v, grad_out, hidden_lr, t)
        m, v = self.hidden_adam_m[cols], self.hidden_adam_v[cols]  # lazy Adam: only the batch's rows
        adam_step(w1, m, v, grad_w1, hidden_lr, t)
        self.hidden_weights[cols], self.hidden_adam_m[cols], self.hidden_adam_v[cols] = w1, m, v


PREDICTORS[HashedMLPPredictor.name] = HashedMLPPredictor
