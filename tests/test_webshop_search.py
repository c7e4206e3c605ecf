"""The shop's search against BM25 written out (Lucene's idf and term weight, computed in a
Python loop) on a generated shop, and on hand-built products whose ranking is plain."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from mem1_core.webshop.catalog import Product
from mem1_core.webshop.generate import generate_shop
from mem1_core.webshop.search import SHOP_BM25, ShopSearch, product_text


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
