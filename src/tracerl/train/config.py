"""The training run's config: one frozen dataclass per section, every field documented, checked at load.

A run is configured by a preset file (`configs/*.toml`), then `--set section.key=value` overrides. Each numeric or
enumerated field declares its one rule beside it (`knob(default, ge=..., choices=...)`, `tracerl.core.rules`),
checked when the section is built, with the key and the allowed range in the message; `TrainConfig` adds what single
fields cannot say (a method that needs a simulator, a domain the embedded policy was not trained on). These are
schema checks: a saved config parses on any machine. `TrainConfig.check_machine` (called by `load_config` and the
trainer) checks what this machine must have: Ray, the CUDA device, peft, a neural predictor's packages, the model.
`tracerl config` lists every field with its type, default, rule and doc. The resolved config is saved as `config.json` in the run directory, and
`tracerl train --config <run>/config.json` reproduces the run.

This module holds no torch code (`check_machine` imports torch only to check that a requested CUDA device exists); it sits in
`train` because it names the trainer's knobs.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.core.advantages import ADVANTAGES, AdvantageConfig
from tracerl.core.methods import METHODS, AllocationConfig
from tracerl.core.predictor import PREDICTORS, predictor_class
from tracerl.core.rules import check_fields, knob, raise_problems
from tracerl.engines import ENGINES
from tracerl.io.domains import DOMAINS, check_options, make_domain
from tracerl.io.env.task import resolve_task_paths
from tracerl.io.files import check_depth
from tracerl.io.files.boundary import listing, parse_int
from tracerl.io.files.config import apply_overrides, from_dict, load_file, to_dict
from tracerl.io.files.runlog import reached_stop
from tracerl.policy.embedded_config import EmbeddedConfig

DATA_DOMAINS = (*DOMAINS, "task")  # the built-in domains, and a task of your own (docs/tasks.md)
# the attention and MLP projections of Qwen3, LLaMA, Mistral and their kin: LoRA's usual targets
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RunConfig:
    seed: int = knob(0, ge=0)  # seeds data order, allocation, sampling and the predictor; same seed -> same run
    num_steps: int = knob(24, ge=1)  # policy updates; each spends one step's sampling budget
    total_token_budget: int = knob(0, ge=0)  # the run's sampled tokens in all: stop after the first step whose cumulative sampled tokens reach this (0 = off; num_steps stays the cap; a step's own budget is allocation's), so every method of a comparison gets the same sampled tokens (docs/training.md)
    out_dir: str = "runs/{method}-seed{seed}"  # run directory ({method} and {seed} are filled in)
    eval_every: int = knob(0, ge=0)  # held-out evaluation every N steps (0 = only before the first and after the last step)
    eval_steps: tuple[int, ...] = knob((), ge=1)  # also evaluate after these steps (besides eval_every's, the first and the last): evaluations where a comparison reads them (docs/training.md)
    eval_prompts: int = knob(256, ge=2)  # held-out questions per evaluation (more = smaller standard error, slower)
    eval_samples: int = knob(4, ge=1)  # samples per held-out question (avg@k)
    eval_temperature: float = knob(1.0, ge=0)  # sampling temperature of the evaluation (0 = greedy)
    eval_coupled: bool = False  # coupled evaluation: each question's samples draw from streams keyed by (seed, question, sample, turn), the same for every method of a seed, so differences between methods carry less sampling noise (docs/training.md)
    checkpoint_every: int = knob(1, ge=1)  # write a checkpoint every N steps (and after the last); a resume restarts there
    num_threads: int = knob(1, ge=0)  # torch CPU threads (0 = torch's default); one is fastest for the tiny model on 2 cores
    tensorboard: bool = True  # also write TensorBoard event files (needs tensorboardX)
    save_trees: bool = True  # write each step's pool and trees to <run>/trees/ (for `tracerl view`; ~0.3 MB a step)
    progress: bool = True  # a progress bar with the key figures on stderr
    executor: str = knob("local", choices=("local", "ray"))  # "local": rollouts in this process; "ray": on Ray actors, clients of policy.base_url
    num_workers: int = knob(2, ge=1)  # executor="ray": rollout worker processes, 1 Ray CPU each; fixed for a run (seeds per worker)
    ray_address: str = ""  # executor="ray": "" = a loopback-only local cluster; "auto" or ray://host:port = yours

    def __post_init__(self) -> None:
        problems = check_fields(self, "run.")
        late = [s for s in self.eval_steps if s > self.num_steps]
        if late:
            problems.append(f"run.eval_steps={list(self.eval_steps)}: {late} after run.num_steps={self.num_steps}; "
                            "drop them or raise num_steps (the last step is always evaluated)")
        raise_problems(problems)

    def evaluates_after(self, step: int) -> bool:
        """Whether the held-out evaluation runs after `step` (the last step's, which always runs, aside)."""
        return bool(self.eval_every and step % self.eval_every == 0) or step in self.eval_steps

    def finished(self, step: int, cum_tokens: float) -> bool:
        """Whether a run at `step` having sampled `cum_tokens` is done: num_steps reached, or the token budget."""
        return reached_stop(self.num_steps, self.total_token_budget, step, cum_tokens)

    def fraction_done(self, step: int, cum_tokens: float) -> float:
        """How far a run is towards whichever stop comes first, in [0, 1]."""
        by_tokens = cum_tokens / self.total_token_budget if self.total_token_budget else 0.0
        return min(1.0, max(step / self.num_steps, by_tokens))


@dataclass(frozen=True)
class PolicyConfig:
    model: str = "embedded"  # "embedded" (built on the spot, cached), a local Hugging Face model directory or a hub id
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)  # the embedded policy's build (policy.model="embedded")
    cache_dir: str = ""  # where the embedded build is cached ("" = $TRACERL_CACHE or ~/.cache/tracerl)
    max_batch_size: int = knob(64, ge=1)  # rollouts the engine decodes together
    engine: str = knob("transformers", choices=ENGINES)  # "transformers" or "vllm" (in process), or "openai" (a vLLM/SGLang/tracerl serve server)
    base_url: str = ""  # the server of engine="openai", e.g. http://127.0.0.1:8000
    served_model_name: str = ""  # the model name the server expects ("" = the first it lists)
    n_mode: str = knob("n", choices=("n", "repeat"))  # "n": one request per prefix with n samples (vLLM, tracerl serve); "repeat": SGLang
    sync_weights: bool = True  # engine="openai": push the weights to the server after each update (tracerl serve, vLLM)
    vllm_max_model_len: int = knob(4096, ge=2)  # engine="vllm": longest prefix + turn vLLM accepts (raise it for long rollouts)
    vllm_kv_cache_gib: float = knob(1.0, gt=0)  # engine="vllm" on CPU: memory of vLLM's KV cache, its prefix cache included
    vllm_gpu_memory_utilization: float = knob(0.3, gt=0, le=1)  # engine="vllm" on a GPU: share of the device vLLM takes (the trainer shares the rest)
    vllm_sleep: bool = True  # engine="vllm" on a GPU: vLLM frees its memory (sleep mode) during each policy update
    device: str = "cpu"  # the trainer's model, reference model and in-process engine: cpu, cuda, cuda:N or auto
    precision: str = knob("float32", choices=("float32", "bfloat16"))  # bfloat16: the update's forwards under autocast (less memory); weights, AdamW and the in-process engine stay float32
    lora_rank: int = knob(0, ge=0)  # LoRA rank r; 0 = full fine-tuning, r > 0 trains only low-rank adapters (needs peft)
    lora_alpha: float = knob(32.0, gt=0)  # LoRA scale: the adapted weight is W + (lora_alpha / lora_rank) B A
    lora_dropout: float = knob(0.0, ge=0, lt=1)  # dropout on the adapters' input in training (0: training and sampling forwards agree)
    lora_target_modules: tuple[str, ...] = LORA_TARGETS  # names of the linear layers that get adapters

    def __post_init__(self) -> None:
        problems = check_fields(self, "policy.")
        if not _names_a_device(self.device):
            problems.append(f"policy.device={self.device!r}; use cpu, cuda, cuda:N or auto (cuda when available, "
                            "else cpu)")
        if not self.lora_target_modules or not all(self.lora_target_modules):
            problems.append(f"policy.lora_target_modules={list(self.lora_target_modules)} must name at least one "
                            f"module and no empty name, e.g. {list(LORA_TARGETS)}")
        if self.engine == "openai" and not self.base_url.startswith(("http://", "https://")):
            problems.append(f"policy.engine='openai' needs policy.base_url=http://host:port of the server "
                            f"(got {self.base_url!r})")
        raise_problems(problems)


