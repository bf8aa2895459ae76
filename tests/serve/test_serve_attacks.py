"""`tracerl serve` against what HTTP/1.1 and JSON let a client send: bodies built to be costly to validate, slow
headers and bodies, idle connections, sampling values that overflow, state dicts with sparse, meta, complex or
non-finite tensors. Each request gets a quick 400 (or its connection closed), the server keeps answering /health
while it happens, and a rejected load leaves the weights as they were."""

import json
import socket
import threading
import time

import httpx
import pytest
import torch

from serve_support import VOCAB, guarded_server

HANG_S = 60.0  # a deadline that only keeps a wait from hanging for ever: generous for a loaded machine


@pytest.fixture(scope="module")
def served(model_dir):
    """The default header and body timeouts: a large body that is only slow to arrive on a loaded machine is read."""
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits(max_n=8, max_samples=16, max_tokens=64, max_request_tokens=512, max_prompt_tokens=4096)
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as url:
        yield url, engine


@pytest.fixture(scope="module")
def impatient(model_dir):
    """Header and body timeouts of 1 s, for the clients that drip or say nothing: the tests wait for them to act."""
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=24)
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as url:
        yield int(url.rsplit(":", 1)[1])


def post_raw(url: str, body: bytes, timeout: float = HANG_S) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", content=body, headers={"Content-Type": "application/json"},
                      timeout=timeout)


def timed(call) -> tuple[object, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def same_size_but_cheap(body: bytes, start: bytes) -> bytes:
    """`start` (a small request that gets a quick 400) padded with blanks to the length of `body`."""
    return start + b" " * (len(body) - len(start))


def allowed_seconds(baseline: float) -> float:
    """How long a costly body may take to be refused, given `baseline`: the slowest of three refusals of a cheap body
    of the same size, timed just before on the same machine. Ten times that, and at least 2 s: a check that costs
    seconds more than reading the body fails on any machine, a busy machine alone fails nothing."""
    return max(10 * baseline, 2.0)


def held_checks(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make every /v1/completions body check (which the app runs off the event loop) wait for `release` before it
    starts, setting `entered` as it waits: an order the tests can observe, instead of a latency."""
    import tracerl.serve.app as app_module

    entered, release = threading.Event(), threading.Event()
    check = app_module.parse_completion

    def held(*args):
        entered.set()
        release.wait(HANG_S)
        return check(*args)
    monkeypatch.setattr(app_module, "parse_completion", held)
    return entered, release


COSTLY_BODIES = [
    ("empty objects", b'{"prompt": [' + b"{}," * 300_000 + b'{}]}'),
    ("strings", b'{"prompt": [' + b'"a",' * 200_000 + b'"a"]}'),
    ("nested lists", b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    ("nested objects in an ignored field",
     b'{"prompt": [1], "x": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"),
    ("a 100,000-digit id", b'{"prompt": [1, ' + b"9" * 100_000 + b"]}"),
    ("too many ids", b'{"prompt": [' + b"1," * 200_000 + b"1]}"),
]


@pytest.mark.parametrize("name, body", COSTLY_BODIES, ids=[c[0] for c in COSTLY_BODIES])
def test_costly_body_gets_a_quick_400_and_health_stays_responsive(served, monkeypatch, name, body):
    """Quick: against a cheap body of the same size (`allowed_seconds`). Responsive: /health answers while this
    body's check is held (`held_checks`), so the check does not run on the event loop, whatever it costs."""
    url, _ = served
    cheap = same_size_but_cheap(body, b'{"prompt": [1], "n": 2.5}')
    baseline = max(timed(lambda: post_raw(url, cheap))[1] for _ in range(3))
    response, took = timed(lambda: post_raw(url, body))
    assert response.status_code == 400, (name, response.status_code, response.text[:300])
    assert took < allowed_seconds(baseline), f"{name}: the 400 took {took:.2f} s, a cheap one {baseline:.2f} s"

    entered, release = held_checks(monkeypatch)
    answers = []
    sender = threading.Thread(target=lambda: answers.append(post_raw(url, body)))
    sender.start()
    try:
        assert entered.wait(HANG_S), f"timeout: the body did not reach its check within {HANG_S:g} s"
        try:
            health = httpx.get(f"{url}/health", timeout=HANG_S)
        except httpx.TimeoutException:
            pytest.fail(f"timeout: {name}: /health did not answer within {HANG_S:g} s while the body was checked")
        checking = sender.is_alive()
    finally:
        release.set()
        sender.join(HANG_S)
    assert health.status_code == 200 and checking, f"{name}: /health answered only after the body's check"
    assert answers and answers[0].status_code == 400, (name, answers)


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 1e-300, "temperature"),
    ("temperature", 1e-40, "temperature"),
    ("temperature", float("inf"), "temperature"),
    ("top_p", float("nan"), "top_p"),
    ("n", True, "n"),
    ("n", 2.5, "n"),
    ("max_tokens", 4.0, "max_tokens"),
    ("seed", 1.5, "seed"),
    ("stop_token_ids", [1] * 5000, "stop_token_ids"),
    ("stop_token_ids", [[1]], "stop_token_ids"),
    ("logprobs", True, "logprobs"),
])
def test_sampling_value_that_cannot_be_served_gets_400(served, field, value, message):
    url, _ = served
    body = json.dumps({"prompt": [1, 2], "max_tokens": 2, field: value}).encode()
    response = post_raw(url, body)
    assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
    assert message in response.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"[1, 2]", b'"prompt"', b"null", b"1e999", b'{"prompt": [1, 2]} trailing',
                                  b'\xff\xfe{"prompt": [1]}'])
