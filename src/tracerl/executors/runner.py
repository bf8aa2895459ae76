"""Where a run's rollouts are sampled, behind one interface: `make_runner(config, policy, engine, out_dir)`.

A runner is a `tracerl.core.growth.RolloutRunner` (`run_roots`, `run_continuations`) plus

- `set_rows(rows, seed) -> histories`: the step's candidate pool and its sampling seed (worker i of a Ray runner
  samples with `worker_seed(seed, i)`; worker 0 and the local runner sample with `seed` itself, so one Ray worker
  samples what the local runner samples);
- `for_step(rows, seed) -> StepRunner`: the runner bound to the run's prompt rows and the step's seed, a
  `tracerl.core.step.PoolRunner` whose `set_pool(prompt_indices)` loads those rows, so `Sampler.step` loads its pool;
- `take_counters() -> dict`: the rollout counters (`rollout/turns`, `rollout/tool_errors`, ...) since the last take;
- `close()`: stops what the runner started (Ray workers, and the loopback Ray cluster if it started one).

`LocalRunner` is a `ReActDriver` over the trainer's engine in this process (run.executor="local"); `RayRunner` is
`RayRolloutRunner` workers that are clients of policy.base_url (run.executor="ray"). The trainer never asks which.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from tracerl.core.history import History
from tracerl.core.tree import Tree
from tracerl.io.rollout.driver import ReActDriver
from tracerl.io.rollout.engine import SamplingParams


class _Runner:
    """What both runners share: the calls go to `self.target` (a driver, or the Ray workers), and `take_counters`
    turns its counters into increments since the last take."""

    target: Any = None

    def __init__(self) -> None:
        self._taken: Counter[str] = Counter()

    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        return self.target.run_roots(prompt_indices, counts)

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        return self.target.run_continuations(requests)

    def take_counters(self) -> dict[str, int]:
        now = Counter(self.target.counters) if self.target is not None else Counter()
        out = {k: v - self._taken[k] for k, v in now.items()}
        self._taken = now
        return out

    def for_step(self, rows: Sequence[dict[str, Any]], seed: int | None) -> StepRunner:
        """This runner for one step: pool indices into `rows` (the run's prompts), sampled with `seed`."""
        return StepRunner(self, rows, seed)


class StepRunner:
    """A runner bound to a run's prompt rows and one step's sampling seed (`tracerl.core.step.PoolRunner`):
    `set_pool(prompt_indices)` loads those rows into the runner (`set_rows`); the rollouts are the runner's."""

    def __init__(self, runner: LocalRunner | RayRunner, rows: Sequence[dict[str, Any]], seed: int | None):
        self.runner, self.rows, self.seed = runner, rows, seed

    def set_pool(self, prompt_indices: Sequence[int]) -> list[History]:
        return self.runner.set_rows([self.rows[i] for i in prompt_indices], seed=self.seed)

    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        return self.runner.run_roots(prompt_indices, counts)

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        return self.runner.run_continuations(requests)


class LocalRunner(_Runner):
    """A fresh `ReActDriver` per step over `engine`, sampling with the step's seed."""

    def __init__(self, engine: Any, renderer: Any, domain: Any, limits: Any, temperature: float, top_p: float):
        super().__init__()
        self.engine, self.renderer, self.domain, self.limits = engine, renderer, domain, limits
        self.temperature, self.top_p = temperature, top_p

    def set_rows(self, rows: Sequence[dict[str, Any]], seed: int | None) -> list[History]:
        self.target = ReActDriver(self.engine, self.renderer, self.domain, limits=self.limits,
                                  sampling=SamplingParams(self.temperature, self.top_p, seed=seed))
        self._taken = Counter()  # a fresh driver counts from zero
        return self.target.set_rows(rows)

    def close(self) -> None:
        pass


class RayRunner(_Runner):
    """`RayRolloutRunner` workers (they count over the whole run), and the local Ray cluster when this runner
    started it."""

    def __init__(self, workers: Any, owns_ray: bool):
        super().__init__()
        self.target, self.owns_ray = workers, owns_ray

    def set_rows(self, rows: Sequence[dict[str, Any]], seed: int | None) -> list[History]:
        return self.target.set_rows(rows, seed=seed)

    def close(self) -> None:
        if self.target is not None:
            self.target.close()
            self.target = None
        if self.owns_ray:
            import ray

            ray.shutdown()
            self.owns_ray = False


def make_runner(config: Any, policy: Any, engine: Any, out_dir: Path,
                say: Callable[[str], None] = lambda message: None) -> LocalRunner | RayRunner:
    """The runner `config.run.executor` names, for `policy` (a `tracerl.train.policy` policy: tokenizer, renderer,
    domain, limits).

    Ray: the one this process already initialised, else the cluster at run.ray_address, else a loopback-only local
    cluster with a CPU per worker (a reservation, not cores: workers mostly wait on the server) and a 100 MiB object
    store (a step's pool and trees are a few MB). The workers load the policy's tokenizer from <out_dir>/tokenizer
    and build the domain the policy was built for."""
    sampling = config.sampling
    if config.run.executor != "ray":
        return LocalRunner(engine, policy.renderer, policy.domain, policy.limits, sampling.temperature,
                           sampling.top_p)
    import ray

    from tracerl.executors.cluster import start_ray
    from tracerl.executors.ray_runner import RayRolloutRunner

    run, cfg = config.run, config.policy
    owns_ray = False
    if ray.is_initialized():
        say("rollout workers on the Ray cluster this process already uses")
    else:
        start_ray(run.ray_address or None, num_cpus=run.num_workers, object_store_bytes=100 * 2**20)
        owns_ray = True
    domain = config.domain_factory()  # the domain the policy was built for, as load_policy builds it
    try:
        tokenizer_dir = (Path(out_dir) / "tokenizer").resolve()
        policy.tokenizer.save_pretrained(tokenizer_dir)
        workers = RayRolloutRunner(
            cfg.base_url, str(tokenizer_dir), domain, num_workers=run.num_workers,
            model=cfg.served_model_name or None, limits=policy.limits,
            sampling=SamplingParams(sampling.temperature, sampling.top_p),
            engine_options={"n_mode": cfg.n_mode, "max_concurrency": cfg.max_batch_size})
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    say(f"{run.num_workers} rollout workers on Ray, clients of {cfg.base_url}")
    return RayRunner(workers, owns_ray)
