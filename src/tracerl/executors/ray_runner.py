"""Rollouts on Ray actors: `RayRolloutRunner`, a `RolloutRunner` that spreads a step's prompts over worker processes.

Each worker (a Ray actor, `RolloutWorker`) holds its own `ReActDriver` over an `OpenAIEngine` client, its own chat
renderer (tokenizer loaded from a local directory) and its own domain (from a picklable zero-argument factory or a
domain name). All workers talk to one generation server (`base_url`: vLLM, SGLang or `tracerl serve`).

- `set_rows(rows)` sends the step's pool to every worker (and replaces workers that died in an earlier step);
- `run_roots` splits the selected prompts over the live workers, balanced by rollout count, runs them in parallel
  and returns `Tree` objects rebuilt from dicts, in the caller's order;
- `run_continuations` sends each request to the worker that grew the tree, because only that worker holds the
  environment snapshots a continuation resumes from. The new nodes come back as dicts and are *appended* to the
  caller's `Tree` (its `nodes` and `children` lists, in place): existing nodes are left as they are, so what the
  caller wrote on them between calls (`p_pred`, `expand_reason`, `num_granted`, set by `growth.grow_trees`) stays.
- `counters` sums the workers' driver counters (same keys as `ReActDriver.counters`; they accumulate over the
  runner's life like a driver's) plus `rollout/worker_errors` (worker calls that died, raised or timed out),
  `rollout/worker_error_rollouts` (rollouts recorded as failed leaves because of them) and
  `rollout/worker_restarts` (`WORKER_COUNTERS`: always present, 0 until a worker fails).

A worker that dies, raises or exceeds `call_timeout_s` never takes the step down: each rollout it owed becomes a
failed leaf (finish_reason "error", reward 0, no tokens, the error in `observation_text`); a bare rollout's tree gets
an untokenized root (the question text, no ids). A dead worker's trees get failed leaves for every later
continuation of the step; `set_rows` starts a replacement. Sampling seeds: worker i samples with `seed + i * 1_000_003`
(worker 0 with `seed` itself), so a run is reproducible for a fixed number of workers and a one-worker runner
samples exactly what an in-process `ReActDriver` with the same seed samples.

`tracerl train` uses it with `run.executor="ray"`: the trainer builds one runner per run (workers persist across
steps), re-seeds it each step with the seed its in-process `ReActDriver` would get, and closes it when the run ends.

What it does not do: start a Ray cluster (`start_ray` in `tracerl.executors`, or your own `ray.init`), run the
generation server, move environment snapshots between workers (a continuation always runs where its root ran), or
retry a failed rollout.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from tracerl.core.history import History
from tracerl.core.tree import Segment, Tree
from tracerl.io.domains import make_domain
from tracerl.io.rollout.driver import DriverLimits, ReActDriver, prompt_id
from tracerl.io.rollout.engine import SamplingParams

try:
    import ray
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("tracerl.executors needs Ray: pip install -e \".[ray]\"") from err

SEED_STRIDE = 1_000_003  # worker i samples with seed + i * SEED_STRIDE
WORKER_COUNTERS = ("rollout/worker_errors", "rollout/worker_error_rollouts", "rollout/worker_restarts")


def worker_seed(seed: int | None, worker_index: int) -> int | None:
    """The sampling seed of worker `worker_index` (None stays None; worker 0 keeps `seed`)."""
    return None if seed is None else seed + worker_index * SEED_STRIDE


def partition(counts: Sequence[int], num_workers: int) -> list[list[int]]:
    """Positions of `counts` per worker, balanced by total count (largest first onto the least loaded worker;
    ties go to the lower position and the lower worker). Each worker's positions come back in ascending order."""
    assert num_workers >= 1, "partition needs at least one worker"
    loads = [0] * num_workers
    shares: list[list[int]] = [[] for _ in range(num_workers)]
    for pos in sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i)):
        w = min(range(num_workers), key=lambda j: (loads[j], j))
        shares[w].append(pos)
        loads[w] += int(counts[pos])
    return [sorted(s) for s in shares]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its driver; sent to each actor, so it must pickle."""

    base_url: str  # the generation server, e.g. http://127.0.0.1:8000
    tokenizer_dir: str  # a local directory the workers can read (save_pretrained layout)
    domain: str | Callable[[], Any]  # "multihop", "math", "funcall", "bfcl", or a picklable zero-argument factory
    model: str | None = None  # served model name; None takes the first the server lists
    sampling: SamplingParams = SamplingParams()
    limits: DriverLimits = DriverLimits()
    engine_options: dict[str, Any] = field(default_factory=dict)  # OpenAIEngine keywords (n_mode, timeout_s, ...)


def _make_domain(domain: str | Callable[[], Any]) -> Any:
    if isinstance(domain, str):
        return make_domain(domain)
    return domain()


# ------------------------------------------------------------------------------------------------ failed rollouts

def failed_tree(row: dict[str, Any], pool_index: int, count: int, error: str) -> Tree:
    """A tree whose `count` bare rollouts all failed because their worker did (root text only, no token ids)."""
    tree = Tree.new(prompt_id(row), Segment(observation_text=row["prompt"][-1]["content"]),
                    meta={"pool_index": int(pool_index), "data_source": row.get("data_source", ""),
                          "worker_error": error})
    tree.add_failed_leaves(0, count, error, origin="bare")
    return tree


# ------------------------------------------------------------------------------------------------ the worker (actor)

class RolloutWorker:
    """One Ray actor: a `ReActDriver` over an `OpenAIEngine`, and the trees it grew this step (by key).

    Every method catches what the driver raises (e.g. `EngineError` once the server stops answering) and reports it
    as failed rollouts plus an error string instead, so the runner sees the same shape either way."""

    def __init__(self, spec: WorkerSpec, worker_index: int):
        from transformers import AutoTokenizer

        from tracerl.engines.openai_engine import OpenAIEngine
        from tracerl.io.rollout.chat import ChatRenderer

        self.spec, self.worker_index = spec, worker_index
        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir, local_files_only=True)
        self.renderer = ChatRenderer(tokenizer)
        self.domain = _make_domain(spec.domain)
        self.engine = OpenAIEngine(spec.base_url, spec.model, **spec.engine_options)
        self.driver = self._driver(spec.sampling.seed)
        self.trees: dict[int, Tree] = {}

    def _driver(self, seed: int | None) -> ReActDriver:
        s = self.spec.sampling
        sampling = SamplingParams(s.temperature, s.top_p, s.max_tokens, s.stop_token_ids,
                                  worker_seed(seed, self.worker_index))
        return ReActDriver(self.engine, self.renderer, self.domain, sampling=sampling, limits=self.spec.limits)

    def ping(self) -> int:
        return self.worker_index

    def set_rows(self, rows: Sequence[dict[str, Any]], seed: int | None = None) -> None:
        """The step's pool; with `seed`, a fresh driver sampling with this worker's share of it."""
        if seed is not None:
            self.driver = self._driver(seed)
        self.driver.set_rows(rows)
        self.trees.clear()

    def _counted(self, before: Counter) -> dict[str, int]:
        return {k: v - before.get(k, 0) for k, v in self.driver.counters.items() if v != before.get(k, 0)}

    def run_roots(self, keys: Sequence[int], prompt_indices: Sequence[int], counts: Sequence[int]):
        """Returns (tree dicts, tokens sampled, counter increments, error or None)."""
        before = Counter(self.driver.counters)
        try:
            trees, num_tokens = self.driver.run_roots(prompt_indices, counts)
            error = None
        except Exception as err:  # the step goes on; these rollouts are recorded as failed
            error = f"{type(err).__name__}: {err}"
            trees = [failed_tree(self.driver.rows[i], i, m, error) for i, m in zip(prompt_indices, counts)]
            num_tokens = 0
        self.trees.update(zip(keys, trees))
        return [t.to_dict() for t in trees], num_tokens, self._counted(before), error

    def run_continuations(self, requests: Sequence[tuple[int, int, int, int]]):
        """`requests`: (tree key, the caller's node count, node id, k). Returns ({key: new node dicts}, tokens
        sampled, counter increments, error or None)."""
        before = Counter(self.driver.counters)
        sizes = {}
        for key, num_nodes, _, _ in requests:
            assert len(self.trees[key]) == num_nodes, \
                f"tree {key} has {len(self.trees[key])} nodes here but {num_nodes} at the caller"
            sizes[key] = num_nodes
        try:
            num_tokens = self.driver.run_continuations([(self.trees[key], node_id, k)
                                                        for key, _, node_id, k in requests])
            error = None
        except Exception as err:  # roll back the partial growth, then record every requested rollout as failed
            error = f"{type(err).__name__}: {err}"
            num_tokens = 0
            for key, num_nodes in sizes.items():
                self.trees[key].truncate(num_nodes)
            for key, _, node_id, k in requests:
                self.trees[key].add_failed_leaves(node_id, k, error)
        grown = {key: [asdict(n) for n in self.trees[key].nodes[num_nodes:]] for key, num_nodes in sizes.items()}
        return grown, num_tokens, self._counted(before), error


# ------------------------------------------------------------------------------------------------ the runner

@dataclass
class _Owner:
    tree: Tree  # the caller's object (kept so an id() is never reused while we map it)
    worker: int | None  # None: no worker holds it (every worker was dead when it was asked for)
    key: int
    num_nodes: int  # nodes the worker's copy holds; the caller's tree must have as many when it asks for more


class RayRolloutRunner:
    """A `RolloutRunner` over `num_workers` Ray actors (see the module docstring).

    - `base_url`, `model`, `engine_options`: the generation server and `OpenAIEngine` keywords, the same for all.
    - `tokenizer_dir`: a local directory holding the policy's tokenizer, readable on every worker's machine.
    - `domain`: a domain name ("multihop", "math", "funcall", "bfcl": default options) or a picklable zero-argument
      factory, e.g. an `EmbeddedConfig`'s `make_domain`.
    - `sampling`, `limits`: as for `ReActDriver`; `sampling.seed` is spread over workers (`worker_seed`).
    - `num_cpus_per_worker`: the Ray CPU reservation of each actor; lower it to run more workers than CPUs (they
      mostly wait on the server).
    - `call_timeout_s`: how long one worker call may take before the worker is killed and its rollouts recorded
      as failed; None waits forever.
    Ray must be initialised first (`tracerl.executors.start_ray`, or `ray.init`)."""

    def __init__(self, base_url: str, tokenizer_dir: str, domain: str | Callable[[], Any], *, num_workers: int = 2,
                 model: str | None = None, sampling: SamplingParams = SamplingParams(),
                 limits: DriverLimits = DriverLimits(), engine_options: dict[str, Any] | None = None,
                 num_cpus_per_worker: float = 1.0, call_timeout_s: float | None = None):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised; call tracerl.executors.start_ray() (a loopback-only local "
                               "cluster) or ray.init(address=...) before building a RayRolloutRunner")
        self.spec = WorkerSpec(base_url, str(tokenizer_dir), domain, model, sampling, limits,
                               dict(engine_options or {}))
        self.num_workers, self.call_timeout_s = num_workers, call_timeout_s
        self._actor_class = ray.remote(num_cpus=num_cpus_per_worker, max_restarts=0)(RolloutWorker)
        self.actors = [self._start(i) for i in range(num_workers)]
        self.dead: set[int] = set()
        self.rows: list[dict[str, Any]] = []
        self.counters: Counter[str] = Counter(dict.fromkeys(WORKER_COUNTERS, 0))
        self._owners: dict[int, _Owner] = {}
        self._next_key = 0
        self._call(range(num_workers), lambda w, a: a.ping.remote(), None)  # no limit: a worker's imports take a while
        if self.dead:  # a worker that cannot even start is a setup problem (bad tokenizer_dir, domain, ...)
            raise RuntimeError(f"rollout workers {sorted(self.dead)} failed to start: {self._last_errors}")

    def _start(self, worker_index: int):
        return self._actor_class.remote(self.spec, worker_index)

    def close(self) -> None:
        """Kill the worker actors (the Ray cluster stays up)."""
        for w in range(self.num_workers):
            self._kill(w)
        self.dead = set(range(self.num_workers))

    def __enter__(self) -> RayRolloutRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ calls
    def _call(self, workers: Sequence[int | None], submit, timeout_s: float | None) -> dict[int, Any]:
        """Submit one call per live worker, wait for all; returns worker -> result. A worker whose call dies,
        raises or times out is killed, marked dead and left out (its error in `_last_errors`)."""
        self._last_errors: dict[int, str] = {}
        refs = {w: submit(w, self.actors[w]) for w in workers if w is not None and w not in self.dead}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results = {}
        for w, ref in refs.items():
            try:
                results[w] = ray.get(ref, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except Exception as err:  # RayActorError (died), RayTaskError (raised), GetTimeoutError
                self._last_errors[w] = f"{type(err).__name__}: {str(err)[:300]}"
                self.counters["rollout/worker_errors"] += 1
                self.dead.add(w)
                self._kill(w)
        return results

    def _kill(self, worker: int) -> None:
        try:
            ray.kill(self.actors[worker])
        except Exception:  # already gone: nothing left to stop
            pass

    def _absorb(self, counters: dict[str, int], error: str | None) -> None:
        self.counters.update(counters)
        self.counters["rollout/worker_errors"] += error is not None

    # ------------------------------------------------------------------ pool
    def set_rows(self, rows: Sequence[dict[str, Any]], seed: int | None = None) -> list[History]:
        """Send the step's candidate pool to every worker, replacing dead ones first; returns the bare-prompt
        histories for the predictor. `seed` (optional): re-seed the workers' sampling for this step, as a fresh
        `ReActDriver(sampling=SamplingParams(seed=seed))` per step would."""
        for w in sorted(self.dead):
            self.actors[w] = self._start(w)
            self.counters["rollout/worker_restarts"] += 1
        self.dead = set()
        self.rows = list(rows)
        self._owners.clear()
        rows_ref = ray.put(self.rows)
        self._call(range(self.num_workers), lambda w, a: a.set_rows.remote(rows_ref, seed), self.call_timeout_s)
        if len(self.dead) == self.num_workers:
            raise RuntimeError(f"no rollout worker is alive after set_rows: {self._last_errors}; check that the "
                               "workers can import tracerl and read tokenizer_dir, then build a new RayRolloutRunner")
        return [History(text=row["prompt"][-1]["content"], prompt_id=prompt_id(row)) for row in self.rows]

    # ------------------------------------------------------------------ RolloutRunner
    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        """One tree per prompt with counts[i] bare rollouts, grown on the live workers in parallel."""
        prompt_indices, counts = [int(i) for i in prompt_indices], [int(m) for m in counts]
        live = [w for w in range(self.num_workers) if w not in self.dead]
        shares = {w: share for w, share in zip(live, partition(counts, len(live))) if share} if live else {}
        keys = list(range(self._next_key, self._next_key + len(counts)))
        self._next_key += len(counts)
        results = self._call(list(shares), lambda w, a: a.run_roots.remote(
            [keys[p] for p in shares[w]], [prompt_indices[p] for p in shares[w]], [counts[p] for p in shares[w]]),
            self.call_timeout_s)
        trees: list[Tree | None] = [None] * len(counts)
        num_tokens = 0
        for w, share in shares.items():
            if w in results:
                tree_dicts, tokens, counters, error = results[w]
                self._absorb(counters, error)
                num_tokens += tokens
                share_trees = [Tree.from_dict(d) for d in tree_dicts]
            else:
                error = self._last_errors.get(w, "the worker was dead")
                share_trees = [failed_tree(self.rows[prompt_indices[p]], prompt_indices[p], counts[p], error)
                               for p in share]
            if error is not None:
                self.counters["rollout/worker_error_rollouts"] += sum(counts[p] for p in share)
            for p, tree in zip(share, share_trees):
                trees[p] = tree
                self._owners[id(tree)] = _Owner(tree, w, keys[p], len(tree))
        if not live and counts:  # every worker died during this step: all of it is recorded as failed
            for p, (i, m) in enumerate(zip(prompt_indices, counts)):
                trees[p] = failed_tree(self.rows[i], i, m, "no rollout worker is alive")
                self._owners[id(trees[p])] = _Owner(trees[p], None, keys[p], len(trees[p]))
            self.counters["rollout/worker_error_rollouts"] += sum(counts)
        return trees, num_tokens

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        """For each (tree, node_id, k): k continuations from that node, grown by the worker that grew the tree and
        appended to the caller's tree in place."""
        per_worker: dict[int | None, list[tuple[int, int, int, int]]] = {}
        for tree, node_id, k in requests:
            owner = self._owners.get(id(tree))
            if owner is None or owner.tree is not tree:
                raise ValueError(f"tree {tree.prompt_id!r} was not grown by this runner since the last set_rows; "
                                 "continuations must come from trees that run_roots returned in this step")
            if len(tree) != owner.num_nodes:
                raise ValueError(f"tree {tree.prompt_id!r} has {len(tree)} nodes but its worker grew "
                                 f"{owner.num_nodes}; add nodes only through the runner")
            if int(k) > 0:
                per_worker.setdefault(owner.worker, []).append((owner.key, owner.num_nodes, int(node_id), int(k)))
        by_key = {owner.key: owner for owner in self._owners.values()}
        results = self._call(list(per_worker), lambda w, a: a.run_continuations.remote(per_worker[w]),
                             self.call_timeout_s)
        num_tokens = 0
        for w, reqs in per_worker.items():
            if w in results:
                grown, tokens, counters, error = results[w]
                self._absorb(counters, error)
                num_tokens += tokens
                for key, raw_nodes in grown.items():
                    by_key[key].tree.append_nodes(raw_nodes)
            else:  # the worker died (now or earlier in the step): its snapshots are gone with it
                error = self._last_errors.get(w, "the worker died earlier in this step")
                for key, _, node_id, k in reqs:
                    by_key[key].tree.add_failed_leaves(node_id, k, error)
            if error is not None:
                self.counters["rollout/worker_error_rollouts"] += sum(k for *_, k in reqs)
            for key, *_ in reqs:
                by_key[key].num_nodes = len(by_key[key].tree)
        return num_tokens