@dataclass(frozen=True)
class DataConfig:
    domain: str = knob("multihop", choices=DATA_DOMAINS)  # one of multihop, math, funcall, bfcl, or task (your own; set by data.task/train_files)
    task: str = ""  # your own task: "module:function" returning tracerl.io.env.task.UserTask (see docs/tasks.md)
    train_files: tuple[str, ...] = ()  # parquet/JSONL rows in verl's layout; replace the task's own training rows
    test_files: tuple[str, ...] = ()  # parquet/JSONL held-out rows in verl's layout; replace the task's own
    options: dict = field(default_factory=dict)  # the built-in domain's constructor options, e.g. math's mix (docs/domains.md)
    num_train_prompts: int = knob(4000, ge=1)  # training questions the pools are drawn from (in a fixed shuffled order)
    max_turns: int = knob(0, ge=0)  # policy turns per rollout (0 = the embedded policy's or 8)
    max_tokens_per_turn: int = knob(0, ge=0)  # sampled tokens per turn (0 = the embedded policy's or 128)
    max_tokens_per_rollout: int = knob(0, ge=0)  # policy + observation tokens after the prompt (0 = the embedded policy's or 1024)

    def __post_init__(self) -> None:
        raise_problems(check_fields(self, "data."))
        if (self.task or self.train_files) and self.domain not in ("multihop", "task"):
            raise ValueError(f"data.task/data.train_files set with data.domain={self.domain!r}; drop data.domain "
                             "(a task of your own is data.domain='task')")
        if self.task or self.train_files:
            object.__setattr__(self, "domain", "task")  # the default domain gives way to the user's task
        elif self.domain == "task":
            raise ValueError("data.domain='task' needs data.task=\"module:function\" or data.train_files")
        if self.options and self.domain == "task":
            raise ValueError("data.options with a task of your own: its options belong in your task's code; drop "
                             "data.options")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = knob(1.0, gt=0)  # rollout sampling temperature (the loss scores tokens at the same temperature)
    top_p: float = knob(1.0, gt=0, le=1)  # nucleus sampling; < 1 makes the sampled logprobs differ from the trained distribution

    def __post_init__(self) -> None:
        raise_problems(check_fields(self, "sampling."))


