"""OpenAIEngine against servers that abuse what HTTP/1.1 allows: headers dripped a byte at a time, an endless stream
of `100 Continue`, silence, answers far larger than the request can justify (with or without Content-Length, or
compressed), the same for `/v1/models` and `load_weights`. Every call ends by its deadline with an EngineError that
names the server, and reads no more than the request's size bound."""

import gzip
import json
import socket
import threading
import time
import tracemalloc

import pytest

from tracerl.engines.openai_engine import EngineError, OpenAIEngine
from tracerl.io.rollout.engine import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=2, seed=0)
GOOD = json.dumps({"choices": [{"index": 0, "token_ids": [3, 4], "finish_reason": "length",
                                "logprobs": {"token_logprobs": [-1.0, -0.5]}}]}).encode()


class RawServer:
    """A TCP server on loopback that reads a request's head (and the body its Content-Length announces), then runs
    `script(conn, path)`, which writes whatever bytes it likes. `sent` counts the bytes the scripts wrote."""

    def __init__(self, script):
        self.script, self.sent, self.stop = script, 0, threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].decode()
                length = next((int(l.split(b":")[1]) for l in lines if l.lower().startswith(b"content-length")), 0)
                body = head.split(b"\r\n\r\n", 1)[1]
                while len(body) < length:
                    body += conn.recv(65536)
                self.script(self, conn, path)
            except OSError:
                pass

    def write(self, conn, data: bytes):
        conn.sendall(data)
        self.sent += len(data)


HANG_S = 60.0  # a deadline that only stops a test from hanging: every call here ends in seconds, or never
AT_ONCE_S = 30.0  # timeout_s against a server that answers at once: no loaded machine comes near it


def finishes(call) -> BaseException | None:
    """Run `call()` in a thread; fail the test if it is still running after HANG_S. Returns what it raised.

    Against a server that never stops, that the call ends at all is the property; that its deadline ended it is
    shown by the error's message, not by a clock, so a loaded machine cannot fail the test."""
    caught = []

    def run():
        try:
            call()
        except BaseException as err:  # noqa: BLE001 (handed back to the test)
            caught.append(err)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"timeout: the call was still running after {HANG_S:g} s"
    return caught[0] if caught else None


def drip_headers(server, conn, path):
    server.write(conn, b"HTTP/1.1 200 OK\r\n")
    while not server.stop.is_set():
        server.write(conn, b"X")
        time.sleep(0.1)


def endless_continue(server, conn, path):
    while not server.stop.is_set():
        server.write(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.05)


def silent(server, conn, path):
    server.stop.wait(30)


def drip_body(server, conn, path):
    # a length under the size bound, so that only the deadline can end it
    server.write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n")
    while not server.stop.is_set():
        server.write(conn, b" ")
        time.sleep(0.05)


def huge(content_length: bool):
    def script(server, conn, path):
        size = 300 << 20
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if content_length:
            server.write(conn, head + f"Content-Length: {size}\r\n\r\n".encode() + GOOD)
            pad = b" " * (1 << 20)
            for _ in range(300):
                server.write(conn, pad)
        else:
            server.write(conn, head + b"Transfer-Encoding: chunked\r\n\r\n")
            server.write(conn, b"%x\r\n%s\r\n" % (len(GOOD), GOOD))
            pad = b" " * (1 << 20)
            for _ in range(300):
                server.write(conn, b"%x\r\n%s\r\n" % (len(pad), pad))
            server.write(conn, b"0\r\n\r\n")
    return script


# GOOD with 200 MiB of blanks inside, as 202 gzip members (RFC 1952 allows any number): about 200 KiB to send,
# built in milliseconds (one compressed MiB repeated) instead of compressing 200 MiB inside the timed call
BOMB = gzip.compress(GOOD[:-2]) + gzip.compress(b" " * (1 << 20)) * 200 + gzip.compress(GOOD[-2:])


def gzip_bomb(server, conn, path):
    server.write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                 + f"Content-Length: {len(BOMB)}\r\n\r\n".encode() + BOMB)


SLOW = [("headers dripped", drip_headers), ("endless 100 Continue", endless_continue), ("silence", silent),
        ("body dripped", drip_body)]


@pytest.mark.parametrize("name, script", SLOW, ids=[s[0] for s in SLOW])
def test_completion_call_ends_by_its_deadline(name, script):
    with RawServer(script) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=1.0, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
    assert isinstance(err, EngineError) and server.url in str(err) and "deadline" in str(err), repr(err)


