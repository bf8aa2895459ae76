"""`LMValuePredictor` ("lm_value"): a value head on a causal LM's last hidden state, as in the TRACE paper.

The base model (e.g. Qwen3-0.6B on a GPU) is loaded from a local directory (`model_path`, written by
`save_pretrained`) with transformers' `AutoModel` (the decoder without its LM head), `local_files_only=True`.
A history's text is tokenised with the tokenizer at `tokenizer_path` (default: `model_path`), truncated on
the left to its last `max_tokens` tokens (the latest turns say most about where the rollout is going), and
its embedding is the final-norm hidden state of its last token: the causal LM's summary of the whole
prefix. The head (see `EmbeddingHeadPredictor`) reads that plus the structural features.

By default the base is frozen (embeddings are cached by text and kept in the replay window); with
`train_base=True` the base is fine-tuned with the head (each mini-batch re-encoded with gradients, the base's
weights saved in `state_dict`): much slower, and only sensible on a GPU.

Deliberately not here: LoRA/adapters, sharing weights with the policy, downloads, chat templating (the
history text is encoded as is).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracerl.predictors.head import EmbeddingHeadPredictor

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def last_token_state(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """h[b, t_b] with t_b the last real token of row b (any padding side). (B, T, H), (B, T) -> (B, H)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # (B, T)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,)
    assert bool((last >= 0).all()), "a text encoded to zero tokens"
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)


class LMValuePredictor(EmbeddingHeadPredictor):
    """p(h) = sigmoid(MLP([LM(text(h))[last token], structural(h)])).

    model_path: local directory of a causal LM (config + weights), e.g. Qwen3-0.6B.
    tokenizer_path: local tokenizer directory (default: model_path).
    train_base: fine-tune the base with the head (default False: frozen base, cached embeddings).
    max_tokens: keep the last this many tokens of a history.
    encode_batch_size: texts per base forward pass.
    dtype: the base's weights ("float32", "bfloat16", "float16"); the head always runs in float32.
    base_lr: Adam step size of the base when train_base (much smaller than the head's lr).
    Head and replay options: see `EmbeddingHeadPredictor`.
    """

    name = "lm_value"

    def __init__(self, model_path: str, tokenizer_path: str | None = None, train_base: bool = False,
                 max_tokens: int = 512, encode_batch_size: int = 16, dtype: str = "float32",
                 base_lr: float = 1e-5, **head_options: Any):
        from transformers import AutoModel, AutoTokenizer

        if not model_path or not (Path(model_path) / "config.json").is_file():
            raise ValueError(f"model_path={model_path!r} has no config.json; pass a local directory written by "
                             "save_pretrained (e.g. a downloaded Qwen3-0.6B)")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r}; use one of {sorted(_DTYPES)}")
        if max_tokens < 1 or encode_batch_size < 1 or base_lr <= 0:
            raise ValueError(f"max_tokens={max_tokens}, encode_batch_size={encode_batch_size} must be >= 1 and "
                             f"base_lr={base_lr} > 0")
        self.model_path, self.tokenizer_path = str(model_path), str(tokenizer_path) if tokenizer_path else None
        self.train_base, self.max_tokens = bool(train_base), int(max_tokens)
        self.encode_batch_size, self.dtype, self.base_lr = int(encode_batch_size), dtype, float(base_lr)
        device = head_options.get("device", "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path or self.model_path, local_files_only=True)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:  # padded positions are masked out, any id will do
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.convert_ids_to_tokens(0)
        self.base = AutoModel.from_pretrained(self.model_path, local_files_only=True,
                                              dtype=_DTYPES[dtype]).to(device).eval()
        self.base.requires_grad_(self.train_base)
        vocab = self.base.get_input_embeddings().num_embeddings
        if len(self.tokenizer) > vocab:
            raise ValueError(f"the tokenizer has {len(self.tokenizer)} tokens but the model's embedding table has "
                             f"{vocab}; pass the tokenizer the model was trained with (tokenizer_path)")
        super().__init__(embed_dim=int(self.base.config.hidden_size), **head_options)

    def _encoder_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.base.parameters()) if self.train_base else []

    def _build_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": list(self.head.parameters()), "lr": self.lr}]
        if self.train_base:
            groups.append({"params": list(self.base.parameters()), "lr": self.base_lr, "weight_decay": 0.0})
        optimizer = torch.optim.Adam(groups, lr=self.lr, weight_decay=self.l2)
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer

    def _embed(self, texts: list[str], grad: bool) -> torch.Tensor:
        out = []
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.set_grad_enabled(grad and self.train_base):
            for start in range(0, len(order), self.encode_batch_size):
                idx = order[start:start + self.encode_batch_size]
                batch = self.tokenizer([texts[i] or " " for i in idx], padding=True, truncation=True,
                                       max_length=self.max_tokens, return_tensors="pt",
                                       add_special_tokens=False).to(self.device)
                hidden = self.base(input_ids=batch["input_ids"],
                                   attention_mask=batch["attention_mask"]).last_hidden_state  # (B, T, H)
                out.append(last_token_state(hidden, batch["attention_mask"]).float())  # (B, H)
        emb = torch.cat(out)  # (N, H) in length order
        inverse = torch.from_numpy(np.argsort(np.array(order))).to(emb.device)
        return emb[inverse]  # (N, H) in input order

    def _encoder_state(self) -> dict[str, torch.Tensor]:
        return {k: v.float() for k, v in self.base.state_dict().items()}

    def _load_encoder_state(self, state: dict[str, Any]) -> None:
        own = self.base.state_dict()
        self.base.load_state_dict({k: torch.as_tensor(np.asarray(state[k])).to(own[k].dtype) for k in own})

    def config(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "train_base": self.train_base,
                "max_tokens": self.max_tokens, "encode_batch_size": self.encode_batch_size, "dtype": self.dtype,
                "base_lr": self.base_lr, **super().config()}
