"""The shop's search engine: BM25 over each product's text, ranked asins for keywords.

WebShop indexes one document per product with Pyserini (Lucene BM25, k1=0.9, b=0.4): the
title, the description, the first bullet point and the option text ("color: red, blue, and
size: small"), lowercased (`search_engine/convert_product_file_format.py`), and a search
returns the top 50. This module indexes the same text with our retrieval package's BM25
(bm25s's Lucene scores, `mem1_core.retrieval.postings`) with the same k1 and b.

A saved shop keeps its index beside it, in `search/` of the shop's directory: built the first
time a search needs it (from `products.jsonl`, read one product at a time) and loaded,
memory-mapped, afterwards. The index records the size and SHA-256 of the `products.jsonl` it
was built from and the BM25 options; a shop whose products changed gets a new one. A shop
held only in memory (a test's, a generated one not saved) builds its index in memory.

Where it departs from WebShop: tokens are lowercase `\\w\\w+` words without Lucene's
English analyzer (no stemming, no stop words, one-letter words dropped), so scores differ
from Pyserini's in detail; equal scores rank in catalogue order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mem1_core.retrieval.bm25 import BM25Options, PostingScorer, tokenize, top_k
from mem1_core.retrieval.postings import Postings, build_postings, load_postings, save_postings
from mem1_core.runs.atomic import atomic_dir, file_sha256
from mem1_core.webshop.catalog import PRODUCTS_FILE, Product, Shop, read_jsonl

SEARCH_RETURN_N = 50
"""Results a search returns (WebShop's `SEARCH_RETURN_N`); pages show 10 of them at a time."""
SHOP_BM25 = BM25Options(method="lucene", k1=0.9, b=0.4)
"""Pyserini's LuceneSearcher defaults, which WebShop's search engine runs with."""
SEARCH_DIR = "search"
"""A saved shop's index: a directory beside its files."""
INDEX_FORMAT = "mem1-shop-search-1"
"""Version of the saved index (the document text and the arrays); another is rebuilt."""
KEY_FILE = "key.json"
ASINS_FILE = "asins.json"
log = logging.getLogger(__name__)


def product_text(product: Product) -> str:
    """What the index holds for a product, as WebShop builds its search documents."""
    option_text = ", and ".join(f"{g}: {', '.join(v)}" for g, v in product.options.items())
    first_feature = product.features[0] if product.features else ""
    # a null description indexes as no text (WebShop's index script stops on one)
    description = product.description or ""
    return " ".join([product.title, description, first_feature, option_text]).lower()


class ShopSearch:
    """BM25 over a shop's products: `ShopSearch(products)` builds it in memory;
    `shop_search(shop)` loads a saved shop's index."""

    def __init__(self, products: Sequence[Product], options: BM25Options = SHOP_BM25):
        if not products:
            raise ValueError("a search needs at least one product")
        postings = build_postings((product_text(p) for p in products), options)
        self._use([p.asin for p in products], postings, options)

    @classmethod
    def from_postings(
        cls, asins: list[str], postings: Postings, options: BM25Options = SHOP_BM25
    ) -> ShopSearch:
        """The search over an index already built, `asins` its documents in order."""
        if len(asins) != postings.num_docs:
            raise ValueError(f"{len(asins)} asins for an index of {postings.num_docs} products")
        search = cls.__new__(cls)
        search._use(asins, postings, options)
        return search

    def _use(self, asins: list[str], postings: Postings, options: BM25Options) -> None:
        self.options, self.asins = options, asins
        self._vocab = postings.vocab
        arrays = (postings.data, postings.indices, postings.indptr)
        self.scorer = PostingScorer(*arrays, postings.num_docs)

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


def shop_search(shop: Shop, options: BM25Options = SHOP_BM25) -> ShopSearch:
    """The shop's search: its directory's saved index where it was loaded from one (and the
    directory still holds its products), else built in memory."""
    if shop.directory is not None:
        search = saved_search(shop.directory, options)
        if search.asins == [p.asin for p in shop.products]:
            return search
        # products.jsonl was replaced after this shop was loaded
        log.warning("%s holds other products than the shop loaded from it", shop.directory)
    return ShopSearch(shop.products, options)


def index_key(shop_dir: str | Path, options: BM25Options = SHOP_BM25) -> dict[str, Any]:
    """What a saved index must have been built from to serve this shop."""
    products = Path(shop_dir) / PRODUCTS_FILE
    return {
        "format": INDEX_FORMAT,
        "products": {"bytes": products.stat().st_size, "sha256": file_sha256(products)},
        "options": asdict(options),
    }


def saved_search(shop_dir: str | Path, options: BM25Options = SHOP_BM25) -> ShopSearch:
    """The search of the shop saved in `shop_dir`, from `search/` there; built and saved the
    first time, and again where `products.jsonl` or the options changed. A directory that
    cannot be written (read-only, full) leaves the index in memory, with a warning."""
    src = Path(shop_dir) / SEARCH_DIR
    key = index_key(shop_dir, options)
    try:
        if json.loads((src / KEY_FILE).read_text()) == key:
            saved = json.loads((src / ASINS_FILE).read_text())
            postings = load_postings(src, num_docs=len(saved))
            return ShopSearch.from_postings(saved, postings, options)
    except (OSError, ValueError) as e:
        if (src / KEY_FILE).exists():
            log.warning("rebuilding the shop's search index in %s: %s", src, e)
    asins: list[str] = []
    texts = _texts(read_jsonl(Path(shop_dir) / PRODUCTS_FILE, Product.from_dict), asins)
    postings = build_postings(texts, options)
    try:
        with atomic_dir(src) as tmp:
            save_postings(postings, tmp)
            (tmp / ASINS_FILE).write_text(json.dumps(asins))
            (tmp / KEY_FILE).write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
    except OSError as e:
        log.warning("could not save the shop's search index in %s (%s): kept in memory", src, e)
    return ShopSearch.from_postings(asins, postings, options)


def _texts(products: Iterable[Product], asins: list[str]) -> Iterable[str]:
    """Each product's index text, its asin appended to `asins` as it is read."""
    for p in products:
        asins.append(p.asin)
        yield product_text(p)
