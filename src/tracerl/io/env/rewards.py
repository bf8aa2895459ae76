"""A user's reward functions run as practitioners run them: in a pool of workers, each call with a timeout, every
failure counted.

`RewardPool(functions, weights)` scores one answer as sum_i w_i * score_i, each `score_i` from a function with
verl's custom-reward signature `(data_source, solution_str, ground_truth, extra_info)` (a list of functions with
weights is TRL's `reward_funcs` / `reward_weights`). `submit(**kwargs)` starts a call and returns a handle;
`result(handle)` waits for it and returns the reward or raises `RewardError`, whose `metric` names the counter the
driver increments (`rollout/reward_errors` or `rollout/reward_timeouts`). The caller keeps its handles, so results
come back in the order it asks for them, whatever order the workers finish in. A result that is not a finite
number (NaN, infinity, `10**400`, a string, an array) is a reward error, and so is a weighted sum that overflows.

The calls run in `tracerl.io.env.user_code.Runner`, the runner of all user code. Pools: "thread" (default; rewards that
wait on I/O, a sandbox, a judge server, or release the GIL: past its deadline a call's thread cannot be stopped and
is abandoned, so the next call does not wait behind it), "process" (CPU-bound Python, or code that can hang: past
its deadline the worker process is killed, wherever it is stuck, and replaced; the functions must be importable
module-level functions, checked at load) or "none" (in the caller's thread, no timeout: for debugging).

Deliberately not here: retries (a reward that fails is a failed leaf, counted), async batching of judge calls.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import pickle
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.io.env import EpisodeError
from tracerl.io.env.user_code import CallFailed, CallTimeout, Runner, describe, finite_number

POOLS = ("thread", "process", "none")
WARN_AFTER_CALLS = 8  # warn once when, after at least this many calls, more than half have failed


class RewardError(EpisodeError):
    """The task's reward function raised, timed out or returned a non-number (the leaf fails; the run goes on)."""

    def __init__(self, message: str, metric: str = "rollout/reward_errors") -> None:
        super().__init__(message)
        self.metric = metric  # the driver's counter for this failure, besides rollout/env_exceptions


def score_of(value: Any) -> float:
    """A reward function's result as a float: a finite number, or a dict with a numeric "score" (verl allows both)."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    number = finite_number(value)
    if number is None:
        raise RewardError(f"the reward function returned {describe(value)}; it must return a finite number or a dict "
                          "with a numeric 'score'")
    return number


def _weighted_score(functions: Sequence[Callable[..., Any]], weights: Sequence[float],
                    kwargs: dict[str, Any]) -> tuple[float | None, str]:
    """(sum_i w_i * score_i, "") or (None, what went wrong); user errors come back as data, not exceptions, so they
    cross from a worker process as they are."""
    total = 0.0
    for fn, weight in zip(functions, weights):
        try:
            value = fn(**kwargs)
            if inspect.iscoroutine(value):
                value = asyncio.run(value)
            total += weight * score_of(value)
        except RewardError as err:
            return None, str(err)
        except Exception as err:
            return None, (f"the reward function {getattr(fn, '__name__', fn)!r} raised {type(err).__name__}: "
                          f"{str(err)[:200]}")
    if not math.isfinite(total):
        return None, f"the weighted reward is {total}, not finite; lower reward_weights or the scores"
    return total, ""


class RewardPool:
    """Reward calls in a pool of workers, with a timeout per call and counts of calls, errors and timeouts."""

    def __init__(self, functions: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None, *,
                 workers: int = 4, pool: str = "thread", timeout_s: float = 60.0) -> None:
        if pool not in POOLS:
            raise ValueError(f"reward_pool={pool!r}; use one of {POOLS}")
        if workers < 1 and pool != "none":
            raise ValueError(f"reward_workers={workers} must be >= 1 (or reward_pool='none')")
        if finite_number(timeout_s) is None or timeout_s < 0:
            raise ValueError(f"reward_timeout_s={timeout_s} must be a finite number of seconds >= 0 (0: no timeout)")
        weights = [1.0] * len(functions) if weights is None else [finite_number(w) for w in weights]
        if None in weights:
            raise ValueError(f"reward_weights={describe(weights)} must be finite numbers")
        if len(weights) != len(functions) or not functions:
            raise ValueError(f"{len(functions)} reward function(s) and {len(weights)} weight(s); give one weight "
                             "per function (reward_weights), or none for weights of 1")
        if pool == "process":
            try:
                pickle.dumps(list(functions))
            except Exception as err:
                raise ValueError(f"reward_pool='process' sends the reward functions to worker processes, and they "
                                 f"cannot be pickled ({type(err).__name__}: {err}); define them at module level of "
                                 "an importable file, or use reward_pool='thread'") from None
        self.functions, self.weights = list(functions), weights
        self.pool, self.workers, self.timeout_s = pool, workers, timeout_s
        self.counts = {"calls": 0, "errors": 0, "timeouts": 0}
        self._lock = threading.Lock()
        self._runner = Runner(pool, workers=workers, timeout_s=timeout_s, label="reward")
        self._warned = False
        self._last_error = ""

    def submit(self, **kwargs: Any) -> Any:
        """Start one reward call; pass the handle to `result`."""
        return self._runner.submit(_weighted_score, self.functions, self.weights, kwargs)

    def result(self, handle: Any) -> float:
        """The reward of a submitted call; raises RewardError (counted) when it failed or timed out."""
        try:
            try:
                value, problem = handle.result()
            except CallTimeout as err:
                raise RewardError(f"the reward function {err}", "rollout/reward_timeouts") from None
            except CallFailed as err:  # its process died, its result could not be sent back, too many stuck threads
                raise RewardError(f"the reward call failed: {err}") from None
            if problem:
                raise RewardError(problem)
            return self._count(value)
        except RewardError as err:
            self._count(None, err)
            raise

    def __call__(self, **kwargs: Any) -> float:
        return self.result(self.submit(**kwargs))

    def _count(self, value: float | None, error: RewardError | None = None) -> float:
        with self._lock:
            self.counts["calls"] += 1
            if error is not None:
                self.counts["timeouts" if error.metric == "rollout/reward_timeouts" else "errors"] += 1
                self._last_error = str(error)
            failed, calls = self.counts["errors"] + self.counts["timeouts"], self.counts["calls"]
            warn = not self._warned and calls >= WARN_AFTER_CALLS and failed * 2 > calls
            self._warned |= warn
        if warn:
            warnings.warn(f"the reward function failed on {failed} of {calls} calls so far ({self.counts['errors']} "
                          f"errors, {self.counts['timeouts']} timeouts; last: {self._last_error}); the leaves it "
                          "fails get reward 0, so most of this run learns nothing: fix the reward", UserWarning,
                          stacklevel=2)
        return value

    def close(self) -> None:
        self._runner.close()
