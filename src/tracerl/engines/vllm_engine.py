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

What it does not do: text, chat templates, tokenization; tensor or pipeline parallelism; LoRA adapters inside vLLM
(it loads merged weights); models vLLM's CPU backend cannot run (its attention needs head_dim in {32, 64, 80, 96,
112, 128, ...} and block sizes that are multiples of 32).
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tracerl.engines.openai_engine import EngineError, request_seed
from tracerl.io.engine import Completion, SamplingParams, check_request


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

    `stats`: `num_calls`, `num_requests`, `generated_tokens`, `weight_loads`, and vLLM's cumulative
    `prefix_cache_queries` and `prefix_cache_hits` (tokens), read after every call.
    """

    def __init__(self, model: str | Path, *, device: str = "cpu", dtype: str = "float32", max_model_len: int = 4096,
                 block_size: int | None = None, kv_cache_gib: float = 1.0, gpu_memory_utilization: float = 0.3,
                 enable_sleep_mode: bool = False, max_num_seqs: int = 256, seed: int = 0,
                 enforce_eager: bool | None = None, load_format: str = "auto", options: dict[str, Any] | None = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}; VLLMEngine runs on 'cpu' or 'cuda' (choose the GPU with "
                             "CUDA_VISIBLE_DEVICES)")
        if max_model_len < 2 or kv_cache_gib <= 0 or not 0 < gpu_memory_utilization <= 1 or max_num_seqs < 1:
            raise ValueError(f"need max_model_len >= 2 (got {max_model_len}), kv_cache_gib > 0 ({kv_cache_gib}), "
                             f"0 < gpu_memory_utilization <= 1 ({gpu_memory_utilization}), max_num_seqs >= 1 "
                             f"({max_num_seqs})")
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
        for i, p in enumerate(prompts):
            if len(p) >= self.max_model_len:
                raise ValueError(f"prefix {i} has {len(p)} tokens; vLLM was started with max_model_len="
                                 f"{self.max_model_len}: raise it (policy.vllm_max_model_len)")
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
        in place, then reset the prefix cache. Raises EngineError if vLLM cannot reset it (requests still hold
        blocks), since a cached key/value of the old weights must never be reused."""
        if isinstance(weights, (str, Path)):
            weights = torch.load(weights, map_location="cpu", weights_only=True)
        if self.sleeping:  # weights first: the KV cache is allocated again after the new weights are in place
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items()),
                                                          "is_checkpoint_format": True})
        self._wake()
        self.clear_cache()
        self.stats["weight_loads"] += 1

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
