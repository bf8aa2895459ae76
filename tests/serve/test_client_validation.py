"""OpenAIEngine against a real loopback server that answers malformed JSON or drips its body: every failure is an
EngineError naming the server and the field, and no attempt holds longer than its timeout."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tracerl.engines.openai_engine import EngineError, OpenAIEngine
from tracerl.io.rollout.engine import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=2, seed=0, stop_token_ids=(9,))


def good_choice(index=0):
    return {"index": index, "token_ids": [3, 4], "finish_reason": "length",
            "logprobs": {"tokens": ["token_id:3", "token_id:4"], "token_logprobs": [-1.0, -0.5]}}


class Canned:
    """Answers every POST with `answer` (bytes), or drips it one byte per `drip_s` seconds."""

    def __init__(self, answer: bytes, drip_s: float = 0.0):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                try:
                    if not drip_s:
                        return self.wfile.write(answer)
                    for i in range(len(answer)):
                        self.wfile.write(answer[i:i + 1])
                        self.wfile.flush()
                        time.sleep(drip_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        outer.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def answer(*choices) -> bytes:
    return json.dumps({"choices": list(choices)}).encode()


def with_field(path, value):
    choice = good_choice()
    target = choice
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return choice


MALFORMED = [
    (b'{"choices": [1]}', "not an object"),
    (b'[]', "without 1 choices"),
    (b'{"choices": "x"}', "without 1 choices"),
    (answer(with_field(["index"], "zero")), "'index'"),
    (answer(with_field(["logprobs"], "oops")), "'logprobs'"),
    (answer(with_field(["token_ids"], [3, -4])), "'token_ids'"),
    (answer(with_field(["token_ids"], [3, 1000])), "'token_ids'"),
    (answer(with_field(["token_ids"], [3, 2**63])), "'token_ids'"),
    (answer(with_field(["token_ids"], [3, "4"])), "'token_ids'"),
    (answer(with_field(["token_ids"], {"a": 1})), "'token_ids'"),
    (answer(with_field(["logprobs", "token_logprobs"], [-1.0, 0.5])), "token_logprobs"),
    (answer(with_field(["logprobs", "token_logprobs"], [-1.0, "x"])), "token_logprobs"),
    (answer(with_field(["logprobs", "token_logprobs"], [-1.0])), "logprobs"),
    (b'{"choices": [{"index": 0, "token_ids": [3, 4], "finish_reason": "length", '
     b'"logprobs": {"token_logprobs": [-1.0, NaN]}}]}', "token_logprobs"),
    (b'{"choices": [{"index": 0, "token_ids": [3, 4], "finish_reason": "length", '
     b'"logprobs": {"token_logprobs": [-Infinity, -1.0]}}]}', "token_logprobs"),
    (answer(with_field(["finish_reason"], None)), "finish_reason"),
    (answer({**good_choice(), "token_ids": None,
             "logprobs": {"tokens": ["token_id:abc", "x"], "token_logprobs": [-1.0, -1.0]}}), "no token ids"),
]


@pytest.mark.parametrize("body, field", MALFORMED)
def test_malformed_answer_is_an_engine_error_naming_the_server_and_field(body, field):
    with Canned(body) as server:
        engine = OpenAIEngine(server.url, model="m", max_retries=0, vocab_size=100)
        with pytest.raises(EngineError) as caught:
            engine.generate([[1, 2]], PARAMS)
    assert server.url in str(caught.value) and field in str(caught.value), str(caught.value)


def test_good_answer_passes_validation():
    with Canned(answer(good_choice())) as server:
        [[c]] = OpenAIEngine(server.url, model="m", max_retries=0, vocab_size=100).generate([[1, 2]], PARAMS)
    assert c.token_ids == [3, 4] and c.logprobs == [-1.0, -0.5]


def test_dripping_server_cannot_hold_an_attempt_past_its_timeout():
    """The answer's 360 bytes take over 7 s to drip (a sleep of 0.02 s after each, longer on a loaded machine), so
    an error naming the deadline shows that the 1 s timeout ended the attempt before the answer was whole."""
    with Canned(answer(good_choice()) + b" " * 200, drip_s=0.02) as server:
        engine = OpenAIEngine(server.url, model="m", max_retries=0, timeout_s=1.0)
        with pytest.raises(EngineError, match="no complete answer within the deadline"):
            engine.generate([[1, 2]], PARAMS)