def test_body_that_is_not_one_json_object_gets_400(served, body):
    url, _ = served
    response = post_raw(url, body)
    assert response.status_code == 400, response.text[:300]


def test_request_over_the_token_budget_gets_400_naming_it(served):
    url, _ = served
    response = post_raw(url, json.dumps({"prompt": [[1, 2]] * 2, "n": 8, "max_tokens": 64}).encode())
    assert response.status_code == 400 and "max_request_tokens=512" in response.text, response.text


def test_prompt_that_cannot_fit_the_positions_gets_400_before_generation(served):
    url, _ = served
    response = post_raw(url, json.dumps({"prompt": [1] * 4090, "max_tokens": 10}).encode())
    assert response.status_code == 400 and "positions" in response.text


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_headers_dripped_slowly_get_the_connection_closed(impatient):
    with socket.create_connection(("127.0.0.1", impatient)) as sock:
        sock.settimeout(0.2)
        started, closed = time.monotonic(), False
        request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 400
        for i in range(len(request)):
            try:
                sock.sendall(request[i:i + 1])
                if sock.recv(4096) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = True
                break
            if time.monotonic() - started > HANG_S:
                break
    assert closed, f"timeout: a client dripping its headers held the connection for {HANG_S:g} s (header_timeout_s=1)"


def test_body_that_never_ends_gets_the_connection_closed(impatient):
    with socket.create_connection(("127.0.0.1", impatient)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n")
        sock.settimeout(HANG_S)
        try:
            answer = sock.recv(4096)
        except socket.timeout:
            answer = None
    assert answer is not None, f"timeout: a chunked body without its last chunk held the connection for {HANG_S:g} s"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]


def test_idle_connections_are_closed_and_the_server_keeps_answering(impatient):
    idle = [socket.create_connection(("127.0.0.1", impatient)) for _ in range(60)]  # more than max_connections=24
    try:
        deadline, still_open = time.monotonic() + HANG_S, idle
        while still_open:  # header_timeout_s=1
            still_open = [sock for sock in still_open if not closed_by_server(sock)]
            assert time.monotonic() < deadline, \
                f"timeout: {len(still_open)} connections that sent nothing are still open after {HANG_S:g} s"
        assert httpx.get(f"http://127.0.0.1:{impatient}/health", timeout=HANG_S).status_code == 200
    finally:
        for sock in idle:
            sock.close()


def save_with(engine, tmp_path, name, change) -> str:
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    change(state)
    path = tmp_path / f"{name}.pt"
    torch.save(state, path)
    return str(path)


def last_key(state) -> str:
    return list(state)[-1]


BAD_STATES = [
    ("sparse", lambda s: s.__setitem__(last_key(s), s[last_key(s)].to_sparse())),
    ("complex", lambda s: s.__setitem__(last_key(s), s[last_key(s)].to(torch.complex64))),
    ("integer", lambda s: s.__setitem__(last_key(s), s[last_key(s)].to(torch.int64))),
    ("nan", lambda s: s[last_key(s)].view(-1)[0].fill_(float("nan"))),
    ("inf", lambda s: s[last_key(s)].view(-1)[0].fill_(float("inf"))),
    ("not a tensor", lambda s: s.__setitem__(last_key(s), [1.0, 2.0])),
    ("missing", lambda s: s.pop(last_key(s))),
]


@pytest.mark.parametrize("name, change", BAD_STATES, ids=[b[0] for b in BAD_STATES])
def test_load_weights_with_one_bad_tensor_changes_nothing(served, tmp_path, name, change):
    url, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    path = save_with(engine, tmp_path, name, lambda s: ([v.add_(1.0) for v in s.values()], change(s)))
    response = httpx.post(f"{url}/v1/load_weights", json={"path": path}, timeout=30)
    assert response.status_code == 400, (name, response.status_code, response.text[:300])
    after = engine.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, f"a rejected load ({name}) changed {len(changed)} tensors"


