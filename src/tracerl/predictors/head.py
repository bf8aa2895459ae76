"""A torch MLP head over dense embeddings of prefix histories: the shared machinery of the neural predictors.

`EmbeddingHeadPredictor` implements the `tracerl.core.predictor.Predictor` interface for any predictor whose
input is a fixed-size embedding of the history text (a sentence encoder's mean-pooled output, a causal
LM's last hidden state) plus the five structural features the numpy model uses (`tracerl.core.features`):

    x(h) = [e(text(h)), depth, num_tool_errors, log(1 + num_tokens), 1{depth = 0}]
    p(h) = sigmoid(MLP(x(h)))          (a logistic head when hidden_size = 0)

trained like `HashedLogisticPredictor`: each `update` appends `(h, Vhat, n)` to a bounded FIFO replay window
and refits on the whole window with Adam (weighted BCE on the soft targets, L2 as weight decay, the step
size decaying linearly to 0 within an update). With a frozen encoder, embeddings are cached by text (LRU)
and stored in the replay window, so a step's nodes are encoded once for predict and update, and the window
is never re-encoded. Subclasses supply `_embed(texts, grad)`; one that trains its encoder (`train_base`)
re-embeds each mini-batch with gradients instead.

Deliberately not here: model loading (subclasses), a separate root head (the `is_root` input lets the
MLP treat bare prompts apart), device placement beyond one `device` string, torch thread settings (the
caller's choice), multi-process training.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tracerl.core.features import STRUCTURAL_COLUMNS, check_histories
from tracerl.core.history import History
from tracerl.core.predictor import P_MAX, P_MIN, Predictor, check_targets, weighted_bce

# the structural columns of the numpy model, less its bias (the head's first layer has one)
STRUCTURAL_INPUTS = tuple(c for c in STRUCTURAL_COLUMNS if c != "bias")
assert STRUCTURAL_INPUTS == ("depth", "num_tool_errors", "log_tokens", "is_root"), "features.py changed its columns"


def structural_features(depth: np.ndarray, num_tool_errors: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
    """(N, 4) float32: depth, num_tool_errors, log(1 + num_tokens), 1{depth = 0} (as in HashedFeatures)."""
    depth = np.asarray(depth, dtype=np.float32)
    return np.stack([depth, np.asarray(num_tool_errors, np.float32),
                     np.log1p(np.asarray(num_tokens, np.float32)), (depth == 0).astype(np.float32)], axis=1)


def _to_numpy(value: Any) -> Any:
    """Tensors (also inside dicts/lists, e.g. an optimizer state) -> numpy arrays, for `save_state`."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, dict):
        return {str(k): _to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_numpy(v) for v in value]
    return value


