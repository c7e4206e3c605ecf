"""N-objective task composition (MEM1 §4.1): N independent questions joined into one task
whose answer is `a1; a2; …; aN`.

Grouping modes:
- `per_source`: consecutive questions of one source, as the paper (its multi-objective sets
  join consecutive questions of one dataset); `shuffle=True` shuffles within each source first.
  The tasks of the sources alternate (one of each source in turn), so a cap keeps the mix.
- `mixed`: a seeded shuffle across sources, then consecutive chunks.
Leftovers that do not fill a task are dropped and counted.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mem1_core.data.prompts import task_prompt
from mem1_core.runs import atomic

COMPOSER_VERSION = "compose-3"
"""Written into every task file; compose-2: per_source tasks alternate between sources."""
MODES = ("per_source", "mixed")

TASKS_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("sources", pa.list_(pa.string())),
        ("n_objectives", pa.int32()),
        ("question_ids", pa.list_(pa.string())),
        ("questions", pa.list_(pa.string())),
        ("golden_answers", pa.list_(pa.list_(pa.string()))),
        ("supporting_titles", pa.list_(pa.list_(pa.string()))),
        ("hops", pa.list_(pa.int32())),
        ("plans", pa.list_(pa.string())),
        ("prompt", pa.string()),
        ("split", pa.string()),
        ("seed", pa.int64()),
    ]
)


@dataclass
class ComposeSummary:
    n_objectives: int
    mode: str
    tasks: int = 0
    questions_in: int = 0
    leftover_dropped: int = 0
    per_source: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def compose(
    questions: pa.Table,
    n_objectives: int,
    mode: str = "per_source",
    seed: int = 0,
    split: str | None = None,
    shuffle: bool = False,
    max_tasks: int | None = None,
) -> tuple[pa.Table, ComposeSummary]:
    """Group normalised questions (qa_data.QUESTIONS_SCHEMA) into N-objective tasks.

    `split` keeps only rows of that split (rows without a split are kept for any split name
    only when the table has no split information at all)."""
    if n_objectives < 1:
        raise ValueError(f"objectives must be >= 1 (got {n_objectives})")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {MODES}")
    rows = questions.to_pylist()
    if not rows:
        raise ValueError("no questions to compose: the input is empty")
    if split is not None:
        known = any(r.get("split") for r in rows)
        if known:
            rows = [r for r in rows if r.get("split") == split]
            if not rows:
                raise ValueError(f"no questions in split {split!r}")
    if len(rows) < n_objectives:
        raise ValueError(
            f"only {len(rows)} question(s) available, fewer than objectives={n_objectives}"
        )
    rng = random.Random(seed)
    groups: list[list[dict]] = []
    summary = ComposeSummary(n_objectives, mode, questions_in=len(rows))
    if mode == "per_source":
        by_source: dict[str, list[dict]] = {}
        for r in rows:
            by_source.setdefault(r["source"], []).append(r)
        per_source: list[list[list[dict]]] = []
        for src_rows in by_source.values():
            if shuffle:
                rng.shuffle(src_rows)
            full = len(src_rows) // n_objectives * n_objectives
            summary.leftover_dropped += len(src_rows) - full
            per_source.append(
                [src_rows[i : i + n_objectives] for i in range(0, full, n_objectives)]
            )
        # Tasks of the sources in turn, so that `max_tasks` keeps the mix: source after source,
        # without it the paper profile's 128 test tasks per N were all HotpotQA's.
        groups = [g for turn in itertools.zip_longest(*per_source) for g in turn if g is not None]
    else:
        rng.shuffle(rows)
        full = len(rows) // n_objectives * n_objectives
        summary.leftover_dropped = len(rows) - full
        groups = [rows[i : i + n_objectives] for i in range(0, full, n_objectives)]
    if max_tasks is not None:
        groups = groups[:max_tasks]
    if not groups:
        raise ValueError("no task could be filled: too few questions per source")

    cols: dict[str, list] = {f.name: [] for f in TASKS_SCHEMA}
    for i, g in enumerate(groups):
        qs = [r["question"] for r in g]
        cols["task_id"].append(f"n{n_objectives}-{split or 'all'}-s{seed}-{i:06d}")
        cols["sources"].append([r["source"] for r in g])
        cols["n_objectives"].append(n_objectives)
        cols["question_ids"].append([r["id"] for r in g])
        cols["questions"].append(qs)
        cols["golden_answers"].append([list(r["golden_answers"]) for r in g])
        cols["supporting_titles"].append([list(r.get("supporting_titles") or []) for r in g])
        cols["hops"].append([int(r.get("hops") or 1) for r in g])
        cols["plans"].append([r.get("plan") or "[]" for r in g])
        cols["prompt"].append(task_prompt(qs))
        splits = {r.get("split") for r in g}
        cols["split"].append(splits.pop() if len(splits) == 1 else (split or "mixed"))
        cols["seed"].append(seed)
        for r in g:
            summary.per_source[r["source"]] = summary.per_source.get(r["source"], 0) + 1
    summary.tasks = len(groups)
    meta = {
        b"generator": COMPOSER_VERSION.encode(),
        b"config": json.dumps(
            {
                "n_objectives": n_objectives,
                "mode": mode,
                "seed": seed,
                "split": split,
                "shuffle": shuffle,
                "max_tasks": max_tasks,
            },
            sort_keys=True,
        ).encode(),
    }
    return pa.table(cols, schema=TASKS_SCHEMA).replace_schema_metadata(meta), summary


def write_tasks(table: pa.Table, path: str | Path) -> Path:
    return atomic.write_parquet(table, path)
