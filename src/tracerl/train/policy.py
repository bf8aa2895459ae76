"""The policy a run trains: the embedded tiny model (built or loaded from its cache) or a local Hugging Face model.

`load_policy(config)` is the step that builds the run's policy, before and apart from the trainer
(`Trainer(config, load_policy(config))`): it returns everything the trainer needs around the weights: the tokenizer's
chat renderer, the domain, the driver limits and the padding id. `policy.model` is "embedded", a local directory or a
hub id (`from_pretrained` loads a local copy or the hub's cache first; a hub id on an offline machine fails with a
message naming the fix). The chat template and tool-call format come from the tokenizer (`tracerl.io.rollout.chat`).

With `policy.lora_rank` > 0 the model gets LoRA adapters (peft, arXiv 2106.09685) on `policy.lora_target_modules`
and every other weight is frozen. `TrainPolicy.model` is then still the transformers model (the adapters sit inside
its linear layers, so its forward, the engine and the loss see the adapted policy unchanged) and `TrainPolicy.peft`
the peft wrapper around it (adapter export, the adapter-free forward of the KL reference). `merged_state_dict`
gives the plain model's weights with each adapter merged in, which is what a served engine loads.

Deliberately not here: quantised bases (QLoRA), several adapters, other peft methods.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.io.rollout.chat import ChatRenderer
from tracerl.io.rollout.driver import DriverLimits
from tracerl.train.config import TrainConfig, check_device


@dataclass
class TrainPolicy:
    model: torch.nn.Module
    tokenizer: Any
    renderer: ChatRenderer
    domain: Any
    limits: DriverLimits
    pad_id: int
    source: str  # where the weights came from (the cache folder or the model directory)
    device: torch.device = torch.device("cpu")  # where the model is
    peft: Any = None  # the peft wrapper of `model` when it has LoRA adapters (policy.lora_rank > 0), else None


def _user_task(config: TrainConfig) -> Any:
    """The user's own task (data.task / data.train_files, docs/tasks.md), or None for a built-in domain."""
    if config.data.domain != "task":
        return None
    from tracerl.core.methods import METHODS
    from tracerl.io.env.task import load_task
    return load_task(config.data.task, config.data.train_files, config.data.test_files,
                     branching=METHODS[config.method].prefix_policy is not None)


def embedded_domain(config: TrainConfig) -> Any:
    """The domain an embedded build is made for, beside its own multihop world (None): a built-in domain with its
    `data.options`, or the user's task."""
    if config.data.domain == "multihop":
        return None
    factory = config.domain_factory()
    return factory() if factory else _user_task(config)


def run_limits(config: TrainConfig, default: DriverLimits) -> DriverLimits:
    """The run's turn limits: `data`'s where set, else `default` (the embedded build's, or the driver's)."""
    data = config.data
    return DriverLimits(data.max_turns or default.max_turns, data.max_tokens_per_turn or default.max_tokens_per_turn,
                        data.max_tokens_per_rollout or default.max_tokens_per_rollout)