@pytest.mark.parametrize("name, script", SLOW, ids=[s[0] for s in SLOW])
def test_retries_stay_inside_one_call_deadline(name, script):
    with RawServer(script) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=1.0, call_timeout_s=2.0, max_retries=50,
                              backoff_s=0.01)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))  # 51 attempts of 1 s each, without the deadline
    assert isinstance(err, EngineError) and "call_timeout_s=2.0" in str(err), repr(err)


@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "chunked"])
def test_answer_far_larger_than_the_request_is_refused_early(content_length):
    with RawServer(huge(content_length)) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=20.0, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
        time.sleep(0.2)
        sent = server.sent
    assert isinstance(err, EngineError) and "bytes" in str(err) and server.url in str(err), repr(err)
    assert sent < 64 << 20, f"the client read {sent >> 20} MiB for a 2-token answer"


def test_compressed_answer_is_not_inflated():
    """Refused by its Content-Encoding (the message), and never inflated: the call's peak of Python memory (every
    thread's, tracemalloc) stays far below the 200 MiB the answer inflates to."""
    with RawServer(gzip_bomb) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=20.0, max_retries=0)
        tracemalloc.start()
        try:
            err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert isinstance(err, EngineError) and "Content-Encoding" in str(err), repr(err)
    assert peak < 16 << 20, f"the call held {peak >> 20} MiB at its peak: it inflated the answer"


def answering(status: int, body: bytes, only: str | None = None):
    def script(server, conn, path):
        if only is not None and path != only:
            return server.write(conn, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        server.write(conn, f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return script


@pytest.mark.parametrize("body", [
    b'{"data": [1]}', b'{"data": [{"id": 7}]}', b'{"data": []}', b'{"data": "x"}', b"[]", b"not json",
    b'{"data": [{"id": ""}]}', json.dumps({"data": [{"id": "m" * 100_000}]}).encode(),
])
def test_malformed_model_list_is_an_engine_error_naming_the_field(body):
    with RawServer(answering(200, body)) as server:
        engine = OpenAIEngine(server.url, timeout_s=AT_ONCE_S, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
    assert isinstance(err, EngineError) and server.url in str(err) and "data" in str(err), repr(err)


@pytest.mark.parametrize("name, script", SLOW + [("huge", huge(True))], ids=[s[0] for s in SLOW] + ["huge"])
def test_model_list_and_load_weights_end_by_their_deadline(name, script):
    ended_by = "bytes" if name == "huge" else "deadline"  # the size bound ends the huge answer first
    with RawServer(script) as server:
        engine = OpenAIEngine(server.url, timeout_s=1.0, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
        assert isinstance(err, EngineError) and server.url in str(err) and ended_by in str(err), repr(err)
        err = finishes(lambda: engine.load_weights("/tmp/w.pt"))
        assert isinstance(err, EngineError) and server.url in str(err) and ended_by in str(err), repr(err)


@pytest.mark.parametrize("body", [b"not json", b'{"results": "x"}', b'{"results": [{"num_tensors": "7"}]}',
                                  b"[1]"])
def test_malformed_collective_rpc_answer_is_an_engine_error(body):
    with RawServer(answering(200, body, only="/collective_rpc")) as server:
        engine = OpenAIEngine(server.url, timeout_s=AT_ONCE_S, max_retries=0)
        err = finishes(lambda: engine.load_weights("/tmp/w.pt"))
    assert isinstance(err, EngineError) and server.url in str(err), repr(err)


def choice(**fields) -> bytes:
    base = {"index": 0, "token_ids": [3, 4], "finish_reason": "length", "logprobs": {"token_logprobs": [-1.0, -0.5]}}
    return json.dumps({"choices": [{**base, **fields}]}).encode()


@pytest.mark.parametrize("body, field", [
    (choice(token_ids=[9, 4], finish_reason="length"), "stop"),  # a stop token that did not end the sample
    (choice(token_ids=[3, 4, 5], logprobs={"token_logprobs": [-1.0, -1.0, -1.0]}), "max_tokens"),
    (choice(index=True), "index"),
    (choice(token_ids=[True, 4]), "token_ids"),
    (choice(logprobs={"token_logprobs": [True, -0.5]}), "token_logprobs"),
    (b'{"choices": [' + b"[" * 5_000 + b"]" * 5_000 + b"]}", "JSON"),
])
def test_answer_breaking_the_protocol_is_an_engine_error(body, field):
    stops = SamplingParams(temperature=1.0, max_tokens=2, seed=0, stop_token_ids=(9,))
    with RawServer(answering(200, body)) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=AT_ONCE_S, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], stops))
    assert isinstance(err, EngineError) and server.url in str(err) and field in str(err), repr(err)


def test_engine_error_has_one_home_below_both_engines():
    import subprocess
    import sys

    code = ("import sys; import tracerl.engines.vllm_worker as w; "
            "assert 'tracerl.engines.openai_engine' not in sys.modules, 'vllm_worker imported openai_engine'; "
            "from tracerl.engines.openai_engine import EngineError; assert w.EngineError is EngineError")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]


