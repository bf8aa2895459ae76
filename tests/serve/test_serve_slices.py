"""`tracerl serve`'s scheduler bounds a slice by the work it costs the engine, prefill included: every engine call of
a request inside every limit computes at most `slice_tokens` prompt tokens and decoding steps together (or, when a
single prompt is longer than that, that prompt and at most `slice_steps` steps for one sample), so a one-token
request that arrives behind it waits for one such slice. Counted in tokens and calls, never timed."""

import json
import threading
from dataclasses import dataclass

import pytest

from tracerl.io.rollout.engine import Completion, SamplingParams

HANG_S = 120.0  # a deadline that only keeps a wait from hanging for ever: generous for a loaded machine


@dataclass
class Call:
    num_prefixes: int
    num_rows: int  # samples decoded
    prefill_tokens: int  # prefix tokens not yet computed by an earlier call (what a prefix-caching engine computes)
    longest_prefill: int  # of one prefix
    steps: int  # max_tokens of the call: every sample here runs them all
    first_token: int  # of the first prefix: tells requests apart

    @property
    def work(self) -> int:
        return self.prefill_tokens + self.num_rows * self.steps


class CountingEngine:
    """Never stops a sample early; remembers every sequence it computed (each prefix, and each prefix + sample), as
    an engine with an unbounded prefix cache would, and counts per call the tokens of each distinct prefix past the
    longest remembered sequence it starts with (what such an engine computes). The
    first call waits for `release`, so the test can queue requests behind it."""

    def __init__(self):
        self.calls: list[Call] = []
        self.seen: dict[int, set[tuple[int, ...]]] = {}  # computed sequences by length
        self.entered, self.release = threading.Event(), threading.Event()

    def _computed(self, prefix: tuple[int, ...]) -> int:
        """The tokens of `prefix` past the longest computed sequence it starts with."""
        cached = max((k for k, seqs in self.seen.items() if k <= len(prefix) and prefix[:k] in seqs), default=0)
        return len(prefix) - cached

    def _remember(self, seq: tuple[int, ...]) -> None:
        self.seen.setdefault(len(seq), set()).add(seq)

    def generate(self, prefixes, params, n=1, keys=None):
        if not self.calls:
            self.entered.set()
            self.release.wait(HANG_S)
        counts = [n] * len(prefixes) if isinstance(n, int) else list(n)
        prefixes = [tuple(p) for p in prefixes]
        computed = [self._computed(p) for p in dict.fromkeys(prefixes)]
        self.calls.append(Call(len(prefixes), sum(counts), sum(computed), max(computed, default=0), params.max_tokens,
                               prefixes[0][0]))
        out = []
        for prefix, count in zip(prefixes, counts):
            self._remember(prefix)
            samples = []
            for j in range(count):
                ids = [1 + (len(prefix) + j + t) % 200 for t in range(params.max_tokens)]
                self._remember(prefix + tuple(ids))
                samples.append(Completion(ids, [-1.0] * len(ids), "length"))
            out.append(samples)
        return out


def slice_bound_problem(call: Call, limits) -> str:
    """Why `call` is more than one slice, or ''."""
    if call.work <= limits.slice_tokens:
        return ""
    if call.num_rows == 1 and call.steps <= limits.slice_steps:
        return ""  # one sample whose prompt alone is over the slice: prefill cannot be split
    return (f"a slice of {call.num_rows} samples, {call.num_prefixes} prefixes, {call.prefill_tokens} prompt tokens "
            f"computed and {call.steps} steps costs {call.work} tokens, over slice_tokens={limits.slice_tokens}")


SMALL = 255  # the one-token request's prompt token: no large request below uses it first

LARGE = [  # each inside every default limit (ServeLimits())
    ("256 prompts of 4096 ids, 1 token each", [[1 + i % 200] * 4096 for i in range(256)], 1, 1),
    ("8 prompts of 2000 ids, 64 samples of 16 tokens", [[1 + i] * 2000 for i in range(8)], 64, 16),
    ("1 prompt of 8192 ids, 32 samples of 256 tokens", [[7] * 8192], 32, 256),
    ("512 samples of 512 tokens after 2-id prompts", [[1 + i, 2] for i in range(8)], 64, 512),
]


@pytest.mark.parametrize("name, prompts, n, max_tokens", LARGE, ids=[c[0] for c in LARGE])
def test_one_token_request_waits_for_at_most_one_bounded_slice(name, prompts, n, max_tokens):
    from tracerl.serve import ServeLimits
    from tracerl.serve.request import parse_completion
    from tracerl.serve.scheduler import Scheduler

    limits = ServeLimits()
    body = json.dumps({"prompt": prompts, "n": n, "max_tokens": max_tokens}).encode()
    parse_completion(body, limits)  # raises if the request is not inside every limit: then it would test nothing
    engine = CountingEngine()
    scheduler = Scheduler(engine, limits)
    try:
        large = scheduler.submit(prompts, SamplingParams(max_tokens=max_tokens, seed=0), n)
        assert engine.entered.wait(HANG_S), f"timeout: the engine was not called within {HANG_S:g} s"
        small = scheduler.submit([[SMALL, 2]], SamplingParams(max_tokens=1, seed=0), 1)
        engine.release.set()
        assert len(small.future.result(HANG_S)[0][0].token_ids) == 1
        large_results = large.future.result(HANG_S)
    finally:
        engine.release.set()
        scheduler.stop()

    assert all(len(c.token_ids) == max_tokens for row in large_results for c in row), "a sample came back short"
    small_at = next(i for i, c in enumerate(engine.calls) if c.first_token == SMALL)
    assert small_at == 1, f"{name}: the one-token request waited for {small_at} slices of the large one"
    problems = [p for c in engine.calls if (p := slice_bound_problem(c, limits))]
    assert not problems, f"{name}: {len(problems)} of {len(engine.calls)} slices over the bound, e.g. {problems[0]}"