def resolve_device(name: str) -> torch.device:
    """policy.device as a torch device: "auto" is cuda when torch sees a GPU, else cpu. A cuda device that does not
    exist raises ValueError (the config check, repeated here for callers that build devices themselves)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)
    return torch.device(name)


def compute_dtype(precision: str) -> torch.dtype | None:
    """policy.precision as the dtype the forwards compute in under autocast: None for float32 (no autocast)."""
    return {"float32": None, "bfloat16": torch.bfloat16}[precision]


def sampling_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The dtype the trainer's transformers engine samples in: policy.precision's on a GPU (on an H200 a bfloat16 copy
    of the weights sampled a step's rollouts at float32's rate and the step peaked at 0.71x float32's memory,
    benchmarks/gpu/README.md); None (the float32 model itself) on a CPU, where bfloat16 matrix products need
    instructions many CPUs lack."""
    return compute_dtype(precision) if device.type == "cuda" else None


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The context a policy forward runs in: `torch.autocast` to `dtype` on `device`'s type, or a no-op for None.

    Mixed precision, not low-precision weights: the parameters, their gradients and AdamW's moments stay float32
    (an update of lr 1e-6 is far below bfloat16's resolution of a weight, 2^-8 of it, and would be lost), while
    matrix products and attention run in `dtype`. Logits are cast back to float32 before any softmax."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def load_policy(config: TrainConfig, say: Callable[[str], None] = lambda message: None) -> TrainPolicy:
    """The run's policy on `policy.device`, with LoRA adapters when `policy.lora_rank` > 0: the embedded policy
    loaded from its cache, or built there on first use (minutes, on `tracerl.policy.embedded.BUILD_THREADS` threads,
    its progress told to `say`), or `policy.model`'s weights. The machine is checked first (`check_machine`), so a
    missing package or device is told before a build."""
    config.check_machine()
    policy = _load_base(config, say)
    if config.policy.lora_rank:
        policy.peft = add_lora(policy.model, config)
        policy.model = policy.peft.get_base_model()
    policy.device = resolve_device(config.policy.device)
    policy.model.to(policy.device)
    return policy


def add_lora(model: torch.nn.Module, config: TrainConfig) -> Any:
    """Wrap `model` with LoRA adapters in place (peft's `get_peft_model`) and freeze everything else.

    Each targeted linear layer computes W x + (alpha / r) B A x with A (r, in) random and B (out, r) zero, so the
    adapted model starts as the base model. A is drawn from torch's RNG seeded with run.seed inside a fork (the
    global state comes back unchanged), so a run's initial adapters are a function of its config."""
    from peft import LoraConfig, get_peft_model

    cfg = config.policy
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers a deprecated question; the warning would print on every LoRA run
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(config.run.seed)
        try:
            return get_peft_model(model, lora)
        except ValueError as err:  # peft: no module matches the targets
            names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear)})
            raise ValueError(f"policy.lora_target_modules={list(cfg.lora_target_modules)} does not fit this model "
                             f"({err}); its linear layers are named {names}") from None


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimiser updates: all of them, or only the adapters' with LoRA (the rest is frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of the plain model (no adapters), with every LoRA layer merged: W' = W + (alpha / r) B A.

    Keys are those of the model without peft (`...q_proj.weight`, not `...q_proj.base_layer.weight`), so a server
    holding the plain model loads it as is and then computes what the adapted model computes. `model` itself is not
    changed (merging in place and back would round the frozen base weights). Without adapters: `model.state_dict()`.
    """
    state = model.state_dict()
    if "peft" not in sys.modules:  # never imported, so no adapters (and no import of peft for full fine-tuning)
        return state
    from peft.tuners.lora import LoraLayer

    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    if not layers:
        return state
    merged = {}
    for key, value in state.items():
        owner, rest = _lora_owner(key, layers)
        if owner is None:
            merged[key] = value
        elif rest.startswith("base_layer."):
            merged[f"{owner}.{rest.removeprefix('base_layer.')}"] = value
        # else: the adapter's own tensors (lora_A, lora_B, ...), folded into the weight below
    with torch.no_grad():
        for name, layer in layers.items():
            weight = layer.get_base_layer().weight
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    weight = weight + layer.get_delta_weight(adapter)
            merged[f"{name}.weight"] = weight.detach()
    return merged


def _lora_owner(key: str, layers: dict[str, Any]) -> tuple[str | None, str]:
    """(name of the LoRA layer a state-dict key belongs to, the rest of the key) or (None, key)."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        owner = ".".join(parts[:cut])
        if owner in layers:
            return owner, ".".join(parts[cut:])
    return None, key


def _load_base(config: TrainConfig, say: Callable[[str], None]) -> TrainPolicy:
    if config.policy.model == "embedded":
        from tracerl.policy.embedded import build_embedded

        built = build_embedded(config.policy.embedded, config.policy.cache_dir or None,
                               progress=say, domain=embedded_domain(config))
        return TrainPolicy(built.model, built.tokenizer, built.renderer, built.domain,
                           run_limits(config, built.config.limits()), built.tokenizer.pad_token_id, str(built.path))
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
    factory = config.domain_factory()
    return TrainPolicy(model, tokenizer, ChatRenderer(tokenizer), factory() if factory else _user_task(config),
                       run_limits(config, DriverLimits()), int(pad_id or 0), config.policy.model)