@dataclass(frozen=True)
class OptimConfig:
    lr: float = knob(5e-4, gt=0)  # AdamW learning rate (constant); the tiny policy takes a large one, real models ~1e-6
    weight_decay: float = knob(0.0, ge=0)  # AdamW decoupled weight decay
    betas: tuple[float, float] = knob((0.9, 0.99), ge=0, lt=1)  # AdamW betas (each in [0, 1))
    grad_clip: float = knob(1.0, ge=0)  # max global gradient norm (0 = no clipping)
    num_epochs: int = knob(1, ge=1)  # passes over a step's rollouts; > 1 reuses samples off-policy (the clip matters then)
    micro_batch_rollouts: int = knob(32, ge=1)  # rollouts per forward/backward (gradients accumulate); lower it to save memory
    clip_eps: float = knob(0.2, ge=0, lt=1)  # PPO clip range below 1
    clip_eps_high: float = knob(0.28, ge=0)  # clip range above 1 (DAPO's clip-higher keeps exploration alive)
    kl_coef: float = knob(0.0, ge=0)  # k3 KL penalty to the initial policy (0 = no reference model is kept)
    agg: str = knob("token-mean", choices=("token-mean", "seq-mean-token-mean"))  # loss aggregation: token-mean or seq-mean-token-mean
    packed: bool = False  # train on packed trees (shared prefixes computed once); same gradient, faster for wide trees

    def __post_init__(self) -> None:
        raise_problems(check_fields(self, "optim."))


@dataclass(frozen=True)
class PredictorConfig:
    name: str = "hashed_logistic"  # a registered predictor (tracerl.core.predictor.PREDICTORS; tracerl predictors lists them)
    # its constructor options (see its docstring); these are the best of a small grid on real multihop trees with the
    # domain's state features (docs/predictors.md): text weights held back by l2, longer fits, a gentle recalibration
    options: dict = field(default_factory=lambda: {"l2": 0.1, "num_epochs": 4, "root_num_epochs": 10,
                                                   "calibration_ridge": 500.0})

    def __post_init__(self) -> None:
        if self.name not in PREDICTORS or self.name == "oracle":
            raise ValueError(f"predictor.name={self.name!r}; use one of {sorted(set(PREDICTORS) - {'oracle'})} (the "
                             "oracle exists only in the simulator)")
        if "seed" in self.options or "state_features" in self.options:
            raise ValueError("predictor.options sets seed or state_features; drop it: the predictor's seed is "
                             "run.seed and its state features are the domain's")

    def check_machine(self) -> None:
        """The predictor's class imports here (a neural one needs torch and transformers), and every option is one
        of its constructor's parameters."""
        try:
            cls = predictor_class(self.name)
        except ImportError as err:
            raise ValueError(f"predictor.name={self.name!r}: {err}") from err
        params = inspect.signature(cls).parameters
        known = sorted(set(params) - {"self", "seed", "state_features"})
        unknown = set(self.options) - set(known)
        if unknown:
            raise ValueError(f"predictor.options has {listing(unknown)}, which {self.name} does not take; its "
                             f"options: {known} (docs/predictors.md)")


