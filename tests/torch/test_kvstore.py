"""The engine's KV store against the plain definition it implements: the same entries, in the same LRU order, and
the same answers, whatever sequence of stores and lookups (a random walk over sequences that share prefixes)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from tracerl.engines.transformers_engine import KVStore


class PlainStore:
    """Every entry compared in full: the definition `KVStore` must match (ties go to the least recently used)."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens, self.entries, self.num_tokens, self.next_id = capacity_tokens, OrderedDict(), 0, 0

    @staticmethod
    def lcp(a, b) -> int:
        m = 0
        while m < min(len(a), len(b)) and a[m] == b[m]:
            m += 1
        return m

    def longest_match(self, tokens):
        best_id, best = None, 0
        for key, stored in self.entries.items():
            if self.lcp(stored, tokens) > best:
                best_id, best = key, self.lcp(stored, tokens)
        if best_id is not None:
            self.entries.move_to_end(best_id)
        return best_id, best

    def put(self, tokens):
        if not 0 < len(tokens) <= self.capacity_tokens:
            return
        for key, stored in list(self.entries.items()):
            lcp = self.lcp(stored, tokens)
            if lcp == len(tokens):
                self.entries.move_to_end(key)
                return
            if lcp == len(stored):
                self.num_tokens -= len(self.entries.pop(key))
        while self.num_tokens + len(tokens) > self.capacity_tokens:
            self.num_tokens -= len(self.entries.pop(next(iter(self.entries))))
        self.entries[self.next_id] = list(tokens)
        self.next_id += 1
        self.num_tokens += len(tokens)


def random_sequence(rng: np.random.Generator, stored: list[np.ndarray]) -> np.ndarray:
    """Often an extension or a truncation of an earlier sequence (how rollouts grow), else a fresh one over a small
    vocabulary (so unrelated sequences still share short prefixes)."""
    if stored and rng.random() < 0.7:
        base = stored[rng.integers(len(stored))]
        cut = int(rng.integers(0, len(base) + 1))
        tail = rng.integers(0, 3, size=int(rng.integers(0, 6)))
        return np.concatenate([base[:cut], tail]).astype(np.int64)
    return rng.integers(0, 3, size=int(rng.integers(0, 12))).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_the_store_matches_the_plain_definition(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(8, 60))
    store, plain, seen = KVStore(capacity), PlainStore(capacity), []
    for _ in range(400):
        tokens = random_sequence(rng, seen)
        seen.append(tokens)
        if rng.random() < 0.5:
            store.put(tokens, kv=[])
            plain.put(tokens)
        else:
            entry, length = store.longest_match(tokens)
            key, plain_length = plain.longest_match(tokens)
            assert length == plain_length
            assert (entry is None) == (key is None)
            if entry is not None:
                assert list(entry.tokens) == plain.entries[key]
        assert [list(e.tokens) for e in store.entries.values()] == list(plain.entries.values())
        assert store.num_tokens == plain.num_tokens
