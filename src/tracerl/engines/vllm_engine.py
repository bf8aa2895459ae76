"""Engine protocol on vLLM running in this process, with the trainer's weights loaded after every update.

What it does:
- token ids in (`TokensPrompt`, no tokenizer: `skip_tokenizer_init`), token ids, per-token logprobs and a finish
  reason out; one vLLM request per prefix with `n` samples; only `stop_token_ids` end a sample (`ignore_eos`), and
  the stop token is the last id of the output, as with every tracerl engine;
- logprobs after temperature: vLLM is built with `logprobs_mode="processed_logprobs"`, so a sampled token's logprob is
  `log_softmax(logits / T)`, what the trainer recomputes (`tracerl.train.loss.token_logprobs`). At top_p < 1 vLLM
  renormalises over the nucleus (`tracerl.engines.transformers_engine` does not); at T = 0 it is `log_softmax(logits)`;
- prefix caching on: a continuation from a tree node, or the next turn of a rollout, only prefills what vLLM's
  cache (whole KV blocks of `block_size` tokens) does not hold. `stats` carries vLLM's own counters
  (`prefix_cache_queries`, `prefix_cache_hits`, in tokens);
- `load_weights(state_dict or torch.save path)`: vLLM's in-place reload (`reload_weights` on its worker: the
  layerwise reload its RLHF weight-transfer engines run on checkpoint-format weights; names and shapes of the
  Hugging Face checkpoint, which vLLM maps onto its fused layers), then the prefix cache is reset, so no key/value
  computed with old weights is reused. `from_model` starts vLLM on dummy weights from a config alone and loads the
  given state dict, so no checkpoint is written: the trainer builds it from its own model (with LoRA: the merged
  weights);
- seeds: a seeded call gives each prefix's request its own seed (`request_seed`: the OpenAI engine's derivation), and
  vLLM gives the n samples of a request seed, seed+1, ...; same seed and inputs give the same samples whatever the
  batch. On CPU, vLLM's chunked prefill is switched off: a seeded request whose prefill is split crashes vLLM's
  CPU sampler ("CPU Generator does not use offset"), so every prompt is prefilled in one step.

vLLM's engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before it starts), so weights go
from the trainer's tensors to vLLM's without serialisation, and `llm.collective_rpc` reaches the worker directly.
vLLM's CPU worker replaces `torch.set_num_threads` process-wide (it pins threads in its own process); in this
process it pins nothing, so the original function is put back and `run.num_threads` keeps working. vLLM seeds
Python's, numpy's and torch's global generators with `seed` when it starts. Its log level defaults to ERROR here
(`VLLM_LOGGING_LEVEL` overrides it), on stderr.

GPU (untested: this code has only run on CPU): `gpu_memory_utilization` is the share of the device vLLM takes
(weights, activations and KV cache); the trainer shares the rest. With `enable_sleep_mode=True`, `sleep()` frees
vLLM's KV cache and moves its weights to host memory (vLLM's sleep level 1) while the trainer updates the policy;
`load_weights` and `generate` wake it first. On CPU vLLM has no sleep mode and `sleep()` does nothing.

Inputs are checked before vLLM sees them, since an input vLLM rejects from inside its engine core can leave the
engine stuck (the next `generate` hangs) and a weight load it rejects halfway leaves meta tensors behind:
- at construction, on CPU: head_dim among the sizes vLLM's CPU attention supports and block_size a multiple of 32
  (ValueError naming the value);
- in `generate`: token ids of every prefix and `stop_token_ids` in [0, vocab_size), a finite temperature that is 0
  or at least MIN_TEMPERATURE (vLLM would serve a smaller one as greedy, with logprobs the trainer cannot
  recompute), each prefix shorter than max_model_len (ValueError);
- in `load_weights`: the state dict has exactly the model's Hugging Face keys (a tied lm_head may be left out; keys
  of an unmerged adapter are named as such), and each value is a dense, finite, real floating tensor of the right
  shape, not on the meta device (ValueError; nothing is loaded). Non-contiguous or other-precision tensors are
  converted. The keys and shapes come from the model given to `from_model`, or from its config built on the meta
  device. If a checked load still fails inside vLLM, the last loaded weights (a host copy, `keep_last_weights`) are
  loaded back and EngineError says so.

What it does not do: text, chat templates, tokenization; tensor or pipeline parallelism; LoRA adapters inside vLLM
(it loads merged weights); models vLLM's CPU backend cannot run (see the construction checks above).
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tracerl.engines.errors import EngineError
from tracerl.engines.openai_engine import request_seed
from tracerl.engines.tensors import tensor_problem
from tracerl.io.files.boundary import listing
from tracerl.io.rollout.engine import MIN_TEMPERATURE, Completion, SamplingParams, check_request

_ADAPTER_MARKS = ("lora_", "base_model.model.", ".base_layer.", "modules_to_save")  # keys of an unmerged adapter


class VLLMEngine:
    """Engine protocol on an in-process `vllm.LLM` (see the module docstring).

    - `model`: a Hugging Face model directory (config and weights; with `load_format="dummy"` the config alone).
    - `device`: "cpu" or "cuda" (vLLM picks the GPU; "cuda:N" is not supported, set CUDA_VISIBLE_DEVICES).
    - `dtype`: vLLM's compute dtype; float32 matches a float32 trainer's logprobs best.
    - `max_model_len`: longest prefix plus generation a request may have; vLLM refuses longer prompts.
    - `block_size`: tokens per KV block, the unit of prefix-cache hits (a multiple of 32 on CPU).
    - `kv_cache_gib`: CPU only: memory for the KV cache (and so the prefix cache).
    - `gpu_memory_utilization`: GPU only: share of the device vLLM may use.
    - `enable_sleep_mode`: GPU only: allow `sleep()` (see the module docstring).
    - `max_num_seqs`: most sequences vLLM decodes together.
    - `seed`: vLLM's engine seed (unseeded calls draw from it).
    - `enforce_eager`: no CUDA graphs / torch.compile; None = True on CPU (compiling costs more than it saves on
      small models), vLLM's default on GPU.
    - `options`: any other `vllm.LLM` keyword arguments, passed as given.
    - `keep_last_weights`: keep a host copy of the last loaded weights, to load back if a load fails inside vLLM;
      False saves that memory (a model's size) at the price of an engine without usable weights after such a failure.
    - `expected_weights`: the Hugging Face state dict the model takes (its tensors give names and shapes), used when
      transformers cannot build the model from its config on the meta device (a custom architecture); `from_model`
      passes the state dict it loads.

    `stats`: `num_calls`, `num_requests`, `generated_tokens`, `weight_loads`, and vLLM's cumulative
    `prefix_cache_queries` and `prefix_cache_hits` (tokens), read after every call.
    """

    def __init__(self, model: str | Path, *, device: str = "cpu", dtype: str = "float32", max_model_len: int = 4096,
                 block_size: int | None = None, kv_cache_gib: float = 1.0, gpu_memory_utilization: float = 0.3,
                 enable_sleep_mode: bool = False, max_num_seqs: int = 256, seed: int = 0,
                 enforce_eager: bool | None = None, load_format: str = "auto", options: dict[str, Any] | None = None,
                 keep_last_weights: bool = True, expected_weights: Mapping[str, torch.Tensor] | None = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}; VLLMEngine runs on 'cpu' or 'cuda' (choose the GPU with "
                             "CUDA_VISIBLE_DEVICES)")
        if max_model_len < 2 or kv_cache_gib <= 0 or not 0 < gpu_memory_utilization <= 1 or max_num_seqs < 1:
            raise ValueError(f"need max_model_len >= 2 (got {max_model_len}), kv_cache_gib > 0 ({kv_cache_gib}), "
                             f"0 < gpu_memory_utilization <= 1 ({gpu_memory_utilization}), max_num_seqs >= 1 "
                             f"({max_num_seqs})")
        config_file = Path(model) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        if device == "cpu":
            _check_cpu_shapes(config, block_size or 32)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (module docstring)
        # vLLM logs to stdout (which `--json` output owns) and warns about what this engine chose on purpose
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        from vllm import LLM

        cpu = device == "cpu"
        kwargs: dict[str, Any] = dict(
            model=str(model), runner="generate", skip_tokenizer_init=True, dtype=dtype, max_model_len=max_model_len,
            enable_prefix_caching=True, logprobs_mode="processed_logprobs", disable_log_stats=False,
            generation_config="vllm", seed=seed, max_num_seqs=max_num_seqs, load_format=load_format,
            enforce_eager=cpu if enforce_eager is None else enforce_eager)
        if block_size or cpu:
            kwargs["block_size"] = block_size or 32
        if cpu:  # an explicit KV size, and whole-prompt prefill (seeded requests; module docstring)
            kwargs.update(kv_cache_memory_bytes=int(kv_cache_gib * 2**30), enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_model_len, 2048))
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        kwargs.update(options or {})
        set_num_threads = torch.set_num_threads
        try:
            self.llm = LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads  # vLLM's CPU worker replaced it (module docstring)
        self.device, self.max_model_len = device, max_model_len
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.dtype = self.llm.llm_engine.model_config.dtype
        # name -> a meta tensor of the expected shape; names of tied copies (e.g. lm_head) may be left out of a load
        self._expected, self._optional = _expected_weights(model, expected_weights)
        self.keep_last_weights = keep_last_weights
        self._last_weights: dict[str, torch.Tensor] | None = None
        self.sleep_mode = enable_sleep_mode and not cpu
        self.sleeping = False
        self._workdir: tempfile.TemporaryDirectory | None = None
        self.stats: dict[str, int] = dict.fromkeys(
            ("num_calls", "num_requests", "generated_tokens", "weight_loads", "prefix_cache_queries",
             "prefix_cache_hits"), 0)

    @classmethod
    def from_model(cls, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor] | None = None,
                   workdir: str | Path | None = None, **kwargs) -> VLLMEngine:
        """An engine with the architecture and config of `model` (a transformers causal LM) and the weights
        `state_dict` (Hugging Face names; default `model.state_dict()`; a trainer with LoRA passes its merged
        weights). Only config.json is written, to `workdir` (default: a temporary directory removed by `close`);
        vLLM starts on dummy weights and then loads `state_dict`. Other keyword arguments go to the constructor."""
        tmp = None
        if workdir is None:
            tmp = tempfile.TemporaryDirectory(prefix="tracerl-vllm-")
            workdir = tmp.name
        Path(workdir).mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]  # a config built in code names none; vLLM picks the model by it
        config.save_pretrained(workdir)
        positions = getattr(config, "max_position_embeddings", None)
        if positions:  # vLLM refuses a max_model_len beyond the model's positions
            kwargs["max_model_len"] = min(kwargs.get("max_model_len", 4096), positions)
        kwargs.setdefault("expected_weights", model.state_dict(keep_vars=True) if state_dict is None else state_dict)
        try:
            engine = cls(workdir, load_format="dummy", **kwargs)
        except BaseException:
            if tmp is not None:
                tmp.cleanup()
            raise
        engine._workdir = tmp
        try:
            engine.load_weights(model.state_dict() if state_dict is None else state_dict)
        except BaseException:
            engine.close()
            raise
        return engine

    # ---- the Engine protocol -------------------------------------------------------------------------------------

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1) -> list[list[Completion]]:
        """For each prefix, n (or n[i]) sampled continuations; see the module docstring for logprobs and seeds."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        prompts, counts = check_request(prefixes, n)
        self._check_inputs(prompts, params)
        self._wake()
        self.stats["num_calls"] += 1
        asked = [i for i, c in enumerate(counts) if c]
        results: list[list[Completion]] = [[] for _ in prompts]
        if not asked:
            return results
        sampling = [VLLMSamplingParams(
            n=counts[i], temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            stop_token_ids=list(params.stop_token_ids), ignore_eos=True, logprobs=0, detokenize=False,
            skip_special_tokens=False, seed=request_seed(params.seed, i, 0)) for i in asked]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i in asked], sampling,
                                    use_tqdm=False)
        stops = set(params.stop_token_ids)
        for i, output in zip(asked, outputs):
            choices = sorted(output.outputs, key=lambda c: c.index)
            results[i] = [self._completion(choice, stops, i) for choice in choices]
            if len(results[i]) != counts[i]:
                raise EngineError(f"vLLM returned {len(results[i])} samples for prefix {i}, {counts[i]} were asked")
        self.stats["num_requests"] += len(asked)
        self.stats["generated_tokens"] += sum(len(c.token_ids) for r in results for c in r)
        self._read_counters()
        return results

    def _check_inputs(self, prompts: list[list[int]], params: SamplingParams) -> None:
        """ValueError naming what vLLM cannot take (module docstring), before vLLM sees it."""
        for i, p in enumerate(prompts):
            if len(p) >= self.max_model_len:
                raise ValueError(f"prefix {i} has {len(p)} tokens; vLLM was started with max_model_len="
                                 f"{self.max_model_len}: raise it (policy.vllm_max_model_len)")
        for name, ids in [(f"prefix {i}", p) for i, p in enumerate(prompts)] + [("stop_token_ids",
                                                                                 params.stop_token_ids)]:
            if ids and not (0 <= min(ids) and max(ids) < self.vocab_size):
                bad = next(t for t in ids if not 0 <= t < self.vocab_size)
                raise ValueError(f"{name} has token id {bad}, outside the vocabulary [0, {self.vocab_size}); encode "
                                 "with the tokenizer that matches this model")
        temperature = params.temperature
        if not math.isfinite(temperature) or 0 < temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={temperature}: need 0 (greedy) or a finite value >= {MIN_TEMPERATURE} "
                             "(vLLM serves smaller ones as greedy, with logprobs the trainer cannot recompute)")

    @staticmethod
    def _completion(choice: Any, stops: set[int], i: int) -> Completion:
        ids = [int(t) for t in choice.token_ids]
        if choice.logprobs is None or len(choice.logprobs) != len(ids):
            raise EngineError(f"vLLM returned {len(ids)} tokens but no logprob for each (prefix {i})")
        logprobs = [float(entry[t].logprob) for t, entry in zip(ids, choice.logprobs)]
        reason = choice.finish_reason
        if reason == "stop" and not (ids and ids[-1] in stops):
            raise EngineError(f"vLLM stopped prefix {i} on something other than stop_token_ids {sorted(stops)} "
                              f"(last ids {ids[-3:]}, stop_reason {choice.stop_reason!r})")
        if reason not in ("stop", "length"):
            raise EngineError(f"vLLM finished prefix {i} with finish_reason={reason!r} after {len(ids)} tokens")
        return Completion(ids, logprobs, reason)

    # ---- weights, memory, counters -------------------------------------------------------------------------------

    def load_weights(self, weights: Mapping[str, torch.Tensor] | str | Path) -> None:
        """Load new weights (a state dict with the Hugging Face names, or the path of one saved with `torch.save`)
        in place, then reset the prefix cache. Checked whole first (module docstring): ValueError and nothing
        loaded if it does not fit. Raises EngineError if vLLM fails anyway (the last weights are loaded back) or
        cannot reset its cache (requests still hold blocks), since a cached key/value of the old weights must never
        be reused."""
        if isinstance(weights, (str, Path)):
            if not Path(weights).is_file():
                raise ValueError(f"no weights file at {weights}; save the state dict with torch.save")
            weights = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
        state = self._checked(weights)
        if self.sleeping:  # weights first: the KV cache is allocated again after the new weights are in place
            self.llm.wake_up(tags=["weights"])
        try:
            self._reload(state)
        except Exception as err:
            if self._last_weights is None:
                raise EngineError(f"vLLM failed to load the weights ({type(err).__name__}: {str(err)[:300]}) and no "
                                  "earlier weights are kept (keep_last_weights=False): load a full state dict "
                                  "before generating") from err
            self._reload(self._last_weights)
            self.clear_cache()
            raise EngineError(f"vLLM failed to load the weights ({type(err).__name__}: {str(err)[:300]}); the "
                              "previous weights were loaded back") from err
        if self.keep_last_weights:
            self._last_weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self._wake()
        self.clear_cache()
        self.stats["weight_loads"] += 1

    def _reload(self, state: Mapping[str, torch.Tensor]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items()),
                                                          "is_checkpoint_format": True})

    def _checked(self, state: Any) -> dict[str, torch.Tensor]:
        """`state` with every tensor checked and converted to this engine's dtype and contiguous, or ValueError."""
        if not isinstance(state, Mapping):
            raise ValueError(f"weights must be a state dict (a mapping of names to tensors), not "
                             f"{type(state).__name__}")
        problems = [f"{k}: {p}" for k, v in state.items() if (p := tensor_problem(v, self._expected.get(k)))]
        if self._expected:
            missing = set(self._expected) - set(state) - self._optional
            unexpected = set(state) - set(self._expected)
            adapter = [k for k in unexpected if any(mark in str(k) for mark in _ADAPTER_MARKS)]
            if adapter:
                raise ValueError(f"the state dict has keys of an unmerged adapter (lora) such as "
                                 f"{listing(adapter, 3)}; merge it first (peft's merge_and_unload) and send the merged "
                                 "weights; nothing was loaded")
            if missing or unexpected:
                raise ValueError(f"the state dict does not match the model: missing {listing(missing)}, unexpected "
                                 f"{listing(unexpected)}; nothing was loaded")
        if problems:
            raise ValueError(f"{len(problems)} tensors cannot be loaded: {problems[:5]}; nothing was loaded")
        return {k: v.detach().to(self.dtype).contiguous() for k, v in state.items()}

    def clear_cache(self) -> None:
        """Empty vLLM's prefix cache (after new weights; or to time a workload from a cold cache). Raises
        EngineError if vLLM cannot (requests still hold blocks): a stale key/value must never be reused."""
        if not self.llm.reset_prefix_cache():
            raise EngineError("vLLM could not reset its prefix cache (blocks still in use); load weights or clear "
                              "the cache only when no generate() call is running")

    def sleep(self) -> None:
        """Free vLLM's GPU memory for the policy update (with enable_sleep_mode on a GPU; otherwise nothing)."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def _wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def _read_counters(self) -> None:
        """vLLM's own prefix-cache counters (tokens queried and found in its cache, since the engine started)."""
        for metric in self.llm.get_metrics():
            key = {"vllm:prefix_cache_queries": "prefix_cache_queries",
                   "vllm:prefix_cache_hits": "prefix_cache_hits"}.get(metric.name)
            if key is not None:
                self.stats[key] = int(metric.value)

    def close(self) -> None:
        """Shut vLLM down (its engine core, then its one-process distributed group, so that another engine can
        start in this process) and remove the temporary model directory, if any."""
        import gc

        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        if getattr(self, "llm", None) is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()
            cleanup_dist_env_and_memory()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_cpu_shapes(config: dict, block_size: int) -> None:
    """ValueError when vLLM's CPU attention cannot run a model of `config` with `block_size` (module docstring)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    if block_size % 32:
        raise ValueError(f"block_size={block_size}: vLLM's CPU attention needs a multiple of 32")
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads and "hidden_size" in config else None)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is not None and head_dim not in supported:
        raise ValueError(f"head_dim={head_dim}: vLLM's CPU attention supports head sizes {supported}; choose "
                         "hidden_size / num_attention_heads among them")


def _expected_weights(model: str | Path, fallback: Mapping[str, torch.Tensor] | None
                      ) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The Hugging Face state dict the model takes, as meta tensors, and the names that may be left out (tied
    copies of another tensor): from the model's config built on the meta device, else from `fallback`, else
    ({}, set()) (then only each tensor is checked)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            given = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model))).state_dict(keep_vars=True)
    except Exception:  # noqa: BLE001 (a custom architecture: use what the caller gave)
        given = fallback
    if given is None:
        return {}, set()
    seen: set[int] = set()
    optional = set()
    for name, tensor in given.items():  # a tied tensor appears under two names; the second may be left out
        if id(tensor) in seen:
            optional.add(name)
        seen.add(id(tensor))
    return {k: torch.empty_like(v, device="meta") for k, v in given.items()}, optional