@dataclass(frozen=True)
class TrainConfig:
    method: str = knob("trace", choices=tuple(METHODS))  # a method preset (tracerl methods lists them)
    run: RunConfig = field(default_factory=RunConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    allocation: AllocationConfig = field(default_factory=lambda: AllocationConfig(num_prompts=16))
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        raise_problems(check_fields(self))
        preset = METHODS[self.method]
        if preset.predictor == "oracle":
            raise ValueError(f"method={self.method!r} needs the true success probability, which only the simulator "
                             "knows; run it with `tracerl bench alloc`")
        if preset.advantage not in ADVANTAGES:
            raise ValueError(f"method {self.method!r} names advantage {preset.advantage!r}, which is not registered")
        if self.policy.model == "embedded" and self.data.domain == "bfcl":
            raise ValueError("data.domain='bfcl' with policy.model='embedded': the embedded policy does not learn BFCL's "
                             "multi-turn cases (docs/domains.md says why); set policy.model to a local Hugging Face "
                             "model directory")
        if self.policy.model == "embedded" and self.data.domain == "multihop" and self.policy.embedded.warmup_options:
            raise ValueError("policy.embedded.warmup_options with the multihop world: its warm start's questions are set "
                             "by policy.embedded.warmup_hop_mix; drop warmup_options")
        if self.policy.model == "embedded" and self.data.domain == "multihop" and self.data.options:
            raise ValueError("data.options with the embedded multihop policy: its world is policy.embedded's (e.g. "
                             "--set policy.embedded.hops=[1,3]); drop data.options")
        if self.run.executor == "ray" and self.data.domain == "task":
            raise ValueError("data.task with run.executor='ray': rollout workers do not load a task of your own yet; "
                             "use run.executor=local")
        if self.run.executor == "ray" and self.policy.engine != "openai":
            raise ValueError(f"run.executor='ray' with policy.engine={self.policy.engine!r}: the rollout workers are "
                             "clients of a generation server; set policy.engine=openai and policy.base_url=http://"
                             "host:port of `tracerl serve` (or vLLM, SGLang), or use run.executor=local")

    def check_machine(self) -> None:
        """What this machine must have to run the config (schema checks run at construction, so a saved
        config.json parses anywhere): Ray for run.executor=ray, the CUDA device, peft for LoRA, the neural
        predictor's packages, vLLM for policy.engine=vllm, and the model directory (or a hub id)."""
        if self.run.executor == "ray" and not _has_ray():
            raise ValueError("run.executor='ray' needs Ray: pip install -e \".[ray]\" (or set run.executor=local)")
        if self.policy.engine == "vllm" and not _has_vllm():
            raise ValueError("policy.engine='vllm' needs vLLM in this environment: pip install -e '.[vllm]' in its "
                             "own virtual environment (docs/engines.md), or set policy.engine=transformers")
        check_device(self.policy.device)
        if self.policy.lora_rank and importlib.util.find_spec("peft") is None:
            raise ValueError(f"policy.lora_rank={self.policy.lora_rank} needs peft: pip install -e '.[lora]' (or set "
                             "policy.lora_rank=0 for full fine-tuning)")
        self.predictor.check_machine()
        if self.data.options:
            check_options(self.data.domain, self.data.options)
        model = self.policy.model
        if model != "embedded" and not (model and Path(model).is_dir()) and not _looks_like_hub_id(model):
            raise ValueError(f"policy.model={model!r} is neither 'embedded', a local model directory nor a hub id "
                             "like Qwen/Qwen3-0.6B")

    def domain_factory(self) -> Callable[[], Any] | None:
        """The built-in domain this run trains on, as a picklable zero-argument factory (the trainer and the Ray
        rollout workers build it the same way); None for a task of your own. The embedded multihop policy's world
        is the one its build describes (`policy.embedded`)."""
        if self.data.domain == "task":
            return None
        if self.policy.model == "embedded" and self.data.domain == "multihop":
            return self.policy.embedded.make_domain
        return functools.partial(make_domain, self.data.domain, **self.data.options)

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


def _names_a_device(device: str) -> bool:
    """cpu, auto, cuda or cuda:N with N in ASCII digits ("cuda:²" passes `isdigit` and fails in torch)."""
    kind, _, index = device.partition(":")
    if device in ("cpu", "auto", "cuda"):
        return True
    try:
        return kind == "cuda" and parse_int(index, "the cuda index", max_digits=4) >= 0
    except ValueError:
        return False


def check_device(device: str) -> None:
    """policy.device names cpu, cuda, cuda:N or auto, and a cuda device exists (torch is imported only to check)."""
    if not _names_a_device(device):
        raise ValueError(f"policy.device={device!r}; use cpu, cuda, cuda:N or auto (cuda when available, else cpu)")
    kind, _, index = device.partition(":")
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


# what a resumed run may change: none of it changes what is sampled or trained. run.ray_address may (a cluster is
# where workers run, not what they sample); run.executor and run.num_workers may not (each worker samples its share
# of a step's prompts with its own seed, so the split and the seeds follow them). policy.device may, so that a run
# saved on a GPU resumes on a CPU: the algorithm is the same, but float rounding and the sampler's random stream
# differ between devices, so only a resume on the same device repeats the uninterrupted run exactly. run.out_dir may:
# a run folder moved or copied elsewhere (a comparison's runs gathered from several machines) is the same run.
RESUMABLE_CHANGES = ("run.num_steps", "run.total_token_budget", "run.progress", "run.tensorboard", "run.eval_every",
                     "run.eval_steps", "run.checkpoint_every", "run.ray_address", "policy.device", "run.out_dir")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{dotted key: canonical JSON of the value} of every leaf of a nested dict (NaN equals NaN here)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
    return out


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any], may_change: Sequence[str] = (),
                   defaults: Mapping[str, Any] | None = None) -> list[str]:
    """Dotted keys whose values differ between two configs, leaving out the keys in `may_change` (and the keys
    under them). A key one side lacks takes its value in `defaults` (a field added since the save: the run had its
    default's behaviour), else it differs. Each side nests at most `tracerl.io.files.MAX_DEPTH` levels (ValueError),
    so the walk's recursion is bounded."""
    check_depth(saved, "the saved config")
    check_depth(now, "this run's config")
    base = _flatten(defaults or {})
    saved_flat, now_flat = {**base, **_flatten(saved)}, {**base, **_flatten(now)}

    def allowed(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in may_change)
    return sorted(k for k in set(saved_flat) | set(now_flat)
                  if saved_flat.get(k) != now_flat.get(k) and not allowed(k))


