r"""Hashed n-gram features of prefix histories, for the numpy success predictors.

A `History` becomes one sparse row of `num_buckets + NUM_STRUCTURAL` columns:

* text part (columns `0 .. num_buckets-1`).
  Tokens, on the lowercased text's utf-8 bytes: a maximal run of word bytes (ASCII letters, digits,
  `_`, every byte of a non-ASCII character) or a single ASCII punctuation character; whitespace and
  control characters only separate. In regex terms:
  `re.findall(r"[0-9a-z_\u0080-\U0010ffff]+|[!-/:-@\[-^`{-~]", text.lower())`.
  Punctuation is kept as its own token because it carries signal: the bigram ("-", "3") tells
  "level -3" from "level 3", and "?" or a traceback's ":" mean something in a transcript.
  Token hash: 32-bit FNV-1a of the token's utf-8 bytes (the first MAX_TOKEN_BYTES of them) with
  basis `2166136261 ^ seed`. An n-gram with token hashes h_1..h_n goes to bucket
  `fmix64(g) % num_buckets`, where `g = h_1`, then `g = (g * 0x9E3779B97F4A7C15 + h_k + 1) mod 2^64`
  for k = 2..n, and `fmix64(g)`: `g ^= g >> 33; g = g * 0xFF51AFD7ED558CCD mod 2^64; g ^= g >> 33`
  (MurmurHash3's finaliser). Unigrams use the same formula with n = 1.
  Value: the sublinear term frequency `1 + log(count)` times `1 / sqrt(max(1, D / norm_ngrams))`,
  D = the row's number of distinct n-gram buckets. A short text (D <= norm_ngrams, default 64) keeps
  raw sublinear tf; a long transcript is shrunk so its squared norm stops growing with length (about
  norm_ngrams at most). Why: on synthetic tasks where "good"/"bad" token counts set p through a known
  logistic, hidden among up to 600 filler words, raw tf let long transcripts swing the logit (held-out
  ECE 0.07-0.12 with binary targets); dividing by sqrt(D) (norm ~1) shrank a decisive token to
  ~1/sqrt(D) and left the model under-confident (ECE 0.11-0.19); this cap gave ECE 0.01-0.07 at
  equal or better AUC.
* structural part (column `num_buckets + STRUCTURAL_COLUMNS.index(name)`, see `column`): `bias` = 1,
  `depth`, `num_tool_errors`, `log_tokens` = log1p(num_tokens), `is_root` = 1 if depth == 0 else 0.
* state part (`state_buckets` columns after the structural ones, 0 by default): the named features a domain
  computes from the history (the domain's `state_features` hook, handed to the featuriser by whoever builds the
  predictor, e.g. multihop: hops remaining, the last search failed), each name hashed (FNV-1a, as a token) to a
  column. Hashed text n-grams cannot compute such quantities (hops resolved needs the question's chain replayed
  over the observations); a domain hook reads them from the question and transcript only, never the gold answer.

Nothing uses Python's salted `hash()`: the same text gives the same columns in every process and on
every platform. Tokenising and hashing run in numpy over the whole batch (no per-token Python loop),
and per-text results are kept in a bounded LRU cache: a step predicts on its nodes and then trains on
the same nodes, so the second pass is a lookup.

Deliberately not here: vocabularies, idf weighting, Unicode-aware punctuation (a non-ASCII character
is a word character, so "don’t" is one token), a policy model's tokenizer (the predictor must not
depend on it), scipy (a `SparseBatch` is three numpy arrays).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from tracerl.core.history import History

STRUCTURAL_COLUMNS = ("bias", "depth", "num_tool_errors", "log_tokens", "is_root")
StateFeatures = Callable[[History], dict[str, float]]
NUM_STRUCTURAL = len(STRUCTURAL_COLUMNS)
MAX_TOKEN_BYTES = 64  # longer tokens (base64 blobs, hashes) are hashed on their first 64 bytes

_FNV_BASIS = 2166136261
_FNV_PRIME = 16777619
_MIX_MUL = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd
_FINAL_MUL = 0xFF51AFD7ED558CCD  # MurmurHash3 fmix64 constant
_SEPARATOR, _WORD, _PUNCT = 0, 1, 2
_BYTE_KIND = np.full(256, _SEPARATOR, dtype=np.int8)  # what each utf-8 byte is, for the tokenizer
_BYTE_KIND[0x21:0x7F] = _PUNCT  # printable ASCII that is not a word byte
for _lo, _hi in ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("a"), ord("z")), (0x80, 0xFF)):
    _BYTE_KIND[_lo:_hi + 1] = _WORD
_BYTE_KIND[ord("_")] = _WORD


@dataclass(frozen=True)
class SparseBatch:
    """A (num_rows, num_cols) sparse matrix in coordinate form with entries sorted by row (CSR without scipy)."""

    rows: np.ndarray  # (nnz,) int32, non-decreasing
    cols: np.ndarray  # (nnz,) int32
    values: np.ndarray  # (nnz,) float32
    num_rows: int
    num_cols: int

    def __post_init__(self) -> None:
        assert self.rows.shape == self.cols.shape == self.values.shape, "rows, cols, values must align"
        assert self.rows.size == 0 or (np.all(np.diff(self.rows) >= 0) and self.rows[-1] < self.num_rows)

    @property
    def nnz(self) -> int:
        return int(self.values.size)

    @cached_property  # computed once per batch; replay mini-batches call `take` on the same batch many times
    def indptr(self) -> np.ndarray:
        """(num_rows + 1,) int64: row r's entries are `[indptr[r], indptr[r+1])`."""
        out = np.zeros(self.num_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.rows, minlength=self.num_rows), out=out[1:])
        return out

    def dot(self, weights: np.ndarray) -> np.ndarray:
        """X @ weights: (num_rows,) float64."""
        assert weights.shape == (self.num_cols,)
        return np.bincount(self.rows, weights=weights[self.cols] * self.values, minlength=self.num_rows)

    def rdot(self, row_weights: np.ndarray) -> np.ndarray:
        """X.T @ row_weights: (num_cols,) float64."""
        assert row_weights.shape == (self.num_rows,)
        return np.bincount(self.cols, weights=row_weights[self.rows] * self.values, minlength=self.num_cols)

    def take(self, row_ids: np.ndarray) -> "SparseBatch":
        """The rows `row_ids` (in that order) as a new batch."""
        row_ids = np.asarray(row_ids, dtype=np.int64)
        indptr = self.indptr
        starts, lengths = indptr[row_ids], indptr[row_ids + 1] - indptr[row_ids]
        new_rows = np.repeat(np.arange(row_ids.size, dtype=np.int32), lengths)
        offsets = np.cumsum(lengths) - lengths  # where each taken row starts in the output
        pos = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - offsets, lengths)
        return SparseBatch(new_rows, self.cols[pos], self.values[pos], int(row_ids.size), self.num_cols)

    def to_dense(self) -> np.ndarray:
        """(num_rows, num_cols) float64; for tests and small batches only."""
        out = np.zeros((self.num_rows, self.num_cols))
        np.add.at(out, (self.rows, self.cols), self.values)
        return out

    @staticmethod
    def concat(batches: Sequence["SparseBatch"]) -> "SparseBatch":
        """Stack batches with the same `num_cols` row-wise."""
        assert batches and len({b.num_cols for b in batches}) == 1, "need batches with one num_cols"
        offsets = np.cumsum([0] + [b.num_rows for b in batches])
        return SparseBatch(
            np.concatenate([b.rows + np.int32(o) for b, o in zip(batches, offsets)]).astype(np.int32),
            np.concatenate([b.cols for b in batches]),
            np.concatenate([b.values for b in batches]),
            int(offsets[-1]), batches[0].num_cols,
        )


