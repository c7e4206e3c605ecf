"""The shop's search against BM25 written out (Lucene's idf and term weight, computed in a
Python loop) on a generated shop, and on hand-built products whose ranking is plain; its
streamed index against bm25s's; a saved shop's index built once and reused."""

from __future__ import annotations

import math
import re
from collections import Counter

import bm25s
import numpy as np
import pytest

from mem1_core.retrieval.bm25 import tokenize
from mem1_core.retrieval.postings import build_postings
from mem1_core.webshop import search as search_module
from mem1_core.webshop.catalog import Product, Shop
from mem1_core.webshop.env import WebShopEnvironment
from mem1_core.webshop.generate import generate_shop
from mem1_core.webshop.search import SEARCH_DIR, SHOP_BM25, ShopSearch, product_text, shop_search


def _product(asin: str, title: str, description: str = "") -> Product:
    return Product(asin, "fashion", "boots", title, 10.0, (), {}, description, (), ())


def lucene_bm25(docs: list[list[str]], query: list[str], k1: float, b: float) -> list[float]:
    """score(d) = sum over query tokens t of idf(t) * tf (k1 + 1) / (tf + k1 (1 - b + b |d| /
    avgdl)), idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)); a repeated query token counts
    again."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df = Counter(t for d in docs for t in set(d))
    out = []
    for d in docs:
        tf = Counter(d)
        s = 0.0
        for t in query:
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


def test_ranking_matches_bm25_written_out():
    shop = generate_shop(seed=1, n_products=300, n_goals=20)
    search = ShopSearch(shop.products)
    docs = [re.findall(r"\b\w\w+\b", product_text(p)) for p in shop.products]
    for goal in shop.goals[:10]:
        query = goal.instruction.split(" with ")[0]
        expected = lucene_bm25(docs, re.findall(r"\b\w\w+\b", query.lower()), 0.9, 0.4)
        got = search.search(query, k=10)
        by_asin = dict(zip((p.asin for p in shop.products), expected, strict=True))
        # the same scores (float32 against float64), best first
        got_scores = [by_asin[a] for a in got]
        assert got_scores == sorted(got_scores, reverse=True)
        assert got_scores[0] == pytest.approx(max(expected), rel=1e-5)
        tenth = sorted(expected, reverse=True)[9]
        assert all(s >= tenth - 1e-4 for s in got_scores)


def test_hand_built_ranking():
    products = [
        _product("A", "Leather Hiking Boots", "warm and waterproof"),
        _product("B", "Rain Boots", "waterproof rubber"),
        _product("C", "Cotton T-Shirt", "soft"),
    ]
    search = ShopSearch(products)
    # B's shorter text scores both words higher than A's (length normalisation); C has neither
    assert search.search("waterproof boots") == ["B", "A"]
    assert search.search("leather") == ["A"]
    assert search.search("nothing matches") == []
    assert search.search("boots", k=1) == ["B"]
    assert search.search_many(["soft", "rubber"]) == [["C"], ["B"]]
    assert SHOP_BM25.k1 == 0.9 and SHOP_BM25.b == 0.4


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one product"):
        ShopSearch([])
    with pytest.raises(ValueError, match="k must be"):
        ShopSearch([_product("A", "red boots")]).search("red", k=0)


def test_postings_equal_bm25s_arrays():
    """The streamed builder against bm25s's index of the same tokens, column by column."""
    shop = generate_shop(seed=2, n_products=700, n_goals=5)
    texts = [product_text(p) for p in shop.products]
    ours = build_postings(texts, SHOP_BM25, batch_docs=64)  # batches cut the corpus anywhere
    model = bm25s.BM25(method="lucene", k1=SHOP_BM25.k1, b=SHOP_BM25.b)
    model.index(tokenize(texts, SHOP_BM25), show_progress=False)
    s = model.scores
    assert ours.num_docs == 700 and set(ours.vocab) == set(model.vocab_dict) - {""}
    for token, j in model.vocab_dict.items():
        if token == "":
            continue
        i = ours.vocab[token]
        mine, theirs = slice(*ours.indptr[i : i + 2]), slice(*s["indptr"][j : j + 2])
        assert np.array_equal(ours.indices[mine], s["indices"][theirs])
        assert np.array_equal(ours.data[mine], s["data"][theirs])  # the same float32 bits


QUERIES = ["running shoes", "waterproof black boots", "organic green tea", "no such words"]


@pytest.fixture(scope="module")
def tok():
    from mem1_core.models.tokenizer import train_tiny_tokenizer

    return train_tiny_tokenizer(["search[shoes] click[Buy Now]"] * 8, 300)


def test_a_saved_shop_builds_its_index_once(tmp_path, monkeypatch, tok):
    builds: list[int] = []

    def spy(texts, options, *args):
        builds.append(1)
        return build_postings(texts, options, *args)

    monkeypatch.setattr(search_module, "build_postings", spy)
    shop = generate_shop(seed=3, n_products=400, n_goals=10)
    shop.save(tmp_path)
    fresh = ShopSearch(shop.products)
    assert builds == [1]
    for _ in range(2):  # two environment starts, each in its own process in a run
        env = WebShopEnvironment(tok, {"s": Shop.load(tmp_path)})
        assert [env.search("s", q) for q in QUERIES] == [fresh.search(q) for q in QUERIES]
    assert builds == [1, 1]  # the first start built and saved it; the second loaded it
    assert (tmp_path / SEARCH_DIR / "data.npy").is_file()
    loaded = shop_search(Shop.load(tmp_path))
    assert builds == [1, 1] and loaded.scores(QUERIES).tolist() == fresh.scores(QUERIES).tolist()
    # products changed: the saved index is stale, and a new one serves the new products
    other = generate_shop(seed=4, n_products=300, n_goals=10)
    expected = ShopSearch(other.products).search_many(QUERIES)
    other.save(tmp_path)
    builds.clear()
    rebuilt = shop_search(Shop.load(tmp_path))
    assert builds == [1] and rebuilt.search_many(QUERIES) == expected
    shop_search(Shop.load(tmp_path))
    assert builds == [1]


def test_a_shop_whose_directory_was_rewritten_searches_its_own_products(tmp_path):
    first = generate_shop(seed=5, n_products=200, n_goals=5)
    first.save(tmp_path)
    loaded = Shop.load(tmp_path)
    generate_shop(seed=6, n_products=250, n_goals=5).save(tmp_path)  # converted again since
    got = shop_search(loaded).search_many(QUERIES)
    assert got == ShopSearch(first.products).search_many(QUERIES)