def test_slices_of_a_real_engine_compute_at_most_slice_tokens(model):
    """The same bound, counted by `TransformersEngine.stats` (prompt tokens computed, tokens generated) around each
    call: 16 prompts of 1,000 ids (a prefill the tiny model can do), 4 samples of 8 tokens each."""
    from tracerl.engines.transformers_engine import TransformersEngine
    from tracerl.serve import ServeLimits
    from tracerl.serve.scheduler import Scheduler

    engine = TransformersEngine(model)
    work = []

    class Counted:
        def generate(self, prefixes, params, n=1, **kwargs):
            before = dict(engine.stats)
            out = engine.generate(prefixes, params, n, **kwargs)
            num_rows = sum(len(samples) for samples in out)
            computed = engine.stats["prefill_tokens_computed"] - before["prefill_tokens_computed"]
            work.append((computed + num_rows * params.max_tokens, num_rows, params.max_tokens))
            return out

    limits = ServeLimits()
    scheduler = Scheduler(Counted(), limits)
    try:
        job = scheduler.submit([[1 + i] + [2] * 999 for i in range(16)], SamplingParams(max_tokens=8, seed=0), 4)
        results = job.future.result(HANG_S * 5)
    finally:
        scheduler.stop()
    assert sum(len(row) for row in results) == 64
    over = [w for w in work if w[0] > limits.slice_tokens and not (w[1] == 1 and w[2] <= limits.slice_steps)]
    assert not over, f"{len(over)} of {len(work)} calls computed more than slice_tokens: (work, rows, steps) {over[:3]}"


def run_alone(engine, prompts, params, n, limits=None):
    from tracerl.serve import ServeLimits
    from tracerl.serve.scheduler import Scheduler

    scheduler = Scheduler(engine, limits or ServeLimits())
    try:
        return scheduler.submit(prompts, params, n).future.result(HANG_S * 5)
    finally:
        scheduler.stop()


def ids(results) -> list[list[list[int]]]:
    return [[c.token_ids for c in row] for row in results]


def test_request_that_fits_one_slice_is_the_engines_own_answer(model):
    """Prompt tokens + samples x max_tokens within slice_tokens, max_tokens within slice_steps: one engine call with
    the request's seed, so the server answers what the engine would."""
    from tracerl.engines.transformers_engine import TransformersEngine

    prompts, params = [[1, 2, 3], [4, 5]], SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    served = run_alone(TransformersEngine(model), prompts, params, 4)
    direct = TransformersEngine(model).generate([p for p in prompts for _ in range(4)], params, n=1)
    assert ids(served) == [[c.token_ids for [c] in direct[i * 4:(i + 1) * 4]] for i in range(2)]


def test_request_of_many_slices_is_deterministic_and_whole(model):
    """Continued rows (max_tokens over slice_steps), groups (rows over one slice's budget) and rows that stop early:
    the same seed gives the same samples, each of max_tokens unless it ended with a stop token."""
    from tracerl.engines.transformers_engine import TransformersEngine
    from tracerl.serve import ServeLimits

    limits = ServeLimits(slice_tokens=256, slice_steps=16)
    prompts = [[1 + i] * 100 for i in range(3)]
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=11, stop_token_ids=(5, 6, 7))
    first = run_alone(TransformersEngine(model), prompts, params, 4, limits)
    second = run_alone(TransformersEngine(model), prompts, params, 4, limits)
    assert ids(first) == ids(second), "the same seeded request gave other samples"
    for row in first:
        assert len(row) == 4
        for c in row:
            stopped = c.finish_reason == "stop"
            assert (stopped and c.token_ids[-1] in params.stop_token_ids and len(c.token_ids) <= 40) or \
                   (not stopped and len(c.token_ids) == 40 and not set(c.token_ids) & {5, 6, 7}), c


def test_continued_rows_cost_the_engine_only_their_new_tokens(model):
    """The slice budget counts no prefill for a row continued from its group's previous slice, because the engine's
    KV store holds its prefix: checked on `TransformersEngine.stats`, 4 samples of 200 tokens after a 1,000-id
    prompt (4 slices of 64 steps)."""
    from tracerl.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(model)
    computed = []

    class Counted:
        def generate(self, prefixes, params, n=1, **kwargs):
            before = engine.stats["prefill_tokens_computed"]
            out = engine.generate(prefixes, params, n, **kwargs)
            computed.append(engine.stats["prefill_tokens_computed"] - before)
            return out

    run_alone(Counted(), [[3] * 1000], SamplingParams(temperature=1.0, max_tokens=200, seed=0), 4)
    assert len(computed) == 4, computed
    assert all(c <= 4 * 2 for c in computed[1:]), f"prompt tokens computed per slice: {computed}"
