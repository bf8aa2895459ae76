"""The TRACE agent-loop worker for verl V1: one tree per prompt, grown by tracerl, stored as one row per leaf.

`TraceAgentLoopWorker` subclasses verl's `AgentLoopWorkerTQ` (its undecorated class: Ray cannot subclass an actor
class) and overrides `_run_prompt`, the coroutine verl runs per prompt. For a prompt granted m > 0 rollouts
(`__rollout_n__`, written by the manager's stage 1) it

1. runs `grow_tree` in a thread: tracerl's `ReActDriver` over a `VerlEngine` (verl's LLM client, the tree's uid as
   request id) grows m bare rollouts, then stage 2 spends the prompt's share of the prefix budget
   (`__trace_prefix_budget__`) with `tracerl.core.growth`'s per-prompt expansion on a ledger of the run's prices
   (`tracerl.core.ledger`), asking the coordinator's predictor for prefix probabilities;
2. computes the tree's advantages with tracerl's registry (`tracerl.advantage`, the method's by default);
3. writes one row per leaf under `{uid}_{j}_0` with the fields and tags verl's own worker writes
   (`_agent_loop_postprocess`), `rm_scores` holding the per-token advantages (or the reward on the last token
   with `tracerl.rm_scores=reward`), the true reward in `extra_fields.reward_extra_info.tracerl_reward`;
4. hands the tree to the coordinator (predictor update) and marks the prompt `finished`.

A prompt granted 0 is marked `finished` with no rows: verl's sampler skips it. Generation that fails or times out
(`RolloutFailed`) never fails the prompt: the rollouts it owed become failed leaves (reward 0, finish reason
"error") and are counted (`rollout/failed_rollouts`, `rollout/engine_timeouts`, `rollout/engine_errors`). Only a
bug (an exception outside generation) marks the prompt `failure`, as verl's worker does.

Validation batches run bare rollouts only (`val_kwargs.n` each, no stage 2) and store rewards in `rm_scores`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tracerl.core.advantages import AdvantageConfig, compute_advantages
from tracerl.core.growth import expand_trees, mark_roots
from tracerl.core.ledger import make_prices
from tracerl.core.methods import AllocationConfig, MethodPreset, get_method
from tracerl.core.tree import Tree
from tracerl.integrations.verl.config import TraceVerlConfig, task_domain, task_settings
from tracerl.integrations.verl.engine import RolloutTimeout, VerlEngine
from tracerl.integrations.verl.rows import LeafRow, leaf_rows, tracerl_row
from tracerl.io.rollout.chat import ChatRenderer
from tracerl.io.rollout.driver import DriverLimits, ReActDriver
from tracerl.io.rollout.engine import SamplingParams

logger = logging.getLogger(__name__)

# per-row controls the manager adds to verl's batch; they are not stored with the rows
CONTROL_KEYS = ("__rollout_n__", "__do_sample__", "__trace_prefix_budget__", "__trace_p__", "__trace_seed__",
                "__trace_coordinator__")


class FailSafeRunner:
    """tracerl's `RolloutRunner` over a `ReActDriver`: a call whose generation raises records every rollout it
    owed as a failed leaf (the partial growth of a failed continuation call is dropped first) and counts it."""

    def __init__(self, driver: ReActDriver):
        self.driver = driver
        self.counters: Counter[str] = Counter()

    def _failed(self, err: Exception, num_rollouts: int) -> str:
        self.counters["rollout/engine_timeouts" if isinstance(err, RolloutTimeout) else "rollout/engine_errors"] += 1
        self.counters["rollout/failed_rollouts"] += num_rollouts
        return f"{type(err).__name__}: {err}"

    def run_roots(self, prompt_indices, counts):
        try:
            return self.driver.run_roots(prompt_indices, counts)
        except AssertionError:
            raise
        except Exception as err:  # the server failed or timed out: the prompt's rollouts are failed leaves
            error = self._failed(err, int(sum(counts)))
            trees, _ = self.driver.run_roots(prompt_indices, [0] * len(counts))  # the tokenized roots only
            for tree, m in zip(trees, counts):
                tree.add_failed_leaves(0, int(m), error, origin="bare")
            return trees, 0

    def run_continuations(self, requests):
        sizes = {id(tree): (tree, len(tree)) for tree, _, _ in requests}
        try:
            return self.driver.run_continuations(requests)
        except AssertionError:
            raise
        except Exception as err:
            error = self._failed(err, int(sum(k for *_, k in requests)))
            for tree, num_nodes in sizes.values():  # drop the failed call's partial growth
                tree.truncate(num_nodes)
            for tree, node_id, k in requests:
                tree.add_failed_leaves(node_id, int(k), error)
            return 0


def grow_tree(row: dict, count: int, prefix_budget: float, p_root: float | None, *, engine,
              renderer: ChatRenderer, domain: Any, limits: DriverLimits, sampling: SamplingParams,
              method: MethodPreset, alloc: AllocationConfig, predict, rng: np.random.Generator) -> tuple[Tree, Counter]:
    """One prompt's tree: `count` bare rollouts, then stage 2 on `prefix_budget` (tracerl's per-prompt expansion,
    charged to a ledger of `alloc`'s prices holding that budget). `p_root`: stage 1's prediction (None where the
    method reads none)."""
    driver = ReActDriver(engine, renderer, domain, sampling=sampling, limits=limits)
    driver.set_rows([row])
    runner = FailSafeRunner(driver)
    (tree,), _ = runner.run_roots([0], [count])
    mark_roots([tree], None if p_root is None else [p_root], [count])
    if method.prefix_policy is not None and alloc.expand_rounds > 0 and prefix_budget > 0:
        prices = make_prices(alloc)
        expand_trees(method, alloc, [tree], np.array([prefix_budget]), predict, runner, prices.ledger(prefix_budget),
                     rng, prices)
    return tree, Counter(driver.counters) + runner.counters


class TraceAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace_config = TraceVerlConfig.from_verl(self.config)
        self.method = get_method(self.trace_config.method)
        self.renderer = ChatRenderer(self.tokenizer)
        self.domain = task_domain(task_settings(self.config), self.trace_config.domain,
                                  self.trace_config.domain_options)
        self.limits = self.trace_config.limits(self.rollout_config.response_length)
        self.trace_threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="tracerl-tree")
        self.coordinators: dict[str, Any] = {}

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        uid, validate = prompt["uid"], bool(trajectory["validate"])
        partition = "val" if validate else "train"
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": "running"})
        try:
            await self._grow_and_store(prompt, dict(sampling_params), validate, partition)
            status = "finished"
        except Exception:
            logger.exception("TRACE worker failed on prompt uid=%s", uid)
            status = "failure"
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": status})

    def _coordinator(self, name: str | None):
        if name and name not in self.coordinators:
            self.coordinators[name] = ray.get_actor(name)
        return self.coordinators.get(name) if name else None

    async def _grow_and_store(self, prompt: dict, sampling_params: dict, validate: bool, partition: str) -> None:
        cfg = self.trace_config
        controls = {k: prompt.pop(k) for k in CONTROL_KEYS if k in prompt}
        default_n = self.rollout_config.val_kwargs.n if validate else self.rollout_config.n
        count = int(controls.get("__rollout_n__", default_n))
        if count == 0:
            return
        uid = prompt["uid"]
        prefix_budget = 0.0 if validate else float(controls.get("__trace_prefix_budget__", 0.0))
        seed = controls.get("__trace_seed__")
        if not validate and not bool(controls.get("__do_sample__", True)):
            sampling_params["temperature"] = 0.0
        sampling = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                  top_p=float(sampling_params.get("top_p", 1.0)),
                                  seed=None if seed is None else int(seed))
        loop = asyncio.get_running_loop()
        engine = VerlEngine(self.llm_client, loop, str(uid), timeout_s=cfg.timeout_s, base_params=sampling_params)
        coordinator = None if validate else self._coordinator(controls.get("__trace_coordinator__"))
        predict = None
        if coordinator is not None and self.method.predictor != "none":
            def predict(histories):  # called from the tree's thread; the actor call runs on the loop
                call = _await(coordinator.predict.remote(list(histories)))
                return asyncio.run_coroutine_threadsafe(call, loop).result()
        p_root = float(controls["__trace_p__"]) if "__trace_p__" in controls and self.method.predictor != "none" \
            else None
        rng = np.random.default_rng([cfg.seed, 3, 0 if seed is None else int(seed)])
        grow = functools.partial(grow_tree, tracerl_row(prompt), count, prefix_budget, p_root, engine=engine,
                                 renderer=self.renderer, domain=self.domain, limits=self.limits, sampling=sampling,
                                 method=self.method, alloc=cfg.allocation, predict=predict, rng=rng)
        tree, counters = await loop.run_in_executor(self.trace_threads, grow)
        kind = "reward" if validate else cfg.rm_scores
        advantages = None
        if kind == "advantages":
            advantages = compute_advantages(cfg.advantage_name, [tree], AdvantageConfig(**cfg.advantage_options))[0]
        rows = leaf_rows(tree, advantages, filler_token_id=self.renderer.stop_token_ids[0])
        steps = engine.global_steps or [int(prompt.get("global_steps", 0) or 0)]
        keys, fields, tags = [], [], []
        for j, row in enumerate(rows):
            field, tag = self._leaf_fields(row, kind, dict(prompt, session_id=j), min(steps), max(steps))
            keys.append(f"{uid}_{j}_0")
            fields.append(field)
            tags.append(tag)
        await tq.async_kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags,
                                    partition_id=partition)
        if coordinator is not None:
            await coordinator.observe.remote(str(uid), tree.to_dict(), dict(counters))

    def _leaf_fields(self, row: LeafRow, kind: str, kwargs: dict, min_steps: int, max_steps: int):
        """One leaf's TransferQueue fields and tag, as verl's `_agent_loop_postprocess` writes them."""
        output = AgentLoopOutput(
            prompt_ids=row.prompt_ids, response_ids=row.response_ids, response_mask=row.response_mask,
            response_logprobs=row.logprobs, num_turns=1 + 2 * row.depth, metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": {"tracerl_reward": row.reward},
                          "min_global_steps": min_steps, "max_global_steps": max_steps,
                          "tracerl_leaf_id": row.leaf_id, "tracerl_finish_reason": row.finish_reason})
        field = output.as_dict()
        field["rm_scores"] = torch.tensor(row.token_scores(kind), dtype=torch.float32)
        field.update(kwargs)
        input_ids = torch.cat([field["prompts"], field["responses"]], dim=0)
        attention_mask = torch.ones_like(input_ids, dtype=torch.int64)
        multi_modal_inputs = self._compute_multi_modal_inputs(output, input_ids)
        position_ids = self._compute_position_ids(input_ids.unsqueeze(0), attention_mask.unsqueeze(0),
                                                  multi_modal_inputs).squeeze(0)
        field.update(loss_mask=field["response_mask"], input_ids=input_ids, position_ids=position_ids,
                     multi_modal_inputs=multi_modal_inputs)
        prompt_len, response_len = len(row.prompt_ids), len(row.response_ids)
        tag = {"status": "success", "prompt_len": prompt_len, "response_len": response_len,
               "seq_len": prompt_len + response_len, "global_steps": kwargs.get("global_steps"),
               "min_global_steps": min_steps, "max_global_steps": max_steps}
        return field, tag


async def _await(ref):
    return await ref
