"""Build, persist, reload: one entry point per direction for every index kind.

An index directory holds `docs.arrow` (the cleaned corpus, memory-mapped at load), the
kind's own files, and `manifest.json` (written last). It is built in a temporary sibling
and renamed into place, so a killed build leaves no half-index behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mem1_core.retrieval.base import (
    DOCS_NAME,
    IndexKind,
    Manifest,
    Retriever,
    file_sizes,
    index_file_problems,
    library_versions,
    parse_kind,
    read_manifest,
)
from mem1_core.retrieval.corpus import CorpusReport, OnProblem, corpus_fingerprint, load_corpus
from mem1_core.retrieval.docstore import DocStore, write_docstore
from mem1_core.runs.atomic import atomic_dir


@dataclass(frozen=True)
class _Kind:
    """How one index kind parses options, builds and loads (imported lazily: the dense
    kind pulls in torch and transformers)."""

    parse: Callable[[dict[str, Any]], Any]
    to_manifest: Callable[[Any], dict[str, Any]]
    build: Callable[[pd.DataFrame, Path, Any, bool], None]
    load: Callable[[Path, Any, DocStore], Retriever]
    libraries: tuple[str, ...]


def _kind(kind: IndexKind) -> _Kind:
    if kind is IndexKind.BM25:
        from mem1_core.retrieval import bm25

        return _Kind(
            bm25.BM25Options.from_dict,
            bm25.resolved_options,
            bm25.build,
            bm25.BM25Retriever,
            ("bm25s", "PyStemmer", "numpy"),
        )
    from mem1_core.retrieval import dense

    return _Kind(
        dense.DenseOptions.from_dict,
        dense.DenseOptions.to_manifest,
        dense.build,
        dense.DenseRetriever,
        ("faiss-cpu", "torch", "transformers", "tokenizers"),
    )


def options_digest(kind: IndexKind | str, options: dict[str, Any]) -> str:
    """Short hash of the resolved options: part of a cache key beside the fingerprint."""
    k = parse_kind(kind)
    resolved = _kind(k).to_manifest(_kind(k).parse(options))
    blob = json.dumps({"kind": k.value, **resolved}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_index(
    corpus_path: str | os.PathLike,
    kind: IndexKind | str,
    out_dir: str | os.PathLike,
    *,
    on_problem: OnProblem | str = OnProblem.DROP,
    show_progress: bool = True,
    **options: Any,
) -> Path:
    """Build an index of `kind` over the corpus file and write it to `out_dir` (replaced
    whole if it exists). `options` are the kind's options (`BM25Options`, `DenseOptions`)."""
    start = time.perf_counter()
    _kind(parse_kind(kind)).parse(options)  # bad options fail before the corpus is read
    df, report = load_corpus(corpus_path, on_problem)
    return _build(df, report, kind, out_dir, start, show_progress, options)


def _build(
    df: pd.DataFrame,
    report: CorpusReport,
    kind: IndexKind | str,
    out_dir: str | os.PathLike,
    start: float,
    show_progress: bool,
    options: dict[str, Any],
) -> Path:
    kind = parse_kind(kind)
    spec = _kind(kind)
    parsed = spec.parse(options)
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        write_docstore(df, tmp / DOCS_NAME)
        spec.build(df, tmp, parsed, show_progress)
        Manifest(
            kind=kind,
            corpus_fingerprint=corpus_fingerprint(df),
            documents=len(df),
            options=spec.to_manifest(parsed),
            versions=library_versions("mem1", *spec.libraries),
            build_seconds=round(time.perf_counter() - start, 3),
            corpus_report=report.to_dict(),
            file_bytes=file_sizes(tmp),
        ).write(tmp)
    return out_dir


def load_index(
    index_dir: str | os.PathLike,
    corpus_path: str | os.PathLike | None = None,
    *,
    device: str | None = None,
) -> Retriever:
    """Load an index (its kind read from the manifest). With `corpus_path`, refuse the
    index unless that corpus has the fingerprint the index was built from. `device`
    places a dense encoder (default cpu)."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    if corpus_path is not None:
        fingerprint = corpus_fingerprint(load_corpus(corpus_path)[0])
        if fingerprint != manifest.corpus_fingerprint:
            raise ValueError(
                f"index {index_dir} was built from a different corpus than {corpus_path} "
                f"(fingerprint {manifest.corpus_fingerprint[:12]} vs {fingerprint[:12]}); "
                "rebuild it with `mem1 index`"
            )
    spec = _kind(manifest.kind)
    options = dict(manifest.options)
    if manifest.kind is IndexKind.DENSE and device is not None:
        options["device"] = device
    rebuild = f"rebuild it with `mem1 index --corpus CORPUS --kind {manifest.kind.value} --out {index_dir}`"
    if problems := index_file_problems(index_dir, manifest):
        raise ValueError(f"index {index_dir} is corrupt: {'; '.join(problems)}; {rebuild}")
    try:
        docs = DocStore(index_dir / DOCS_NAME)
    except (OSError, ValueError) as e:  # pyarrow's errors are both
        raise ValueError(f"index {index_dir}: {DOCS_NAME} is unreadable ({e}); {rebuild}") from e
    if len(docs) != manifest.documents:
        raise ValueError(
            f"index {index_dir}: {DOCS_NAME} has {len(docs)} rows, the manifest "
            f"{manifest.documents}; {rebuild}"
        )
    parsed = spec.parse(options)
    try:
        return spec.load(index_dir, parsed, docs)
    except Exception as e:  # noqa: BLE001 - each kind's library fails its own way
        if isinstance(e, ImportError):
            raise
        raise ValueError(
            f"index {index_dir} is corrupt or incomplete ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:300] if str(e) else 'no message'}); {rebuild}"
        ) from e


def index_size_bytes(index_dir: str | os.PathLike) -> int:
    return sum(p.stat().st_size for p in Path(index_dir).rglob("*") if p.is_file())


def ensure_index(
    corpus_path: str | os.PathLike,
    kind: IndexKind | str,
    root: str | os.PathLike,
    *,
    show_progress: bool = True,
    **options: Any,
) -> tuple[Path, bool]:
    """The index of `corpus_path` under `root`, built only if no index with the same corpus
    fingerprint and options exists. Returns (index_dir, built_now)."""
    start = time.perf_counter()
    kind = parse_kind(kind)
    df, report = load_corpus(corpus_path)
    fingerprint = corpus_fingerprint(df)
    index_dir = Path(root) / f"{kind.value}-{fingerprint[:16]}-{options_digest(kind, options)}"
    try:
        manifest = read_manifest(index_dir)
        if manifest.corpus_fingerprint == fingerprint and not index_file_problems(
            index_dir, manifest
        ):
            return index_dir, False
    except (FileNotFoundError, ValueError):
        pass  # absent, corrupt or from an older format: rebuild
    _build(df, report, kind, index_dir, start, show_progress, options)
    return index_dir, True
