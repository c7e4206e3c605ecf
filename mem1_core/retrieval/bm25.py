"""BM25 retrieval with `bm25s`: eager sparse scores, saved as NumPy arrays and loaded
memory-mapped.

bm25s precomputes each (token, document) BM25 term score at index time and stores them
as a CSC matrix (`indptr` over tokens); a query's score vector is the sum of its tokens'
columns. `PostingScorer` computes the same sums faster than bm25s's per-query
`np.add.at` loop: a batch of queries at once, frequent tokens as one matrix product over
dense columns, the rare rest (names, years) by scattering their short posting lists.

Tokenisation: lowercase `\\w\\w+` words (bm25s's pattern, done here without its
per-call progress bars, which cost more than the search on a small corpus), with stop
words and Snowball stemming as options. Both are off by default: the task world's
invented names are made of syllables that can be stop words ("Gorde To", "Gorde This":
with English stop words both become "gorde") or stem together ("Vales", "Vale"). On the
seed-0 world (2,744 documents, 8,021 questions) single-hop recall@1 is 0.9983 without
stop words and 0.9966 with them; stemming moves recall by < 0.3 points either way.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import bm25s
import bm25s.stopwords as bm25s_stopwords
import numpy as np
import pandas as pd

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.docstore import DocStore

# bm25s writes its arrays and vocabulary into this subdirectory of the index directory.
BM25_SUBDIR = "bm25s"
_WORD = re.compile(r"(?u)\b\w\w+\b")
STOPWORD_LISTS = {
    "en": bm25s_stopwords.STOPWORDS_EN,
    "en_plus": bm25s_stopwords.STOPWORDS_EN_PLUS,
    "de": bm25s_stopwords.STOPWORDS_GERMAN,
    "fr": bm25s_stopwords.STOPWORDS_FRENCH,
    "es": bm25s_stopwords.STOPWORDS_SPANISH,
    "it": bm25s_stopwords.STOPWORDS_ITALIAN,
    "nl": bm25s_stopwords.STOPWORDS_DUTCH,
    "pt": bm25s_stopwords.STOPWORDS_PORTUGUESE,
}
# Score-matrix cells per batch of queries (float32: 2 MB, so a batch stays in cache: on
# the world corpus ~190 queries per batch ran 1.5x faster than 1,500); on a
# Wikipedia-size corpus a batch is one query.
_SCORE_CELLS = 1 << 19
# Float32 cells (64 MB) of dense columns for frequent tokens; none on a corpus so large
# that one column would not fit.
_DENSE_CELLS = 1 << 24
# OpenBLAS runs a product of m*n*k multiply-adds at most this on one thread.
_BLAS_SINGLE_THREAD = 1 << 18
# A token's column is kept dense when its posting list covers >= 1/this of the corpus.
_DENSE_MIN_FRACTION = 64


@dataclass(frozen=True)
class BM25Options:
    """How documents and queries are tokenised and scored."""

    stemmer: str | None = None
    """PyStemmer algorithm applied to every token ("english"), or None for no stemming."""
    stopwords: str | None = None
    """Stop-word list removed from documents and queries (a `STOPWORD_LISTS` key), or None."""
    lower: bool = True
    """Lowercase before splitting into `\\w\\w+` words."""
    title_repeat: int = 1
    """How many times the title is prepended to the body before indexing (its weight)."""
    method: str = "lucene"
    """bm25s scoring variant: lucene, robertson, atire, bm25l, bm25+."""
    k1: float = 1.5
    """Term-frequency saturation."""
    b: float = 0.75
    """Document-length normalisation."""

    def __post_init__(self) -> None:
        if self.title_repeat < 0:
            raise ValueError("title_repeat must be >= 0 (0 indexes the body only)")
        if self.method not in ("lucene", "robertson", "atire", "bm25l", "bm25+"):
            raise ValueError(f"unknown BM25 method {self.method!r}")
        if self.stopwords is not None and self.stopwords not in STOPWORD_LISTS:
            raise ValueError(f"unknown stop words {self.stopwords!r}; use {sorted(STOPWORD_LISTS)}")
        if self.stemmer is not None:
            _stemmer(self.stemmer)  # fail at configuration time on an unknown algorithm

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> BM25Options:
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown BM25 options {sorted(unknown)}; known: {sorted(known)}")
        return cls(**options)


@functools.lru_cache(maxsize=8)
def _stemmer(name: str):
    import Stemmer

    try:
        return Stemmer.Stemmer(name).stemWords
    except KeyError:
        raise ValueError(f"unknown stemmer {name!r}; see Stemmer.algorithms()") from None


def tokenize(texts: list[str], options: BM25Options) -> list[list[str]]:
    """Texts -> token strings, exactly as the index sees them."""
    stop = frozenset(STOPWORD_LISTS[options.stopwords]) if options.stopwords else None
    stem = _stemmer(options.stemmer) if options.stemmer else None
    out = []
    for text in texts:
        words = _WORD.findall(text.lower() if options.lower else text)
        if stop:
            words = [w for w in words if w not in stop]
        out.append(stem(words) if stem else words)
    return out


def document_texts(df: pd.DataFrame, options: BM25Options) -> list[str]:
    """What is indexed for each document: the title `title_repeat` times, then the body."""
    return [
        " ".join([title] * options.title_repeat + [body])
        for title, body in zip(df["title"], df["contents"], strict=True)
    ]


def add_columns(
    out: np.ndarray,
    data: np.ndarray,
    indices: np.ndarray,
    indptr: np.ndarray,
    qidx: np.ndarray,
    tokens: np.ndarray,
) -> None:
    """Add CSC column `tokens[j]` to row `qidx[j]` of `out`, for every j, in place
    (a repeated token adds again).

    out: (Q, N) float32; data, indices: (nnz,); indptr: (V+1,); qidx, tokens: (T,)."""
    starts, ends = indptr[tokens].astype(np.int64), indptr[tokens + 1].astype(np.int64)
    lens = ends - starts
    # Concatenated ranges start_j..end_j without a Python loop: output position p of range
    # j lies (p - first output position of range j) past start_j.
    first = np.cumsum(lens) - lens
    pos = np.arange(int(lens.sum())) + np.repeat(starts - first, lens)
    cell = np.repeat(qidx.astype(np.int64), lens) * out.shape[1] + indices[pos]
    flat = out.reshape(-1)
    if len(pos) * 8 < flat.size:  # few postings: scatter them
        np.add.at(flat, cell, data[pos])
    else:  # many: one pass over the whole matrix is cheaper than a scattered add
        flat += np.bincount(cell, weights=data[pos], minlength=flat.size).astype(np.float32)


def dense_columns(
    data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, tokens: np.ndarray, num_docs: int
) -> np.ndarray:
    """The CSC columns `tokens` as dense rows. tokens: (F,) -> (F, N) float32."""
    out = np.zeros((len(tokens), num_docs), dtype=np.float32)
    for row, t in enumerate(tokens):
        out[row, indices[indptr[t] : indptr[t + 1]]] = data[indptr[t] : indptr[t + 1]]
    return out


def blocked_product(counts: np.ndarray, dense: np.ndarray, used: np.ndarray) -> np.ndarray:
    """counts @ dense[used], one block of columns at a time.

    counts: (Q, U), dense: (F, N), used: (U,) row ids -> (Q, N) float32.

    Blocks keep each product small: its operands stay in cache, and it stays under the
    size (m*n*k = 2^18) at which OpenBLAS splits one product over threads, which on a
    busy 2-core machine made the product 1-10x slower from call to call."""
    n_queries, n_used = counts.shape
    out = np.empty((n_queries, dense.shape[1]), dtype=np.float32)
    step = max(64, _BLAS_SINGLE_THREAD // max(n_queries * n_used, 1))
    for start in range(0, dense.shape[1], step):
        block = dense[used, start : start + step]
        np.matmul(counts, block, out=out[:, start : start + step])
    return out


class PostingScorer:
    """BM25 scores from bm25s's CSC arrays, with the most frequent tokens' columns kept
    dense: a frequent token ("born", "city") has a posting list nearly as long as the
    corpus, and one matrix product over dense rows beats scattering it for every query.
    Scores are the same sums either way (a test checks it)."""

    def __init__(
        self,
        data: np.ndarray,
        indices: np.ndarray,
        indptr: np.ndarray,
        num_docs: int,
        dense_cells: int = _DENSE_CELLS,
    ):
        self.data, self.indices, self.indptr, self.num_docs = data, indices, indptr, num_docs
        df = np.diff(np.asarray(indptr, dtype=np.int64))
        budget = dense_cells // max(num_docs, 1)
        frequent = np.flatnonzero(df * _DENSE_MIN_FRACTION >= num_docs)
        frequent = frequent[np.argsort(-df[frequent], kind="stable")][:budget]
        self.dense_slot = np.full(len(df), -1, dtype=np.int64)
        self.dense_slot[frequent] = np.arange(len(frequent))
        self.dense = dense_columns(data, indices, indptr, frequent, num_docs)

    def scores(self, query_token_ids: list[np.ndarray]) -> np.ndarray:
        """query_token_ids: Q arrays of token ids -> scores (Q, N) float32."""
        n_queries = len(query_token_ids)
        qidx = np.repeat(np.arange(n_queries), [len(t) for t in query_token_ids])
        tokens = np.concatenate(query_token_ids).astype(np.int64) if len(qidx) else qidx
        slot = self.dense_slot[tokens]
        frequent = slot >= 0
        if frequent.any():
            # Only the dense rows these queries use: multiplying by all of them would read
            # the whole block (tens of MB on a large corpus) for every batch.
            used, col = np.unique(slot[frequent], return_inverse=True)
            counts = np.zeros((n_queries, len(used)), dtype=np.float32)
            np.add.at(counts, (qidx[frequent], col), 1.0)
            out = blocked_product(counts, self.dense, used)
        else:
            out = np.zeros((n_queries, self.num_docs), dtype=np.float32)
        rare = ~frequent
        add_columns(out, self.data, self.indices, self.indptr, qidx[rare], tokens[rare])
        return out


def top_k(scores: np.ndarray, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Best `k` positive scores of each row, best first, equal scores in index order.

    scores: (Q, N) -> Q arrays of rows (<=k,), Q arrays of scores (<=k,)."""
    n_queries, n = scores.shape
    k = min(k, n)
    # Select by value, not by `argpartition`: BM25 rows hold few distinct values (documents
    # matching the same common words tie), which makes argpartition several times slower
    # than `partition` plus one pass; it also fixes which tied documents survive.
    kth = np.partition(scores, n - k, axis=1)[:, n - k, None]  # k-th largest per row
    qs, rows = np.nonzero(scores >= kth)  # the top k and every tie of the k-th
    best = scores[qs, rows]
    order = np.lexsort((rows, -best, qs))
    qs, rows, best = qs[order], rows[order], best[order]
    first = np.searchsorted(qs, np.arange(n_queries))
    rank = np.arange(len(qs)) - first[qs]
    top = rank < k
    qs, rows, best = qs[top], rows[top], best[top]
    positive = best > 0  # a BM25 hit must share at least one term with the query
    bounds = np.searchsorted(qs[positive], np.arange(n_queries + 1))
    rows, best = rows[positive], best[positive]
    return (
        [rows[bounds[q] : bounds[q + 1]] for q in range(n_queries)],
        [best[bounds[q] : bounds[q + 1]] for q in range(n_queries)],
    )


