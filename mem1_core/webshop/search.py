"""The shop's search engine: BM25 over each product's text, ranked asins for keywords.

WebShop indexes one document per product with Pyserini (Lucene BM25, k1=0.9, b=0.4): the
title, the description, the first bullet point and the option text ("color: red, blue, and
size: small"), lowercased (`search_engine/convert_product_file_format.py`), and a search
returns the top 50. This module indexes the same text with our retrieval package's BM25
(bm25s's Lucene variant, `mem1_core.retrieval.bm25`) in memory, with the same k1 and b.

Where it departs from WebShop: tokens are lowercase `\\w\\w+` words without Lucene's
English analyzer (no stemming, no stop words, one-letter words dropped), so scores differ
from Pyserini's in detail; equal scores rank in catalogue order.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np

from mem1_core.retrieval.bm25 import BM25Options, PostingScorer, tokenize, top_k
from mem1_core.webshop.catalog import Product

SEARCH_RETURN_N = 50
"""Results a search returns (WebShop's `SEARCH_RETURN_N`); pages show 10 of them at a time."""
SHOP_BM25 = BM25Options(method="lucene", k1=0.9, b=0.4)
"""Pyserini's LuceneSearcher defaults, which WebShop's search engine runs with."""


def product_text(product: Product) -> str:
    """What the index holds for a product, as WebShop builds its search documents."""
    option_text = ", and ".join(f"{g}: {', '.join(v)}" for g, v in product.options.items())
    first_feature = product.features[0] if product.features else ""
    # a null description indexes as no text (WebShop's index script stops on one)
    description = product.description or ""
    return " ".join([product.title, description, first_feature, option_text]).lower()


class ShopSearch:
    """BM25 over a shop's products, built in memory (a few thousand products: well under
    a second)."""

    def __init__(self, products: Sequence[Product], options: BM25Options = SHOP_BM25):
        if not products:
            raise ValueError("a search needs at least one product")
        self.options = options
        self.asins = [p.asin for p in products]
        model = bm25s.BM25(method=options.method, k1=options.k1, b=options.b)
        model.index(tokenize([product_text(p) for p in products], options), show_progress=False)
        self._vocab: dict[str, int] = model.vocab_dict
        s = model.scores
        arrays = (np.asarray(s["data"]), np.asarray(s["indices"]), np.asarray(s["indptr"]))
        self.scorer = PostingScorer(*arrays, len(products))

    def scores(self, queries: list[str]) -> np.ndarray:
        """BM25 score of every product for each query. -> (Q, products)"""
        ids = [
            np.array([self._vocab[t] for t in tokens if t in self._vocab], dtype=np.int64)
            for tokens in tokenize(queries, self.options)
        ]
        return self.scorer.scores(ids)

    def search_many(self, queries: list[str], k: int = SEARCH_RETURN_N) -> list[list[str]]:
        """The top-`k` asins of each query, best first; products sharing no word with the
        query are never returned, so a query of unknown words gets []."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        rows, _ = top_k(self.scores(queries), k)
        return [[self.asins[r] for r in row] for row in rows]

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The top-`k` asins for `keywords`, best first."""
        return self.search_many([keywords], k)[0]
