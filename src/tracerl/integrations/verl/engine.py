"""Engines across the verl boundary, in both directions.

- `VerlEngine`: tracerl's engine protocol (`generate(prefixes, params, n) -> completions`, synchronous) over
  verl's LLM client (`async generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput`), so tracerl's
  ReAct driver grows trees on verl's vLLM/SGLang servers. The driver runs in a worker thread; every sample of a
  call is sent to the client on the worker's event loop at once, all under one request id (the tree's), which
  verl's load balancer routes stickily, so a tree's branches reach one replica and its prefix cache. A call that
  passes `timeout_s`, a request the server aborts, or one without logprobs raises `RolloutFailed`; the worker
  records the rollouts it owed as failed leaves.
- `EngineLLMClient`: verl's LLM-client interface over any tracerl engine (the transformers engine, a scripted
  one), so verl's agent-loop machinery can run with no inference server (CPU tests, debugging).

verl's `TokenOutput.stop_reason` says "completed" for both a stop token and the length limit, so the finish
reason is read from the tokens: "stop" when the last one is a stop token, else "length". Neither class tokenizes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Sequence

from verl.workers.rollout.replica import TokenOutput

from tracerl.io.rollout.engine import Completion, SamplingParams


class RolloutFailed(RuntimeError):
    """The generation server did not produce a usable turn (error, abort, missing logprobs)."""


class RolloutTimeout(RolloutFailed):
    """A turn's generation took longer than `timeout_s`."""


class VerlEngine:
    """tracerl `Engine` over a verl LLM client, for calls made from a thread other than the loop's."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop, request_id: str, *, timeout_s: float,
                 base_params: dict[str, Any] | None = None):
        self.client, self.loop, self.request_id, self.timeout_s = client, loop, request_id, timeout_s
        self.base_params = {k: v for k, v in (base_params or {}).items()
                            if k not in ("temperature", "top_p", "max_tokens", "logprobs", "seed")}
        self.global_steps: list[int] = []  # policy versions the server reported (verl's staleness tags)

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1) -> list[list[Completion]]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        assert running is not self.loop, "VerlEngine.generate blocks; call it from a worker thread, not the loop"
        counts = [n] * len(prefixes) if isinstance(n, int) else list(n)
        future = asyncio.run_coroutine_threadsafe(self._generate_all(prefixes, params, counts), self.loop)
        return future.result()

    async def _generate_all(self, prefixes, params: SamplingParams, counts: list[int]) -> list[list[Completion]]:
        # one seed per request: a server given the same seed and prefix twice returns the same sample twice
        requests = [prefix for prefix, k in zip(prefixes, counts) for _ in range(k)]
        jobs = [self._one(prefix, params, index) for index, prefix in enumerate(requests)]
        try:
            flat = await asyncio.wait_for(asyncio.gather(*jobs), self.timeout_s)
        except asyncio.TimeoutError:
            raise RolloutTimeout(f"generation for tree {self.request_id} took longer than timeout_s="
                                 f"{self.timeout_s}") from None
        out, start = [], 0
        for k in counts:
            out.append(list(flat[start:start + k]))
            start += k
        return out

    async def _one(self, prefix: Sequence[int], params: SamplingParams, request_index: int) -> Completion:
        sampling = dict(self.base_params, temperature=params.temperature, top_p=params.top_p,
                        max_tokens=params.max_tokens, stop_token_ids=list(params.stop_token_ids), logprobs=True)
        if params.seed is not None:
            sampling["seed"] = params.seed + request_index
        out: TokenOutput = await self.client.generate(self.request_id, prompt_ids=list(prefix),
                                                      sampling_params=sampling)
        if out.stop_reason == "aborted" or not out.token_ids:
            raise RolloutFailed(f"the server returned no tokens for tree {self.request_id} "
                                f"(stop_reason={out.stop_reason!r})")
        if out.log_probs is None or len(out.log_probs) != len(out.token_ids):
            raise RolloutFailed(f"the server returned {len(out.token_ids)} tokens without one logprob each; "
                                "tracerl needs sampling logprobs (vLLM and SGLang return them when asked)")
        steps = (out.extra_fields or {}).get("global_steps")
        if steps is not None:
            self.global_steps.append(int(steps))
        finish = "stop" if out.token_ids[-1] in params.stop_token_ids else "length"
        return Completion(list(out.token_ids), [float(x) for x in out.log_probs], finish)


class EngineLLMClient:
    """verl's LLM-client interface (`generate(request_id, *, prompt_ids, sampling_params)`) over a tracerl engine.

    Calls are serialised (tracerl engines are not thread-safe) and run off the event loop. `requests` counts calls
    per request id, so a test can check that a tree's turns all carried the tree's id. `global_steps` is reported
    back in each `TokenOutput`, as verl's servers do."""

    def __init__(self, engine: Any, *, global_steps: int = 0):
        self.engine, self.global_steps = engine, global_steps
        self.requests: Counter[str] = Counter()
        self._lock: asyncio.Lock | None = None

    def __getstate__(self) -> dict[str, Any]:  # Ray pickles the client into each worker actor
        return {**self.__dict__, "_lock": None}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        if self._lock is None:
            self._lock = asyncio.Lock()
        self.requests[str(request_id)] += 1
        params = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                top_p=float(sampling_params.get("top_p", 1.0)),
                                max_tokens=int(sampling_params.get("max_tokens", 256)),
                                stop_token_ids=tuple(sampling_params.get("stop_token_ids", ())),
                                seed=sampling_params.get("seed"))
        async with self._lock:
            completion = (await asyncio.to_thread(self.engine.generate, [list(prompt_ids)], params, 1))[0][0]
        return TokenOutput(token_ids=list(completion.token_ids), log_probs=list(completion.logprobs),
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})
