"""Engine protocol on a Hugging Face causal LM, with KV reuse across the branches of a rollout tree.

What it does:
- batched sampling over all prefixes and samples of a call: one prefill forward for the call's distinct prefixes,
  then one decode forward per step for every live sample (a finished sample leaves the batch);
- reuse (a): the n samples of one prefix share one prefill, whose cache rows are then copied n times;
- reuse (b): a bounded LRU store keeps the keys/values of recent sequences (each finished sample's prefix + output);
  a later prefix only prefills what follows its longest common prefix with a stored sequence. A continuation
  from an intermediate node of an earlier rollout, or the next turn of a rollout, thus costs only its new tokens.

Layout: every row of the batch holds `[pad][reused prefix][pad][new suffix][generated...]` in one preallocated
buffer per layer; pads are masked by the 2D attention mask and every token gets its true position id, so a row's
numbers do not depend on its neighbours (up to float rounding in batched matmuls).

Logprobs are those of the sampled token under the model's distribution after temperature, `log_softmax(logits / T)`,
before top-p truncation (what a trainer recomputes with the same temperature; vLLM's V0 sampler reported this,
its V1 default `raw_logprobs` reports `log_softmax(logits)` instead). At temperature 0 (greedy) they are
`log_softmax(logits)`.

Coupled sampling (`generate(..., keys=...)`, `tracerl.io.rollout.engine`): each row draws from its own counter-based
stream instead of the call's generator, so its draws do not depend on the rest of the batch.

What it does not do: text, chat templates or EOS handling (only `stop_token_ids` end a sample); sliding-window,
hybrid or recurrent-state models (refused at construction); paged memory. Cached keys/values are dropped when
the model's weights change in place (optimizer step, `load_state_dict`); call `clear_cache()` after any other
change to the model. Reused keys/values equal recomputed ones up to float rounding, not bit for bit, so the trainer
empties the store at every step's start (a resumed step starts with an empty one).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.cache_utils import Cache, DynamicLayer

from tracerl.io.rollout.engine import Completion, SamplingParams, stream_key, stream_uniforms

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (H, T, D) for one sequence


class _BufferLayer(DynamicLayer):
    """One layer's cache in a preallocated (B, H, capacity, D) buffer: `update` writes in place (no concatenation)."""

    def __init__(self, capacity: int, kbuf: torch.Tensor | None = None, vbuf: torch.Tensor | None = None,
                 length: int = 0):
        super().__init__()
        self.capacity, self.length = capacity, length
        if kbuf is not None:  # (B, H, capacity, D) buffers whose first `length` positions are already filled
            self.kbuf, self.vbuf, self.dtype, self.device = kbuf, vbuf, kbuf.dtype, kbuf.device
            self.is_initialized = True
            self._views()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.kbuf = key_states.new_zeros(b, h, self.capacity, d)  # (B, H, capacity, D)
        self.vbuf = value_states.new_zeros(b, h, self.capacity, value_states.shape[3])  # (B, H, capacity, Dv)
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.kbuf[:, :, : self.length]  # (B, H, length, D)
        self.values = self.vbuf[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        assert end <= self.capacity, f"KV buffer overflow: {end} > {self.capacity}"
        self.kbuf[:, :, self.length: end] = key_states
        self.vbuf[:, :, self.length: end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf.index_select(0, indices), self.vbuf.index_select(0, indices)
        self._views()


@dataclass
class _Entry:
    tokens: np.ndarray  # (T,) int64: the tokens whose keys/values are stored
    kv: KV


class KVStore:
    """Bounded LRU store of per-sequence keys/values, looked up by longest common token prefix.

    Capacity counts stored tokens (each costs `2 * layers * kv_heads * head_dim` numbers). A sequence that extends
    a stored one replaces it; a sequence already covered by a stored one is not stored again.
    """

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.num_tokens = 0
        self.num_evictions = 0
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.entries)

    @staticmethod
    def _lcp(a: np.ndarray, b: np.ndarray) -> int:
        m = min(len(a), len(b))
        diff = np.flatnonzero(a[:m] != b[:m])
        return int(diff[0]) if len(diff) else m

    def longest_match(self, tokens: np.ndarray) -> tuple[_Entry | None, int]:
        """The entry sharing the longest common prefix with `tokens`, and that length (marks the entry recent); of
        entries sharing equally long ones, the least recently used.

        Only an entry that agrees with `tokens` at position `best` can share more than `best` tokens, so the full
        comparison runs only there: the same answer as comparing every entry, at a scalar test for most of them."""
        best_id, best = None, 0
        num = len(tokens)
        for key, entry in self.entries.items():
            stored = entry.tokens
            if best >= num or best >= len(stored) or stored[best] != tokens[best]:
                continue
            lcp = self._lcp(stored, tokens)
            if lcp > best:
                best_id, best = key, lcp
        if best_id is None:
            return None, 0
        self.entries.move_to_end(best_id)
        return self.entries[best_id], best

    def put(self, tokens: np.ndarray, kv: KV) -> None:
        if len(tokens) == 0 or len(tokens) > self.capacity_tokens:
            return
        for key, entry in list(self.entries.items()):
            shorter = min(len(entry.tokens), len(tokens)) - 1
            if entry.tokens[shorter] != tokens[shorter]:  # neither is a prefix of the other: nothing to do
                continue
            lcp = self._lcp(entry.tokens, tokens)
            if lcp == len(tokens):  # already covered
                self.entries.move_to_end(key)
                return
            if lcp == len(entry.tokens):  # the new sequence extends this one
                self._drop(key)
        while self.num_tokens + len(tokens) > self.capacity_tokens:
            self._drop(next(iter(self.entries)))
            self.num_evictions += 1
        self.entries[self._next_id] = _Entry(tokens, kv)
        self._next_id += 1
        self.num_tokens += len(tokens)

    def _drop(self, key: int) -> None:
        self.num_tokens -= len(self.entries.pop(key).tokens)

    def clear(self) -> None:
        self.entries.clear()
        self.num_tokens = 0


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                uniforms: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens (B,) and their logprobs (B,) from logits (B, V).

    T = 0: argmax, logprob `log_softmax(logits)`. T > 0: inverse-CDF sampling (one uniform draw per row: from
    `generator`, or the given (B,) `uniforms` of coupled sampling) from `softmax(logits / T)` truncated to the top-p
    nucleus (smallest set of most likely tokens whose mass reaches top_p); logprob `log_softmax(logits / T)` of the
    sampled token, not renormalised over the nucleus.
    """
    logits = logits.float()  # (B, V)
    if params.temperature == 0:
        tokens = logits.argmax(-1)  # (B,)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
    logp = torch.log_softmax(logits / params.temperature, -1)  # (B, V)
    probs = logp.exp()
    order = None
    if params.top_p < 1.0:
        probs, order = probs.sort(-1, descending=True)  # (B, V)
        probs = probs * ((probs.cumsum(-1) - probs) < params.top_p)  # keep while the mass before a token < top_p
    cdf = probs.cumsum(-1)  # (B, V), non-decreasing
    if uniforms is None:
        u = torch.rand(len(cdf), 1, generator=generator, device=cdf.device) * cdf[:, -1:]  # (B, 1)
    else:
        u = torch.from_numpy(uniforms).to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]  # (B, 1)
    # first index with cdf > u, but never past the last token of non-zero probability (u may round up to the total)
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous())  # (B, 1)
    idx = torch.minimum(torch.searchsorted(cdf, u, right=True), last)  # (B, 1)
    tokens = (idx if order is None else order.gather(-1, idx))[:, 0]  # (B,)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


# Every attention backend but cuDNN's. Decoding changes the key length at every step, and cuDNN's attention (which
# torch picks for bfloat16/float16 on recent GPUs) builds an execution plan per new shape on the host: on an H200 it
# took 2.0 ms of CPU per call against 11 us on the GPU, and the bfloat16 copy then generated 0.53x float32's tokens/s
# instead of 1.40x (benchmarks/gpu/README.md). Float32 and CPUs never pick cuDNN, so this changes nothing there.
_SDPA_BACKENDS = [backend for name, backend in SDPBackend.__members__.items()
                  if name not in ("ERROR", "CUDNN_ATTENTION")]


@contextmanager
def _eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class TransformersEngine:
    """Engine protocol on a transformers causal LM (see the module docstring).

    - `max_batch_size`: most sample rows decoded together; a call with more rows runs in chunks (later chunks reuse
      the store). Raise it for throughput, lower it for memory.
    - `cache_capacity_tokens`: most tokens of keys/values kept across calls (LRU); raise it when trees are wide.
    - `reuse_kv=False`: no reuse at all (every sample prefills its whole prefix), the baseline of `bench engine`.
    - `device`: where the model runs (it is moved there); None = the device its parameters are on.
    - `compute_dtype`: e.g. torch.bfloat16: generate with a copy of the model whose parameters are in that dtype
      (buffers such as the rotary frequencies keep theirs), refreshed from `model` whenever its weights change;
      None = the model itself. Not autocast: in inference mode autocast casts every weight again at every decoding
      step (a step's rollouts took 2.4x as long as float32's on a GPU, benchmarks/gpu/README.md). On an H200 the
      bfloat16 copy generated 1.40x float32's tokens/s in the engine alone and the same rate in a training step,
      with attention kept off cuDNN (`_SDPA_BACKENDS`).

    `stats` counts work: `prefill_tokens_computed + prefill_tokens_reused` is the sum of the prefix lengths of all
    samples requested; `generated_tokens`, `forward_passes`, `num_calls`, and the store's size and evictions. For a
    FLOP count (`tracerl.bench.engine.engine_flops`): `prefill_forward_passes`, `prefill_rows` (rows whose last
    position gets logits), `decode_tokens_fed` (a sample's last token is sampled, never fed), and
    `prefill_attention_pairs` / `decode_attention_pairs` (over the tokens fed, the real keys each attends to: its
    position + 1; pads not counted). `prefill_seconds` (prefill forwards and copying rows per sample) and
    `decode_seconds` (sampling, decode forwards, storing rows) split the wall time of `generate`.
    """

    def __init__(self, model: torch.nn.Module, *, device: str | torch.device | None = None, max_batch_size: int = 32,
                 cache_capacity_tokens: int = 65_536, reuse_kv: bool = True, compute_dtype: torch.dtype | None = None):
        if max_batch_size < 1 or cache_capacity_tokens < 0:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1 and cache_capacity_tokens="
                             f"{cache_capacity_tokens} >= 0")
        config = model.config.get_text_config(decoder=True)
        bad = sorted({t for t in getattr(config, "layer_types", None) or () if t != "full_attention"})
        if bad or getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise NotImplementedError(f"TransformersEngine handles full-attention models only; this one has "
                                      f"{bad or 'sliding-window'} layers. Serve it with vLLM/SGLang and use the "
                                      f"OpenAI-compatible engine")
        # None: where the model already is, so an engine built around a trainer's model never moves it
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device)
        # transformers renamed forward's `past_key_values` to `cache` in 5.24 (the old name goes in 5.40)
        forward_args = inspect.signature(self.model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"
        self.vocab_size = int(config.vocab_size)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.max_batch_size = max_batch_size
        self.reuse_kv = reuse_kv
        self.compute_dtype = compute_dtype
        self.runner = self.model  # what the forwards run: the model, or its copy in compute_dtype
        if compute_dtype is not None and compute_dtype != next(self.model.parameters()).dtype:
            self.runner = copy.deepcopy(self.model).requires_grad_(False)
            for param in self.runner.parameters():
                param.data = param.data.to(compute_dtype)
        self.store = KVStore(cache_capacity_tokens)
        self.stats: dict[str, int | float] = dict.fromkeys(
            ("num_calls", "prefill_tokens_computed", "prefill_tokens_reused", "generated_tokens", "forward_passes",
             "cache_entries", "cache_tokens", "cache_evictions", "cache_invalidations", "prefill_forward_passes",
             "prefill_rows", "prefill_attention_pairs", "decode_tokens_fed", "decode_attention_pairs"), 0)
        self.stats.update(prefill_seconds=0.0, decode_seconds=0.0)
        self._weights_version = self._read_weights_version()

    @classmethod
    def from_pretrained(cls, path_or_id: str, *, dtype: torch.dtype | str | None = None,
                        device: str | torch.device = "cpu", **kwargs) -> TransformersEngine:
        """Load with `AutoModelForCausalLM` (a local directory works offline). dtype: float32 on CPU, else the
        checkpoint's ("auto"), unless given. Other keyword arguments go to the constructor."""
        from transformers import AutoModelForCausalLM

        if dtype is None:
            dtype = torch.float32 if torch.device(device).type == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype)
        return cls(model, device=device, **kwargs)

    def clear_cache(self) -> None:
        """Drop every stored key/value (needed after changing the model other than by in-place weight updates)."""
        self.store.clear()
        self._sync_store_stats()

    def _refresh_runner(self) -> None:
        """Copy the model's current weights into the compute_dtype copy (a no-op without one)."""
        if self.runner is self.model:
            return
        with torch.no_grad():
            for mine, theirs in zip(self.runner.parameters(), self.model.parameters(), strict=True):
                mine.copy_(theirs)

    def _read_weights_version(self) -> int | None:
        # Every in-place write to a tensor bumps its version counter, so a changed sum means changed weights.
        try:
            return sum(p._version for p in self.model.parameters())
        except RuntimeError:  # inference tensors keep no version counter: only clear_cache() can invalidate
            return None

    def _sync_store_stats(self) -> None:
        self.stats.update(cache_entries=len(self.store), cache_tokens=self.store.num_tokens,
                          cache_evictions=self.store.num_evictions)

    # ---- the Engine protocol -------------------------------------------------------------------------------------

    supports_keys = True  # coupled sampling: generate(..., keys=...), see tracerl.io.rollout.engine

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams,
                 n: int | Sequence[int] = 1, keys: Sequence[int] | None = None) -> list[list[Completion]]:
        """For each prefix, n (or n[i]) sampled continuations; see the module docstring for logprobs. With `keys`
        (one int per prefix), sample j of prefix i draws from the stream `stream_key(keys[i], j)` instead of the
        call's generator (coupled sampling, `tracerl.io.rollout.engine`)."""
        arrays = [self._check_prefix(i, p, params) for i, p in enumerate(prefixes)]
        counts = [n] * len(arrays) if isinstance(n, int) else [int(c) for c in n]
        if len(counts) != len(arrays) or any(c < 0 for c in counts):
            raise ValueError(f"n={n!r} must be an int >= 0 or one count >= 0 per prefix ({len(arrays)} prefixes)")
        if keys is not None and len(keys) != len(arrays):
            raise ValueError(f"keys has {len(keys)} entries for {len(arrays)} prefixes; give one key per prefix")
        version = self._read_weights_version()
        if version != self._weights_version:
            self._refresh_runner()
            self.store.clear()
            self._weights_version = version
            self.stats["cache_invalidations"] += 1
        self.stats["num_calls"] += 1

        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        rows = [i for i, c in enumerate(counts) for _ in range(c)]
        streams = None if keys is None else \
            np.array([stream_key(keys[i], j) for i, c in enumerate(counts) for j in range(c)], dtype=np.uint64)
        results: list[list[Completion]] = [[] for _ in arrays]
        with torch.inference_mode(), _eval_mode(self.runner), sdpa_kernel(_SDPA_BACKENDS):
            for start in range(0, len(rows), self.max_batch_size):
                chunk = rows[start: start + self.max_batch_size]
                own = None if streams is None else streams[start: start + self.max_batch_size]
                for i, completion in zip(chunk, self._generate_rows([arrays[i] for i in chunk], params, generator,
                                                                     own)):
                    results[i].append(completion)
        self._sync_store_stats()
        return results

    def _check_prefix(self, i: int, prefix: Sequence[int], params: SamplingParams) -> np.ndarray:
        tokens = np.asarray(prefix, dtype=np.int64).reshape(-1)
        if len(tokens) == 0:
            raise ValueError(f"prefix {i} is empty; start every prefix with at least one token (e.g. a BOS id)")
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"prefix {i} has token ids outside [0, {self.vocab_size}) (min {tokens.min()}, max "
                             f"{tokens.max()}); encode with the tokenizer that matches this model")
        if self.max_positions and len(tokens) + params.max_tokens > self.max_positions:
            raise ValueError(f"prefix {i} has {len(tokens)} tokens + max_tokens={params.max_tokens} > the model's "
                             f"{self.max_positions} positions; shorten the history or lower max_tokens")
        return tokens

    # ---- one chunk of rows: prefill distinct prefixes, copy rows per sample, decode ------------------------------

    def _generate_rows(self, prefixes: list[np.ndarray], params: SamplingParams, generator: torch.Generator,
                       streams: np.ndarray | None = None) -> list[Completion]:
        if self.reuse_kv:  # samples of one prefix share its prefill
            distinct: dict[bytes, int] = {}
            row_to_prefix = [distinct.setdefault(p.tobytes(), len(distinct)) for p in prefixes]
            unique = [None] * len(distinct)
            for p, u in zip(prefixes, row_to_prefix):
                unique[u] = p
        else:
            row_to_prefix, unique = list(range(len(prefixes))), prefixes
        started = time.perf_counter()
        cache, mask, logits = self._prefill(unique, capacity_extra=params.max_tokens - 1)
        self.stats["prefill_tokens_reused"] += sum(len(p) for p in prefixes) - sum(len(p) for p in unique)

        index = torch.tensor(row_to_prefix, device=self.device)  # (B,)
        if len(unique) != len(prefixes) or row_to_prefix != list(range(len(prefixes))):
            for layer in cache.layers:
                layer.batch_select_indices(index)
            mask, logits = mask.index_select(0, index), logits.index_select(0, index)  # (B, L), (B, V)
        positions = torch.tensor([len(p) for p in prefixes], device=self.device)  # (B,) next token's position id
        if self.device.type == "cuda":  # the forwards run asynchronously: wait, so the split of time is true
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.stats["prefill_seconds"] += now - started
        started = now
        live = list(range(len(prefixes)))  # row of the batch -> output index
        live_prefix_tokens = sum(len(p) for p in prefixes)  # summed prefix length of the live rows
        out_tokens: list[list[int]] = [[] for _ in prefixes]
        out_logprobs: list[list[float]] = [[] for _ in prefixes]
        finish: list[str] = [""] * len(prefixes)
        stops = set(params.stop_token_ids)
        length = cache.get_seq_length()
        for step in range(params.max_tokens):
            uniforms = None if streams is None else stream_uniforms(streams[live], step)  # (B,) coupled draws
            tokens, logprobs = sample_next(logits, params, generator, uniforms)  # (B,), (B,)
            keep = []
            for b, (r, t, lp) in enumerate(zip(live, tokens.tolist(), logprobs.tolist())):
                out_tokens[r].append(t)
                out_logprobs[r].append(lp)
                if t in stops or step + 1 == params.max_tokens:
                    finish[r] = "stop" if t in stops else "length"
                    if self.reuse_kv:
                        self._store_row(cache, mask[b, :length], prefixes[r], out_tokens[r], b)
                else:
                    keep.append(b)
            self.stats["generated_tokens"] += len(live)
            if not keep:
                break
            if len(keep) < len(live):
                sel = torch.tensor(keep, device=self.device)
                for layer in cache.layers:
                    layer.batch_select_indices(sel)
                mask, tokens, positions = mask.index_select(0, sel), tokens.index_select(0, sel), positions[sel]
                live = [live[b] for b in keep]
                live_prefix_tokens = sum(len(prefixes[r]) for r in live)
            mask[:, length] = True
            length += 1
            # the token sampled at `step` sits at position len(prefix) + step and attends to that many + 1 keys
            self.stats["decode_tokens_fed"] += len(live)
            self.stats["decode_attention_pairs"] += live_prefix_tokens + len(live) * (step + 1)
            logits = self._forward(tokens[:, None], mask[:, :length], positions[:, None], cache)  # (B, V)
            positions = positions + 1
        self.stats["decode_seconds"] += time.perf_counter() - started
        return [Completion(out_tokens[r], out_logprobs[r], finish[r]) for r in range(len(prefixes))]

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Cache) -> torch.Tensor:
        self.stats["forward_passes"] += 1
        out = self.runner(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self.cache_kwarg: cache})
        return out.logits[:, -1]  # (B, V): each row's last position (suffixes are left-padded to end together)

    def _prefill(self, prefixes: list[np.ndarray], capacity_extra: int) -> tuple[Cache, torch.Tensor, torch.Tensor]:
        """Prefill each prefix after its longest stored match; returns the cache, the (U, L) mask, (U, V) logits."""
        matches = [self.store.longest_match(p) if self.reuse_kv else (None, 0) for p in prefixes]
        reused = [min(lcp, len(p) - 1) for p, (_, lcp) in zip(prefixes, matches)]  # the last token is always fed
        suffix = [len(p) - r for p, r in zip(prefixes, reused)]
        num, c, s = len(prefixes), max(reused), max(suffix)
        self.stats["prefill_tokens_reused"] += sum(reused)
        self.stats["prefill_tokens_computed"] += sum(suffix)
        self.stats["prefill_forward_passes"] += 1
        self.stats["prefill_rows"] += num
        # tokens at positions r .. len(p)-1 attend to r+1 .. len(p) keys
        self.stats["prefill_attention_pairs"] += sum(len(p) * (len(p) + 1) // 2 - r * (r + 1) // 2
                                                     for p, r in zip(prefixes, reused))

        input_ids = torch.zeros(num, s, dtype=torch.long)  # (U, S) suffixes, left-padded
        position_ids = torch.zeros(num, s, dtype=torch.long)  # (U, S)
        mask = torch.zeros(num, c + s + capacity_extra, dtype=torch.bool)  # (U, L) True = a real token
        for u, (p, r, k) in enumerate(zip(prefixes, reused, suffix)):
            input_ids[u, s - k:] = torch.from_numpy(p[r:])
            position_ids[u, s - k:] = torch.arange(r, len(p))
            mask[u, c - r: c] = True
            mask[u, c + s - k: c + s] = True
        capacity = c + s + capacity_extra
        if c == 0:
            cache = Cache(layers=[_BufferLayer(capacity) for _ in range(self._num_layers())])
        else:
            layers = []
            for layer in range(self._num_layers()):
                k, v = next(e.kv[layer] for e, _ in matches if e is not None)  # (H, T, D) each
                keys = k.new_zeros(num, k.shape[0], capacity, k.shape[2])  # (U, H, capacity, D)
                values = v.new_zeros(num, v.shape[0], capacity, v.shape[2])
                for u, ((entry, _), r) in enumerate(zip(matches, reused)):
                    if r:
                        keys[u, :, c - r: c] = entry.kv[layer][0][:, :r]
                        values[u, :, c - r: c] = entry.kv[layer][1][:, :r]
                layers.append(_BufferLayer(capacity, keys, values, length=c))
            cache = Cache(layers=layers)
        mask = mask.to(self.device)
        logits = self._forward(input_ids.to(self.device), mask[:, : c + s], position_ids.to(self.device), cache)
        return cache, mask, logits

    def _num_layers(self) -> int:
        return self.model.config.get_text_config(decoder=True).num_hidden_layers

    def _store_row(self, cache: Cache, row_mask: torch.Tensor, prefix: np.ndarray, output: list[int],
                   b: int) -> None:
        """Store row b's keys/values: they cover the prefix and all but the last output token (never fed)."""
        where = row_mask.nonzero()[:, 0]  # (T,) the row's real positions
        tokens = np.concatenate([prefix, np.asarray(output[:-1], dtype=np.int64)])
        assert len(where) == len(tokens), f"row {b}: {len(where)} cached positions for {len(tokens)} tokens"
        kv = [(layer.kbuf[b].index_select(1, where), layer.vbuf[b].index_select(1, where)) for layer in cache.layers]
        self.store.put(tokens, kv)
