"""`tracerl serve` (a real subprocess, default limits) shares its engine between requests: a large request inside
every limit cannot make a one-token request wait for it, a request over the token budget is refused at once, and
the work of a client that went away stops."""

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


def in_progress(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=5).json()["requests_in_progress"]


def test_request_over_the_default_token_budget_is_refused_at_once(process_url):
    body = {"prompt": [[1, 2, 3]] * 8, "n": 64, "max_tokens": 1000}  # inside max_n, max_samples and max_tokens
    started = time.monotonic()
    response = httpx.post(f"{process_url}/v1/completions", json=body, timeout=10)
    assert response.status_code == 400 and "max_request_tokens" in response.text, response.text[:300]
    assert time.monotonic() - started < 2.0


def test_small_request_is_not_starved_and_a_gone_client_frees_the_engine(process_url):
    big = {"prompt": [[1, 2, 3]] * 4, "n": 64, "max_tokens": 1000, "temperature": 1.0}  # 256,000 tokens

    def send_big():  # a client that gives up after 4 s and closes its connection
        try:
            httpx.post(f"{process_url}/v1/completions", json=big, timeout=4)
        except httpx.TimeoutException:
            pass

    sender = threading.Thread(target=send_big)
    sender.start()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        small = httpx.post(f"{process_url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=30)
        took = time.monotonic() - started
        assert small.status_code == 200, small.text[:300]
        assert took < 2.0, f"a one-token request waited {took:.1f} s behind a large one"
    finally:
        sender.join()
    deadline = time.monotonic() + 5
    while in_progress(process_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_progress(process_url) == 0, "the server kept generating for a client that had gone"
    after = httpx.post(f"{process_url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=10)
    assert after.status_code == 200, "the server stopped answering after a client went away"
