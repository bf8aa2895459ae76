"""The training run's config: one frozen dataclass per section, every field documented, checked at load.

A run is configured by a preset file (`configs/*.toml`), then `--set section.key=value` overrides, then
`TrainConfig.check()`, which catches what single fields cannot (a method that needs a simulator, a domain the
embedded policy was not trained on). The resolved config is saved as `config.json` in the run directory, and
`tracerl train --config <run>/config.json` reproduces the run.

This module holds no torch code (it imports torch only to check that a requested CUDA device exists); it sits in
`train` because it names the trainer's knobs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tracerl.core.advantages import ADVANTAGES, AdvantageConfig
from tracerl.core.methods import METHODS, AllocationConfig
from tracerl.core.predictor import PREDICTORS
from tracerl.io.config import apply_overrides, from_dict, load_file, to_dict

DOMAINS = ("multihop", "math", "funcall", "bfcl", "task")
# the attention and MLP projections of Qwen3, LLaMA, Mistral and their kin: LoRA's usual targets
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # seeds data order, allocation, sampling and the predictor; same seed -> same run
    num_steps: int = 12  # policy updates; each spends one step's sampling budget
    out_dir: str = "runs/{method}-seed{seed}"  # run directory ({method} and {seed} are filled in)
    eval_every: int = 0  # held-out evaluation every N steps (0 = only before the first and after the last step)
    eval_prompts: int = 128  # held-out questions per evaluation (more = smaller standard error, slower)
    eval_samples: int = 4  # samples per held-out question (avg@k)
    eval_temperature: float = 1.0  # sampling temperature of the evaluation (0 = greedy)
    checkpoint_every: int = 1  # write a checkpoint every N steps (and after the last); a resume restarts there
    num_threads: int = 1  # torch CPU threads (0 = torch's default); one is fastest for the tiny model on 2 cores
    tensorboard: bool = True  # also write TensorBoard event files (needs tensorboardX)
    save_trees: bool = True  # write each step's pool and trees to <run>/trees/ (for `tracerl view`; ~0.3 MB a step)
    progress: bool = True  # a progress bar with the key figures on stderr
    executor: str = "local"  # "local": rollouts in this process; "ray": on Ray actors, clients of policy.base_url
    num_workers: int = 2  # executor="ray": rollout worker processes, 1 Ray CPU each; fixed for a run (seeds per worker)
    ray_address: str = ""  # executor="ray": "" = a loopback-only local cluster; "auto" or ray://host:port = yours

    def __post_init__(self) -> None:
        if self.executor not in ("local", "ray"):
            raise ValueError(f"run.executor={self.executor!r}; use 'local' (in process) or 'ray' (rollout workers)")
        if self.num_workers < 1:
            raise ValueError(f"run.num_workers={self.num_workers} must be >= 1")
        if self.executor == "ray" and not _has_ray():
            raise ValueError("run.executor='ray' needs Ray: pip install -e \".[ray]\" (or set run.executor=local)")
        if self.num_steps < 1 or self.eval_prompts < 2 or self.eval_samples < 1 or self.checkpoint_every < 1:
            raise ValueError(f"run.num_steps={self.num_steps}, run.checkpoint_every={self.checkpoint_every} and "
                             f"run.eval_samples={self.eval_samples} must be >= 1 and run.eval_prompts="
                             f"{self.eval_prompts} >= 2 (the standard error needs two prompts)")
        if self.eval_every < 0 or self.num_threads < 0 or self.eval_temperature < 0:
            raise ValueError("run.eval_every, run.num_threads and run.eval_temperature must be >= 0")


@dataclass(frozen=True)
class PolicyConfig:
    model: str = "embedded"  # "embedded" (built on the spot, cached), a local Hugging Face model directory or a hub id
    embedded: dict = field(default_factory=dict)  # EmbeddedConfig overrides, e.g. {"sft_steps": 400}
    cache_dir: str = ""  # where the embedded build is cached ("" = $TRACERL_CACHE or ~/.cache/tracerl)
    max_batch_size: int = 64  # rollouts the engine decodes together
    engine: str = "transformers"  # "transformers" or "vllm" (in process), or "openai" (vLLM/SGLang/tracerl serve)
    base_url: str = ""  # the server of engine="openai", e.g. http://127.0.0.1:8000
    served_model_name: str = ""  # the model name the server expects ("" = the first it lists)
    n_mode: str = "n"  # "n": one request per prefix with n samples (vLLM, tracerl serve); "repeat": SGLang
    sync_weights: bool = True  # engine="openai": push the weights to the server after each update (tracerl serve, vLLM)
    vllm_max_model_len: int = 4096  # engine="vllm": longest prefix + turn vLLM accepts (raise it for long rollouts)
    vllm_kv_cache_gib: float = 1.0  # engine="vllm" on CPU: memory of vLLM's KV cache, its prefix cache included
    vllm_gpu_memory_utilization: float = 0.3  # engine="vllm" on a GPU: share of the device vLLM takes (the trainer
    # shares the rest)
    vllm_sleep: bool = True  # engine="vllm" on a GPU: vLLM frees its memory (sleep mode) during each policy update
    device: str = "cpu"  # the trainer's model, reference model and in-process engine: cpu, cuda, cuda:N or auto
    lora_rank: int = 0  # LoRA rank r; 0 = full fine-tuning, r > 0 trains only low-rank adapters (needs peft)
    lora_alpha: float = 32.0  # LoRA scale: the adapted weight is W + (lora_alpha / lora_rank) B A
    lora_dropout: float = 0.0  # dropout on the adapters' input in training (0: training and sampling forwards agree)
    lora_target_modules: tuple[str, ...] = LORA_TARGETS  # names of the linear layers that get adapters

    def __post_init__(self) -> None:
        check_device(self.device)
        if self.lora_rank < 0 or not self.lora_alpha > 0 or not 0 <= self.lora_dropout < 1:
            raise ValueError(f"policy.lora_rank={self.lora_rank} must be >= 0 (0 = full fine-tuning), policy."
                             f"lora_alpha={self.lora_alpha} > 0 and policy.lora_dropout={self.lora_dropout} in [0, 1); "
                             "e.g. lora_rank=16, lora_alpha=32, lora_dropout=0")
        if not self.lora_target_modules or not all(self.lora_target_modules):
            raise ValueError(f"policy.lora_target_modules={list(self.lora_target_modules)} must name at least one "
                             f"module and no empty name, e.g. {list(LORA_TARGETS)}")
        if self.lora_rank and importlib.util.find_spec("peft") is None:
            raise ValueError(f"policy.lora_rank={self.lora_rank} needs peft: pip install -e '.[lora]' (or set "
                             "policy.lora_rank=0 for full fine-tuning)")
        if self.max_batch_size < 1:
            raise ValueError(f"policy.max_batch_size={self.max_batch_size} must be >= 1")
        if self.engine not in ("transformers", "vllm", "openai"):
            raise ValueError(f"policy.engine={self.engine!r}; use 'transformers', 'vllm' or 'openai'")
        if self.engine == "vllm" and not _has_vllm():
            raise ValueError("policy.engine='vllm' needs vLLM in this environment: pip install -e '.[vllm]' in its "
                             "own virtual environment (docs/engines.md), or set policy.engine=transformers")
        if self.vllm_max_model_len < 2 or self.vllm_kv_cache_gib <= 0 or not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"policy.vllm_max_model_len={self.vllm_max_model_len} must be >= 2, policy."
                             f"vllm_kv_cache_gib={self.vllm_kv_cache_gib} > 0 and policy.vllm_gpu_memory_utilization="
                             f"{self.vllm_gpu_memory_utilization} in (0, 1]")
        if self.engine == "openai" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"policy.engine='openai' needs policy.base_url=http://host:port of the server "
                             f"(got {self.base_url!r})")
        if self.n_mode not in ("n", "repeat"):
            raise ValueError(f"policy.n_mode={self.n_mode!r}; use 'n' (vLLM, tracerl serve) or 'repeat' (SGLang)")


@dataclass(frozen=True)
class DataConfig:
    domain: str = "multihop"  # one of multihop, math, funcall, bfcl, or task (your own; set by data.task/train_files)
    task: str = ""  # your own task: "module:function" returning tracerl.io.task.UserTask (see docs/tasks.md)
    train_files: tuple[str, ...] = ()  # parquet/JSONL rows in verl's layout; replace the task's own training rows
    test_files: tuple[str, ...] = ()  # parquet/JSONL held-out rows in verl's layout; replace the task's own
    num_train_prompts: int = 4000  # training questions the pools are drawn from (in a fixed shuffled order)
    max_turns: int = 0  # policy turns per rollout (0 = the embedded policy's or 8)
    max_tokens_per_turn: int = 0  # sampled tokens per turn (0 = the embedded policy's or 128)
    max_tokens_per_rollout: int = 0  # policy + observation tokens after the prompt (0 = the embedded policy's or 1024)

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"data.domain={self.domain!r} is unknown; use one of {DOMAINS}")
        if (self.task or self.train_files) and self.domain not in ("multihop", "task"):
            raise ValueError(f"data.task/data.train_files set with data.domain={self.domain!r}; drop data.domain "
                             "(a task of your own is data.domain='task')")
        if self.task or self.train_files:
            object.__setattr__(self, "domain", "task")  # the default domain gives way to the user's task
        elif self.domain == "task":
            raise ValueError("data.domain='task' needs data.task=\"module:function\" or data.train_files")
        if self.num_train_prompts < 1 or min(self.max_turns, self.max_tokens_per_turn,
                                             self.max_tokens_per_rollout) < 0:
            raise ValueError("data.num_train_prompts must be >= 1 and the turn/token limits >= 0 (0 = default)")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # rollout sampling temperature (the loss scores tokens at the same temperature)
    top_p: float = 1.0  # nucleus sampling; < 1 makes the sampled logprobs differ from the trained distribution

    def __post_init__(self) -> None:
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.temperature={self.temperature} must be > 0 and sampling.top_p={self.top_p} "
                             "in (0, 1]; RL needs stochastic rollouts")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 5e-4  # AdamW learning rate (constant); the tiny policy takes a large one, real models ~1e-6
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    grad_clip: float = 1.0  # max global gradient norm (0 = no clipping)
    num_epochs: int = 1  # passes over a step's rollouts; > 1 reuses samples off-policy (the clip matters then)
    micro_batch_rollouts: int = 32  # rollouts per forward/backward (gradients accumulate); lower it to save memory
    clip_eps: float = 0.2  # PPO clip range below 1
    clip_eps_high: float = 0.28  # clip range above 1 (DAPO's clip-higher keeps exploration alive)
    kl_coef: float = 0.0  # k3 KL penalty to the initial policy (0 = no reference model is kept)
    agg: str = "token-mean"  # loss aggregation: token-mean or seq-mean-token-mean
    packed: bool = False  # train on packed trees (shared prefixes computed once); same gradient, faster for wide trees

    def __post_init__(self) -> None:
        if not self.lr > 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.kl_coef < 0:
            raise ValueError("optim.lr must be > 0 and weight_decay, grad_clip, kl_coef >= 0")
        if self.num_epochs < 1 or self.micro_batch_rollouts < 1:
            raise ValueError("optim.num_epochs and optim.micro_batch_rollouts must be >= 1")
        if self.agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"optim.agg={self.agg!r}; use token-mean or seq-mean-token-mean")


NEURAL_PREDICTORS = ("minilm_head", "lm_value")  # registered by importing tracerl.predictors (torch)


@dataclass(frozen=True)
class PredictorConfig:
    name: str = "hashed_logistic"  # a registered predictor (tracerl.core.predictor.PREDICTORS)
    # its constructor options (see its docstring); these are the best of a small grid on real multihop trees with the
    # domain's state features (docs/predictors.md): text weights held back by l2, longer fits, a gentle recalibration
    options: dict = field(default_factory=lambda: {"l2": 0.1, "num_epochs": 4, "root_num_epochs": 10,
                                                   "calibration_ridge": 500.0})

    def __post_init__(self) -> None:
        if self.name in NEURAL_PREDICTORS and self.name not in PREDICTORS:
            try:
                import tracerl.predictors  # noqa: F401  (registers the neural predictors)
            except ImportError as err:
                raise ValueError(f"predictor.name={self.name!r} needs torch and transformers: "
                                 f"pip install -e '.[neural]' ({err})") from err
        if self.name not in PREDICTORS or self.name == "oracle":
            raise ValueError(f"predictor.name={self.name!r}; use one of "
                             f"{sorted(set(PREDICTORS) - {'oracle'})} (the oracle exists only in the simulator)")


@dataclass(frozen=True)
class TrainConfig:
    method: str = "trace"  # a method preset (tracerl methods lists them)
    run: RunConfig = field(default_factory=RunConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    allocation: AllocationConfig = field(default_factory=lambda: AllocationConfig(num_prompts=16))
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is unknown; use one of {sorted(METHODS)}")
        preset = METHODS[self.method]
        if preset.predictor == "oracle":
            raise ValueError(f"method={self.method!r} needs the true success probability, which only the simulator "
                             "knows; run it with `tracerl bench alloc`")
        if preset.advantage not in ADVANTAGES:
            raise ValueError(f"method {self.method!r} names advantage {preset.advantage!r}, which is not registered")
        if self.policy.model == "embedded" and self.data.domain not in ("multihop", "task"):
            raise ValueError(f"data.domain={self.data.domain!r} with policy.model='embedded': the embedded policy "
                             "is trained on multihop only; set policy.model to a local Hugging Face model directory")
        if self.run.executor == "ray" and self.data.domain == "task":
            raise ValueError("data.task with run.executor='ray': rollout workers do not load a task of your own yet; "
                             "use run.executor=local")
        if self.run.executor == "ray" and self.policy.engine != "openai":
            raise ValueError(f"run.executor='ray' with policy.engine={self.policy.engine!r}: the rollout workers are "
                             "clients of a generation server; set policy.engine=openai and policy.base_url=http://"
                             "host:port of `tracerl serve` (or vLLM, SGLang), or use run.executor=local")
        model = self.policy.model
        if model != "embedded" and not (model and Path(model).is_dir()) and not _looks_like_hub_id(model):
            raise ValueError(f"policy.model={model!r} is neither 'embedded', a local model directory nor a hub id "
                             "like Qwen/Qwen3-0.6B")

    def out_dir(self) -> Path:
        return Path(self.run.out_dir.format(method=self.method, seed=self.run.seed))

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def _has_ray() -> bool:
    """Whether Ray is importable (a folder named ray on sys.path, e.g. tests/ray, is a namespace package, not Ray)."""
    spec = importlib.util.find_spec("ray")
    return spec is not None and spec.origin is not None


def _has_vllm() -> bool:
    """Whether vLLM is importable (a folder named vllm on sys.path, e.g. tests/vllm, is a namespace package)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def check_device(device: str) -> None:
    """policy.device names cpu, cuda, cuda:N or auto, and a cuda device exists (torch is imported only to check)."""
    kind, _, index = device.partition(":")
    if device not in ("cpu", "auto", "cuda") and not (kind == "cuda" and index.isdigit()):
        raise ValueError(f"policy.device={device!r}; use cpu, cuda, cuda:N or auto (cuda when available, else cpu)")
    if kind != "cuda":
        return
    try:
        import torch
    except ImportError:
        raise ValueError(f"policy.device={device!r} needs torch: pip install -e '.[torch]'") from None
    if not torch.cuda.is_available():
        raise ValueError(f"policy.device={device!r} but torch {torch.__version__} sees no CUDA device; set "
                         "policy.device=cpu (or auto), or run on a GPU machine with a CUDA build of torch")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"policy.device={device!r} but torch sees {torch.cuda.device_count()} CUDA device(s); "
                         "use cuda:0 .. cuda:N-1")


def _looks_like_hub_id(name: str) -> bool:
    """'org/name' with no path-like start: loaded with from_pretrained, which downloads it when it is not cached."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not Path(name).exists()


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> TrainConfig:
    """Preset file (or `base`, or the defaults), then `key=value` overrides, checked (ValueError names the fix)."""
    data = load_file(path) if path else dict(base or {})
    data = apply_overrides(data, list(overrides or []))
    return from_dict(TrainConfig, data, where="")


def section_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]
