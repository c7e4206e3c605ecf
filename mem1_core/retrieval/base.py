"""The retrieval contract: a `Hit`, the `Retriever` protocol and the index manifest.

The agent's `<query>` goes to a retriever and its top passages come back as `<info>`
(MEM1 §3, following Search-R1). Every retriever — BM25 or dense, in-process, over HTTP
or inside a Ray actor — answers the same batched call, so the environment never knows
which one it talks to.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mem1_core.runs.atomic import write_json

MANIFEST_NAME = "manifest.json"
DOCS_NAME = "docs.arrow"
# Bumped when the on-disk layout of an index changes; older indexes are refused.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    doc_id: str
    """The corpus id of the document."""
    title: str
    """The document title (the entity's name in the task world)."""
    text: str
    """The document body, without the title."""
    score: float
    """Retriever score; higher is better. Only comparable within one query and index."""
    passage: str | None = None
    """The whole document as the corpus gave it (Search-R1's `contents`, verbatim), which
    the server sends; None where only title and text are known (the server then sends
    `"Title"\\ntext`)."""


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers batched queries with ranked hits."""

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-`k` hits per query, best first; an empty (blank) query gets `[]`."""
        ...


class IndexKind(StrEnum):
    BM25 = "bm25"
    DENSE = "dense"


def parse_kind(kind: str | IndexKind) -> IndexKind:
    try:
        return IndexKind(kind)
    except ValueError:
        choices = ", ".join(k.value for k in IndexKind)
        raise ValueError(f"unknown index kind {kind!r}; choose one of: {choices}") from None


@dataclass(frozen=True)
class Manifest:
    """What an index directory holds and what it was built from (written last, so an
    index with a manifest is complete)."""

    kind: IndexKind
    """Which retriever reads the directory."""
    corpus_fingerprint: str
    """`corpus_fingerprint` of the cleaned corpus the index was built from."""
    documents: int
    """Number of indexed documents (rows of `docs.arrow`)."""
    options: dict[str, Any]
    """The kind's resolved build options (e.g. stemmer, encoder, FAISS index type)."""
    versions: dict[str, str]
    """Versions of the libraries that wrote the index."""
    build_seconds: float
    """Wall time of the build, corpus loading included."""
    corpus_report: dict[str, Any] = field(default_factory=dict)
    """Duplicate ids and empty documents found (and dropped) while loading the corpus."""
    format_version: int = FORMAT_VERSION
    file_bytes: dict[str, int] = field(default_factory=dict)
    """The size of every other file of the index, checked at load (`index_file_problems`),
    so a truncated or missing file is named; empty in indexes built before it."""

    def write(self, index_dir: str | os.PathLike) -> Path:
        data = asdict(self)
        data["kind"] = self.kind.value
        return write_json(data, Path(index_dir) / MANIFEST_NAME)


def read_manifest(index_dir: str | os.PathLike) -> Manifest:
    path = Path(index_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir} is not an index directory (no {MANIFEST_NAME})")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(
            f"{path} is corrupt ({e}); rebuild the index with `mem1 index --out {index_dir}`"
        ) from None
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"index {index_dir} has format version {data.get('format_version')}, this code reads "
            f"{FORMAT_VERSION}; rebuild it with `mem1 index`"
        )
    try:
        data["kind"] = parse_kind(data["kind"])
        return Manifest(**data)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"{path} is not an index manifest ({type(e).__name__}: {e}); rebuild the index "
            f"with `mem1 index --out {index_dir}`"
        ) from None


def file_sizes(index_dir: str | os.PathLike) -> dict[str, int]:
    """Relative path -> bytes of every file under `index_dir` but the manifest."""
    root = Path(index_dir)
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def index_file_problems(index_dir: str | os.PathLike, manifest: Manifest) -> list[str]:
    """Files of the index that are missing or not the size the manifest recorded."""
    problems = []
    for rel, size in manifest.file_bytes.items():
        p = Path(index_dir) / rel
        if not p.is_file():
            problems.append(f"{rel} is missing")
        elif p.stat().st_size != size:
            problems.append(f"{rel} has {p.stat().st_size} bytes, the manifest {size}")
    return problems


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of `names` (distribution names); missing ones are left out."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions
