"""A small in-memory BM25 index over documents {"id", "title", "text"}, deterministic, numpy only.

`BM25Index(documents).search(query, k)` returns the `k` best documents for a query. Scoring is the
Lucene variant of BM25 (Robertson et al. 1994; the default of the `bm25s` package, whose scores it
matches): for query tokens q_1..q_n (repeats count) and a document d of |d| tokens,

    score(d) = sum_i idf(q_i) * tf(q_i, d) / (tf(q_i, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

Title and text are indexed together; tokens are lowercase `\\w+` runs minus a short English stopword list.
Ties are broken by document order, so the same corpus and query always give the same list.

It deliberately does not stem, expand queries, persist the index, or scale past what fits in memory
(fine for ~1e6 short passages; a Wikipedia-size corpus wants a search server). It is written here rather
than taken from `bm25s` so that `tracerl.io` needs nothing beyond numpy and imports fast.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

WORD = re.compile(r"\w+")
STOPWORDS = frozenset(
    "a an and are as at be but by for from had has have he her his i if in into is it its of on or she so "
    "than that the their them then there these they this to was were what when where which who whom why "
    "will with would you your".split()
)


def tokenize(text: str, stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """Lowercase word tokens of `text` without stopwords."""
    return [w for w in WORD.findall(text.lower()) if w not in stopwords]


class BM25Index:
    """BM25 over a fixed list of documents; `search` returns copies of the stored documents, best first."""

    def __init__(self, documents: Sequence[Mapping[str, Any]], k1: float = 1.5, b: float = 0.75,
                 stopwords: frozenset[str] = STOPWORDS) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        for i, doc in enumerate(documents):
            if not isinstance(doc, Mapping) or not isinstance(doc.get("text"), str):
                raise ValueError(f"document {i} must be a mapping with a string 'text' (and 'id', 'title'); "
                                 f"got {doc!r:.120}")
        self.documents = [dict(doc) for doc in documents]
        self.stopwords = stopwords
        self.vocab: dict[str, int] = {}
        term_ids, doc_ids, lengths = [], [], np.zeros(len(self.documents))
        for d, doc in enumerate(self.documents):
            tokens = tokenize(f"{doc.get('title', '')} {doc['text']}", stopwords)
            lengths[d] = len(tokens)
            term_ids.extend(self.vocab.setdefault(t, len(self.vocab)) for t in tokens)
            doc_ids.extend([d] * len(tokens))
        # one posting per (term, document): sort by term then document, count repeats as tf
        keys = np.asarray(term_ids, dtype=np.int64) * max(len(self.documents), 1) + np.asarray(doc_ids, dtype=np.int64)
        postings, tf = np.unique(keys, return_counts=True)
        post_term, post_doc = np.divmod(postings, max(len(self.documents), 1))
        df = np.bincount(post_term, minlength=len(self.vocab))
        num_docs, avgdl = len(self.documents), max(lengths.mean() if len(lengths) else 0.0, 1e-9)
        idf = np.log1p((num_docs - df + 0.5) / (df + 0.5))
        norm = k1 * (1 - b + b * lengths[post_doc] / avgdl)
        self._weights = idf[post_term] * tf / (tf + norm)  # (postings,) each term's contribution to its document
        self._docs = post_doc  # (postings,)
        self._indptr = np.concatenate([[0], np.cumsum(df)])  # postings of term t: indptr[t]:indptr[t+1]

    def __len__(self) -> int:
        return len(self.documents)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for `query`, shape (num_docs,); zero where no token matches."""
        ids = [self.vocab[t] for t in tokenize(query, self.stopwords) if t in self.vocab]
        if not ids:
            return np.zeros(len(self.documents))
        sel = np.concatenate([np.arange(self._indptr[t], self._indptr[t + 1]) for t in ids])
        return np.bincount(self._docs[sel], weights=self._weights[sel], minlength=len(self.documents))

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        """The `k` highest-scoring documents (score > 0), best first; ties go to the earlier document."""
        if k <= 0:
            return []
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        best = hits[np.lexsort((hits, -scores[hits]))][:k]
        return [dict(self.documents[d]) for d in best]
