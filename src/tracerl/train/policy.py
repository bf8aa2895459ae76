"""The policy a run trains: the embedded tiny model (built or loaded from its cache) or a local Hugging Face model.

`load_policy(config)` returns everything the trainer needs around the weights: the tokenizer's chat renderer, the
domain, the driver limits and the padding id. `policy.model` is "embedded", a local directory or a hub id
(`from_pretrained` loads a local copy or the hub's cache first; a hub id on an offline machine fails with a
message naming the fix). The chat template and tool-call format come from the tokenizer (`tracerl.io.chat`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.io.chat import ChatRenderer
from tracerl.io.driver import DriverLimits
from tracerl.train.config import TrainConfig


@dataclass
class TrainPolicy:
    model: torch.nn.Module
    tokenizer: Any
    renderer: ChatRenderer
    domain: Any
    limits: DriverLimits
    pad_id: int
    source: str  # where the weights came from (the cache folder or the model directory)


def make_domain(name: str) -> Any:
    """A domain with its default options: multihop, math, funcall or bfcl."""
    if name == "multihop":
        from tracerl.io.domains.multihop import MultiHopDomain
        return MultiHopDomain()
    if name == "math":
        from tracerl.io.domains.math import MathDomain
        return MathDomain()
    if name == "funcall":
        from tracerl.io.domains.funcall import FuncallDomain
        return FuncallDomain()
    if name == "bfcl":
        from tracerl.io.domains.bfcl import BfclDomain
        return BfclDomain()
    raise ValueError(f"unknown domain {name!r}; use multihop, math, funcall or bfcl")


def _limits(config: TrainConfig, default: DriverLimits) -> DriverLimits:
    data = config.data
    return DriverLimits(data.max_turns or default.max_turns, data.max_tokens_per_turn or default.max_tokens_per_turn,
                        data.max_tokens_per_rollout or default.max_tokens_per_rollout)


def load_policy(config: TrainConfig, say: Callable[[str], None] = lambda message: None) -> TrainPolicy:
    if config.policy.model == "embedded":
        from tracerl.policy.embedded import EmbeddedConfig, build_embedded

        built = build_embedded(EmbeddedConfig.from_dict(config.policy.embedded), config.policy.cache_dir or None,
                               progress=say)
        return TrainPolicy(built.model, built.tokenizer, built.renderer, built.domain,
                           _limits(config, built.config.limits()), built.tokenizer.pad_token_id, str(built.path))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its loading bar would break tracerl's own progress bar

    try:
        tokenizer = AutoTokenizer.from_pretrained(config.policy.model)
        model = AutoModelForCausalLM.from_pretrained(config.policy.model, dtype=torch.float32).eval()
    except OSError as err:  # no such directory, or a hub id that is neither cached nor reachable
        raise ValueError(f"could not load policy.model={config.policy.model!r} ({err}); pass a local model "
                         "directory, or a hub id on a machine that can download it") from None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TrainPolicy(model, tokenizer, ChatRenderer(tokenizer), make_domain(config.data.domain),
                       _limits(config, DriverLimits()), int(pad_id or 0), config.policy.model)
