"""The ReAct tree driver: a `RolloutRunner` over a real engine, a chat template and a domain's environments.

Per call it advances every active rollout one turn at a time, batching one engine call per turn over
all of them (the n rollouts of one anchor share one prefix, so the engine can prefill it once). Each
turn becomes a node: the policy's token ids and logprobs exactly as sampled (mask 1), then the text
the environment inserts, rendered by the tokenizer's chat template (mask 0). A continuation from a
node restores that node's environment snapshot and resumes from the node's exact token ids.

Model output never raises out of here: format errors and tool failures are observations, and so is an
environment that raises on the model's turn (an `error:` observation, counted in `rollout/env_exceptions`;
the rollout goes on). An `EpisodeError` (the environment itself cannot go on, e.g. a user's reward that raised)
ends the rollout as a failed leaf, counted the same way; a turn limit or a token limit ends the rollout as a failed leaf. Each case is
counted in `counters`. The driver tokenizes; engines and environments never do.

Text the environment inserts cannot forge the chat template: every observation goes through
`tracerl.io.rollout.chat.neutralise` (as a data row's prompt does when it is rendered), which puts a zero-width space
after the first character of every added or special token of the tokenizer (`<|im_end|>`, `<|im_start|>`,
`</tool_response>`, ...) before encoding, so it is encoded as plain text, never as the control token (counted in
`rollout/neutralised_special_tokens`).

With `coupled=True` (held-out evaluation, `run.eval_coupled`) every rollout samples from its own stream, keyed by
(seed, the question's index in the pool, the anchor node, the sample's index, the turn) and passed to the engine as
`keys` (coupled sampling, `tracerl.io.rollout.engine`): two policies evaluated on the same questions with the same seed
then draw the same random numbers for the same rollout and turn, never depending on how calls were batched. Two
rollouts of one question get different streams even when their histories coincide.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from tracerl.core.history import History
from tracerl.core.tree import Segment, Tree
from tracerl.io.env import EpisodeError, StepResult
from tracerl.io.files.rows import prompt_id
from tracerl.io.rollout.chat import ChatRenderer, neutralise, special_token_pattern
from tracerl.io.rollout.engine import Engine, SamplingParams, stream_key

@dataclass(frozen=True)
class DriverLimits:
    max_turns: int = 6  # policy turns per rollout; the turn that reaches it without an answer is a failed leaf
    max_tokens_per_turn: int = 128  # sampled tokens per turn (SamplingParams.max_tokens)
    max_tokens_per_rollout: int = 1024  # policy + observation tokens after the prompt
    max_observation_chars: int = 1500  # longer observations are cut (the model is told)

    def __post_init__(self) -> None:
        if min(self.max_turns, self.max_tokens_per_turn, self.max_tokens_per_rollout, self.max_observation_chars) < 1:
            raise ValueError(f"every driver limit must be >= 1, got {self}")


@dataclass
class _Active:
    tree: Tree
    node_id: int
    env: Any
    prefix: list[int]  # exact token ids of the prefix ending at node_id
    origin: str
    anchor: int  # the node this rollout started from
    stream: int = 0  # coupled sampling: this rollout's own stream key
    turns: int = 0  # policy turns sampled so far (coupled sampling keys each turn)


class ReActDriver:
    def __init__(self, engine: Engine, renderer: ChatRenderer, domain: Any, *,
                 sampling: SamplingParams = SamplingParams(), limits: DriverLimits = DriverLimits(),
                 coupled: bool = False):
        if coupled and not getattr(engine, "supports_keys", False):
            raise ValueError(f"coupled sampling needs an engine that takes per-prefix keys (TransformersEngine); "
                             f"{type(engine).__name__} does not: turn run.eval_coupled off")
        if coupled and sampling.seed is None:
            raise ValueError("coupled sampling needs a sampling seed (its streams are keyed by it)")
        self.coupled = coupled
        self.engine, self.renderer, self.domain, self.limits = engine, renderer, domain, limits
        self.sampling = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                       max_tokens=limits.max_tokens_per_turn,
                                       stop_token_ids=tuple(dict.fromkeys(sampling.stop_token_ids
                                                                           + renderer.stop_token_ids)),
                                       seed=sampling.seed)
        self.rows: list[dict[str, Any]] = []
        self.counters: Counter[str] = Counter()
        self._snapshots: dict[tuple[int, int], Any] = {}  # (id(tree), node_id) -> environment state after that node
        self._prefix_len: dict[tuple[int, int], int] = {}
        self._calls = 0
        self._specials = special_token_pattern(getattr(renderer, "tokenizer", None))

    # ------------------------------------------------------------------ pool
    def set_rows(self, rows: Sequence[dict[str, Any]]) -> list[History]:
        """Fix the step's candidate pool; returns its bare-prompt histories for the predictor."""
        self.rows = list(rows)
        self._snapshots.clear()
        self._prefix_len.clear()
        return [History(text=row["prompt"][-1]["content"], prompt_id=prompt_id(row)) for row in self.rows]

    # ------------------------------------------------------------------ RolloutRunner
    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        trees, starts = [], []
        for pool_index, m in zip(prompt_indices, counts):
            row = self.rows[pool_index]
            env = self.domain.make_env()
            question, ids = root_prompt(self.renderer, env, row)
            tree = Tree.new(prompt_id(row), Segment(ids, [0.0] * len(ids), [0] * len(ids), "", question),
                            meta={"pool_index": int(pool_index), "data_source": row.get("data_source", "")})
            self._remember(tree, 0, env, len(ids))
            trees.append(tree)
            starts.append((tree, 0, int(m)))
        return trees, self._run(starts, origin="bare")

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        return self._run([(tree, node_id, int(k)) for tree, node_id, k in requests], origin="continuation")

    # ------------------------------------------------------------------ the loop
    def _remember(self, tree: Tree, node_id: int, env: Any, prefix_len: int) -> None:
        self._snapshots[(id(tree), node_id)] = env.snapshot()
        self._prefix_len[(id(tree), node_id)] = prefix_len

    def _resume(self, tree: Tree, node_id: int) -> tuple[Any, list[int]]:
        """A fresh environment in the node's state, and the node's exact prefix ids (checked against the tree)."""
        key = (id(tree), node_id)
        if key not in self._snapshots:
            raise ValueError(f"node {node_id} of tree {tree.prompt_id!r} was not grown by this driver in this step; "
                             "continuations must come from nodes of the current step")
        env = self.domain.make_env()
        env.reset(self.rows[tree.meta["pool_index"]])
        env.restore(self._snapshots[key])
        prefix = tree.prefix_token_ids(node_id)
        assert len(prefix) == self._prefix_len[key], "a branch must resume the very same token ids as its prefix"
        return env, prefix

    def _run(self, starts: list[tuple[Tree, int, int]], origin: str) -> int:
        """Grow k rollouts from each (tree, node, k) to their leaves; returns the number of tokens sampled."""
        num_sampled = 0
        groups = [(self._resume(tree, node_id), tree, node_id, k) for tree, node_id, k in starts if k > 0]
        # first turn: one engine call, n samples per anchor (they share the anchor's prefix)
        pending: list[tuple[_Active, Any]] = []
        if groups:
            keys = [stream_key(self.sampling.seed, tree.meta["pool_index"], node_id) if self.coupled else 0
                    for _, tree, node_id, _ in groups]  # coupled sampling only; the seed was checked at construction
            outs = self._generate([prefix for (_, prefix), *_ in groups], [k for *_, k in groups], keys)
            for ((env, prefix), tree, node_id, k), key, completions in zip(groups, keys, outs):
                for j, completion in enumerate(completions):
                    own_env = env if j == k - 1 else self._copy_env(tree, node_id)
                    # the engine drew sample j from stream_key(key, j): the rollout's own stream from here on
                    stream = stream_key(key, j) if self.coupled else 0
                    pending.append((_Active(tree, node_id, own_env, prefix, origin, node_id, stream, 1), completion))
        while pending:
            for rollout, completion in pending:  # an environment may start slow work (a reward) for all at once
                prefetch = getattr(rollout.env, "prefetch", None)
                if prefetch is not None:
                    prefetch(self.renderer.policy_text(list(completion.token_ids)))
            active = []
            for rollout, completion in pending:
                num_sampled += len(completion.token_ids)
                if self._advance(rollout, completion):
                    active.append(rollout)
            if not active:
                break
            keys = [stream_key(r.stream, r.turns) for r in active] if self.coupled else []
            outs = self._generate([r.prefix for r in active], [1] * len(active), keys)
            for r in active:
                r.turns += 1
            pending = [(r, c[0]) for r, c in zip(active, outs)]
        return num_sampled

    def _copy_env(self, tree: Tree, node_id: int) -> Any:
        fresh = self.domain.make_env()
        fresh.reset(self.rows[tree.meta["pool_index"]])
        fresh.restore(self._snapshots[(id(tree), node_id)])
        return fresh

    def _generate(self, prefixes: list[list[int]], counts: list[int], keys: list[int]):
        """One engine call; `keys` (one per prefix) are passed only when sampling is coupled."""
        self._calls += 1
        if self.coupled:
            return self.engine.generate(prefixes, self.sampling, counts, keys=keys)
        params = self.sampling if self.sampling.seed is None else \
            SamplingParams(self.sampling.temperature, self.sampling.top_p, self.sampling.max_tokens,
                           self.sampling.stop_token_ids, self.sampling.seed + self._calls)
        return self.engine.generate(prefixes, params, counts)

    def _advance(self, rollout: _Active, completion) -> bool:
        """Apply one sampled turn; returns True while the rollout goes on."""
        limits, renderer = self.limits, self.renderer
        tree, parent = rollout.tree, rollout.node_id
        policy_ids, logprobs = list(completion.token_ids), list(completion.logprobs)
        text = renderer.policy_text(policy_ids)
        self.counters["rollout/turns"] += 1

        def add(segment: Segment, **leaf) -> int:
            return tree.add_child(parent, segment, origin=rollout.origin, anchor_id=rollout.anchor, **leaf)

        def policy_only(observation_text: str = "") -> Segment:
            return Segment(policy_ids, logprobs, [1] * len(policy_ids), text, observation_text)

        try:
            result = rollout.env.step(text)
        except EpisodeError as err:  # the environment cannot go on (not the model's doing): a failed leaf
            self.counters["rollout/env_exceptions"] += 1
            if getattr(err, "metric", None):  # what failed, e.g. rollout/reward_errors, rollout/reward_timeouts
                self.counters[err.metric] += 1
                self.counters["rollout/reward_calls"] += err.metric.startswith("rollout/reward_")
            add(policy_only(f"error: {type(err).__name__}: {err}"[:500]), reward=0.0, finish_reason="error",
                tool_error=True)
            return False
        except Exception as err:  # an environment failing on model output is data: the model sees the error
            self.counters["rollout/env_exceptions"] += 1
            result = StepResult(f"error: the environment could not process this turn ({type(err).__name__}: "
                                f"{str(err)[:300]})", done=False, tool_error=True)
        self.counters["rollout/tool_errors"] += bool(result.tool_error)
        if result.info.get("tool_timeout"):  # a key only once it happens, as a Ray worker's counters report it
            self.counters["rollout/tool_timeouts"] += 1
        if result.done:
            self.counters["rollout/reward_calls"] += 1
            add(policy_only(), reward=result.reward, finish_reason="answer", tool_error=result.tool_error)
            return False
        # cut first, then neutralise what is kept: the cost is linear in the kept text, not in what a tool returned
        observation = str(result.observation)
        if len(observation) > limits.max_observation_chars:
            observation = observation[: limits.max_observation_chars] + " [observation truncated]"
            self.counters["rollout/truncated_observations"] += 1
        # lone surrogates (a JSON "\\ud800" echoed by a tool) cannot be encoded: they become "?"
        observation = observation.encode("utf-8", "replace").decode("utf-8")
        observation, num_neutralised = neutralise(observation, self._specials)
        self.counters["rollout/neutralised_special_tokens"] += num_neutralised
        closed = completion.finish_reason == "stop"
        self.counters["rollout/truncated_turns"] += not closed
        obs_ids = renderer.encode(renderer.observation_text(observation, role=result.info.get("role", "tool"),
                                                            turn_closed=closed))
        used = len(rollout.prefix) - tree.root.segment.num_tokens + len(policy_ids) + len(obs_ids)
        reason = ("max_turns" if tree.nodes[parent].depth + 1 >= limits.max_turns
                  else "max_tokens" if used >= limits.max_tokens_per_rollout else None)
        if reason:  # no room for another turn: this one ends the rollout, unanswered
            self.counters[f"rollout/{reason}"] += 1
            add(policy_only(), reward=0.0, finish_reason=reason, tool_error=result.tool_error)
            return False
        segment = Segment(policy_ids + obs_ids, logprobs + [0.0] * len(obs_ids),
                          [1] * len(policy_ids) + [0] * len(obs_ids), text, observation)
        node_id = add(segment, tool_error=result.tool_error, meta=result.info.get("meta"))
        rollout.node_id, rollout.prefix = node_id, rollout.prefix + segment.token_ids
        self._remember(tree, node_id, rollout.env, len(rollout.prefix))
        return True