def test_load_weights_refuses_a_file_far_larger_than_the_model(served, tmp_path):
    url, engine = served
    path = save_with(engine, tmp_path, "padded", lambda s: s.__setitem__("padding", torch.zeros(4_000_000)))
    response = httpx.post(f"{url}/v1/load_weights", json={"path": path}, timeout=30)
    assert response.status_code == 400 and "bytes" in response.text, response.text[:300]


def test_load_weights_accepts_non_contiguous_tensors_and_loads_them(served, tmp_path):
    url, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    name = next(k for k in before if k.endswith("q_proj.weight"))  # not the embedding, which lm_head ties

    def transpose_view(state):
        state[name] = (state[name] + 1.0).t().contiguous().t()  # same values layout-transposed: not contiguous
    path = save_with(engine, tmp_path, "strided", transpose_view)
    try:
        response = httpx.post(f"{url}/v1/load_weights", json={"path": path}, timeout=30)
        assert response.status_code == 200, response.text[:300]
        assert torch.equal(engine.model.state_dict()[name], before[name] + 1.0)
    finally:
        torch.save(before, f"{path}.orig")
        assert httpx.post(f"{url}/v1/load_weights", json={"path": f"{path}.orig"}, timeout=30).status_code == 200


def test_load_weights_from_a_device_or_fifo_is_refused(served, tmp_path):
    import os

    url, _ = served
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    for path in ["/dev/zero", str(fifo), str(tmp_path)]:
        response = httpx.post(f"{url}/v1/load_weights", json={"path": path}, timeout=5)
        assert response.status_code == 400, (path, response.text[:200])


def test_ids_at_the_vocabulary_edge(served):
    url, _ = served
    ok = post_raw(url, json.dumps({"prompt": [0, VOCAB - 1], "max_tokens": 1}).encode())
    assert ok.status_code == 200, ok.text[:200]


def test_load_weights_with_a_costly_body_gets_a_quick_400_without_parsing_it(served, monkeypatch):
    """The handler runs on the event loop, so /health waits for whatever it parses: a body over 64 KiB is refused
    unparsed (counted here), and as quickly as a cheap body of the same size (`allowed_seconds`)."""
    import tracerl.serve.app as app_module

    url, _ = served
    parsed, parse = [], app_module._json_object
    monkeypatch.setattr(app_module, "_json_object", lambda raw: parsed.append(len(raw)) or parse(raw))

    def load(body: bytes) -> httpx.Response:
        return httpx.post(f"{url}/v1/load_weights", content=body, headers={"Content-Type": "application/json"},
                          timeout=HANG_S)
    body = b'{"path": [' + b"{}," * 300_000 + b'{}]}'
    baseline = max(timed(lambda: load(same_size_but_cheap(body, b'{"path": 1}')))[1] for _ in range(3))
    response, took = timed(lambda: load(body))
    assert response.status_code == 400, response.text[:200]
    assert took < allowed_seconds(baseline), f"the 400 took {took:.2f} s, a cheap one {baseline:.2f} s"
    assert parsed == [], f"load_weights parsed bodies of {parsed} bytes on the event loop"


def test_bodies_held_at_once_are_bounded(model_dir):
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    # at most 4 x 4096 bytes of bodies held at once; a body timeout the test cannot outlast, however slow the machine
    limits = ServeLimits(max_body_bytes=4096, body_timeout_s=10 * HANG_S)
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as url:
        port = int(url.rsplit(":", 1)[1])
        held = []
        for _ in range(5):  # each sends all of a 4000-byte body but its last byte
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 4000\r\n\r\n" + b" " * 3999)
            held.append(sock)
        probe = b" " * 3990 + b'{"prompt": [1], "max_tokens": 1}'[:10]  # a 400 if the server reads it whole
        try:  # once the server has read the held bodies (it says when by no clock), a fifth one is refused
            statuses = until(lambda: post_raw(url, probe).status_code, lambda status: status == 503)
            assert statuses[-1] == 503, f"timeout: no 503 in {HANG_S:g} s while 4 bodies were held: {statuses[-5:]}"
        finally:
            for sock in held:
                sock.close()
        statuses = until(lambda: post_raw(url, json.dumps({"prompt": [1], "max_tokens": 1}).encode()).status_code,
                         lambda status: status != 503)  # until the server has seen the held clients go
        assert statuses[-1] == 200, statuses[-5:]


def until(call, done) -> list:
    """Call `call()` until `done(result)` or HANG_S pass; all the results, the last one last."""
    deadline, results = time.monotonic() + HANG_S, [call()]
    while not done(results[-1]) and time.monotonic() < deadline:
        time.sleep(0.05)
        results.append(call())
    return results
