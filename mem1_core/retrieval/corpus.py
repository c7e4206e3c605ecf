"""Corpus loading, validation and fingerprinting.

A corpus is a table with columns `doc_id`, `title`, `contents` (the body, without the
title), and `passage`: the whole document as Search-R1's `contents` field, which the server
answers with. Three inputs map onto it:

- the task world's `corpus.parquet` and HotpotQA paragraphs exported to that schema (their
  `passage` is built, `"Title"\\ntext`);
- Search-R1 / FlashRAG JSON Lines, `{"id": …, "contents": "\\"Title\\"\\ntext"}` (the title
  is the first line, in double quotes), also accepted with explicit `title` / `text` keys.
  A record's `contents` is kept verbatim as its `passage`, whatever its form (a title
  without quotes, no newline, CRLF, surrounding spaces), because that string is what
  Search-R1's server sends and its agent reads.

Duplicate ids and empty documents are reported; by default they are dropped (the first
row of a duplicated id is kept) with a warning, and `on_problem="error"` refuses them.
The fingerprint hashes the cleaned content, so a Parquet file and its JSONL export of
the same documents have the same fingerprint; a `passage` is hashed only where it is not
the built `"Title"\\ntext`, so the fingerprints of such corpora (and the indexes built
from them) did not change when `passage` was added.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

CORPUS_COLUMNS = ("doc_id", "title", "contents")
"""The columns a corpus table (a world's, an exported one) must have."""
PASSAGE = "passage"
"""The column added on reading: the document as Search-R1's `contents`."""
# How many offending ids a report shows in its message; the full lists stay on the report.
_SHOWN_IDS = 5
# Rows hashed per update; only bounds memory, the digest does not depend on it.
_HASH_CHUNK = 10_000


class OnProblem(StrEnum):
    DROP = "drop"
    ERROR = "error"


@dataclass(frozen=True)
class CorpusReport:
    """Problems found while loading a corpus."""

    rows: int
    """Rows read from the file."""
    duplicate_ids: tuple[str, ...]
    """Ids of rows whose id already appeared earlier (the later rows)."""
    empty_ids: tuple[str, ...]
    """Ids of rows whose body text is blank."""

    @property
    def ok(self) -> bool:
        return not self.duplicate_ids and not self.empty_ids

    def summary(self) -> str:
        parts = []
        for name, ids in (
            ("duplicate ids", self.duplicate_ids),
            ("empty documents", self.empty_ids),
        ):
            if ids:
                shown = ", ".join(repr(i) for i in ids[:_SHOWN_IDS])
                more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
                parts.append(f"{len(ids)} {name} ({shown}{more})")
        return "; ".join(parts) if parts else "no problems"

    def to_dict(self) -> dict:
        return {
            "rows": self.rows,
            "duplicate_ids": len(self.duplicate_ids),
            "empty_documents": len(self.empty_ids),
            "dropped": len(self.duplicate_ids) + len(self.empty_ids),
        }


def format_contents(title: str, text: str) -> str:
    """Search-R1's `contents` field: `"Title"` on the first line, then the body."""
    return f'"{title}"\n{text}'


def parse_contents(contents: str) -> tuple[str, str]:
    """Inverse of `format_contents`: `(title, text)`. Without a newline there is no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest


def _read_jsonl(path: Path) -> pd.DataFrame:
    ids, titles, bodies, passages = [], [], [], []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                doc_id = row["id"] if "id" in row else row["doc_id"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a corpus record with an id ({e})") from e
            if "title" in row:
                title, body = row["title"], row.get("text", row.get("contents", ""))
            elif "contents" in row:
                title, body = parse_contents(row["contents"])
            else:
                raise ValueError(f"{path}:{lineno}: record has neither `contents` nor `title`")
            ids.append(str(doc_id))
            titles.append(str(title))
            bodies.append(str(body))
            # Verbatim: Search-R1's server answers with this field as stored.
            passages.append(
                str(row["contents"]) if "contents" in row else format_contents(titles[-1], body)
            )
    return pd.DataFrame({"doc_id": ids, "title": titles, "contents": bodies, PASSAGE: passages})


def _read_table(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    if "doc_id" not in df.columns and "id" in df.columns:
        df = df.rename(columns={"id": "doc_id"})
    missing = [c for c in CORPUS_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: corpus Parquet lacks columns {missing}; need {list(CORPUS_COLUMNS)}"
        )
    df = df[list(CORPUS_COLUMNS)]
    # Ids may be stored as ints; titles or bodies may be null. Normalise to strings.
    df = df.assign(
        doc_id=df["doc_id"].astype(str),
        title=df["title"].fillna("").astype(str),
        contents=df["contents"].fillna("").astype(str),
    )
    passages = [format_contents(t, c) for t, c in zip(df["title"], df["contents"], strict=True)]
    return df.assign(**{PASSAGE: passages})


def clean_corpus(df: pd.DataFrame) -> tuple[pd.DataFrame, CorpusReport]:
    """Drop later duplicates of an id and blank documents; report both."""
    dup = df["doc_id"].duplicated(keep="first")
    empty = df["contents"].str.strip() == ""
    report = CorpusReport(
        rows=len(df),
        duplicate_ids=tuple(df.loc[dup, "doc_id"]),
        empty_ids=tuple(df.loc[empty & ~dup, "doc_id"]),
    )
    return df.loc[~(dup | empty)].reset_index(drop=True), report


def load_corpus(
    path: str | os.PathLike, on_problem: OnProblem | str = OnProblem.DROP
) -> tuple[pd.DataFrame, CorpusReport]:
    """Read a corpus file (`.parquet`, `.jsonl`/`.json`) into the corpus schema."""
    path = Path(path)
    on_problem = OnProblem(on_problem)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if path.suffix == ".parquet":
        raw = _read_table(path)
    elif path.suffix in (".jsonl", ".json"):
        raw = _read_jsonl(path)
    else:
        raise ValueError(f"{path}: unknown corpus format; use .parquet or .jsonl")
    df, report = clean_corpus(raw)
    if not report.ok:
        if on_problem is OnProblem.ERROR:
            raise ValueError(f"{path}: {report.summary()}")
        log.warning("%s: dropped %s", path, report.summary())
    if df.empty:
        raise ValueError(f"{path}: corpus has no usable documents")
    return df, report


def read_corpus(
    path: str | os.PathLike, on_problem: OnProblem | str = OnProblem.DROP
) -> pd.DataFrame:
    """The cleaned corpus as a DataFrame with columns doc_id, title, contents, passage."""
    return load_corpus(path, on_problem)[0]


def corpus_fingerprint(df: pd.DataFrame) -> str:
    """SHA-256 over (doc_id, title, contents) of every row in order, length-prefixed so
    that no two different corpora share a byte stream, and over each `passage` that is
    not `format_contents(title, contents)` (tagged `p`, which no length prefix starts
    with, so the stream stays unambiguous). A table without `passage` hashes as built."""
    h = hashlib.sha256()
    cols = [df[c].tolist() for c in CORPUS_COLUMNS]
    cols.append(df[PASSAGE].tolist() if PASSAGE in df.columns else [None] * len(df))
    for start in range(0, len(df), _HASH_CHUNK):
        parts = []
        for doc_id, title, body, passage in zip(
            *(c[start : start + _HASH_CHUNK] for c in cols), strict=True
        ):
            for value in (doc_id, title, body):
                parts.append(f"{len(value)}:{value}")
            if passage is not None and passage != format_contents(title, body):
                parts.append(f"p{len(passage)}:{passage}")
        h.update("".join(parts).encode("utf-8"))
    return h.hexdigest()
