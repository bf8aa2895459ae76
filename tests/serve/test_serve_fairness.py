"""`tracerl serve` (a real subprocess, default limits) shares its engine between requests: a large request inside
every limit cannot make a one-token request wait for it, a request over the token budget is refused at once, and
the work of a client that went away stops."""

import json
import socket
import threading
import time

import httpx
import pytest

from serve_support import free_port, start_server_process, stop_process


@pytest.fixture(scope="module")
def process_url(model_dir):
    port = free_port()
    proc = start_server_process(model_dir, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


HANG_S = 120.0  # a deadline that only keeps a wait from hanging for ever: generous for a loaded machine


def in_progress(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=HANG_S).json()["requests_in_progress"]


def one_token(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=HANG_S)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"timeout: {what} after {HANG_S:g} s"
        time.sleep(0.05)


def test_request_over_the_default_token_budget_is_refused_at_once(process_url):
    """At once: within 10 times the slowest of three one-token requests timed just before on the same machine
    (and at least 2 s); generating what it asks for would take minutes."""
    baseline = 0.0
    for _ in range(3):
        started = time.monotonic()
        assert one_token(process_url).status_code == 200
        baseline = max(baseline, time.monotonic() - started)
    body = {"prompt": [[1, 2, 3]] * 8, "n": 64, "max_tokens": 1000}  # inside max_n, max_samples and max_tokens
    started = time.monotonic()
    response = httpx.post(f"{process_url}/v1/completions", json=body, timeout=HANG_S)
    took = time.monotonic() - started
    assert response.status_code == 400 and "max_request_tokens" in response.text, response.text[:300]
    assert took < max(10 * baseline, 2.0), f"the refusal took {took:.2f} s, a one-token answer {baseline:.2f} s"


def test_small_request_is_not_starved_and_a_gone_client_frees_the_engine(process_url):
    """The one-token request is answered while the large one is still generating (an order, not a time), and the
    large one stops once its client closes the connection."""
    big = {"prompt": [[1, 2, 3]] * 4, "n": 64, "max_tokens": 1000, "temperature": 1.0}  # 256,000 tokens
    data = json.dumps(big).encode()
    port = int(process_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as client:  # a client that goes away when the test says so
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        wait_until(lambda: in_progress(process_url) == 1, "the large request was not admitted")
        small = one_token(process_url)
        assert small.status_code == 200, small.text[:300]
        assert in_progress(process_url) == 1, "the one-token request was answered only after the large one ended"
    wait_until(lambda: in_progress(process_url) == 0, "the server kept generating for a client that had gone")
    after = one_token(process_url)
    assert after.status_code == 200, "the server stopped answering after a client went away"


def test_health_counts_the_request_whose_slice_is_running():
    """`requests_in_progress` is `Scheduler.num_jobs`: the request the engine thread works on has left the queue
    but is not answered, and counts (it did not, so a lone large request read as 0 in progress)."""
    from tracerl.io.rollout.engine import Completion, SamplingParams
    from tracerl.serve import ServeLimits
    from tracerl.serve.scheduler import Scheduler

    entered, release = threading.Event(), threading.Event()

    class HeldEngine:
        def generate(self, prefixes, params, n=1):
            entered.set()
            release.wait(HANG_S)
            return [[Completion([7], [-1.0], "length")] for _ in prefixes]

    scheduler = Scheduler(HeldEngine(), ServeLimits())
    try:
        job = scheduler.submit([[1, 2]], SamplingParams(max_tokens=1), 1)
        assert entered.wait(HANG_S), f"timeout: the engine was not called within {HANG_S:g} s"
        assert scheduler.num_jobs == 1, "the request whose slice runs is not counted"
        release.set()
        assert job.future.result(HANG_S)[0][0].token_ids == [7]
        assert scheduler.num_jobs == 0, "an answered request is still counted"
    finally:
        release.set()
        scheduler.stop()
