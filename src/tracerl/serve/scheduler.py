"""The one thread that runs the engine for `tracerl serve`, sharing it fairly between requests.

Each admitted request is a job: one row per sample (prompt index, ids and logprobs so far, finish reason). The thread
takes jobs round-robin and runs one slice of the next job. A slice costs the engine the prompt tokens it prefills
plus the tokens it decodes, and both count against `slice_tokens`: a job's rows are generated in groups, in row
order, a group being as many rows not yet started as fit one slice (each costs its `slice_steps` decoding steps,
plus its prompt's length when the job has not sent that prompt before; the first row always fits); the group's rows
are continued, `slice_steps` tokens a slice, until each reached a stop token or max_tokens, and only then does the
next group start. A continued row goes back to the engine as its prompt + what it generated, which the engine's KV
store holds from the group's previous slice, so only the new tokens cost. So a one-token request waits for at most
one slice of each request ahead of it (about `slice_tokens` tokens of work; more only when a single prompt is longer
than that, and then that prompt alone), never for a whole large one. A cancelled job (its client went away) is
dropped at its next turn.

A request whose rows fit one slice (the common case: max_tokens <= slice_steps and prompt tokens + prompts x n x
max_tokens <= slice_tokens) is one engine call with the request's own seed, exactly as the engine would answer it
directly. A longer one is deterministic too: slice k of a seeded job is seeded with a value derived from (seed, k),
and which rows a slice holds depends only on the job, not on other requests.

What it does not do: batch rows of different requests together (one slice is one request's rows), split one
prompt's prefill across slices, or preempt a slice once started (a slice is bounded instead).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from typing import Any

from tracerl.io.rollout.engine import Completion, SamplingParams

from .limits import ServeLimits


class Busy(RuntimeError):
    """The queue is full (HTTP 503; the client retries)."""


@dataclass
class _Row:
    prompt_index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""


@dataclass
class Job:
    """One request's samples and where they stand; `future` gets `[[Completion] * n] * prompts` or the error."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    rows: list[_Row]
    future: Future = field(default_factory=Future)
    cancelled: bool = False
    num_slices: int = 0
    group: list[_Row] = field(default_factory=list)  # the rows being generated now, until they all finish
    prompts_sent: set[int] = field(default_factory=set)  # prompts the engine has prefilled for this job


def slice_seed(seed: int | None, k: int) -> int | None:
    """Slice k's seed: the request's own for k = 0, then a value in [0, 2^63) derived from (seed, k)."""
    if seed is None or k == 0:
        return seed
    return (seed * 1_000_003 + k * 998_244_353) % 2**63


class Scheduler:
    """Runs `engine.generate` on one thread, one bounded slice at a time, round-robin over jobs.

    `engine_lock` is held during each slice; hold it to use the engine otherwise (a weight load runs between slices).
    """

    def __init__(self, engine: Any, limits: ServeLimits):
        self.engine, self.limits = engine, limits
        self.engine_lock = threading.Lock()
        self._jobs: deque[Job] = deque()
        self._running: Job | None = None  # the job whose slice runs now: out of the queue, still in progress
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tracerl-serve-engine", daemon=True)
        self._thread.start()

    @property
    def num_jobs(self) -> int:
        """Requests admitted and not yet answered or dropped: those queued and the one whose slice runs."""
        with self._wake:
            return len(self._jobs) + (self._running is not None)

    def submit(self, prompts: list[list[int]], params: SamplingParams, n: int) -> Job:
        """Queue a request; raises Busy when `max_queued_requests` are already queued."""
        job = Job(prompts, n, params, [_Row(i) for i in range(len(prompts)) for _ in range(n)])
        with self._wake:
            if len(self._jobs) >= self.limits.max_queued_requests:
                raise Busy(f"{len(self._jobs)} requests are queued (max_queued_requests="
                           f"{self.limits.max_queued_requests}); retry later")
            self._jobs.append(job)
            self._wake.notify()
        return job

    def cancel(self, job: Job) -> None:
        """Drop `job` at its next turn (its client went away); a slice already running finishes."""
        job.cancelled = True

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    for job in self._jobs:
                        job.future.cancel()
                    return
                job = self._running = self._jobs.popleft()
            try:
                if job.cancelled:
                    job.future.cancel()
                    continue
                with self.engine_lock:
                    self._run_slice(job)
                with self._wake:  # back in the queue, or finished: never uncounted while in progress
                    self._running = None
                    if not all(row.finish_reason for row in job.rows):
                        self._jobs.append(job)
                        continue
                job.future.set_result(self._results(job))
            except InvalidStateError:  # the request gave up (its client went) while its last slice ran
                pass
            except BaseException as err:  # noqa: BLE001 (handed to the request, which answers 400 or 500)
                if not job.future.done():
                    job.future.set_exception(err)
            finally:
                with self._wake:
                    self._running = None

    def _run_slice(self, job: Job) -> None:
        """Generate the next slice of `job`: its group's unfinished rows (a new group once they all finished), each up
        to slice_steps more tokens."""
        rows = [row for row in job.group if not row.finish_reason] or self._next_group(job)
        done = len(rows[0].token_ids)
        assert all(len(row.token_ids) == done for row in rows), "a group's rows advance together"
        steps = min(self.limits.slice_steps, job.params.max_tokens - done)
        params = replace(job.params, max_tokens=steps, seed=slice_seed(job.params.seed, job.num_slices))
        job.num_slices += 1
        prefixes = [job.prompts[row.prompt_index] + row.token_ids for row in rows]
        for row, [completion] in zip(rows, self.engine.generate(prefixes, params, n=1)):
            row.token_ids += completion.token_ids
            row.logprobs += completion.logprobs
            if completion.finish_reason == "stop":
                row.finish_reason = "stop"
            elif len(row.token_ids) >= job.params.max_tokens:
                row.finish_reason = "length"

    def _next_group(self, job: Job) -> list[_Row]:
        """The next rows not yet started, in order, as many as one slice's work allows and at least one: each costs
        its first slice's decoding steps, plus its prompt's length if the job has not sent that prompt yet."""
        steps = min(self.limits.slice_steps, job.params.max_tokens)
        budget, group = self.limits.slice_tokens, []
        for row in job.rows:
            if row.token_ids or row.finish_reason:  # started in an earlier group
                continue
            cost = steps + (0 if row.prompt_index in job.prompts_sent else len(job.prompts[row.prompt_index]))
            if group and cost > budget:
                break
            budget -= cost
            group.append(row)
            job.prompts_sent.add(row.prompt_index)
        job.group = group
        return group

    @staticmethod
    def _results(job: Job) -> list[list[Completion]]:
        results: list[list[Completion]] = [[] for _ in job.prompts]
        for row in job.rows:
            results[row.prompt_index].append(Completion(row.token_ids, row.logprobs, row.finish_reason))
        return results
