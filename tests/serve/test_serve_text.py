"""`tracerl serve` checks the text of every field of a request: a string that is not Unicode text (a lone surrogate
written as a JSON escape, or bytes that are not UTF-8) gets HTTP 400 whose message names the field, whichever field
it is in (read by the server, ignored by it, or a field's name), never a codec error; text that is Unicode is not
refused for being non-ASCII."""

import json

import httpx
import pytest

from raw_http import HANG_S
from serve_support import guarded_server


@pytest.fixture(scope="module")
def url(model_dir):
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits(max_n=8, max_samples=16, max_tokens=64, max_request_tokens=512, max_prompt_tokens=4096)
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as base:
        yield base


def post(url: str, path: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=body, timeout=HANG_S,
                      headers={"Content-Type": "application/json", **(headers or {})})


def message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def assert_refused_naming(response: httpx.Response, field: str, what: str) -> None:
    assert response.status_code == 400, f"{what}: HTTP {response.status_code}: {response.text[:300]}"
    assert field in message(response), f"{what}: the message does not name {field!r}: {message(response)!r}"


LONE = "\ud800"  # json.dumps writes it as the escape "\ud800": valid JSON, not Unicode text

COMPLETION_FIELDS = [
    ("model", {"model": LONE}),
    ("model", {"model": "\udcff"}),
    ("prompt", {"prompt": LONE}),
    ("prompt", {"prompt": ["ok", "\udfff"]}),
    ("stop", {"stop": LONE}),
    ("stop", {"stop": ["ok", LONE]}),
    ("user", {"user": LONE}),
    ("suffix", {"suffix": LONE}),
    ("logit_bias", {"logit_bias": {LONE: 1}}),
    ("extra", {"extra": LONE}),
    ("extra", {"extra": {"nested": [1, {"deeper": LONE}]}}),
]


@pytest.mark.parametrize("field, fields", COMPLETION_FIELDS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(COMPLETION_FIELDS)])
def test_lone_surrogate_in_any_completion_field_gets_400_naming_it(url, field, fields):
    body = {"prompt": [1, 2], "max_tokens": 1, **fields}
    assert_refused_naming(post(url, "/v1/completions", json.dumps(body).encode()), field, repr(fields))


def test_lone_surrogate_in_a_field_name_gets_400(url):
    response = post(url, "/v1/completions", b'{"prompt": [1, 2], "max_tokens": 1, "\\ud800x": 1}')
    assert response.status_code == 400, response.text[:300]
    assert "name" in message(response), message(response)


def test_bytes_that_are_not_utf8_inside_a_field_get_400_naming_it(url):
    body = b'{"prompt": [1, 2], "max_tokens": 1, "model": "\xff\xfe"}'
    assert_refused_naming(post(url, "/v1/completions", body), "model", "raw 0xff 0xfe in model")


@pytest.mark.parametrize("path", [LONE + ".pt", "\udcff.pt", "a\u0000b.pt"])
def test_load_weights_path_that_is_not_a_file_name_gets_400_naming_it(url, path):
    response = post(url, "/v1/load_weights", json.dumps({"path": path}).encode())
    assert_refused_naming(response, "path", repr(path))


def test_load_weights_lone_surrogate_in_another_field_gets_400_naming_it(url, tmp_path):
    body = json.dumps({"path": str(tmp_path / "none.pt"), "note": LONE}).encode()
    assert_refused_naming(post(url, "/v1/load_weights", body), "note", "note")


@pytest.mark.parametrize("served_as", ["modèle", "\U0001f600"])  # the emoji goes over the wire as a surrogate pair
def test_unicode_text_is_not_a_codec_error(url, served_as):
    """The served model is named otherwise, so a 404 is allowed; it must name the field, not a codec."""
    body = json.dumps({"prompt": [1, 2], "max_tokens": 1, "model": served_as}).encode()
    response = post(url, "/v1/completions", body)
    assert response.status_code == 404, response.text[:300]
    assert "model" in message(response) and "codec" not in message(response), message(response)


def test_header_bytes_that_are_not_ascii_are_not_a_server_error(url):
    body = json.dumps({"prompt": [1, 2], "max_tokens": 1}).encode()
    response = post(url, "/v1/completions", body, {"Content-Type": b"application/json; charset=\xff",
                                                     "X-Note": b"\xfe\xff"})
    assert response.status_code in (200, 400), response.text[:300]


@pytest.mark.parametrize("body", [
    b'\xef\xbb\xbf{"prompt": [1, 2], "max_tokens": 1}',  # a UTF-8 byte order mark, which json.loads skipped too
    b'{"prompt": [1, 2], "max_tokens": 1, "user": "\\ud83d\\ude00"}',  # a surrogate pair: one character
    b'{"prompt": [1, 2], "max_tokens": 1, "user": "\\\\ud800"}',  # a backslash, then the text "ud800"
    '{"prompt": [1, 2], "max_tokens": 1, "user": "h\u00e9 \u4f60\u597d"}'.encode(),
])
def test_unicode_text_anywhere_is_served(url, body):
    response = post(url, "/v1/completions", body)
    assert response.status_code == 200, response.text[:300]


def test_text_problem_names_the_path_to_the_string():
    from tracerl.serve.request import text_problem

    assert text_problem({"a": [1, "ok", {"b": ["x", LONE]}]}) == "a[2].b[1]"
    assert text_problem({"a": {LONE: 1}}) == "a field name in a"
    assert text_problem({"a": ["ok", {"b": "é"}], "c": "\U0001f600"}) == ""


def test_error_message_quoting_a_lone_surrogate_is_sent_escaped():
    """What the app's error answer does with any message: a lone surrogate in it cannot turn a 400 into a 500."""
    from tracerl.serve.app import _error

    response = _error(400, f"bad value {LONE}")
    assert b"\\\\ud800" in response.body, response.body
