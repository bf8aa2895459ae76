"""Policy training (heavy layer: its batches, loss and trainer import torch; its config does not).

`batch` turns a step's trees and advantages into tensors, per rollout or packed one tree per row; `loss` computes
token logprobs and the clipped surrogate over either layout, with the same value and gradient. Nothing in
`tracerl.core` or `tracerl.io` may import this package.

The names below load on first use (PEP 562), so `tracerl.train.config` (the run's typed config, what `tracerl config`
and the verl coordinator read) imports on the core install, which has numpy and no torch.
"""

import importlib

_LAZY = {"PackedBatch": "batch", "RolloutBatch": "batch", "packed_batch": "batch", "rollout_batch": "batch",
         "batch_logprobs": "loss", "batch_policy_loss": "loss", "packed_policy_loss": "loss", "policy_loss": "loss",
         "token_logprobs": "loss"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tracerl.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracerl.train.{_LAZY[name]}"), name)
