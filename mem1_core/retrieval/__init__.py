"""Retrieval for the agent's `<query>`: corpora, BM25 and dense indexes, an HTTP server
in the Search-R1 schema, its client, and a Ray actor — all behind `Retriever.search`."""

from mem1_core.retrieval.base import Hit, IndexKind, Manifest, Retriever, read_manifest
from mem1_core.retrieval.client import HttpRetriever, RetrieverUnavailable
from mem1_core.retrieval.corpus import (
    CorpusReport,
    corpus_fingerprint,
    load_corpus,
    read_corpus,
)
from mem1_core.retrieval.index import build_index, ensure_index, load_index

__all__ = [
    "CorpusReport",
    "Hit",
    "HttpRetriever",
    "IndexKind",
    "Manifest",
    "Retriever",
    "RetrieverUnavailable",
    "build_index",
    "corpus_fingerprint",
    "ensure_index",
    "load_corpus",
    "load_index",
    "read_corpus",
    "read_manifest",
]