class HashedFeatures:
    """History -> sparse row: hashed word n-grams (sublinear tf, length-capped scale) + structural columns.

    num_buckets: hashed text columns; collisions are rarer with more, each costs 8 bytes of weights.
    ngram: (min_n, max_n) n-gram orders, inclusive; (1, 2) = unigrams and bigrams.
    seed: hash seed (FNV-1a basis 2166136261 ^ seed); change it to draw a different collision pattern.
    norm_ngrams: texts with more distinct n-grams than this are scaled down by sqrt(D / norm_ngrams);
        raise it if short texts dominate, lower it if long transcripts give over-confident predictions.
    cache_size: texts whose featurised text part is kept (LRU); 0 turns the cache off.
    state_buckets: columns for the domains' named state features (0 = none); a few hundred keeps collisions rare.
    """

    def __init__(self, num_buckets: int = 2**14, ngram: tuple[int, int] = (1, 2), seed: int = 0,
                 norm_ngrams: int = 64, cache_size: int = 4096, state_buckets: int = 0,
                 state_features: StateFeatures | None = None):
        if not isinstance(num_buckets, (int, np.integer)) or not 1 <= num_buckets <= 2**24:
            raise ValueError(f"num_buckets={num_buckets!r}; use an int in [1, 2**24] (default 2**14)")
        ngram = tuple(int(n) for n in ngram)
        if len(ngram) != 2 or not 1 <= ngram[0] <= ngram[1] <= 5:
            raise ValueError(f"ngram={ngram!r}; use (min_n, max_n) with 1 <= min_n <= max_n <= 5, e.g. (1, 2)")
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed={seed}; use an int in [0, 2**32)")
        if norm_ngrams < 1:
            raise ValueError(f"norm_ngrams={norm_ngrams}; use a positive number of n-grams (default 64)")
        if cache_size < 0:
            raise ValueError(f"cache_size={cache_size}; use 0 (no cache) or a positive number of texts")
        if not 0 <= state_buckets <= 2**16:
            raise ValueError(f"state_buckets={state_buckets}; use 0 (no state features) up to 65536 (e.g. 256)")
        self.num_buckets = int(num_buckets)
        self.ngram = ngram
        self.seed = int(seed)
        self.norm_ngrams = int(norm_ngrams)
        self.cache_size = int(cache_size)
        self.state_buckets = int(state_buckets)
        self.state_features = state_features  # the domain's hook: history -> {name: value}; None = no state part
        self.num_cols = self.num_buckets + NUM_STRUCTURAL + self.state_buckets
        self._text_cache: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def config(self) -> dict:
        return {"num_buckets": self.num_buckets, "ngram": list(self.ngram), "seed": self.seed,
                "norm_ngrams": self.norm_ngrams, "cache_size": self.cache_size, "state_buckets": self.state_buckets}

    def column(self, name: str) -> int:
        """Column index of a structural feature, e.g. `column("depth")`."""
        return self.num_buckets + STRUCTURAL_COLUMNS.index(name)

    # ------------------------------------------------------------------ public
    def transform(self, histories: Sequence[History]) -> SparseBatch:
        """Featurise `histories` into a (len(histories), num_cols) SparseBatch, rows in input order."""
        check_histories(histories)
        text_parts = self._text_parts([h.text for h in histories])
        num = len(histories)
        state_parts = [self.state_part(h) for h in histories]
        text_len = np.array([c.size for c, _ in text_parts], dtype=np.int64)
        state_len = np.array([c.size for c, _ in state_parts], dtype=np.int64)
        row_len = text_len + NUM_STRUCTURAL + state_len
        starts = np.cumsum(row_len) - row_len  # where each row's entries begin
        nnz = int(row_len.sum())
        rows = np.repeat(np.arange(num, dtype=np.int32), row_len)
        cols = np.empty(nnz, dtype=np.int32)
        values = np.empty(nnz, dtype=np.float32)
        # text entries first, then the structural ones, per row (rows stay sorted)
        text_pos = np.arange(int(text_len.sum()), dtype=np.int64) + np.repeat(
            starts - (np.cumsum(text_len) - text_len), text_len)
        if text_pos.size:
            cols[text_pos] = np.concatenate([c for c, _ in text_parts])
            values[text_pos] = np.concatenate([v for _, v in text_parts])
        struct = np.array([[1.0, h.depth, h.num_tool_errors, np.log1p(h.num_tokens), float(h.depth == 0)]
                           for h in histories], dtype=np.float32).reshape(num, NUM_STRUCTURAL)
        struct_pos = (starts + text_len)[:, None] + np.arange(NUM_STRUCTURAL)  # (num, NUM_STRUCTURAL)
        cols[struct_pos] = self.num_buckets + np.arange(NUM_STRUCTURAL, dtype=np.int32)
        values[struct_pos] = struct
        if state_len.sum():  # after the structural entries of each row
            state_pos = np.arange(int(state_len.sum()), dtype=np.int64) + np.repeat(
                starts + text_len + NUM_STRUCTURAL - (np.cumsum(state_len) - state_len), state_len)
            cols[state_pos] = np.concatenate([c for c, _ in state_parts])
            values[state_pos] = np.concatenate([v for _, v in state_parts])
        return SparseBatch(rows, cols, values, num, self.num_cols)

    def state_part(self, history: History) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values) of the history's named state features, summed per column (names hashed, sorted)."""
        named = self.state_features(history) if (self.state_buckets and self.state_features) else {}
        if not named:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        names = sorted(named)
        buf = np.frombuffer("\n".join(names).encode("utf-8"), dtype=np.uint8)
        lengths = np.array([len(n.encode("utf-8")) for n in names])
        starts = np.cumsum(lengths + 1) - lengths - 1
        hashes = fnv1a_spans(buf, starts, lengths, self.seed) % np.uint64(self.state_buckets)
        cols, inverse = np.unique(hashes.astype(np.int64), return_inverse=True)
        values = np.bincount(inverse, weights=[float(named[n]) for n in names], minlength=cols.size)
        return (cols + self.num_buckets + NUM_STRUCTURAL).astype(np.int32), values.astype(np.float32)

    # ------------------------------------------------------------------ text part
    def _text_parts(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out: list = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            hit = self._text_cache.get(text) if self.cache_size else None
            if hit is not None:
                self._text_cache.move_to_end(text)
                out[i] = hit
            else:
                missing.setdefault(text, []).append(i)
        if missing:
            new_texts = list(missing)
            for text, part in zip(new_texts, self._featurise_texts(new_texts)):
                for i in missing[text]:
                    out[i] = part
                if self.cache_size:
                    self._text_cache[text] = part
            while len(self._text_cache) > self.cache_size:
                self._text_cache.popitem(last=False)
        return out

    def _featurise_texts(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """All texts at once, in numpy: tokenise and hash on the utf-8 bytes, one sort to count (row, bucket)."""
        encoded = [t.lower().encode("utf-8") for t in texts]
        text_start = np.cumsum([0] + [len(e) + 1 for e in encoded[:-1]])  # texts joined by b"\n"
        buf = np.frombuffer(b"\n".join(encoded), dtype=np.uint8)
        starts, lengths = token_spans(buf)
        hashes = fnv1a_spans(buf, starts, lengths, self.seed)  # (T,) uint64 holding 32-bit values
        row_of = np.searchsorted(text_start, starts, side="right") - 1  # (T,)
        buckets, bucket_rows = [], []
        for n in range(self.ngram[0], self.ngram[1] + 1):
            m = max(0, row_of.size - n + 1)  # n-grams that fit in the joined token stream
            first = np.flatnonzero(row_of[n - 1:n - 1 + m] == row_of[:m])  # ...and do not cross texts
            g = hashes[first]
            for k in range(1, n):
                g = g * np.uint64(_MIX_MUL) + hashes[first + k] + np.uint64(1)  # wraps mod 2^64
            buckets.append((_fmix64(g) % np.uint64(self.num_buckets)).astype(np.int64))
            bucket_rows.append(row_of[first])
        keys = np.concatenate(bucket_rows) * self.num_buckets + np.concatenate(buckets)
        keys, counts = np.unique(keys, return_counts=True)  # sorted by (row, bucket)
        rows, cols = keys // self.num_buckets, (keys % self.num_buckets).astype(np.int32)
        tf = 1.0 + np.log(counts)
        num_distinct = np.bincount(rows, minlength=len(texts))
        scale = 1.0 / np.sqrt(np.maximum(1.0, num_distinct / self.norm_ngrams))
        values = (tf * scale[rows]).astype(np.float32)
        splits = np.searchsorted(rows, np.arange(1, len(texts)))
        # copies, so an evicted cache entry frees its memory instead of pinning the whole batch's arrays
        return [(c.copy(), v.copy()) for c, v in zip(np.split(cols, splits), np.split(values, splits))]


def token_spans(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each token in a uint8 buffer: a maximal run of word bytes, or one punctuation byte."""
    kind = _BYTE_KIND[buf]
    is_word, is_punct = kind == _WORD, kind == _PUNCT
    prev_word = np.concatenate([[False], is_word[:-1]])
    next_word = np.concatenate([is_word[1:], [False]])
    starts = np.flatnonzero(is_punct | (is_word & ~prev_word))
    lasts = np.flatnonzero(is_punct | (is_word & ~next_word))  # tokens do not overlap, so they pair up in order
    return starts, lasts - starts + 1


def fnv1a_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    """32-bit FNV-1a of each span's first MAX_TOKEN_BYTES bytes, basis 2166136261 ^ seed (uint64 array).

    h = 2166136261 ^ seed; for each byte b: h = ((h ^ b) * 16777619) mod 2^32.
    Vectorised over spans, one pass per byte position.
    """
    lengths = np.minimum(lengths, MAX_TOKEN_BYTES)
    h = np.full(starts.size, (_FNV_BASIS ^ seed) & 0xFFFFFFFF, dtype=np.uint32)
    for k in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > k)
        h[live] = (h[live] ^ buf[starts[live] + k]) * np.uint32(_FNV_PRIME)  # wraps mod 2^32
    return h.astype(np.uint64)


def _fmix64(g: np.ndarray) -> np.ndarray:
    g = g ^ (g >> np.uint64(33))
    g = g * np.uint64(_FINAL_MUL)
    return g ^ (g >> np.uint64(33))


def check_histories(histories: Sequence[History]) -> None:
    """Raise a ValueError naming the fix for a non-History or a negative field: what every predictor's input must
    pass before it is featurised."""
    for h in histories:
        if not isinstance(h, History):
            raise ValueError(f"expected tracerl.core.history.History objects, got {type(h).__name__}; "
                             "wrap each transcript as History(text=..., depth=...)")
        if h.depth < 0 or h.num_tool_errors < 0 or h.num_tokens < 0:
            raise ValueError(f"History fields must be >= 0, got depth={h.depth}, "
                             f"num_tool_errors={h.num_tool_errors}, num_tokens={h.num_tokens}")