def root_prompt(renderer: ChatRenderer, env: Any, row: dict[str, Any]) -> tuple[str, list[int]]:
    """(question, token ids) of a row's root, with `env` reset to the row: the row's system messages and the
    environment's question, rendered with the environment's tool schemas."""
    question = env.reset(row)
    messages = [m for m in row["prompt"] if m["role"] == "system"] + [{"role": "user", "content": question}]
    return question, renderer.prompt_ids(messages, env.tools())


def check_prompt_lengths(rows: Sequence[dict[str, Any]], renderer: ChatRenderer, domain: Any, *,
                         context_tokens: int | None, max_tokens_per_turn: int, split: str) -> None:
    """ValueError naming the first row whose root prompt (`root_prompt`: system messages, question, tool schemas)
    leaves less than one turn of `max_tokens_per_turn` tokens of the model's `context_tokens` positions; such a row
    would fail the whole batch of the first step that draws it. `context_tokens=None` (unknown) checks nothing.

    One environment is reset per row (a task's `make_state` runs once per row) and closed at the end."""
    if not context_tokens:
        return
    env = domain.make_env()
    try:
        for number, row in enumerate(rows, 1):
            size = len(root_prompt(renderer, env, row)[1])
            if size + max_tokens_per_turn > context_tokens:
                raise ValueError(
                    f"{split} row {number} (id {prompt_id(row)!r}) has a prompt of {size} tokens (its system messages, "
                    f"question and tool schemas as rendered); with one turn of max_tokens_per_turn="
                    f"{max_tokens_per_turn} it passes the model's {context_tokens} positions: shorten the row or drop "
                    "it from the file, lower data.max_tokens_per_turn, or use a model with a longer context (with "
                    "vLLM, raise policy.vllm_max_model_len)")
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
