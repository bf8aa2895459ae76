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
  other HTTP 4xx (a bad request stays bad), JSON of the wrong shape (a server that does not speak this
  dialect) and an answer over its size bound or compressed. After the last retry the call raises one `EngineError` naming the URL and the last failure.
- deadlines enforced by closing the connection: each attempt must finish (connect, send, the answer's headers and
  body, any number of `100 Continue` before them) within `timeout_s`, and the whole call, retries and backoff
  included, within `call_timeout_s`. A watchdog shuts the socket down at the deadline, so a server dripping its
  headers or body a byte at a time, or sending `100 Continue` forever, cannot hold a call; per-read timeouts alone
  would reset with every byte. `/v1/models` and `load_weights` have the same deadline (`timeout_s`).
- a size bound on every answer derived from the request: 64 KiB + per sample 2 KiB + `max_bytes_per_token` per
  generated token + 32 bytes per prompt token (vLLM echoes the prompt's ids); a longer answer (by Content-Length or
  as it arrives) fails at once, having read at most the bound. Compressed answers are refused, never inflated
  (`Accept-Encoding: identity` is asked for). `/v1/models` and the weight-load answers are bounded to 1 MiB.
- every answer is checked before it is used: choices are objects with distinct in-range indexes, ids are integers in
  [0, vocab_size) (non-negative and below 2^31 when vocab_size is not given), one finite logprob <= 0 per id, no
  stop token before the last id, at most max_tokens ids, a known finish reason. Every number read from text (the
  Content-Length header, vLLM's `"token_id:123"` strings) is ASCII digits read by `tracerl.io.files.boundary.parse_int`,
  never `int()` after `isdigit()`. A malformed answer raises `EngineError` naming the server, the choice and the
  field, never a bare AttributeError, TypeError or ValueError.

Logprobs. tracerl's trainer compares against `log_softmax(logits / T)` of the sampled token (see
`tracerl.engines.transformers_engine`). vLLM's V1 engine reports logprobs *before* temperature by default
(`--logprobs-mode raw_logprobs`); start it with `--logprobs-mode processed_logprobs` (then it reports them after
temperature and after top-k/top-p, renormalised over the kept tokens: the same values at top_p=1). SGLang's
`/v1/completions` reports `log_softmax(logits / T)` unless `SGLANG_RETURN_ORIGINAL_LOGPROB` is set; SGLang honours
seeds only with `--enable-deterministic-inference`. `tracerl serve` reports `log_softmax(logits / T)`.
`docs/engines.md` has the launch commands.

What it does not do: text, chat templates or tokenization; streaming; KV reuse on the client (vLLM and SGLang
reuse shared prefixes themselves with prefix caching); checking that the server's model is the policy being
trained (serve the trainer's weights and name them in `model`); keep-alive (each attempt opens its own connection,
so a closed connection can never be reused by mistake); bounding DNS resolution (use an IP address or a name in
/etc/hosts where a resolver might hang). `EngineError` is defined in `tracerl.engines.errors` and re-exported here.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from urllib.parse import urlsplit

from tracerl.engines.errors import EngineError
from tracerl.io.files.boundary import parse_int
from tracerl.io.rollout.engine import Completion, SamplingParams, check_request

__all__ = ["EngineError", "OpenAIEngine", "request_seed"]

