"""A user's reward functions run as practitioners run them: in a pool of workers, each call with a timeout, every
failure counted.

`RewardPool(functions, weights)` scores one answer as sum_i w_i * score_i, each `score_i` from a function with
verl's custom-reward signature `(data_source, solution_str, ground_truth, extra_info)` (a list of functions with
weights is TRL's `reward_funcs` / `reward_weights`). `submit(**kwargs)` starts a call and returns a handle;
`result(handle)` waits for it (at most `timeout_s`) and returns the reward or raises `RewardError`, whose `metric`
names the counter the driver increments (`rollout/reward_errors` or `rollout/reward_timeouts`). The caller keeps
its handles, so results come back in the order it asks for them, whatever order the workers finish in.

Pools: "thread" (default; rewards that wait on I/O, a sandbox, a judge server, or release the GIL), "process"
(CPU-bound Python, or code that can hang: the timeout is enforced inside the worker with SIGALRM, so a hung call
frees its worker; the functions must be importable module-level functions, checked at load) or "none" (in the
caller's thread, no timeout: for debugging). A timed-out call in a thread cannot be stopped: it keeps its worker
until it returns, so set `workers` above the number of calls that may hang at once, or use processes. The threads
are daemons, so a call that never returns does not keep the process from exiting.

Deliberately not here: retries (a reward that fails is a failed leaf, counted), async batching of judge calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import inspect
import math
import multiprocessing
import pickle
import queue
import signal
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tracerl.io.env import EpisodeError

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
    if isinstance(value, (bool, int, float, np.number)) and math.isfinite(float(value)):
        return float(value)
    raise RewardError(f"the reward function returned {value!r:.80}; it must return a finite number or a dict "
                      "with a numeric 'score'")


class _Alarm(Exception):
    pass


def _weighted_score(functions: Sequence[Callable[..., Any]], weights: Sequence[float], kwargs: dict[str, Any],
                    timeout_s: float = 0.0) -> float:
    """sum_i w_i * score_i; in a process worker, `timeout_s` arms SIGALRM so a hung call frees the worker."""
    def alarm(signum, frame):
        raise _Alarm()
    if timeout_s > 0:
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        total = 0.0
        for fn, weight in zip(functions, weights):
            try:
                value = fn(**kwargs)
                if inspect.iscoroutine(value):
                    value = asyncio.run(value)
            except _Alarm:
                raise
            except Exception as err:
                raise RewardError(f"the reward function {getattr(fn, '__name__', fn)!r} raised "
                                  f"{type(err).__name__}: {str(err)[:200]}") from None
            total += weight * score_of(value)
        return total
    except _Alarm:
        raise RewardError(f"the reward function timed out after {timeout_s:g} s", "rollout/reward_timeouts") from None
    finally:
        if timeout_s > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


class _DaemonThreads:
    """A fixed set of daemon threads that run submitted calls into futures. Unlike ThreadPoolExecutor, whose
    threads are joined when the interpreter exits, a reward call that hangs for ever cannot block the exit."""

    def __init__(self, workers: int) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        for number in range(workers):
            threading.Thread(target=self._work, name=f"tracerl-reward-{number}", daemon=True).start()

    def _work(self) -> None:
        while True:
            future, fn, args = self._calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:  # handed to the caller through the future
                    future.set_exception(err)

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        while cancel_futures:
            try:
                self._calls.get_nowait()[0].cancel()
            except queue.Empty:
                break


class RewardPool:
    """Reward calls in a pool of workers, with a timeout per call and counts of calls, errors and timeouts."""

    def __init__(self, functions: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None, *,
                 workers: int = 4, pool: str = "thread", timeout_s: float = 60.0) -> None:
        if pool not in POOLS:
            raise ValueError(f"reward_pool={pool!r}; use one of {POOLS}")
        if workers < 1 and pool != "none":
            raise ValueError(f"reward_workers={workers} must be >= 1 (or reward_pool='none')")
        if timeout_s < 0:
            raise ValueError(f"reward_timeout_s={timeout_s} must be >= 0 (0: no timeout)")
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
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
        self._executor: Any = None
        self._warned = False
        self._last_error = ""

    def _start(self) -> Any:
        with self._lock:
            if self._executor is None:
                if self.pool == "process":
                    self._executor = concurrent.futures.ProcessPoolExecutor(
                        self.workers, mp_context=multiprocessing.get_context("fork"))
                else:
                    self._executor = _DaemonThreads(self.workers)
            return self._executor

    def submit(self, **kwargs: Any) -> Any:
        """Start one reward call; pass the handle to `result`."""
        if self.pool == "none":
            return kwargs
        in_worker = self.timeout_s if self.pool == "process" else 0.0
        return self._start().submit(_weighted_score, self.functions, self.weights, kwargs, in_worker)

    def result(self, handle: Any) -> float:
        """The reward of a submitted call; raises RewardError (counted) when it failed or timed out."""
        try:
            if self.pool == "none":
                return self._count(_weighted_score(self.functions, self.weights, handle))
            # a process enforces its own timeout; the wait here has a margin for its start-up
            wait = None if not self.timeout_s else self.timeout_s + (5.0 if self.pool == "process" else 0.0)
            try:
                return self._count(handle.result(timeout=wait))
            except concurrent.futures.TimeoutError:
                raise RewardError(f"the reward function timed out after {self.timeout_s:g} s",
                                  "rollout/reward_timeouts") from None
            except concurrent.futures.process.BrokenProcessPool as err:
                self._executor = None  # a worker died (a crash, a kill): the next call starts a fresh pool
                raise RewardError(f"the reward worker process died ({err})") from None
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
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