def as_saved_today(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A run's saved config (its `config.json`, or a checkpoint's) read as this version writes it: a saved
    `policy.embedded` holds only the fields it overrode when it was written before the section was typed (then `{}`
    meant the default build), so those are read over the section's defaults."""
    check_depth(saved, "the saved config")
    saved = json.loads(json.dumps(saved))
    policy = saved.get("policy")
    if isinstance(policy, dict) and isinstance(policy.get("embedded"), dict):
        policy["embedded"] = {**EmbeddedConfig().to_dict(), **policy["embedded"]}
    return saved


def resume_differences(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """The keys in which `config` differs from a run's saved config (`config.json` as a dict, read by
    `as_saved_today`) and a resume may not change (`RESUMABLE_CHANGES`); a key the saved config lacks was added since
    and takes its default."""
    return config_changes(as_saved_today(saved), config.to_dict(), RESUMABLE_CHANGES, TrainConfig().to_dict())


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None, *, machine: bool = True) -> TrainConfig:
    """Preset file (or `base`, or the defaults), then `key=value` overrides, checked (ValueError names the fix);
    with `machine`, also that this machine can run it (`TrainConfig.check_machine`)."""
    data = load_file(path) if path else dict(base or {})
    if path and isinstance(data.get("data"), dict):  # the file's paths start at its folder
        data["data"] = resolve_task_paths(data["data"], Path(path).resolve().parent)
    data = apply_overrides(data, list(overrides or []))
    if isinstance(data.get("data"), dict):  # the command line's at the working directory
        data["data"] = resolve_task_paths(data["data"], Path.cwd())
    config = from_dict(TrainConfig, data, where="")
    if machine:
        config.check_machine()
    return config
