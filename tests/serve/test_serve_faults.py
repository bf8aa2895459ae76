"""OpenAIEngine under server faults, all real on loopback: nothing listening, a server killed mid-call and
restarted, and a tiny HTTP server that answers 500, truncated JSON, slowly or 400 a given number of times."""

import threading
import time

import numpy as np
import pytest

from serve_support import START_S, BadServer, canned_ids, free_port, start_server_process, stop_process

from tracerl.engines.openai_engine import EngineError, OpenAIEngine
from tracerl.io.rollout.engine import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=2, seed=0)


def fast_retries(url, **kwargs) -> OpenAIEngine:
    return OpenAIEngine(url, model="m", backoff_s=0.01, max_backoff_s=0.05, **kwargs)


def test_connection_refused_fails_once_clearly_after_bounded_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    engine = fast_retries(url, max_retries=3)
    with pytest.raises(EngineError, match=f"POST {url}/v1/completions failed 4 times; last failure: "
                                          "ConnectionRefusedError"):
        engine.generate([[1, 2]], PARAMS, n=2)
    assert engine.stats["num_retries"] == 3, "a request is retried max_retries times, no more"


@pytest.mark.parametrize("fault", ["500", "truncated", "slow"])
def test_transient_fault_is_retried_then_succeeds(fault):
    with BadServer({7: [fault, fault]}) as bad:
        # "slow" never answers, so each of its attempts costs timeout_s; the good answer comes in milliseconds
        engine = fast_retries(bad.url, max_retries=2, timeout_s=2.0)
        [[a, b]] = engine.generate([[7]], PARAMS, n=2)
    assert (a.token_ids, b.token_ids) == (canned_ids([7], 0), canned_ids([7], 1))
    assert a.logprobs == [-1.0, -2.0] and a.finish_reason == "length"
    assert bad.seen[7] == 3 and engine.stats["num_retries"] == 2


@pytest.mark.parametrize("fault, last", [("500", "HTTP 500: CUDA out of memory"),
                                         ("truncated", "unparseable JSON body")])
def test_fault_that_never_stops_fails_clearly(fault, last):
    with BadServer(always=fault) as bad:
        engine = fast_retries(bad.url, max_retries=2)
        with pytest.raises(EngineError, match=f"{bad.url}/v1/completions failed 3 times; last failure: {last}"):
            engine.generate([[7]], PARAMS)
    assert bad.seen[7] == 3


def test_bad_request_is_not_retried():
    with BadServer(always="400") as bad, pytest.raises(EngineError, match="HTTP 400: prompt is too long"):
        fast_retries(bad.url, max_retries=5).generate([[7]], PARAMS)
    assert bad.seen[7] == 1


def test_only_failed_requests_are_sent_again():
    with BadServer({2: ["500", "truncated"]}) as bad:
        engine = fast_retries(bad.url, max_retries=2, max_concurrency=3)
        out = engine.generate([[1], [2], [3]], PARAMS, n=1)
    assert [s[0].token_ids for s in out] == [canned_ids([1], 0), canned_ids([2], 0), canned_ids([3], 0)]
    assert dict(bad.seen) == {1: 1, 2: 3, 3: 1}, "a request that was answered was sent again"


def test_server_killed_mid_call_and_restarted_keeps_received_completions(model_dir):
    port = free_port()
    proc = start_server_process(model_dir, port)
    restarted = []
    try:
        # a refused attempt backs off at most max_backoff_s: retries for twice as long as a restart may take
        engine = OpenAIEngine(f"http://127.0.0.1:{port}", max_concurrency=1, timeout_s=30,
                              max_retries=int(2 * START_S / 0.5), backoff_s=0.05, max_backoff_s=0.5)
        prefixes = [np.random.default_rng(40 + i).integers(0, 256, 8).tolist() for i in range(8)]
        params = SamplingParams(temperature=1.0, max_tokens=64, seed=3)
        want = engine.generate(prefixes, params, n=2)  # the same call on a healthy server
        answered, retried = engine.stats["num_requests"], engine.stats["num_retries"]

        call_over = threading.Event()

        def kill_and_restart():
            while engine.stats["num_requests"] < answered + 2:
                if call_over.is_set():  # the call failed early: nothing to kill
                    return
                time.sleep(0.002)
            proc.kill()  # mid-call: the third request is in flight or about to be sent
            proc.wait()
            restarted.append(start_server_process(model_dir, port))

        killer = threading.Thread(target=kill_and_restart)
        killer.start()
        try:
            got = engine.generate(prefixes, params, n=2)
        finally:  # a restart still under way when the call fails is waited for, so that it is stopped below
            call_over.set()
            killer.join()
        assert restarted, "the server was not restarted"
        assert engine.stats["num_retries"] > retried, "the kill did not interrupt the call"
        assert engine.stats["num_requests"] - answered == len(prefixes), "an answered request was sent again"
        assert [[c.token_ids for c in s] for s in got] == [[c.token_ids for c in s] for s in want]
    finally:
        for p in [proc, *restarted]:
            stop_process(p)
