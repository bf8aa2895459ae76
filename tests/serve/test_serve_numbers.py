"""`tracerl serve` reads the one number a client writes as text, the request's Content-Length, with the strict ASCII
parser every boundary uses (`tracerl.io.files.boundary.parse_int`): "²" (which `bytes.isdigit` refuses but `str.isdigit`
accepts), "١٢", "+12", "1_2", "-1" and a 5,000-digit run each get HTTP 400 naming the header, never a 500 from a bare
ValueError. uvicorn's HTTP parsers refuse them before the app sees them; the app's own check must refuse them too, since
another ASGI server may pass the header on."""

import asyncio
import json
import socket

import httpx
import pytest

from serve_support import guarded_server

HANG_S = 60.0  # keeps a read from hanging for ever; every answer here comes at once
LENGTHS = ["²", "١٢", "+12", "1_2", "-1", "9" * 5000]
IDS = ["superscript", "arabic-indic", "plus", "underscore", "minus", "5000 digits"]


@pytest.fixture(scope="module")
def served(model_dir):
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits()
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as url:
        yield url


@pytest.mark.parametrize("length", LENGTHS, ids=IDS)
def test_a_content_length_that_is_not_ascii_digits_gets_400(served, length):
    port = int(served.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(HANG_S)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + length.encode() + b"\r\n\r\n" + b'{"prompt": [1], "max_tokens": 1}')
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert httpx.get(f"{served}/health", timeout=HANG_S).status_code == 200


@pytest.mark.parametrize("length", LENGTHS, ids=IDS)
def test_the_apps_own_body_limit_refuses_it_naming_the_header(length):
    from tracerl.serve.app import _BodyLimit

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope)

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", length.encode())]}
    asyncio.run(_BodyLimit(app, 4096, HANG_S, 1 << 20)(scope, receive, send))
    assert not reached and sent[0]["status"] == 400, sent[:1]
    assert "Content-Length" in json.loads(sent[1]["body"])["error"]["message"], sent[1]["body"][:200]


def test_the_apps_own_body_limit_passes_a_plain_length_on():
    from tracerl.serve.app import _BodyLimit

    reached = []

    async def app(scope, receive, send):
        reached.append((await receive())["body"])

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"content-length", b"2")]}
    asyncio.run(_BodyLimit(app, 4096, HANG_S, 1 << 20)(scope, receive, send))
    assert reached == [b"{}"]