def build(df: pd.DataFrame, out_dir: Path, options: BM25Options, show_progress: bool) -> None:
    model = bm25s.BM25(method=options.method, k1=options.k1, b=options.b)
    model.index(tokenize(document_texts(df, options), options), show_progress=show_progress)
    model.save(str(out_dir / BM25_SUBDIR), show_progress=False)


class BM25Retriever:
    """A loaded BM25 index; implements `Retriever`."""

    def __init__(self, index_dir: str | os.PathLike, options: BM25Options, docs: DocStore):
        self.options = options
        self.docs = docs
        path = str(Path(index_dir) / BM25_SUBDIR)
        self.model = bm25s.BM25.load(path, mmap=True, show_progress=False)
        self._vocab: dict[str, int] = self.model.vocab_dict
        s = self.model.scores
        self._num_docs = int(s["num_docs"])
        if self._num_docs != len(docs):
            raise ValueError(f"BM25 index has {self._num_docs} documents, docs.arrow {len(docs)}")
        # Plain ndarray views of the memory maps: still backed by the files, without
        # np.memmap's per-slice Python overhead.
        arrays = (np.asarray(s["data"]), np.asarray(s["indices"]), np.asarray(s["indptr"]))
        self.scorer = PostingScorer(*arrays, self._num_docs)

    def token_ids(self, queries: list[str]) -> list[np.ndarray]:
        """Vocabulary ids of each query's tokens; out-of-vocabulary tokens are dropped."""
        vocab = self._vocab
        return [
            np.array([vocab[t] for t in tokens if t in vocab], dtype=np.int64)
            for tokens in tokenize(queries, self.options)
        ]

    def scores(self, queries: list[str]) -> np.ndarray:
        """BM25 score of every document for each query. -> (Q, N)"""
        return self.scorer.scores(self.token_ids(queries))

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        rows = [np.zeros(0, dtype=np.int64)] * len(queries)
        scores = [np.zeros(0, dtype=np.float32)] * len(queries)
        live = [i for i, q in enumerate(queries) if q.strip()]
        chunk = max(1, _SCORE_CELLS // self._num_docs)
        for start in range(0, len(live), chunk):
            part = live[start : start + chunk]
            r, s = top_k(self.scores([queries[i] for i in part]), k)
            for j, i in enumerate(part):
                rows[i], scores[i] = r[j], s[j]
        return self.docs.hits(rows, scores)


def resolved_options(options: BM25Options) -> dict[str, Any]:
    return asdict(options)
