"""`tracerl serve` over raw HTTP: vLLM's response shape for token-id output, and HTTP 400 (never a crash) for
every bad request."""

import httpx
import pytest

pytest.importorskip("torch")

from serve_support import VOCAB

from tracerl.cli import main


def test_response_has_vllm_token_id_shape_and_batches_prompts(server, model_dir):
    body = {"model": str(model_dir), "prompt": [[1, 2, 3], [4, 5]], "n": 2, "max_tokens": 4, "temperature": 0.0,
            "logprobs": 0, "stop_token_ids": [], "seed": 3, "return_tokens_as_token_ids": True}
    data = httpx.post(f"{server}/v1/completions", json=body).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3], "one choice per sample, prompt-major"
    for c in data["choices"]:
        assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
        assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"]) == 4 and c["finish_reason"] == "length"
        assert c["logprobs"]["top_logprobs"][0] == {c["logprobs"]["tokens"][0]: c["logprobs"]["token_logprobs"][0]}
    assert data["choices"][0]["token_ids"] == data["choices"][1]["token_ids"], "greedy samples of one prompt differ"
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
    without = httpx.post(f"{server}/v1/completions", json={**body, "logprobs": None}).json()
    assert without["choices"][0]["logprobs"] is None, "logprobs were not asked for"


def test_models_and_health(server, model_dir):
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "requests_in_progress": 0}
    [listed] = httpx.get(f"{server}/v1/models").json()["data"]
    assert listed["id"] == str(model_dir) and listed["max_model_len"] == 4096


@pytest.mark.parametrize("body, message", [
    ({"prompt": "Hello"}, "prompt: must be a list of token ids"),
    ({"max_tokens": 4}, "prompt: Field required"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens >= 1"),
    ({"prompt": [1, 2], "temperature": -1}, "temperature >= 0"),
    ({"prompt": [1, 2], "n": 0}, "n=0"),
    ({"prompt": [1, -2]}, "outside"),
    ({"prompt": [1, VOCAB]}, "outside"),
    ({"prompt": []}, "empty"),
    ({"prompt": [[1], []]}, "empty"),
    ({"prompt": [1, 2], "logprobs": 5}, "logprobs=0"),
    ({"prompt": [1, 2], "stream": True}, "stream"),
    ({"prompt": [1, 2], "stop": ["</s>"]}, "stop_token_ids"),
    ({"prompt": [1, 2], "max_tokens": "many"}, "max_tokens"),
])
def test_bad_request_gets_400_with_a_message(server, body, message):
    response = httpx.post(f"{server}/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_unparseable_body_gets_400_and_server_keeps_serving(server):
    response = httpx.post(f"{server}/v1/completions", content=b'{"prompt": [1, 2',
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert httpx.post(f"{server}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}).status_code == 200


def test_cli_refuses_a_model_that_is_not_a_directory(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert "neither 'embedded' nor a local model directory" in capsys.readouterr().err


def test_model_error_gets_500_with_a_message_and_server_keeps_serving():
    from serve_support import thread_server

    from tracerl.serve import create_app

    class BrokenEngine:  # a model that fails inside generate (e.g. out of memory)
        max_positions = 64

        def generate(self, prefixes, params, n=1):
            raise RuntimeError("out of memory (on purpose)")

    with thread_server(create_app(BrokenEngine(), "broken")) as url:
        response = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2]})
        assert response.status_code == 500
        assert response.json()["error"]["message"] == "generation failed: RuntimeError: out of memory (on purpose)"
        assert httpx.get(f"{url}/health").status_code == 200
