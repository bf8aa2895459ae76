"""`tracerl serve` bounds every request (n, prompts x n, max_tokens, body size) and validates sampling values
and ids with a 400 naming the limit; `/v1/load_weights` loads all of a state dict or nothing."""

import httpx
import pytest
import torch

from serve_support import VOCAB


@pytest.fixture(scope="module")
def limited(model_dir):
    from serve_support import thread_server

    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits(max_n=4, max_samples=6, max_tokens=32, max_body_bytes=4096)
    with thread_server(create_app(engine, name, tokenizer, limits)) as url:
        yield url, engine


@pytest.mark.parametrize("body, message", [
    ({"prompt": [1, 2], "n": 5}, "max_n=4"),
    ({"prompt": [1, 2], "n": 10**12}, "max_n=4"),
    ({"prompt": [[1], [2]], "n": 4}, "max_samples=6"),
    ({"prompt": [1, 2], "max_tokens": 33}, "max_tokens=32"),
    ({"prompt": [1, 2], "temperature": float("nan")}, "temperature=nan"),
    ({"prompt": [1, 2], "temperature": -0.5}, "temperature"),
    ({"prompt": [1, 2], "top_p": 0.0}, "top_p"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "seed": -1}, "seed=-1"),
    ({"prompt": [1, 2], "seed": 2**63}, "seed="),
    ({"prompt": [1, 2**63]}, "outside"),
    ({"prompt": [1, 2**64 + 5]}, "outside"),
    ({"prompt": [1, VOCAB]}, "outside"),
    ({"prompt": [1, 2], "stop_token_ids": [-3]}, "stop_token_ids"),
    ({"prompt": [1, 2], "stop_token_ids": [2**63]}, "stop_token_ids"),
])
def test_request_over_a_limit_or_with_a_bad_value_gets_400_naming_it(limited, body, message):
    url, _ = limited
    # json= cannot send NaN; write the body ourselves so NaN reaches the server as Python's json writes it
    import json
    response = httpx.post(f"{url}/v1/completions", content=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"], response.text


def test_body_over_the_size_limit_gets_400_with_or_without_content_length(limited):
    url, _ = limited
    big = b'{"prompt": [' + b"1, " * 3000 + b'1]}'
    response = httpx.post(f"{url}/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "max_body_bytes" in response.text

    def chunks():  # no Content-Length: the limit must hold as the body streams in
        for _ in range(10):
            yield b" " * 1000
    response = httpx.post(f"{url}/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "max_body_bytes" in response.text
    ok = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "n": 4})
    assert ok.status_code == 200, ok.text


def test_load_weights_is_all_or_nothing(limited, tmp_path):
    url, engine = limited
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    state = {k: torch.full_like(v, 0.5) for k, v in before.items()}
    state["extra.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "bad.pt")
    response = httpx.post(f"{url}/v1/load_weights", json={"path": str(tmp_path / "bad.pt")})
    assert response.status_code == 400 and "unexpected ['extra.weight']" in response.text
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a rejected load_weights changed the weights"

    name = next(iter(before))
    shaped = {k: v.clone() for k, v in before.items()}
    shaped[name] = torch.zeros(3, 3, 3)
    torch.save(shaped, tmp_path / "shape.pt")
    response = httpx.post(f"{url}/v1/load_weights", json={"path": str(tmp_path / "shape.pt")})
    assert response.status_code == 400 and "the model's is" in response.text

    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    response = httpx.post(f"{url}/v1/load_weights", json={"path": str(tmp_path / "junk.pt")})
    assert response.status_code == 400 and "junk.pt" in response.text
    assert httpx.get(f"{url}/health").status_code == 200