SMALL_ANSWER_BYTES = 1 << 20  # bound on answers that carry no tokens: /v1/models, weight loads


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
    - `timeout_s`: per attempt, from connecting to the last byte of the answer; lower it to fail fast, raise it for
      long generations.
    - `call_timeout_s`: the whole `generate` call, every request, retry and backoff included; None = enough for each
      wave of `max_concurrency` requests and every retry of one: `timeout_s * (waves + max_retries)` plus the
      backoffs. Set it to bound a training step's wait on a server.
    - `vocab_size`: the policy's vocabulary; returned ids at or above it are rejected (pass it: a server serving
      another model answers with ids the trainer cannot embed).
    - `max_retries`, `backoff_s`, `max_backoff_s`: a failed request is sent again up to `max_retries` times,
      after `backoff_s * 2**attempt` seconds (at most `max_backoff_s`); raise them to ride out a server restart.
    - `max_bytes_per_token`: the answer size allowed per generated token (module docstring); vLLM writes about 120.

    `stats` counts `num_calls`, `num_requests` (answered), `num_retries` (attempts sent again) and
    `generated_tokens`.
    """

    def __init__(self, base_url: str, model: str | None = None, *, n_mode: str = "n", max_concurrency: int = 8,
                 timeout_s: float = 300.0, call_timeout_s: float | None = None, max_retries: int = 4,
                 backoff_s: float = 0.5, max_backoff_s: float = 8.0, api_key: str | None = None,
                 vocab_size: int | None = None, max_bytes_per_token: int = 1024):
        if n_mode not in ("n", "repeat"):
            raise ValueError(f"n_mode={n_mode!r} must be 'n' (one request with n samples; vLLM, tracerl serve) or "
                             f"'repeat' (n requests of one sample; SGLang)")
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0 or max_bytes_per_token < 1 \
                or call_timeout_s is not None and not call_timeout_s > 0:
            raise ValueError(f"need max_concurrency >= 1 (got {max_concurrency}), timeout_s > 0 ({timeout_s}), "
                             f"call_timeout_s None or > 0 ({call_timeout_s}), max_retries >= 0 ({max_retries}), "
                             f"backoff_s >= 0 ({backoff_s}) and max_bytes_per_token >= 1 ({max_bytes_per_token})")
        if urlsplit(base_url).scheme not in ("http", "https") or not urlsplit(base_url).hostname:
            raise ValueError(f"base_url={base_url!r} must look like http://HOST:PORT or https://HOST:PORT")
        self.vocab_size = vocab_size if vocab_size is not None else 2**31  # ids at or above are rejected
        self.timeout_s, self.call_timeout_s = timeout_s, call_timeout_s
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.url = f"{self.base_url}/v1/completions"
        self.model = model
        self.n_mode = n_mode
        self.max_concurrency = max_concurrency
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.max_bytes_per_token = max_bytes_per_token
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._lock = threading.Lock()
        self.stats: dict[str, int] = dict.fromkeys(("num_calls", "num_requests", "num_retries", "generated_tokens"), 0)

    def close(self) -> None:
        """Nothing to release: every attempt opens and closes its own connection."""

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
        budget = self._call_budget(len(requests))
        deadline = time.monotonic() + budget
        if self.model is None:
            self.model = self._first_model(deadline)
        answers: list[list[Completion] | None] = [None] * len(requests)

        def run(k: int) -> None:
            answers[k] = self._send(prompts[requests[k].prefix_index], params, requests[k], deadline, budget)

        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests)))
        try:
            futures = [pool.submit(run, k) for k in range(len(requests))]
            # every attempt is closed by its deadline; the margin covers the thread hand-over only
            done, _ = wait(futures, timeout=budget + 5.0, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:  # give up at the first request that failed for good
                raise failed.exception()
            if len(done) < len(futures):
                raise EngineError(f"POST {self.url}: {len(futures) - len(done)} requests had no answer within "
                                  f"call_timeout_s={budget}s")
        finally:  # on failure, requests not yet started are dropped and running ones are not waited for
            pool.shutdown(wait=False, cancel_futures=True)
        for request, answer in zip(requests, answers):
            results[request.prefix_index].extend(answer)
        return results

    def _call_budget(self, num_requests: int) -> float:
        """Seconds the whole call may take: call_timeout_s, or the default the class docstring states."""
        if self.call_timeout_s is not None:
            return self.call_timeout_s
        waves = -(-num_requests // self.max_concurrency)
        backoff = sum(min(self.max_backoff_s, self.backoff_s * 2**a) for a in range(self.max_retries))
        return self.timeout_s * (waves + self.max_retries) + backoff

    # ---- one request with retries ----------------------------------------------------------------------------------

    def _send(self, prompt: list[int], params: SamplingParams, request: _Request, deadline: float,
              budget: float) -> list[Completion]:
        body = {
            "model": self.model, "prompt": prompt, "n": request.num_samples, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "seed": request.seed, "logprobs": 0,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True, "skip_special_tokens": False,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "stream": False,
        }
        max_bytes = 65536 + request.num_samples * (2048 + params.max_tokens * self.max_bytes_per_token
                                                   + 32 * len(prompt))
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["num_retries"] += 1
                time.sleep(max(0.0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1),
                                        deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                raise EngineError(f"POST {self.url} had no answer within call_timeout_s={budget}s ({attempt} "
                                  f"attempts); last failure: {last or 'none finished'}. Raise call_timeout_s or "
                                  f"timeout_s, or check the server")
            try:
                choices = self._post(body, max_bytes, min(deadline, time.monotonic() + self.timeout_s))
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

    def _post(self, body: dict, max_bytes: int, deadline: float) -> list[dict]:
        status, data = exchange("POST", self.url, body, max_bytes=max_bytes, deadline=deadline,
                                headers=self._headers)
        if status >= 500 or status == 429:
            raise _Retryable(f"HTTP {status}: {error_message(data)}")
        if status >= 400:
            raise EngineError(f"POST {self.url} was refused with HTTP {status}: {error_message(data)}")
        try:
            data = json.loads(data)
        except (ValueError, RecursionError) as err:  # truncated, not JSON at all, or nested past the parser
            raise _Retryable(f"unparseable JSON body ({type(err).__name__}: {str(err)[:100]}; "
                             f"{len(data)} bytes)") from None
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
                                                       for t in tokens):
                raise EngineError(f"{self.url} returned no token ids in choice {k} (tokens {str(tokens)[:60]}...); "
                                  f"use a server that honours return_token_ids (vLLM >= 0.10.2, SGLang, tracerl "
                                  f"serve) or return_tokens_as_token_ids (vLLM)")
            ids = [parse_int(t.removeprefix("token_id:"), f"{self.url} choice {k}: field 'logprobs.tokens[{i}]' "
                             "after 'token_id:'", EngineError) for i, t in enumerate(tokens)]
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
        if stops & set(ids[:-1]):
            raise EngineError(f"{self.url} returned a stop token before the end of choice {k} (field 'token_ids', "
                              f"stop_token_ids {sorted(stops)[:10]}); a stop token must end the sample")
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
        (`tracerl.engines.vllm_worker`); SGLang has its own path (see docs/engines.md). Each request must finish
        within `timeout_s`; the answer is bounded to 1 MiB."""
        url = f"{self.base_url}/v1/load_weights"
        status, data = self.post_small(url, {"path": str(path)})
        if status == 404:  # not tracerl serve: vLLM's /collective_rpc and tracerl's worker extension
            from tracerl.engines.vllm_worker import load_served_weights

            load_served_weights(self.post_small, self.base_url, str(path))
            return
        if status != 200:
            raise EngineError(f"POST {url} answered HTTP {status}: {error_message(data)}")

    def post_small(self, url: str, body: dict | None) -> tuple[int, bytes]:
        """POST `body` (JSON) to `url` within `timeout_s`, reading at most 1 MiB back: (status, body bytes), or
        EngineError naming the URL. For the weight-load calls, which carry no tokens."""
        try:
            return exchange("POST", url, body, max_bytes=SMALL_ANSWER_BYTES, headers=self._headers,
                            deadline=time.monotonic() + self.timeout_s)
        except _Retryable as err:
            raise EngineError(f"POST {url} failed: {err}. Is the server up?") from None

    def _first_model(self, deadline: float) -> str:
        """The first model `GET /v1/models` lists (retried like a completion request, within the call's deadline)."""
        url, last = f"{self.base_url}/v1/models", ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(max(0.0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1),
                                        deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
            try:
                status, data = exchange("GET", url, None, max_bytes=SMALL_ANSWER_BYTES, headers=self._headers,
                                        deadline=min(deadline, time.monotonic() + self.timeout_s))
            except _Retryable as err:
                last = str(err)
                continue
            if status >= 500 or status == 429:
                last = f"HTTP {status}"
                continue
            return _model_id(url, status, data)
        raise EngineError(f"GET {url} failed {self.max_retries + 1} times or ran out of time; last failure: {last}. "
                          f"Is the server up?")


def _model_id(url: str, status: int, data: bytes) -> str:
    """The first model id in a `/v1/models` answer, or EngineError naming the field."""
    hint = "pass model=... explicitly"
    if status != 200:
        raise EngineError(f"GET {url} answered HTTP {status}: {error_message(data)}; {hint}")
    try:
        listing = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise EngineError(f"GET {url} answered with a body that is not JSON (field 'data' unreadable: "
                          f"{type(err).__name__}); {hint}") from None
    models = listing.get("data") if isinstance(listing, dict) else None
    first = models[0] if isinstance(models, list) and models else None
    name = first.get("id") if isinstance(first, dict) else None
    if not isinstance(name, str) or not 0 < len(name) <= 1024:
        raise EngineError(f"GET {url} listed no model: field 'data' must be a list of objects whose 'id' is a name of "
                          f"1 to 1024 characters (got {str(models)[:120]}); {hint}")
    return name


# ---- one bounded HTTP exchange -------------------------------------------------------------------------------------

def exchange(method: str, url: str, body: dict | None, *, max_bytes: int, deadline: float,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 request on its own connection, finished by `deadline` (time.monotonic) and
    reading at most `max_bytes` of body.

    The deadline is enforced by a watchdog that shuts the socket down, which ends any blocked connect, send or
    read, however the server paces its bytes (headers, `100 Continue`, body). Raises _Retryable for what may pass
    (refused, reset, the deadline), EngineError for what will not (an answer over `max_bytes`, a compressed one)."""
    parts = urlsplit(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Retryable("no time left before sending")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=remaining)  # a connect that hangs is bounded by the timeout
    fired = threading.Event()
    held: list[socket.socket] = []  # the response takes the socket over from `conn` once the head is read

    def abort() -> None:
        fired.set()
        for sock in (conn.sock, *held):  # conn.sock: the plain socket while a TLS handshake runs
            try:
                if sock is not None:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    watchdog = threading.Timer(remaining, abort)
    watchdog.daemon = True
    watchdog.start()
    payload = json.dumps(body).encode() if body is not None else None
    try:
        conn.connect()
        held.append(conn.sock)
        if fired.is_set():  # the deadline passed while connecting
            raise OSError("closed at the deadline")
        conn.request(method, target, body=payload, headers={
            **(headers or {}), "Accept-Encoding": "identity", "Connection": "close",
            **({"Content-Type": "application/json"} if payload is not None else {})})
        response = conn.getresponse()
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise EngineError(f"{method} {url} answered with Content-Encoding {encoding[:40]!r}; this client asks for "
                              "and accepts only uncompressed answers")
        length = response.getheader("Content-Length")
        if length is not None:  # http.client reads it with int(), which takes "3_0" and "١٢": parse it strictly
            length = parse_int(length.strip(" \t"), f"{method} {url}: header Content-Length", EngineError)
        if length is not None and length > max_bytes:
            raise EngineError(f"{method} {url} announced an answer of {length} bytes (Content-Length), more "
                              f"than the {max_bytes} bytes this request can justify")
        chunks, size = [], 0
        while chunk := response.read(min(1 << 16, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise EngineError(f"{method} {url} sent more than the {max_bytes} bytes this request can justify; "
                                  "stopped reading")
        if fired.is_set():  # the shut-down socket read as the end of the answer
            raise OSError("closed at the deadline")
        if length is not None and size < length:
            raise _Retryable(f"the answer ended after {size} of its {length} bytes")
        return response.status, b"".join(chunks)
    except (OSError, http.client.HTTPException) as err:
        if fired.is_set() or isinstance(err, TimeoutError):
            raise _Retryable(f"no complete answer within the deadline ({remaining:.3g}s left for this attempt); "
                             f"the connection was closed ({type(err).__name__})") from None
        raise _Retryable(f"{type(err).__name__}: {str(err)[:200]}") from None
    finally:
        watchdog.cancel()
        conn.close()


def error_message(data: bytes) -> str:
    """The server's error message: OpenAI's {"error": {"message"}}, vLLM's {"message"}, FastAPI's {"detail"}."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return data[:300].decode(errors="replace") or "(empty body)"
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:1000]
        for key in ("message", "detail", "error"):
            if key in parsed:
                return str(parsed[key])[:1000]
    return json.dumps(parsed)[:300]
