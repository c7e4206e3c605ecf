"""BM25: scores against the Lucene BM25 formula computed by a slow loop, the fast scorer
paths against each other, persistence, reload, fingerprints, names, and world recall."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mem1_core.retrieval import build_index, load_index, read_manifest
from mem1_core.retrieval.bm25 import (
    BM25Options,
    PostingScorer,
    add_columns,
    blocked_product,
    document_texts,
    tokenize,
    top_k,
)

# Invented names, including ones made of English stop words ("Gorde To", "Gorde This")
# and near-duplicates (the world's distractors).
DOCS = [
    ("d0", "Gorde To", "Gorde To was a painter born in Tirvane in 1847."),
    ("d1", "Gorde This", "Gorde This was a poet born in Osland in 1850."),
    ("d2", "Tirvane", "Tirvane is a city in Osland. It was founded in 1602."),
    ("d3", "Osland", "Osland is a country whose capital is Tirvane."),
    ("d4", "Vales Dorn", "Vales Dorn was a merchant born in Kesmar in 1790."),
    ("d5", "Vale Dorn", "Vale Dorn was an engineer born in Tirvane in 1811."),
    ("d6", "Kesmar", "Kesmar is a city in Osland. The city was established in 1544."),
    ("d7", "Silent River", "Silent River is a 1901 novel written by Gorde To."),
]


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.parquet"
    pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"]).to_parquet(path)
    return path


def reference_bm25(query: str, df: pd.DataFrame, opts: BM25Options) -> np.ndarray:
    """Lucene BM25 from its definition: sum over query tokens t (repeats count) of
    log(1 + (N - df_t + 0.5) / (df_t + 0.5)) * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    docs = tokenize(document_texts(df, opts), opts)
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    scores = np.zeros(n)
    for t in tokenize([query], opts)[0]:
        dft = sum(t in d for d in docs)
        if dft == 0:
            continue
        idf = math.log(1 + (n - dft + 0.5) / (dft + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(t)
            scores[i] += idf * tf / (tf + opts.k1 * (1 - opts.b + opts.b * len(d) / avgdl))
    return scores


QUERIES = [
    "Where was Gorde To born?",
    "In which city was Gorde This born?",
    "founded city Osland Osland",  # a repeated term counts twice
    "Vales Dorn",
    "novel 1901",
    "zzz unknown words only",
]


@pytest.mark.parametrize(
    "opts",
    [
        BM25Options(),
        BM25Options(stemmer="english", stopwords="en"),
        BM25Options(title_repeat=2, k1=0.9, b=0.4),
    ],
)
def test_scores_match_the_bm25_formula(tmp_path, corpus_file, opts):
    retriever = load_index(build_index(corpus_file, "bm25", tmp_path / "idx", **vars(opts)))
    df = pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"])
    got = retriever.scores(QUERIES)
    want = np.stack([reference_bm25(q, df, opts) for q in QUERIES])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dense_columns_and_scattered_postings_give_the_same_sums():
    rng = np.random.default_rng(0)
    n_docs, vocab = 50, 30
    dense = rng.random((vocab, n_docs)) * (rng.random((vocab, n_docs)) < 0.3)
    dense[:3] = rng.random((3, n_docs))  # frequent tokens: in (nearly) every document
    # CSC over tokens: token t's postings are indptr[t]:indptr[t+1].
    indptr = np.concatenate([[0], np.cumsum((dense > 0).sum(1))])
    indices = np.concatenate([np.flatnonzero(row) for row in dense])
    data = np.concatenate([row[row > 0] for row in dense]).astype(np.float32)
    queries = [rng.integers(0, vocab, size=rng.integers(0, 6)) for _ in range(20)]
    queries.append(np.zeros(40, dtype=np.int64))  # many postings: the bincount path
    want = np.stack([dense[q].sum(0) for q in queries])  # repeats count again
    hybrid = PostingScorer(data, indices, indptr, n_docs)
    assert len(hybrid.dense) > 0
    sparse_only = PostingScorer(data, indices, indptr, n_docs, dense_cells=0)
    assert len(sparse_only.dense) == 0
    for got in (hybrid.scores(queries), sparse_only.scores(queries)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for one in queries:  # one query at a time: the scatter path
        out = np.zeros((1, n_docs), dtype=np.float32)
        add_columns(out, data, indices, indptr, np.zeros(len(one), dtype=np.int64), one)
        np.testing.assert_allclose(out[0], dense[one].sum(0), rtol=1e-5, atol=1e-5)


def test_blocked_product_equals_the_plain_product():
    rng = np.random.default_rng(2)
    dense = rng.random((12, 1500), dtype=np.float32)
    counts = rng.integers(0, 3, size=(60, 5)).astype(np.float32)
    used = np.array([7, 0, 3, 11, 5])
    got = blocked_product(counts, dense, used)  # 60 * 5 * 1500 > 2^18: several blocks
    np.testing.assert_allclose(got, counts @ dense[used], rtol=1e-5)


def test_top_k_matches_a_full_sort():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, size=(7, 40)).astype(np.float32)  # many ties, some zeros
    for k in (1, 5, 40, 100):
        rows, best = top_k(scores, k)
        for q in range(len(scores)):
            order = sorted(range(40), key=lambda i: (-scores[q, i], i))
            want = [i for i in order[:k] if scores[q, i] > 0]
            assert rows[q].tolist() == want
            np.testing.assert_array_equal(best[q], scores[q, want])


def test_build_persist_reload_and_answer(tmp_path, corpus_file):
    out = build_index(corpus_file, "bm25", tmp_path / "idx")
    m = read_manifest(out)
    assert m.kind == "bm25" and m.documents == len(DOCS)
    assert m.options["stopwords"] is None and m.options["stemmer"] is None
    assert {"bm25s", "numpy"} <= set(m.versions)
    r = load_index(out, corpus_file)
    assert isinstance(r.model.scores["data"], np.memmap)  # loaded memory-mapped
    hits = r.search(["Where was Gorde To born?", "", "   ", "Kesmar", "qqq"], k=3)
    assert hits[0][0].doc_id == "d0" and hits[0][0].title == "Gorde To"
    assert hits[0][0].text == DOCS[0][2]
    assert [len(h) for h in hits[1:3]] == [0, 0]  # blank query -> no hits
    assert hits[3][0].title == "Kesmar" and hits[4] == []  # unknown words -> no hits
    assert all(a.score >= b.score for a, b in zip(hits[0], hits[0][1:], strict=False))
    assert len(r.search(["born"], k=1000)[0]) == 4  # k beyond the corpus: every match
    with pytest.raises(ValueError):
        r.search(["x"], k=0)


def test_reload_refuses_a_different_corpus(tmp_path, corpus_file):
    out = build_index(corpus_file, "bm25", tmp_path / "idx")
    other = tmp_path / "other.parquet"
    changed = [*DOCS[:-1], ("d7", "Silent River", "Silent River is a 1902 novel.")]
    pd.DataFrame(changed, columns=["doc_id", "title", "contents"]).to_parquet(other)
    with pytest.raises(ValueError, match="different corpus"):
        load_index(out, other)


def test_default_options_keep_names_made_of_stop_words(tmp_path, corpus_file):
    default = load_index(build_index(corpus_file, "bm25", tmp_path / "a"))
    assert [h[0].title for h in default.search(["Gorde To", "Gorde This"], 1)] == [
        "Gorde To",
        "Gorde This",
    ]
    # With English stop words "To" and "This" vanish, and the two names become one.
    stop = load_index(build_index(corpus_file, "bm25", tmp_path / "b", stopwords="en"))
    assert stop.token_ids(["Gorde To"])[0].tolist() == stop.token_ids(["Gorde This"])[0].tolist()
    # Stemming merges near-duplicate names ("Vales" / "Vale") that the default keeps apart.
    stem = load_index(build_index(corpus_file, "bm25", tmp_path / "c", stemmer="english"))
    assert stem.token_ids(["Vales"])[0].tolist() == stem.token_ids(["Vale"])[0].tolist()
    assert default.search(["Vales Dorn"], 1)[0][0].title == "Vales Dorn"


def test_bad_options_fail_before_building(tmp_path, corpus_file):
    with pytest.raises(ValueError, match="unknown BM25 options"):
        build_index(corpus_file, "bm25", tmp_path / "i", model="x")
    with pytest.raises(ValueError, match="unknown stemmer"):
        build_index(corpus_file, "bm25", tmp_path / "i", stemmer="klingon")
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(corpus_file, "sparse", tmp_path / "i")
    assert not (tmp_path / "i").exists()


def test_ensure_index_caches_on_the_corpus_fingerprint(tmp_path, corpus_file):
    from mem1_core.retrieval import ensure_index

    first, built = ensure_index(corpus_file, "bm25", tmp_path / "root", show_progress=False)
    assert built
    again, built = ensure_index(corpus_file, "bm25", tmp_path / "root", show_progress=False)
    assert (again, built) == (first, False)
    other, built = ensure_index(
        corpus_file, "bm25", tmp_path / "root", show_progress=False, title_repeat=2
    )
    assert built and other != first  # different options: a different index


def test_world_single_hop_recall(tmp_path, small_world_dir):
    """Every single-hop question of the (smoke) world finds its document in the top 3."""
    corpus = small_world_dir / "corpus.parquet"
    questions = pd.read_parquet(small_world_dir / "questions.parquet")
    single = questions[questions["hops"] == 1]
    r = load_index(build_index(corpus, "bm25", tmp_path / "idx", show_progress=False))
    hits = r.search(single["question"].tolist(), 3)
    titles = single["supporting_titles"]
    found = [s[0] in {h.title for h in hs} for s, hs in zip(titles, hits, strict=True)]
    assert np.mean(found) >= 0.99
