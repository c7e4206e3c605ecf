"""Dense retrieval: a Hugging Face encoder and a FAISS inner-product index.

The paper (following Search-R1) embeds Wikipedia with e5 and searches a flat FAISS
index. Any `AutoModel`-loadable encoder works — a hub name or a local directory, both
through `from_pretrained`. e5 conventions are supported: `query: ` / `passage: `
prefixes (chosen automatically when the model name contains "e5"), mean pooling over
the attention mask, L2 normalisation (so inner product is cosine). Passages are encoded
as Search-R1 encodes them: each document's `contents` string as the corpus gave it
(`"Title"\\ntext` for corpora stored as title and body). Flat inner product is exact and the
default; HNSW is the approximate option for large corpora.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.corpus import PASSAGE
from mem1_core.retrieval.docstore import DocStore

FAISS_NAME = "faiss.index"
# Passages encoded between two additions to the FAISS index (bounds the embedding buffer).
_ADD_CHUNK = 16384


class Pooling(StrEnum):
    MEAN = "mean"
    CLS = "cls"


class FaissKind(StrEnum):
    FLAT = "flat"
    HNSW = "hnsw"


@dataclass(frozen=True)
class DenseOptions:
    """Encoder and FAISS index settings (stored resolved in the manifest)."""

    model: str = "intfloat/e5-base-v2"
    """Hugging Face hub name or local directory of the encoder."""
    query_prefix: str | None = None
    """Prepended to every query; None: "query: " for e5 models, else ""."""
    passage_prefix: str | None = None
    """Prepended to every passage; None: "passage: " for e5 models, else ""."""
    pooling: Pooling = Pooling.MEAN
    """Mean over non-padding tokens (e5, MiniLM) or the first token (CLS)."""
    normalize: bool = True
    """L2-normalise embeddings so inner product is cosine similarity."""
    max_length: int = 256
    """Tokens per passage or query; longer inputs are truncated."""
    batch_size: int = 64
    """Texts per encoder forward pass."""
    index_type: FaissKind = FaissKind.FLAT
    """Exact flat inner product, or approximate HNSW."""
    hnsw_m: int = 32
    """HNSW graph degree."""
    hnsw_ef_construction: int = 200
    """HNSW build-time candidate list size."""
    hnsw_ef_search: int = 128
    """HNSW query-time candidate list size (higher: better recall, slower)."""
    device: str = "cpu"
    """Torch device of the encoder (not stored: a GPU-built index loads on CPU)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pooling", Pooling(self.pooling))
        object.__setattr__(self, "index_type", FaissKind(self.index_type))
        if self.max_length < 2 or self.batch_size < 1:
            raise ValueError("max_length must be >= 2 and batch_size >= 1")

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> DenseOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown dense options {sorted(unknown)}; known: {sorted(known)}")
        return cls(**options).resolved()

    def resolved(self) -> DenseOptions:
        """Fill the prefixes from the model name (e5 convention)."""
        e5 = "e5" in Path(self.model).name.lower()
        return replace(
            self,
            query_prefix=("query: " if e5 else "")
            if self.query_prefix is None
            else self.query_prefix,
            passage_prefix=("passage: " if e5 else "")
            if self.passage_prefix is None
            else self.passage_prefix,
        )

    def to_manifest(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("device")
        out["pooling"], out["index_type"] = self.pooling.value, self.index_type.value
        return out


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over unmasked tokens. hidden (B, S, H), mask (B, S) -> (B, H)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


class Encoder:
    """Texts -> embeddings with a Hugging Face encoder."""

    def __init__(self, options: DenseOptions):
        from transformers import AutoModel, AutoTokenizer

        self.options = options
        self.tokenizer = AutoTokenizer.from_pretrained(options.model)
        self.model = AutoModel.from_pretrained(options.model).to(options.device).eval()

        # A fast tokenizer refuses concurrent calls ("Already borrowed"); the server
        # searches from a thread pool.
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: list[str], prefix: str, progress: tqdm | None = None) -> np.ndarray:
        """texts (N,) -> embeddings (N, H) float32, in input order."""
        with self._lock:
            return self._encode(texts, prefix, progress)

    def _encode(self, texts: list[str], prefix: str, progress: tqdm | None) -> np.ndarray:
        opts = self.options
        # Longest first, so each batch pads to similar lengths; the order is undone below.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks = []
        for start in range(0, len(texts), opts.batch_size):
            batch = [prefix + texts[i] for i in order[start : start + opts.batch_size]]
            enc = self.tokenizer(
                batch,
                padding=True,
                truncation=True,
                max_length=opts.max_length,
                return_tensors="pt",
            ).to(opts.device)
            hidden = self.model(**enc).last_hidden_state
            if opts.pooling is Pooling.MEAN:
                emb = mean_pool(hidden, enc["attention_mask"])
            else:
                emb = hidden[:, 0]
            if opts.normalize:
                emb = torch.nn.functional.normalize(emb, dim=-1)
            chunks.append(emb.float().cpu().numpy())
            if progress is not None:
                progress.update(len(batch))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if chunks:
            out[order] = np.concatenate(chunks)
        return out


