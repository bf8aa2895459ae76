"""Engine protocol over an OpenAI-compatible `/v1/completions` server: vLLM, SGLang or `tracerl serve`.

What it does:
- sends token-id prompts (`"prompt": [ids]`) and reads token ids and per-token logprobs back, so nothing is
  re-tokenized. It asks for ids both ways servers offer them: `return_token_ids` (a `token_ids` list on each
  choice: vLLM >= 0.10.2, recent SGLang, `tracerl serve`) and `return_tokens_as_token_ids` (vLLM writes each
  `logprobs.tokens` entry as `"token_id:123"`); `logprobs: 0` returns the sampled token's logprob only.
- `ignore_eos: true` and `skip_special_tokens: false`, so, as with every tracerl engine, only `stop_token_ids`
  end a sample and the stop token is part of the output;
- one request per prefix (`n_mode="n"`) or one request per sample (`n_mode="repeat"`, for SGLang, whose n copies
  of one seeded request all draw the same sample). A seeded call gives every request its own seed derived from
  (seed, prefix index, sample index), so equal prefixes in one call still get different samples;
- up to `max_concurrency` requests in flight (a thread pool); each request is retried on its own, so the
  completions already received in a call are kept and only failed requests are sent again. Retried: connection
  refused or dropped, timeouts, HTTP 5xx and 429, and a body that is not JSON (e.g. truncated). Not retried:
  other HTTP 4xx (a bad request stays bad) and JSON of the wrong shape (a server that does not speak this
  dialect). After the last retry the call raises one `EngineError` naming the URL and the last failure.
- a total deadline per attempt: `timeout_s` bounds connecting, sending and reading the whole body together, so a
  server that drips its answer byte by byte fails the attempt (retried) instead of holding the call;
- every answer is checked before it is used: choices are objects with distinct in-range indexes, ids are integers in
  [0, vocab_size) (non-negative and below 2^31 when vocab_size is not given), one finite logprob <= 0 per id, a
  known finish reason. A malformed answer raises `EngineError` naming the server, the choice and the field, never
  a bare AttributeError or TypeError.

Logprobs. tracerl's trainer compares against `log_softmax(logits / T)` of the sampled token (see
`tracerl.engines.transformers_engine`). vLLM's V1 engine reports logprobs *before* temperature by default
(`--logprobs-mode raw_logprobs`); start it with `--logprobs-mode processed_logprobs` (then it reports them after
temperature and after top-k/top-p, renormalised over the kept tokens: the same values at top_p=1). SGLang's
`/v1/completions` reports `log_softmax(logits / T)` unless `SGLANG_RETURN_ORIGINAL_LOGPROB` is set; SGLang honours
seeds only with `--enable-deterministic-inference`. `tracerl serve` reports `log_softmax(logits / T)`.
`docs/engines.md` has the launch commands.

What it does not do: text, chat templates or tokenization; streaming; KV reuse on the client (vLLM and SGLang
reuse shared prefixes themselves with prefix caching); checking that the server's model is the policy being
trained (serve the trainer's weights and name them in `model`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

import httpx

from tracerl.io.engine import Completion, SamplingParams, check_request


class EngineError(ValueError):
    """A request to the generation server failed for good (after retries, or at once for a bad request)."""


@dataclass(frozen=True)
class _Request:
    prefix_index: int
    num_samples: int  # the n of this request
    seed: int | None


class _Retryable(Exception):
    """One attempt failed in a way that may pass (connection, timeout, 5xx, unparseable body)."""


def request_seed(seed: int | None, prefix_index: int, sample_index: int) -> int | None:
    """A per-request seed in [0, 2^31) from the call's seed, the prefix index and the sample index (None stays
    None): requests of one seeded call draw different samples, and the same call draws the same ones again."""
    if seed is None:
        return None
    return ((seed % 2**31) * 1_000_003 + prefix_index * 10_007 + sample_index) % 2**31


class OpenAIEngine:
    """Engine protocol on an OpenAI-compatible completions server (see the module docstring).

    - `base_url`: the server's root, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted).
    - `model`: the served model name sent with every request; None asks `GET /v1/models` once and takes the first.
    - `n_mode`: "n" (one request per prefix with n samples; vLLM, `tracerl serve`) or "repeat" (n requests of one
      sample each; SGLang).
    - `max_concurrency`: most requests in flight; raise it to keep a big server busy.
    - `timeout_s`: per attempt, connecting, sending and reading the whole answer together; lower it to fail fast, raise it for long generations.
    - `vocab_size`: the policy's vocabulary; returned ids at or above it are rejected (pass it: a server serving
      another model answers with ids the trainer cannot embed).
    - `max_retries`, `backoff_s`, `max_backoff_s`: a failed request is sent again up to `max_retries` times,
      after `backoff_s * 2**attempt` seconds (at most `max_backoff_s`); raise them to ride out a server restart.

    `stats` counts `num_calls`, `num_requests` (answered), `num_retries` (attempts sent again) and
    `generated_tokens`.
    """

    def __init__(self, base_url: str, model: str | None = None, *, n_mode: str = "n", max_concurrency: int = 8,
                 timeout_s: float = 300.0, max_retries: int = 4, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, api_key: str | None = None, vocab_size: int | None = None):
        if n_mode not in ("n", "repeat"):
            raise ValueError(f"n_mode={n_mode!r} must be 'n' (one request with n samples; vLLM, tracerl serve) or "
                             f"'repeat' (n requests of one sample; SGLang)")
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError(f"need max_concurrency >= 1 (got {max_concurrency}), timeout_s > 0 ({timeout_s}), "
                             f"max_retries >= 0 ({max_retries}) and backoff_s >= 0 ({backoff_s})")
        self.vocab_size = vocab_size if vocab_size is not None else 2**31  # ids at or above are rejected
        self.timeout_s = timeout_s
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.url = f"{self.base_url}/v1/completions"
        self.model = model
        self.n_mode = n_mode
        self.max_concurrency = max_concurrency
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers,
                                    limits=httpx.Limits(max_connections=max_concurrency))
        self._lock = threading.Lock()
        self.stats: dict[str, int] = dict.fromkeys(("num_calls", "num_requests", "num_retries", "generated_tokens"), 0)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the Engine protocol -------------------------------------------------------------------------------------

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1) -> list[list[Completion]]:
        """For each prefix, n (or n[i]) sampled continuations; see the module docstring for logprobs."""
        prompts, counts = check_request(prefixes, n)
        with self._lock:
            self.stats["num_calls"] += 1
        if self.n_mode == "n":
            requests = [_Request(i, c, request_seed(params.seed, i, 0)) for i, c in enumerate(counts) if c]
        else:
            requests = [_Request(i, 1, request_seed(params.seed, i, j)) for i, c in enumerate(counts) for j in range(c)]
        results: list[list[Completion]] = [[] for _ in prompts]
        if not requests:
            return results
        if self.model is None:
            self.model = self._first_model()
        answers: list[list[Completion] | None] = [None] * len(requests)

        def run(k: int) -> None:
            answers[k] = self._send(prompts[requests[k].prefix_index], params, requests[k])

        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests)))
        try:
            futures = [pool.submit(run, k) for k in range(len(requests))]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:  # give up at the first request that failed for good
                raise failed.exception()
        finally:  # on failure, requests not yet started are dropped and running ones are not waited for
            pool.shutdown(wait=False, cancel_futures=True)
        for request, answer in zip(requests, answers):
            results[request.prefix_index].extend(answer)
        return results

    # ---- one request with retries ----------------------------------------------------------------------------------

    def _send(self, prompt: list[int], params: SamplingParams, request: _Request) -> list[Completion]:
        body = {
            "model": self.model, "prompt": prompt, "n": request.num_samples, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "seed": request.seed, "logprobs": 0,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True, "skip_special_tokens": False,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "stream": False,
        }
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["num_retries"] += 1
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            try:
                choices = self._post(body)
            except _Retryable as err:
                last = str(err)
                continue
            completions = [self._parse_choice(c, params, k) for k, c in enumerate(choices)]
            with self._lock:
                self.stats["num_requests"] += 1
                self.stats["generated_tokens"] += sum(len(c.token_ids) for c in completions)
            return completions
        raise EngineError(f"POST {self.url} failed {self.max_retries + 1} times; last failure: {last}. Is the server "
                          f"up (`tracerl serve`, vLLM or SGLang; see docs/engines.md)? Raise max_retries/timeout_s "
                          f"to wait longer")

    def _post(self, body: dict) -> list[dict]:
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._client.stream("POST", self.url, json=body) as streamed:
                chunks, size = [], 0
                for chunk in streamed.iter_bytes():  # each read is bounded by timeout_s; the total by the deadline
                    chunks.append(chunk)
                    size += len(chunk)
                    if time.monotonic() > deadline:
                        raise _Retryable(f"the answer took longer than timeout_s={self.timeout_s}s to arrive "
                                         f"({size} bytes so far)")
                response = httpx.Response(streamed.status_code, headers=streamed.headers, content=b"".join(chunks))
        except httpx.TimeoutException as err:
            raise _Retryable(f"timed out ({type(err).__name__})") from err
        except httpx.TransportError as err:  # connection refused, reset, or dropped mid-response
            raise _Retryable(f"{type(err).__name__}: {err}") from err
        if response.status_code >= 500 or response.status_code == 429:
            raise _Retryable(f"HTTP {response.status_code}: {_error_message(response)}")
        if response.status_code >= 400:
            raise EngineError(f"POST {self.url} was refused with HTTP {response.status_code}: "
                              f"{_error_message(response)}")
        try:
            data = response.json()
        except (ValueError, RecursionError) as err:  # truncated or not JSON at all
            raise _Retryable(f"unparseable JSON body ({type(err).__name__}: {str(err)[:100]}; "
                             f"{len(response.content)} bytes)") from err
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != body["n"]:
            raise EngineError(f"POST {self.url} answered without {body['n']} choices: {str(data)[:300]}")
        if not all(isinstance(c, dict) for c in choices):
            raise EngineError(f"{self.url} answered with a choice that is not an object: {str(choices)[:300]}")
        indexes = [c.get("index", k) for k, c in enumerate(choices)]
        if sorted(i for i in indexes if type(i) is int) != list(range(len(choices))):
            raise EngineError(f"{self.url} answered with choice indexes {str(indexes)[:200]}; field 'index' must "
                              f"number the {len(choices)} choices 0..{len(choices) - 1}")
        return [c for _, c in sorted(zip(indexes, choices), key=lambda pair: pair[0])]

    def _parse_choice(self, choice: dict, params: SamplingParams, k: int) -> Completion:
        """Token ids, logprobs and finish reason of one choice, in either dialect (see the module docstring)."""
        logprobs = choice.get("logprobs") or {}
        if not isinstance(logprobs, dict):
            raise EngineError(f"{self.url} returned field 'logprobs' of type {type(logprobs).__name__} in choice {k}")
        values = logprobs.get("token_logprobs")
        ids = choice.get("token_ids")
        if ids is None:  # vLLM without return_token_ids: "token_id:123" strings
            tokens = logprobs.get("tokens") or []
            if not isinstance(tokens, list) or not all(isinstance(t, str) and t.startswith("token_id:")
                                                       and t[9:].isdigit() and len(t) < 30 for t in tokens):
                raise EngineError(f"{self.url} returned no token ids in choice {k} (tokens {str(tokens)[:60]}...); "
                                  f"use a server that honours return_token_ids (vLLM >= 0.10.2, SGLang, tracerl "
                                  f"serve) or return_tokens_as_token_ids (vLLM)")
            ids = [int(t.removeprefix("token_id:")) for t in tokens]
        if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < self.vocab_size for t in ids):
            bad = next((t for t in ids if not (type(t) is int and 0 <= t < self.vocab_size)), ids) \
                if isinstance(ids, list) else ids
            raise EngineError(f"{self.url} returned field 'token_ids' with {str(bad)[:60]!s} in choice {k}; ids must "
                              f"be integers in [0, {self.vocab_size}) (is the server serving the policy's model?)")
        if not isinstance(values, list) or len(values) != len(ids) or any(v is None for v in values):
            raise EngineError(f"{self.url} returned {len(ids)} token ids but logprobs {str(values)[:200]} in choice "
                              f"{k}; the server must return a logprob for every sampled token")
        if not all(type(v) in (int, float) and math.isfinite(v) and v <= 1e-6 for v in values):
            bad = next(v for v in values if not (type(v) in (int, float) and math.isfinite(v) and v <= 1e-6))
            raise EngineError(f"{self.url} returned field 'logprobs.token_logprobs' with {str(bad)[:60]} in choice "
                              f"{k}; a logprob must be a finite number <= 0")
        reason = choice.get("finish_reason")
        stops = set(params.stop_token_ids)
        if reason == "stop" and not (ids and ids[-1] in stops):
            raise EngineError(f"{self.url} stopped choice {k} on something other than stop_token_ids {sorted(stops)} "
                              f"(last ids {ids[-3:]}); the server must honour ignore_eos and keep the stop token")
        if reason not in ("stop", "length") or len(ids) > params.max_tokens:
            raise EngineError(f"{self.url} returned finish_reason={reason!r} with {len(ids)} tokens for max_tokens="
                              f"{params.max_tokens} in choice {k}")
        return Completion([int(t) for t in ids], [min(float(v), 0.0) for v in values], reason)

    def load_weights(self, path: str) -> None:
        """Ask the server to load the state dict saved at `path` (`torch.save`; the server must be able to read it).

        `tracerl serve` implements this as `POST /v1/load_weights {"path": ...}`. A server without that endpoint
        (HTTP 404) is taken to be vLLM started with tracerl's worker extension in dev mode
        (`tracerl.engines.vllm_worker`); SGLang has its own path (see docs/engines.md)."""
        url = f"{self.base_url}/v1/load_weights"
        try:
            response = self._client.post(url, json={"path": str(path)})
        except httpx.TransportError as err:
            raise EngineError(f"POST {url} failed: {type(err).__name__}: {err}. Is the server up?") from err
        if response.status_code == 404:  # not tracerl serve: vLLM's /collective_rpc and tracerl's worker extension
            from tracerl.engines.vllm_worker import load_served_weights

            load_served_weights(self._client, self.base_url, str(path))
            return
        if response.status_code != 200:
            raise EngineError(f"POST {url} answered HTTP {response.status_code}: {_error_message(response)}")

    def _first_model(self) -> str:
        """The first model `GET /v1/models` lists (retried like a completion request)."""
        url, last = f"{self.base_url}/v1/models", ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            try:
                response = self._client.get(url)
                if response.status_code < 500:
                    response.raise_for_status()
                    return response.json()["data"][0]["id"]
                last = f"HTTP {response.status_code}"
            except (httpx.TransportError, ValueError) as err:
                last = f"{type(err).__name__}: {err}"
            except (httpx.HTTPStatusError, KeyError, IndexError, TypeError) as err:
                raise EngineError(f"GET {url} listed no model ({err}); pass model=... explicitly") from err
        raise EngineError(f"GET {url} failed {self.max_retries + 1} times; last failure: {last}. Is the server up?")


def _error_message(response: httpx.Response) -> str:
    """The server's error message: OpenAI's {"error": {"message"}}, vLLM's {"message"}, FastAPI's {"detail"}."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if key in data:
                return str(data[key])
    return json.dumps(data)[:300]
