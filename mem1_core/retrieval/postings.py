"""BM25 postings built from a stream of documents in bounded memory, and kept as files.

bm25s (`mem1_core.retrieval.bm25`) indexes a corpus from every document's token list held at
once and counts them in Python loops: for a million product pages (WebShop's 1.18M products,
~150 words each) that is ~10 GB of Python lists. `build_postings` computes the same CSC
arrays as bm25s's Lucene variant (float32 term scores, `indptr` over tokens; a test compares
them with bm25s's) from documents tokenised a batch at a time, holding 6 bytes per distinct
(document, token) pair until the scores are known, then the 8 bytes a pair of the result.

`save_postings` writes the arrays as `.npy` files and the vocabulary as JSON; `load_postings`
reads them back, the arrays memory-mapped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mem1_core.retrieval.bm25 import BM25Options, tokenize

ARRAYS = ("data", "indices", "indptr")
VOCAB_FILE = "vocab.json"
BATCH_DOCS = 4096
"""Documents tokenised and counted together."""


@dataclass(frozen=True)
class Postings:
    """A BM25 index as CSC arrays over tokens (bm25s's `scores`)."""

    data: np.ndarray
    """(nnz,) float32: the BM25 term score of each (token, document) pair, by token."""
    indices: np.ndarray
    """(nnz,) int32: the document of each pair, ascending within a token."""
    indptr: np.ndarray
    """(V+1,) int64: token t's pairs are [indptr[t], indptr[t+1])."""
    vocab: dict[str, int]
    """Token -> its id (its column)."""
    num_docs: int


def _batches(texts: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def build_postings(
    texts: Iterable[str], options: BM25Options, batch_docs: int = BATCH_DOCS
) -> Postings:
    """Lucene's BM25 (bm25s's `method="lucene"`) over `texts`, read once, in order:
    score(t, d) = idf(t) * tf / (tf + k1 (1 - b + b |d| / avgdl)), idf(t) = ln(1 + (N - df + 0.5)
    / (df + 0.5)), computed in float64 and stored in float32, as bm25s does."""
    if options.method != "lucene":
        raise ValueError(f"build_postings computes Lucene's BM25, not {options.method!r}")
    vocab: dict[str, int] = {}
    tokens: list[np.ndarray] = []  # per batch: each distinct pair's token, by document
    counts: list[np.ndarray] = []  # its count in the document
    pairs: list[np.ndarray] = []  # per document: its distinct tokens
    lengths: list[np.ndarray] = []  # per document: its tokens
    for batch in _batches(texts, batch_docs):
        token_lists = tokenize(batch, options)
        ids = np.fromiter(
            (vocab.setdefault(t, len(vocab)) for words in token_lists for t in words), np.int64
        )
        n_words = np.array([len(words) for words in token_lists], dtype=np.int64)
        doc = np.repeat(np.arange(len(batch), dtype=np.int64), n_words)
        keys, tf = np.unique((doc << 32) | ids, return_counts=True)
        tokens.append((keys & 0xFFFFFFFF).astype(np.int32))
        counts.append(tf.astype(np.uint16 if tf.max(initial=0) <= 0xFFFF else np.int32))
        pairs.append(np.bincount(keys >> 32, minlength=len(batch)).astype(np.int32))
        lengths.append(n_words.astype(np.int32))
    doc_len = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    num_docs, n_vocab = len(doc_len), len(vocab)
    if not num_docs:
        raise ValueError("a BM25 index needs at least one document")
    df = np.zeros(n_vocab, dtype=np.int64)
    for t in tokens:
        df += np.bincount(t, minlength=n_vocab)
    idf = np.log(1 + (num_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
    # bm25s: l_d / l_avg with l_avg the mean length as a float64
    norm = options.k1 * ((1 - options.b) + options.b * doc_len / doc_len.mean(dtype=np.float64))
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    data = np.empty(indptr[-1], dtype=np.float32)
    indices = np.empty(indptr[-1], dtype=np.int32)
    fill = indptr[:-1].copy()  # the next free slot of each token's column
    first_doc = 0
    while tokens:  # batch by batch, in document order, freeing each
        t, tf, per_doc = tokens.pop(0), counts.pop(0).astype(np.float64), pairs.pop(0)
        doc = np.repeat(np.arange(first_doc, first_doc + len(per_doc), dtype=np.int32), per_doc)
        first_doc += len(per_doc)
        score = (idf[t] * (tf / (norm[doc] + tf))).astype(np.float32)
        order = np.argsort(t, kind="stable")  # by token, documents ascending within one
        ts = t[order]
        starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])
        run = np.diff(np.r_[starts, len(ts)])
        slot = fill[ts] + np.arange(len(ts)) - np.repeat(starts, run)
        indices[slot], data[slot] = doc[order], score[order]
        fill[ts[starts]] += run
    return Postings(data, indices, indptr, vocab, num_docs)


def save_postings(postings: Postings, out_dir: Path) -> None:
    """The arrays as `data.npy`, `indices.npy`, `indptr.npy` and the vocabulary as
    `vocab.json` (tokens by id) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ARRAYS:
        np.save(out_dir / f"{name}.npy", getattr(postings, name))
    words = sorted(postings.vocab, key=postings.vocab.__getitem__)
    (out_dir / VOCAB_FILE).write_text(json.dumps(words, ensure_ascii=False), encoding="utf-8")


def load_postings(src: Path, num_docs: int) -> Postings:
    """Read what `save_postings` wrote; the arrays are memory-mapped."""
    arrays = {name: np.load(src / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
    words = json.loads((src / VOCAB_FILE).read_text(encoding="utf-8"))
    if len(arrays["indptr"]) != len(words) + 1:
        raise ValueError(f"{src}: {len(words)} tokens but {len(arrays['indptr'])} indptr entries")
    # plain ndarray views of the maps (np.memmap's per-slice overhead is Python's)
    return Postings(
        *(np.asarray(arrays[n]) for n in ARRAYS),
        vocab={w: i for i, w in enumerate(words)},
        num_docs=num_docs,
    )