def empty_faiss_index(dim: int, options: DenseOptions) -> faiss.Index:
    """An empty FAISS inner-product index of the configured kind for `dim`-dim vectors."""
    if options.index_type is FaissKind.FLAT:
        return faiss.IndexFlatIP(dim)
    index = faiss.IndexHNSWFlat(dim, options.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = options.hnsw_ef_construction
    return index


def passages(df: pd.DataFrame) -> list[str]:
    """The strings to encode: the corpus's `passage` column (see `corpus.PASSAGE`)."""
    return df[PASSAGE].tolist()


def build(df: pd.DataFrame, out_dir: Path, options: DenseOptions, show_progress: bool) -> None:
    """Encode the corpus in chunks and add each to the index as it comes, so that only
    the index itself (N x H floats for a flat one) has to fit in memory."""
    encoder = Encoder(options)
    index = empty_faiss_index(encoder.dim, options)
    texts = passages(df)
    with tqdm(total=len(texts), desc="encode passages", disable=not show_progress) as progress:
        for start in range(0, len(texts), _ADD_CHUNK):
            chunk = texts[start : start + _ADD_CHUNK]
            index.add(encoder.encode(chunk, options.passage_prefix or "", progress))
    faiss.write_index(index, str(out_dir / FAISS_NAME))


class DenseRetriever:
    """A loaded dense index; implements `Retriever`."""

    def __init__(self, index_dir: str | os.PathLike, options: DenseOptions, docs: DocStore):
        self.options = options
        self.docs = docs
        path = str(Path(index_dir) / FAISS_NAME)
        try:  # flat indexes map their vectors from disk; other kinds may refuse
            self.index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            self.index = faiss.read_index(path)
        if options.index_type is FaissKind.HNSW:
            faiss.downcast_index(self.index).hnsw.efSearch = options.hnsw_ef_search
        if self.index.ntotal != len(docs):
            raise ValueError(f"FAISS index has {self.index.ntotal} vectors, docs.arrow {len(docs)}")
        self.encoder = Encoder(options)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        k = min(k, self.index.ntotal)
        rows = [np.zeros(0, dtype=np.int64)] * len(queries)
        scores = [np.zeros(0, dtype=np.float32)] * len(queries)
        live = [i for i, q in enumerate(queries) if q.strip()]
        if live:
            emb = self.encoder.encode([queries[i] for i in live], self.options.query_prefix or "")
            s, r = self.index.search(emb, k)
            for j, i in enumerate(live):
                keep = r[j] >= 0  # HNSW pads with -1 when it finds fewer than k
                rows[i], scores[i] = r[j][keep], s[j][keep]
        return self.docs.hits(rows, scores)
