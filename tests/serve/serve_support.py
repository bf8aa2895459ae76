"""Servers for the serve tests, all real and on loopback: `tracerl serve`'s app in a uvicorn thread, `tracerl serve`
in a subprocess (to kill it), and a tiny `http.server` that answers badly a given number of times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from helpers import free_port, thread_server  # noqa: F401 (the serve tests import them from here)

VOCAB = 256  # of the tiny Qwen3 the tests serve
START_S = 120.0  # how long `tracerl serve` may take to answer /health: generous, a loaded machine imports slowly


def start_server_process(model_dir, port: int) -> subprocess.Popen:
    """`tracerl serve --model model_dir --port port` in a subprocess, returned once /health answers."""
    cmd = [sys.executable, "-m", "tracerl.cli", "serve", "--model", str(model_dir), "--port", str(port),
           "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tracerl serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"timeout: tracerl serve did not answer /health within {START_S:g} s")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    proc.stderr.close()


def vllm_choice(index: int, ids: list[int], logprobs: list[float], finish_reason: str) -> dict:
    """One choice as vLLM writes it with return_tokens_as_token_ids (and no token_ids field)."""
    tokens = [f"token_id:{t}" for t in ids]
    return {"index": index, "text": "", "finish_reason": finish_reason, "stop_reason": None,
            "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "text_offset": [0] * len(ids),
                         "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)]}}


def canned_ids(prompt: list[int], sample: int) -> list[int]:
    """What BadServer's good answer holds: two ids that depend on the prompt and the sample."""
    return [prompt[-1], 100 + sample]


class BadServer:
    """A real HTTP server that answers `/v1/completions` badly first, then well.

    `plan` maps a prompt's first token id to the list of bad answers it gets before good ones ("500", "truncated":
    a 200 whose JSON body is cut off, "slow": no answer until the server closes, so that only the client's timeout
    ends the attempt, "400"); `always` is what every request gets instead, forever. A good answer is vLLM-shaped:
    n choices of `canned_ids` with logprobs [-1, -2], "length". `seen` counts requests per first token id.
    """

    def __init__(self, plan: dict[int, list[str]] | None = None, always: str | None = None):
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.always = always
        self.seen: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.closed = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["prompt"]
                with outer.lock:
                    outer.seen[prompt[0]] += 1
                    todo = outer.always or (outer.plan.get(prompt[0]) or ["ok"]).pop(0)
                if todo == "slow":
                    outer.closed.wait()
                    return
                if todo == "500":
                    return self._send(500, b'{"error": {"message": "CUDA out of memory (on purpose)"}}')
                if todo == "400":
                    return self._send(400, b'{"error": {"message": "prompt is too long (on purpose)"}}')
                choices = [vllm_choice(j, canned_ids(prompt, j), [-1.0, -2.0], "length") for j in range(body["n"])]
                data = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": choices}).encode()
                self._send(200, data[: len(data) // 2] if todo == "truncated" else data)

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> BadServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def guarded_server(app, limits):
    """`app` served by uvicorn in a daemon thread, configured as `tracerl serve` configures it for `limits` (header
    and body timeouts, connection cap); yields the base URL."""
    from tracerl.serve import server_config

    def config(app, port):
        return server_config(app, host="127.0.0.1", port=port, limits=limits, log_level="warning")

    with thread_server(app, config) as url:
        yield url
