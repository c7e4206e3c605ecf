"""Question-answering datasets, normalised to one schema.

Sources: the generated world (`mem1_core.data.world`), HotpotQA (hub `hotpotqa/hotpot_qa`,
distractor / fullwiki, or local JSON / JSON Lines / Parquet in its row format: the original
files' `_id`, `[[title, sent_id], ...]` / `[[title, [sentences]], ...]` or the hub's
`id` and `{"title": [...], ...}` columns) and Natural Questions (FlashRAG rows
`id, question, golden_answers`, or hub `nq_open` rows `question, answer`). A source is a
row file (`.json`, `.jsonl`, `.parquet`), a local directory holding a hub dataset's snapshot (read as
the hub's, by config and split: clusters without hub access), or a hub name. All become
`QUESTIONS_SCHEMA`:
`id, source, question, golden_answers, supporting_titles` (+ `hops`, `plan`, `split` where the
source knows them). Rows with an empty question or no answer are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.config.sections import is_row_file

if TYPE_CHECKING:
    import datasets

QUESTIONS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("supporting_titles", pa.list_(pa.string())),
        ("hops", pa.int32()),
        ("plan", pa.string()),
        ("split", pa.string()),
    ]
)
FORMATS = ("hotpotqa", "nq", "world")


@dataclass
class Loaded:
    """A normalised question table and what was skipped on the way."""

    table: pa.Table
    skipped: dict[str, int] = field(default_factory=dict)
    total_rows: int = 0


def read_json_rows(path: Path) -> list[dict[str, Any]]:
    """JSON Lines, or one JSON array; a malformed line is reported with its number."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: a JSON array of objects is expected")
        return rows
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON on line {lineno}: {e.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {lineno} is not a JSON object")
        rows.append(row)
    return rows


def load_rows(
    source: str, *, config: str | None = None, split: str = "validation"
) -> list[dict[str, Any]] | datasets.Dataset:
    """A local .json/.jsonl/.parquet file (its rows as dicts), or a hub dataset `name` or a
    local snapshot directory of one (+ `config`, `split`)."""
    path = Path(source)
    if is_row_file(source):
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        # JSON rows stay plain dicts: Arrow (datasets.Dataset.from_list) wants one type per
        # list, and HotpotQA's original files mix them ([title, sent_id], [title, [sentences]]).
        rows = (
            pq.read_table(path).to_pylist() if path.suffix == ".parquet" else read_json_rows(path)
        )
        if not rows:
            raise ValueError(f"{path}: the input is empty")
        return rows
    import datasets  # heavy (~5 s): only where rows are loaded

    # A hub name, or a local directory laid out as the hub's repository (its README's
    # configs map config and split to files). Hub names are exercised only where the hub
    # is reachable (never in tests).
    return datasets.load_dataset(source, config, split=split)


def _answers(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    return [str(a).strip() for a in value if a is not None and str(a).strip()]


def _normalise(rows: datasets.Dataset | list[dict], source: str, convert) -> Loaded:
    cols: dict[str, list] = {f.name: [] for f in QUESTIONS_SCHEMA}
    skipped = {"empty_question": 0, "no_answer": 0}
    n = 0
    for i, row in enumerate(rows):
        n += 1
        rec = convert(row, i)
        if not rec["question"]:
            skipped["empty_question"] += 1
            continue
        if not rec["golden_answers"]:
            skipped["no_answer"] += 1
            continue
        for k in cols:
            cols[k].append(rec.get(k))
    if n == 0:
        raise ValueError(f"{source}: the input is empty")
    return Loaded(pa.table(cols, schema=QUESTIONS_SCHEMA), skipped, n)


def _hotpot_row(row: dict, i: int) -> dict:
    sf = row.get("supporting_facts") or {}
    titles = sf.get("title", []) if isinstance(sf, dict) else [t for t, _ in sf]
    return {
        "id": str(row.get("id") or row.get("_id") or f"hotpotqa-{i}"),
        "source": "hotpotqa",
        "question": (row.get("question") or "").strip(),
        "golden_answers": _answers(row.get("answer")),
        "supporting_titles": list(dict.fromkeys(titles)),
        "hops": 2,
        "plan": None,
        "split": None,
    }


def _nq_row(row: dict, i: int) -> dict:
    answers = row.get("golden_answers", row.get("answer"))
    return {
        "id": str(row.get("id") or f"nq-{i}"),
        "source": "nq",
        "question": (row.get("question") or "").strip(),
        "golden_answers": _answers(answers),
        "supporting_titles": [],
        "hops": 1,
        "plan": None,
        "split": None,
    }


def load_hotpotqa(source: str, config: str = "distractor", split: str = "validation") -> Loaded:
    return _normalise(load_rows(source, config=config, split=split), "hotpotqa", _hotpot_row)


def load_nq(source: str, split: str = "validation") -> Loaded:
    return _normalise(load_rows(source, split=split), "nq", _nq_row)


def world_questions(table: pa.Table) -> Loaded:
    """The world's questions table (mem1_core.data.world) in the normalised schema."""
    d = table.to_pydict()

    def conv(_row, i):
        return {
            "id": d["id"][i],
            "source": "world",
            "question": d["question"][i],
            "golden_answers": d["golden_answers"][i],
            "supporting_titles": d["supporting_titles"][i],
            "hops": d["hops"][i],
            "plan": d["plan"][i],
            "split": d["split"][i],
        }

    return _normalise(range(table.num_rows), "world", conv)


def load_questions(fmt: str, source: str, **kw: Any) -> Loaded:
    if fmt == "hotpotqa":
        return load_hotpotqa(source, **kw)
    if fmt == "nq":
        return load_nq(source, **kw)
    if fmt == "world":
        return world_questions(pq.read_table(Path(source) / "questions.parquet"))
    raise ValueError(f"unknown format {fmt!r}; choose one of {FORMATS}")


def hotpotqa_corpus(
    sources: str | Sequence[str], config: str = "distractor", split: str = "validation"
) -> pa.Table:
    """HotpotQA context paragraphs of one or more sources (e.g. the train and dev files, so
    that training questions find their paragraphs too) as a retrieval corpus
    (`doc_id, title, contents`), one document per distinct title, in first-seen order."""
    from mem1_core.data.world import CORPUS_SCHEMA

    sources = [sources] if isinstance(sources, str) else list(sources)
    seen: dict[str, str] = {}
    for source in sources:
        for row in load_rows(source, config=config, split=split):
            ctx = row.get("context") or {}
            pairs = (
                zip(ctx.get("title", []), ctx.get("sentences", []), strict=False)
                if isinstance(ctx, dict)
                else ctx
            )
            for title, sentences in pairs:
                # HotpotQA's sentences carry their own leading spaces: joined as they are
                text = "".join(sentences).strip()
                if title and text and title not in seen:
                    seen[title] = text
    if not seen:
        raise ValueError(f"{', '.join(sources)}: no context paragraphs found")
    return pa.table(
        {
            "doc_id": [f"hp{i:07d}" for i in range(len(seen))],
            "title": list(seen),
            "contents": list(seen.values()),
        },
        schema=CORPUS_SCHEMA,
    )