class EmbeddingHeadPredictor(Predictor):
    """Interface glue + replay + head training; subclasses set `name`, `embed_dim` and implement `_embed`.

    hidden_size: width of the MLP's hidden layer; 0 gives logistic regression on the embedding.
    prior: prediction before any update (the output bias starts at logit(prior), its weights at 0).
    lr: Adam step size at the start of each update (decays linearly to 0 over the update's passes).
    l2: weight decay on the head's weights.
    replay_size: samples kept in the FIFO window; smaller tracks the policy faster.
    num_epochs: passes over the window per update.
    batch_size: samples per mini-batch.
    cache_size: embeddings kept by text (LRU); at least `replay_size` is sensible, 0 turns the cache off.
    seed: seeds the head's init and the shuffling (the shuffling state is saved).
    """

    name = ""
    train_base = False  # subclasses that fine-tune their encoder set this per instance

    def __init__(self, *, embed_dim: int, hidden_size: int = 64, prior: float = 0.5, lr: float = 3e-3,
                 l2: float = 1e-4, replay_size: int = 8192, num_epochs: int = 2, batch_size: int = 256,
                 cache_size: int = 16384, seed: int = 0, device: str = "cpu"):
        if not 0 < prior < 1:
            raise ValueError(f"prior={prior}; use a probability strictly between 0 and 1 (default 0.5)")
        if lr <= 0 or l2 < 0:
            raise ValueError(f"lr={lr}, l2={l2}; use lr > 0 and l2 >= 0")
        if replay_size < 1 or num_epochs < 1 or batch_size < 1 or hidden_size < 0 or cache_size < 0:
            raise ValueError(f"replay_size={replay_size}, num_epochs={num_epochs}, batch_size={batch_size} must be "
                             f">= 1 and hidden_size={hidden_size}, cache_size={cache_size} >= 0")
        self.embed_dim, self.hidden_size = int(embed_dim), int(hidden_size)
        self.prior, self.lr, self.l2 = float(prior), float(lr), float(l2)
        self.replay_size, self.num_epochs, self.batch_size = int(replay_size), int(num_epochs), int(batch_size)
        self.cache_size, self.seed, self.device = int(cache_size), int(seed), str(device)
        self._emb_width = 0 if self.train_base else self.embed_dim  # a trained encoder re-embeds; nothing to keep
        with torch.random.fork_rng(devices=[]):  # same seed -> same head, global RNG untouched
            torch.manual_seed(self.seed)
            self.head = self._build_head().to(self.device)
        self.optimizer = self._build_optimizer()
        self.num_updates = 0
        self.generator = torch.Generator().manual_seed(self.seed)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        # the replay window: history fields, targets, weights and (frozen encoder) the cached embeddings
        self.replay_texts: list[str] = []
        self.replay_struct = np.zeros((0, 3), dtype=np.int64)  # depth, num_tool_errors, num_tokens
        self.replay_emb = np.zeros((0, self._emb_width), dtype=np.float32)
        self.replay_targets = np.zeros(0)
        self.replay_weights = np.zeros(0)

    # ------------------------------------------------------------------ subclass hooks
    def _embed(self, texts: list[str], grad: bool) -> torch.Tensor:
        """(len(texts), embed_dim) float32 on `self.device`; with `grad`, differentiable in the encoder."""
        raise NotImplementedError

    def _encoder_parameters(self) -> list[torch.nn.Parameter]:
        """The encoder's trainable parameters when `train_base`; none for a frozen encoder."""
        return []

    # ------------------------------------------------------------------ model
    def _build_head(self) -> torch.nn.Module:
        num_in = self.embed_dim + len(STRUCTURAL_INPUTS)
        if self.hidden_size:
            head = torch.nn.Sequential(torch.nn.Linear(num_in, self.hidden_size), torch.nn.GELU(),
                                       torch.nn.Linear(self.hidden_size, 1))
        else:
            head = torch.nn.Sequential(torch.nn.Linear(num_in, 1))
        with torch.no_grad():
            head[-1].weight.zero_()  # predict exactly `prior` before any update
            head[-1].bias.fill_(math.log(self.prior / (1 - self.prior)))
        return head

    def _build_optimizer(self) -> torch.optim.Optimizer:
        params = list(self.head.parameters()) + self._encoder_parameters()
        optimizer = torch.optim.Adam(params, lr=self.lr, weight_decay=self.l2)
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer

    def _set_lr(self, frac: float) -> None:
        """Scale every parameter group's step size to `frac` of its initial one."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * frac

    def _embed_cached(self, texts: list[str]) -> np.ndarray:
        """(N, embed_dim) float32 numpy, each distinct text encoded once (LRU cache of `cache_size` texts)."""
        out = np.empty((len(texts), self.embed_dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                out[i] = hit
            else:
                missing.setdefault(text, []).append(i)
        if missing:
            new_texts = list(missing)
            with torch.no_grad():
                emb = self._embed(new_texts, grad=False).float().cpu().numpy()  # (M, D)
            for text, row in zip(new_texts, emb):
                out[missing[text]] = row
                if self.cache_size:
                    self._cache[text] = row.copy()
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

    def _logits(self, emb: torch.Tensor, struct: np.ndarray) -> torch.Tensor:
        """(N,) logits from (N, D) embeddings and (N, 3) raw structural fields."""
        s = torch.from_numpy(structural_features(struct[:, 0], struct[:, 1], struct[:, 2])).to(self.device)  # (N, 4)
        return self.head(torch.cat([emb.float(), s], dim=1)).squeeze(1)  # (N,)

    @staticmethod
    def _struct(histories: Sequence[History]) -> np.ndarray:
        return np.array([[h.depth, h.num_tool_errors, h.num_tokens] for h in histories],
                        dtype=np.int64).reshape(len(histories), 3)

    # ------------------------------------------------------------------ Predictor
    def predict(self, histories: Sequence[History]) -> np.ndarray:
        """p_i = clip(sigmoid(MLP([e(text_i), structural_i])), P_MIN, P_MAX), shape (len(histories),)."""
        check_histories(histories)
        if not histories:
            return np.zeros(0)
        texts = [h.text for h in histories]
        self.head.eval()
        with torch.no_grad():
            emb = torch.from_numpy(self._embed_cached(texts)).to(self.device)  # (N, D)
            logits = self._logits(emb, self._struct(histories))  # (N,)
        p = torch.sigmoid(logits.double()).cpu().numpy()
        return np.clip(p, P_MIN, P_MAX)

    def update(self, histories: Sequence[History], targets, weights=None) -> dict[str, float]:
        """Append (h, Vhat, n) to the window and refit the head on it (weighted BCE, Adam).

        Loss per mini-batch B: sum_{i in B} n_i BCE(p_i, Vhat_i) / sum_{i in B} n_i. Returns loss_new (BCE on the
        new samples before fitting), loss (BCE over the window after fitting), replay_size, num_samples.
        """
        check_histories(histories)
        targets, weights = check_targets(histories, targets, weights)
        if not histories:
            return {"loss": float("nan"), "loss_new": float("nan"), "replay_size": float(len(self.replay_texts)),
                    "num_samples": 0.0}
        loss_new = weighted_bce(self.predict(histories), targets, weights)
        texts = [h.text for h in histories]
        emb = np.zeros((len(texts), 0), np.float32) if self.train_base else self._embed_cached(texts)
        self._append(texts, self._struct(histories), emb, targets, weights)
        self._fit()
        loss = weighted_bce(self._predict_replay(), self.replay_targets, self.replay_weights)
        return {"loss": loss, "loss_new": loss_new, "replay_size": float(len(self.replay_texts)),
                "num_samples": float(len(targets))}

    def _append(self, texts, struct, emb, targets, weights) -> None:
        keep = self.replay_size
        self.replay_texts = (self.replay_texts + texts)[-keep:]
        self.replay_struct = np.concatenate([self.replay_struct, struct])[-keep:]
        self.replay_emb = np.concatenate([self.replay_emb, emb])[-keep:]
        self.replay_targets = np.concatenate([self.replay_targets, targets])[-keep:]
        self.replay_weights = np.concatenate([self.replay_weights, weights])[-keep:]

    def _batch_embeddings(self, idx: np.ndarray, grad: bool) -> torch.Tensor:
        if self.train_base:
            return self._embed([self.replay_texts[i] for i in idx], grad=grad)  # (B, D)
        return torch.from_numpy(self.replay_emb[idx]).to(self.device)  # (B, D)

    def _fit(self) -> None:
        num = len(self.replay_texts)
        num_batches = math.ceil(num / self.batch_size)
        total_steps, step = self.num_epochs * num_batches, 0
        targets = torch.from_numpy(self.replay_targets).float().to(self.device)  # (W,)
        weights = torch.from_numpy(self.replay_weights).float().to(self.device)  # (W,)
        self.head.train()
        for _ in range(self.num_epochs):
            order = torch.randperm(num, generator=self.generator).numpy()
            for b in range(num_batches):
                idx = order[b * self.batch_size:(b + 1) * self.batch_size]
                w = weights[idx]  # (B,)
                if float(w.sum()) <= 0:
                    step += 1
                    continue
                self._set_lr(1 - step / total_steps)  # linear decay within the update: settle, not jitter
                logits = self._logits(self._batch_embeddings(idx, grad=True), self.replay_struct[idx])  # (B,)
                loss = F.binary_cross_entropy_with_logits(logits, targets[idx], weight=w, reduction="sum") / w.sum()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                step += 1
        self.num_updates += 1
        if self.train_base:
            self._cache.clear()  # the encoder moved: cached embeddings are stale

    def _predict_replay(self) -> np.ndarray:
        self.head.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(self.replay_texts), 1024):
                idx = np.arange(start, min(start + 1024, len(self.replay_texts)))
                out.append(torch.sigmoid(self._logits(self._batch_embeddings(idx, grad=False),
                                                      self.replay_struct[idx]).double()).cpu().numpy())
        return np.clip(np.concatenate(out), P_MIN, P_MAX) if out else np.zeros(0)

    # ------------------------------------------------------------------ state
    def config(self) -> dict[str, Any]:
        return {"hidden_size": self.hidden_size, "prior": self.prior, "lr": self.lr, "l2": self.l2,
                "replay_size": self.replay_size, "num_epochs": self.num_epochs, "batch_size": self.batch_size,
                "cache_size": self.cache_size, "seed": self.seed, "device": self.device}

    def state_dict(self) -> dict[str, Any]:
        """Head weights, Adam state, shuffling RNG and the replay window, as numpy arrays and JSON values."""
        state = {
            "head": _to_numpy(self.head.state_dict()),
            "optimizer": _to_numpy(self.optimizer.state_dict()),
            "generator": self.generator.get_state().numpy().copy(),  # (K,) uint8
            "num_updates": self.num_updates,
            "replay_texts": list(self.replay_texts),
            "replay_struct": self.replay_struct.copy(), "replay_emb": self.replay_emb.copy(),
            "replay_targets": self.replay_targets.copy(), "replay_weights": self.replay_weights.copy(),
        }
        if self.train_base:
            state["encoder"] = _to_numpy(self._encoder_state())
        return state

    def _encoder_state(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _load_encoder_state(self, state: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        head_state = {k: torch.as_tensor(np.asarray(v)) for k, v in state["head"].items()}
        own = self.head.state_dict()
        bad = [k for k in own if k not in head_state or tuple(head_state[k].shape) != tuple(own[k].shape)]
        if bad or set(head_state) != set(own):
            raise ValueError(f"the saved head does not fit this predictor (mismatch at {bad or sorted(head_state)}); "
                             "build it with the saved config (hidden_size, encoder) before loading its state")
        if self.train_base != ("encoder" in state):
            raise ValueError("the state was saved with a different train_base setting; build the predictor with the "
                             "saved config first")
        if self.train_base:
            self._load_encoder_state(state["encoder"])
            self._cache.clear()
        self.head.load_state_dict(head_state)
        self.optimizer = self._build_optimizer()
        self.optimizer.load_state_dict(_optimizer_from_numpy(state["optimizer"]))
        self.generator.set_state(torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy()))
        self.num_updates = int(state["num_updates"])
        self.replay_texts = [str(t) for t in state["replay_texts"]]
        self.replay_struct = np.asarray(state["replay_struct"], dtype=np.int64).reshape(-1, 3)
        self.replay_emb = np.asarray(state["replay_emb"], dtype=np.float32).reshape(
            len(self.replay_texts), self._emb_width)
        self.replay_targets = np.asarray(state["replay_targets"], dtype=float)
        self.replay_weights = np.asarray(state["replay_weights"], dtype=float)


def _optimizer_from_numpy(state: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `_to_numpy` on an optimizer state: per-parameter dicts keyed by int again, arrays as tensors."""
    per_param = {}
    for key, slot in state["state"].items():
        per_param[int(key)] = {k: torch.as_tensor(np.asarray(v)) for k, v in slot.items()}
    groups = []
    for group in state["param_groups"]:
        group = dict(group)
        group["params"] = [int(p) for p in group["params"]]
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": per_param, "param_groups": groups}
