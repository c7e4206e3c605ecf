"""The documents of an index, stored beside it as an uncompressed Arrow IPC file and
opened memory-mapped: row i is the document at index position i, so a loaded index costs
page cache, not heap, however large the corpus.

Besides id, title and body it stores each document's `passage` (Search-R1's `contents`,
verbatim), which the server answers with. Stores written before that column existed still
load; their hits carry no passage and the server builds `"Title"\\ntext`, as it did."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.corpus import CORPUS_COLUMNS, PASSAGE
from mem1_core.runs.atomic import atomic_path

_COLUMNS = (*CORPUS_COLUMNS, PASSAGE)
_SCHEMA = pa.schema([(c, pa.large_string()) for c in _COLUMNS])


def write_docstore(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the corpus rows (columns doc_id, title, contents, passage) in index order."""
    table = pa.Table.from_pandas(df[list(_COLUMNS)], preserve_index=False).cast(_SCHEMA)
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink:
        with pa.ipc.new_file(sink, _SCHEMA) as writer:
            writer.write_table(table.combine_chunks())
    return Path(path)


class _Strings:
    """Row access to one memory-mapped large_string column without building Arrow
    scalars: a string is the UTF-8 bytes between two offsets (~10x faster per row than
    `take`, which matters when a call fetches a handful of passages)."""

    def __init__(self, column: pa.ChunkedArray):
        array = column.combine_chunks()
        if array.null_count:
            raise ValueError("docs.arrow holds null strings; rebuild the index")
        _, offsets, data = array.buffers()
        self._offsets = np.frombuffer(offsets, dtype=np.int64)[array.offset :]
        self._data = memoryview(data) if data is not None else memoryview(b"")

    def __getitem__(self, i: int) -> str:
        return str(self._data[self._offsets[i] : self._offsets[i + 1]], "utf-8")

    def take(self, rows: np.ndarray) -> list[str]:
        """The strings at `rows` (R,) -> R strings; offsets gathered once for all."""
        starts, ends = self._offsets[rows].tolist(), self._offsets[rows + 1].tolist()
        data = self._data
        return [str(data[a:b], "utf-8") for a, b in zip(starts, ends, strict=True)]

    def __len__(self) -> int:
        return len(self._offsets) - 1


class DocStore:
    """Read-only, memory-mapped documents."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        table = pa.ipc.open_file(pa.memory_map(str(self.path), "r")).read_all()
        self.doc_ids, self.titles, self.texts = (_Strings(table.column(c)) for c in CORPUS_COLUMNS)
        names = table.schema.names
        self.passages = _Strings(table.column(PASSAGE)) if PASSAGE in names else None

    def __len__(self) -> int:
        return len(self.doc_ids)

    def hits(self, rows: list[np.ndarray], scores: list[np.ndarray]) -> list[list[Hit]]:
        """Hits for several queries. rows[q], scores[q]: (k_q,) -> list of k_q hits."""
        flat = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        ids, titles, texts = (col.take(flat) for col in (self.doc_ids, self.titles, self.texts))
        passages = self.passages.take(flat) if self.passages is not None else [None] * len(ids)
        flat_scores = np.concatenate(scores).tolist() if scores else []
        hits = list(map(Hit, ids, titles, texts, flat_scores, passages))
        bounds = np.cumsum([0, *map(len, rows)]).tolist()
        return [hits[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
