"""Policy loss: token logprobs of a model on a batch, and the clipped PPO/GRPO surrogate over them.

One implementation serves both batch layouts of `tracerl.train.batch`. The surrogate is written over
(token, leaf) terms: a per-rollout batch is the case of one leaf column per row, a packed tree carries one column
per leaf of the tree, valid where the token lies on that leaf's rollout. Each (token, leaf) term is clipped on
its own and weighted as the per-rollout loss weights it, so packing changes which tokens the model computes,
never the loss value or its gradient (on any epoch, not only at policy ratio 1).

This module does not build batches, step an optimiser or schedule epochs. The (B, K, V) logits are the update's
largest tensor with a large vocabulary: the batch functions ask only for the K row positions that predict a policy
token in some row (`token_logprobs`'s `needed`, through the model's `logits_to_keep`), not for every prompt,
observation and padding position; within those they are materialised whole (no chunking over the vocabulary).
"""

from __future__ import annotations

import inspect

import torch

from tracerl.train.batch import PackedBatch, RolloutBatch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
TREE_MASK_ATTENTION = ("eager", "sdpa")  # implementations that take a custom 4D mask in transformers 5.x


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor | None = None, *, prev_index: torch.Tensor | None = None,
                   temperature: float = 1.0, needed: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) log p(token t | its context) = log_softmax(logits / temperature) at the position that predicts t.

    Default: the previous token (t - 1), the usual shift; a 2D `attention_mask` marks real tokens. With a packed
    tree, pass the (B, 1, T, T) bool tree mask, `position_ids` and `prev_index` (-1 = nothing predicts the token).
    Entries with no predictor are 0. The temperature must be the sampling temperature, so that a ratio compares
    like with like: the engine's logprobs are log_softmax(logits / T).

    `needed` (B, T) bool: the only tokens the caller reads (a loss's policy tokens); every other entry is 0. A
    model that takes `logits_to_keep` (transformers' causal LMs) then computes logits only at the positions that
    predict a needed token in some row: the same values at those positions (each position's logits are its own
    row of the output projection), without the (B, T, V) tensor.
    """
    if attention_mask.dim() == 4:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in TREE_MASK_ATTENTION:
            raise ValueError(f"the packed tree mask needs attn_implementation in {TREE_MASK_ATTENTION}, the model uses "
                             f"{impl!r}; call model.set_attn_implementation('sdpa') or train per rollout")
        dtype = next(model.parameters()).dtype
        # eager adds the mask to the scores, so it must be additive; finfo.min (not -inf) keeps rows finite
        additive = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)  # (B, 1, T, T)
        attention_mask = additive.masked_fill(~attention_mask.bool(), torch.finfo(dtype).min)
    num_rows, width = input_ids.shape
    device = input_ids.device
    if prev_index is None:
        prev_index = (torch.arange(width, device=device) - 1).expand(num_rows, width)  # (B, T)
    src = prev_index.clamp(min=0)  # (B, T) the row position whose logits predict each token
    read = prev_index >= 0 if needed is None else (prev_index >= 0) & needed.bool()  # (B, T)
    keep = {}
    if needed is not None and takes_logits_to_keep(model):
        # the positions that predict a read token in some row, sorted (K,); at least one, so that a batch with
        # nothing to read still gives a loss connected to the parameters (its gradient is then zero)
        positions = torch.unique(src[read]) if bool(read.any()) else torch.zeros(1, dtype=torch.long, device=device)
        slot = torch.zeros(width, dtype=torch.long, device=device)
        slot[positions] = torch.arange(len(positions), device=device)
        src = slot[src]  # (B, T) the kept logits' index of each predicting position (0 where nothing is read)
        keep["logits_to_keep"] = positions
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False, **keep).logits.float()  # (B, K, V); K = T without `needed`
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(-1)  # (B, K)
    rows = torch.arange(num_rows, device=device)[:, None]  # (B, 1)
    picked = logits[rows, src, input_ids] - lse[rows, src]  # (B, T)
    return torch.where(read, picked, torch.zeros_like(picked))


def takes_logits_to_keep(model) -> bool:
    """Whether `model`'s forward (under a PEFT wrapper, its base model's) takes transformers' `logits_to_keep`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _agg_weights(valid: torch.Tensor, agg: str) -> torch.Tensor:
    """(B, T, L) weight of each (token, leaf) term, from `valid` (B, T, L) float 0/1: the weights sum to 1 over
    the valid terms (all 0 if there are none).

    token-mean: 1 / (policy tokens over all rollouts). seq-mean-token-mean: 1 / (policy tokens of the term's rollout
    * rollouts with at least one policy token): every rollout weighs the same whatever its length (DAPO's
    token-mean exists to undo exactly this, so it is not the default).
    """
    if agg == "token-mean":
        return valid / valid.sum().clamp(min=1)
    per_rollout = valid.sum(1, keepdim=True)  # (B, 1, L)
    num_rollouts = (per_rollout > 0).sum().clamp(min=1)
    return valid / per_rollout.clamp(min=1) / num_rollouts


def packed_policy_loss(logprobs_new: torch.Tensor, logprobs_old: torch.Tensor, advantages: torch.Tensor,
                       leaf_mask: torch.Tensor, *, clip_eps: float = 0.2, clip_eps_high: float | None = None,
                       agg: str = "token-mean", ref_logprobs: torch.Tensor | None = None,
                       kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate summed over (token t, leaf l) terms, each clipped apart (PPO, arXiv 1707.06347;
    GRPO, arXiv 2402.03300; clip_eps_high is DAPO's clip-higher, arXiv 2503.14476):

        loss = sum_{t,l} w_{t,l} [ -min(r_t A_{t,l}, clip(r_t, 1 - eps, 1 + eps_high) A_{t,l}) + kl_coef k3_t ]
        r_t = exp(logprob_new_t - logprob_old_t),   k3_t = exp(ref_t - new_t) - (ref_t - new_t) - 1

    w from `agg` over the valid terms (`leaf_mask`). Shapes: logprobs (B, T); advantages and leaf_mask (B, T, L),
    leaf_mask True where token t is a policy token of leaf l's rollout. The per-token normaliser weight of the
    token-mean is `leaf_mask.sum(-1)`, the number of rollouts the token is trained in. Metrics (floats, token-mean
    over the same terms): train/pg_loss, train/clip_frac (terms where the clip is the active branch: no gradient),
    train/approx_kl (k3 estimate of KL(old || new)), train/ratio_mean, train/kl_ref (with ref_logprobs),
    train/num_policy_tokens (valid terms: the per-rollout token count).
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; use one of {AGGREGATIONS}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if not (0 < clip_eps < 1 and high > 0):
        raise ValueError(f"clip_eps={clip_eps} must lie in (0, 1) and clip_eps_high={clip_eps_high} be > 0 "
                         "(0.2 and 0.28 are the usual values)")
    valid = leaf_mask.bool()  # (B, T, L)
    on = valid.any(-1)  # (B, T)
    zero = torch.zeros_like(logprobs_new)  # (B, T)
    # masked positions may hold anything (padding logits, unset old logprobs): keep them out of exp()
    log_ratio = torch.where(on, logprobs_new - logprobs_old, zero)  # (B, T)
    ratio = log_ratio.exp().unsqueeze(-1)  # (B, T, 1)
    unclipped = -advantages * ratio  # (B, T, L)
    clipped = -advantages * ratio.clamp(1 - clip_eps, 1 + high)  # (B, T, L)
    pg = torch.maximum(unclipped, clipped)  # (B, T, L)
    weights = _agg_weights(valid.to(pg.dtype), agg)  # (B, T, L)
    pg_loss = (pg * weights).sum()
    loss = pg_loss
    token_w = weights if agg == "token-mean" else _agg_weights(valid.to(pg.dtype), "token-mean")  # (B, T, L)
    per_token = token_w.sum(-1)  # (B, T) token-mean weight of each token over its rollouts

    with torch.no_grad():
        metrics = {
            "train/pg_loss": float(pg_loss),
            "train/clip_frac": float(((clipped > unclipped).to(pg.dtype) * token_w).sum()),
            "train/approx_kl": float(((log_ratio.exp() - 1 - log_ratio) * per_token).sum()),
            "train/ratio_mean": float((ratio.squeeze(-1) * per_token).sum()),
            "train/num_policy_tokens": float(valid.sum()),
        }
    if ref_logprobs is not None:
        diff = torch.where(on, ref_logprobs - logprobs_new, zero)  # (B, T)
        k3 = diff.exp() - diff - 1  # (B, T)
        kl = (k3.unsqueeze(-1) * weights).sum()
        loss = loss + kl_coef * kl
        metrics["train/kl_ref"] = float(kl.detach())
    elif kl_coef:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs (the reference policy's token logprobs); "
                         "pass them or set kl_coef=0")
    return loss, metrics


def policy_loss(logprobs_new: torch.Tensor, logprobs_old: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_eps: float = 0.2, clip_eps_high: float | None = None,
                agg: str = "token-mean", ref_logprobs: torch.Tensor | None = None,
                kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-rollout form of `packed_policy_loss`: all inputs (B, T), one rollout per row, mask 1 = policy token.

        loss = sum_{b,t} w_{b,t} [ -min(r A, clip(r, 1 - eps, 1 + eps_high) A) + kl_coef k3 ]

    token-mean: w = mask / sum(mask); seq-mean-token-mean: w = mask / (sum_t mask_b * rows with a policy token).
    """
    return packed_policy_loss(logprobs_new, logprobs_old, advantages.unsqueeze(-1), (mask > 0).unsqueeze(-1),
                              clip_eps=clip_eps, clip_eps_high=clip_eps_high, agg=agg, ref_logprobs=ref_logprobs,
                              kl_coef=kl_coef)


def batch_logprobs(model, batch: RolloutBatch | PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """(B, T) `token_logprobs` of `model` on either batch layout, at its policy tokens (0 elsewhere: the loss reads
    no other, so the logits of no other position are computed)."""
    return token_logprobs(model, **batch.model_inputs(), temperature=temperature, needed=batch.loss_mask > 0)


def batch_policy_loss(model, batch: RolloutBatch | PackedBatch, *, temperature: float = 1.0,
                      logprobs_old: torch.Tensor | None = None, ref_logprobs: torch.Tensor | None = None,
                      **loss_kwargs) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward `model` on `batch` and return the policy loss; `logprobs_old` defaults to the batch's sampling
    logprobs (pass the trainer's recomputed ones to correct for engine/trainer numeric mismatch)."""
    new = batch_logprobs(model, batch, temperature)  # (B, T)
    old = batch.logprobs_old if logprobs_old is None else logprobs_old  # (B, T)
    if isinstance(batch, PackedBatch):
        return packed_policy_loss(new, old, batch.advantages, batch.leaf_mask, ref_logprobs=ref_logprobs,
                                  **loss_kwargs)
    return policy_loss(new, old, batch.advantages, batch.loss_mask, ref_logprobs=ref_logprobs, **loss_kwargs)
