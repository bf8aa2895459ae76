"""Policy training (heavy layer: imports torch). Batches built from trees, the clipped policy loss.

`batch` turns a step's trees and advantages into tensors, per rollout or packed one tree per row; `loss` computes
token logprobs and the clipped surrogate over either layout, with the same value and gradient. Nothing in
`tracerl.core` or `tracerl.io` may import this package.
"""

from tracerl.train.batch import PackedBatch, RolloutBatch, packed_batch, rollout_batch
from tracerl.train.loss import batch_logprobs, batch_policy_loss, packed_policy_loss, policy_loss, token_logprobs

__all__ = ["PackedBatch", "RolloutBatch", "batch_logprobs", "batch_policy_loss", "packed_batch",
           "packed_policy_loss", "policy_loss", "rollout_batch", "token_logprobs"]
