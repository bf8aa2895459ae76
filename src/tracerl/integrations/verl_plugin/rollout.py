"""A transformers rollout server registered as a verl rollout (`actor_rollout_ref.rollout.name=tracerl_hf`).

verl's trainer talks to its rollout servers through three objects, and this module gives each:
- `TransformersReplica` (a verl `RolloutReplica`, built by verl's `LLMServerManager` in the trainer's process):
  starts one `TransformersServer` Ray actor per replica, named so the training workers can find it;
- `TransformersServer` (the server): `generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput` on
  tracerl's `TransformersEngine` (KV reuse across a tree's turns, sampling log-probs), the control calls verl makes
  around a weight sync (sleep, wake_up, abort, resume: nothing to free on CPU), and `load_weights` (with `TRACERL_ROLLOUT_WEIGHTS_HASH=1` it prints the served weights' SHA-256 after each sync, a
  check for small models);
- `ServerAdapter` (a verl `BaseRollout`, built inside each hybrid training worker): verl's `update_weights` hands
  it the actor's full parameters after every update (the `naive` sync of colocated training); the worker of rollout
  rank 0 sends them to its replica's server, which copies them into its model in place.

Requests are served one at a time (the engine is not thread-safe), in arrival order: a CPU server for tests and
small models, not a throughput engine; on GPUs verl's vLLM and SGLang rollouts serve the same calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Generator

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.rollout.engine import SamplingParams
from tracerl.policy.embedded import weights_hash

logger = logging.getLogger(__name__)


def server_name(replica_rank: int) -> str:
    return f"tracerl_hf_server_{replica_rank}"


class TransformersServer:
    """One replica's generation server: a causal LM loaded from the actor's model path, in float32."""

    def __init__(self, model_path: str, replica_rank: int, max_batch_size: int = 32):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(max(1, int(os.environ.get("TRACERL_ROLLOUT_THREADS", "1"))))
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
        model.eval()
        self.engine = TransformersEngine(model, device="cpu", max_batch_size=max_batch_size)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.weight_syncs = 0
        self._lock = asyncio.Lock()

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError("the tracerl_hf rollout serves text models only; use verl's vLLM or SGLang rollout "
                             "for multimodal data")
        limit = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens", 256))
        params = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                top_p=float(sampling_params.get("top_p", 1.0)), max_tokens=int(limit),
                                stop_token_ids=tuple(sampling_params.get("stop_token_ids") or ()),
                                seed=sampling_params.get("seed"))
        async with self._lock:
            completion = (await asyncio.to_thread(self.engine.generate, [list(prompt_ids)], params, 1))[0][0]
        return TokenOutput(token_ids=list(completion.token_ids), log_probs=list(completion.logprobs),
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    async def load_weights(self, weights: list[tuple[str, torch.Tensor]], global_steps: int | None) -> int:
        """Copy the actor's parameters into the model in place; the number of tensors copied. A name the model
        does not have raises (a sync that silently skipped weights would serve a stale policy)."""
        async with self._lock:
            # the state dict, not named_parameters(): a tied lm_head is one parameter under two names there
            params = self.engine.model.state_dict(keep_vars=True)
            missing = [name for name, _ in weights if name not in params]
            if missing:
                raise KeyError(f"the actor sent weights the rollout model does not have: {missing[:5]}")
            with torch.no_grad():
                for name, tensor in weights:
                    params[name].copy_(tensor.to(params[name].dtype))
            self.engine.clear_cache()
            self.global_steps = global_steps
            self.weight_syncs += 1
            if os.environ.get("TRACERL_ROLLOUT_WEIGHTS_HASH"):  # a check for small models: hashing costs a pass
                print(f"tracerl_hf: replica {self.replica_rank} sync {self.weight_syncs} at step {global_steps}: "
                      f"weights {weights_hash(self.engine.model)}", flush=True)
        return len(weights)

    async def state(self) -> dict[str, Any]:
        """The served weights and how many syncs brought them (for tests and checks)."""
        return {"weights": {k: v.detach().clone() for k, v in self.engine.model.state_dict().items()},
                "weight_syncs": self.weight_syncs, "global_steps": self.global_steps}

    # the control calls verl makes around a weight sync: a CPU server frees nothing and holds no queue to abort
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        self.engine.clear_cache()

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        async with self._lock:
            return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class TransformersReplica(RolloutReplica):
    """verl's replica interface over one `TransformersServer` actor."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(f"the tracerl_hf rollout runs one process per replica; set "
                             f"actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel "
                             f"sizes 1), not a world size of {self.world_size}")
        path = self.model_config.get("path") if hasattr(self.model_config, "get") else self.model_config.path
        server = ray.remote(TransformersServer).options(
            name=server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency,
        ).remote(str(path), self.replica_rank)
        await server.wake_up.remote()  # raises here if the model does not load
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"tracerl-hf-{self.replica_rank}"


class ServerAdapter(BaseRollout):
    """The training worker's side of the weight sync: rollout rank 0 of a replica sends, the others only drain."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.sends = (rank % world) == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the tracerl_hf rollout takes merged weights only: set "
                                      "actor_rollout_ref.model.lora.merge=True")
        # every rank gathers (a sharded tensor's full_tensor() is a collective), only rank 0 of a replica sends
        named = [(name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor)
                 for name, tensor in weights]
        if not self.sends:
            return None
        named = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in named]
        count = await self._server_handle().load_weights.remote(named, kwargs.get("global_steps"))
        logger.info("tracerl_hf: %d tensors sent to replica %d", count, self.replica_rank)
        return None

    def generate_sequences(self, prompts: Any) -> Any:
        raise NotImplementedError("the tracerl_hf rollout is served through verl's agent loop (async mode)")
