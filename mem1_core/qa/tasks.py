"""A run's world and composed tasks, made by the compose stage (`mem1 compose`, the
`compose-tasks` flow) into the run directory (mem1_core.runs.layout.RunPaths: `world/`,
`tasks/{split}_n{N}.parquet`) and read there by every later stage. Each file is built only if
missing, so a stage run on its own composes what it needs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.config import Config
from mem1_core.data.compose import COMPOSER_VERSION, compose, write_tasks
from mem1_core.data.qa_data import Loaded, load_hotpotqa, load_nq, world_questions
from mem1_core.data.world import generate_world, write_world
from mem1_core.runs.layout import RunPaths


def ensure_world(cfg: Config, paths: RunPaths) -> Path:
    if not (paths.world / "questions.parquet").exists():
        write_world(generate_world(cfg.world), paths.world)
    return paths.world


def corpus_path(cfg: Config, paths: RunPaths) -> Path:
    if cfg.data.source == "world":
        return ensure_world(cfg, paths) / "corpus.parquet"
    if cfg.retrieval.corpus is None:
        raise ValueError("retrieval.corpus must name a corpus file for non-world sources")
    return Path(cfg.retrieval.corpus)


def _composed_by(path: Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    return meta.get(b"generator", b"").decode() or None


def ensure_tasks(cfg: Config, paths: RunPaths, split: str, n: int) -> Path:
    """The composed N-objective tasks of `split` (world: train/test by entity; QA data: the
    sources of DataConfig.question_source; WebShop: the goals of the split's shop,
    mem1_core.webshop.run)."""
    out = paths.task_file(split, n)
    cap = cfg.data.max_train_tasks if split == "train" else cfg.data.eval_tasks(n)
    # A file composed under a smaller cap is composed again: composition is deterministic
    # and the tasks come in the same order, so the old tasks are a prefix of the new ones.
    # A file another composer version wrote (an older prompt template) is composed again.
    if (
        out.exists()
        and _composed_by(out) == COMPOSER_VERSION
        and (cap is None or pq.read_metadata(out).num_rows >= cap or _complete(out))
    ):
        return out
    if cfg.data.source == "world":
        questions = world_questions(pq.read_table(ensure_world(cfg, paths) / "questions.parquet"))
        use_split = split
    else:
        tables = []
        if "hotpotqa" in cfg.data.source:
            source, hub_split = cfg.data.question_source("hotpotqa", split)
            tables.append(load_hotpotqa(source, cfg.data.hotpotqa_config, hub_split).table)
        if "nq" in cfg.data.source:
            tables.append(load_nq(*cfg.data.question_source("nq", split)).table)
        questions = Loaded(pa.concat_tables(tables))
        use_split = None
    table, _ = compose(
        questions.table,
        n,
        cfg.data.mode,
        cfg.data.seed,
        use_split,
        shuffle=split == "train",
        max_tasks=cap,
    )
    write_tasks(table, out)
    return out


def _complete(task_file: Path) -> bool:
    """True if a task file holds every task its questions allowed (no cap cut it)."""
    meta = pq.read_schema(task_file).metadata or {}
    cap = json.loads(meta.get(b"config", b"{}")).get("max_tasks")
    return cap is None or pq.read_metadata(task_file).num_rows < cap


def teacher_world(cfg: Config, paths: RunPaths, k: int) -> tuple[Config, RunPaths]:
    """The k-th extra world for teacher data: the same sizes and phrasing as the run's world,
    fresh names and facts (seed 10000 + 1000 * world.seed + k), under `teacher_worlds/`.

    Why: from one world the tiny model memorises its training entities instead of learning
    to copy names from the prompt and from <info> (measured: EM 0.48 on training entities vs
    0.15 on held-out ones for single-hop questions). Names that never come back make copying
    the only way to lower the loss. Only their train split is used, and none of them is the
    evaluation world, so held-out entities stay unseen."""
    seed = 10_000 + 1_000 * cfg.world.seed + k
    sub = replace(cfg, world=replace(cfg.world, seed=seed))
    return sub, RunPaths(paths.teacher_worlds / f"seed{seed}")
