"""A run's tasks as the rollout reads them (checked task files), and `prepare`: everything a
training or evaluation stage reads from the run directory, made where missing (tasks by
mem1_core.data.run_tasks, the tokenizer by mem1_core.models.policy, the index by
mem1_core.retrieval.run_index), so a stage can run on its own."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.config import Config
from mem1_core.data.run_tasks import ensure_tasks
from mem1_core.models.policy import ensure_tokenizer
from mem1_core.retrieval.run_index import ensure_run_index
from mem1_core.rollout.loop import Task, tasks_from_table
from mem1_core.runs.layout import RunPaths

TASK_COLUMNS = ("task_id", "prompt", "questions", "golden_answers")
"""The columns a task file must have (`plans` is optional); `mem1 compose` writes them all."""


def read_task_file(path: Path) -> list[Task]:
    """The tasks of a task Parquet, or a ValueError naming the file and how to fix it."""
    fix = f"write it with `mem1 compose ... --out {path}`, or delete it to have it composed again"
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path} is not a readable Parquet file ({e}); {fix}") from e
    missing = [c for c in TASK_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"{path} lacks the task column(s) {missing} (it has {table.column_names}); {fix}"
        )
    return tasks_from_table(table)


def load_tasks(cfg: Config, paths: RunPaths, split: str, n: int) -> list[Task]:
    return read_task_file(ensure_tasks(cfg, paths, split, n))


def prepare(cfg: Config, root: str | Path) -> RunPaths:
    """Build everything a run needs that is still missing; returns the paths."""
    paths = RunPaths(Path(root).resolve())
    paths.root.mkdir(parents=True, exist_ok=True)
    ensure_tasks(cfg, paths, "train", cfg.data.train_objectives)
    for n in cfg.sft.warm_start_objectives:
        ensure_tasks(cfg, paths, "train", n)
    for n in cfg.data.eval_objectives:
        ensure_tasks(cfg, paths, "test", n)
    ensure_tokenizer(cfg, paths)
    if cfg.retrieval.url is None and cfg.env.kind == "qa":  # a server holds its own index
        ensure_run_index(cfg, paths)
    return paths