def test_tls_handshake_dripped_ends_by_the_deadline():
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip():  # a TLS record header announcing 16 KiB, then its bytes one at a time
        conn, _ = server.accept()
        with conn:
            try:
                conn.sendall(b"\x16\x03\x03\x40\x00")
                while not stop.is_set():
                    conn.sendall(b"\x00")
                    time.sleep(0.1)
            except OSError:
                pass
    threading.Thread(target=drip, daemon=True).start()
    url = f"https://127.0.0.1:{server.getsockname()[1]}"
    try:
        engine = OpenAIEngine(url, model="m", timeout_s=1.0, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
    finally:
        stop.set()
        server.close()
    assert isinstance(err, EngineError) and url in str(err) and "deadline" in str(err), repr(err)


# ---------------------------------------------------------------- numbers a server writes
# Every number the client reads from a server goes through one strict ASCII parser: Unicode digits (which
# `str.isdigit` accepts, and `int` either refuses, as for "²", or reads, as for "١٢"), signs, underscores and
# 5,000-digit runs are an EngineError naming the server and the field, never a raw ValueError or a silent value.

NOT_ASCII_INTEGERS = ["²", "١", "１", "+3", "3_0", "-1", "9" * 5000, ""]


def vllm_tokens(token: str) -> bytes:
    """A vLLM-shaped answer (ids only as `"token_id:N"` strings) whose second token is `token`."""
    tokens = ["token_id:3", token]
    return json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length",
                                    "logprobs": {"tokens": tokens, "token_logprobs": [-1.0, -0.5]}}]}).encode()


def test_a_vllm_shaped_answer_with_ascii_ids_still_parses():
    with RawServer(answering(200, vllm_tokens("token_id:4"))) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=AT_ONCE_S, max_retries=0)
        assert engine.generate([[1, 2]], PARAMS)[0][0].token_ids == [3, 4]


@pytest.mark.parametrize("digits", NOT_ASCII_INTEGERS, ids=[ascii(d[:8]) for d in NOT_ASCII_INTEGERS])
def test_a_token_id_string_that_is_not_an_ascii_integer_is_an_engine_error(digits):
    with RawServer(answering(200, vllm_tokens("token_id:" + digits))) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=AT_ONCE_S, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
    assert isinstance(err, EngineError) and server.url in str(err) and "token" in str(err), repr(err)


def announcing(length: str):
    """A good answer under a Content-Length header of `length` (written as UTF-8)."""
    def script(server, conn, path):
        server.write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           b"Content-Length: " + length.encode() + b"\r\n\r\n" + GOOD)
    return script


@pytest.mark.parametrize("length", [d for d in NOT_ASCII_INTEGERS if d],
                         ids=[ascii(d[:8]) for d in NOT_ASCII_INTEGERS if d])
def test_a_content_length_that_is_not_an_ascii_integer_is_an_engine_error(length):
    with RawServer(announcing(length)) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=AT_ONCE_S, max_retries=0)
        err = finishes(lambda: engine.generate([[1, 2]], PARAMS))
    assert isinstance(err, EngineError) and server.url in str(err) and "Content-Length" in str(err), repr(err)


def test_a_content_length_with_blanks_around_it_is_read():
    with RawServer(announcing(f"  {len(GOOD)} ")) as server:
        engine = OpenAIEngine(server.url, model="m", timeout_s=AT_ONCE_S, max_retries=0)
        assert engine.generate([[1, 2]], PARAMS)[0][0].token_ids == [3, 4]
