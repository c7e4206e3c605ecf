"""A run's inputs, from its domain: the tasks as the rollout reads them (checked task files), the
run's tokenizer, and `prepare`: everything a training or evaluation stage reads from the run
directory, made where missing (the domain's tasks, the tokenizer, the index of a domain that
searches one), so a stage can run on its own. Nothing here asks which domain runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.config import Config
from mem1_core.domains.registry import domain_of
from mem1_core.models.policy import ADOPTED, adopt_init_tokenizer
from mem1_core.models.tokenizer import load_tokenizer, train_tiny_tokenizer
from mem1_core.rollout.loop import Task, tasks_from_table
from mem1_core.runs.atomic import atomic_dir
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
    return read_task_file(domain_of(cfg).ensure_tasks(cfg, paths, split, n))


def prepare(cfg: Config, root: str | Path) -> RunPaths:
    """Build everything a run needs that is still missing; returns the paths."""
    paths = RunPaths(Path(root).resolve())
    paths.root.mkdir(parents=True, exist_ok=True)
    domain = domain_of(cfg)
    domain.ensure_tasks(cfg, paths, "train", cfg.data.train_objectives)
    for n in cfg.sft.warm_start_objectives:
        domain.ensure_tasks(cfg, paths, "train", n)
    for n in cfg.data.eval_objectives:
        domain.ensure_tasks(cfg, paths, "test", n)
    ensure_tokenizer(cfg, paths)
    if domain.uses_index(cfg):  # not a server's or a search API's
        domain.ensure_index(cfg, paths)
    return paths


def ensure_tokenizer(cfg: Config, paths: RunPaths):
    """The run's tokenizer: a hub model's; else the base's (`model.base`: one tokenizer for
    every run and world); else the tiny tokenizer fitted on its domain's texts (QA: the world's
    corpus and prompts; WebShop: the training shop's text and pages)."""
    if (paths.tokenizer / ADOPTED).is_file():  # a policy's own: the profile's model yields
        return load_tokenizer(paths.tokenizer)
    if cfg.model.name_or_path is not None:
        return load_tokenizer(cfg.model.name_or_path)
    if cfg.model.base is not None:
        from mem1_core.models.base import check_base, resolve_base

        check_base(cfg.model.base)
        adopt_init_tokenizer(cfg, paths, resolve_base(cfg.model.base))
        return load_tokenizer(paths.tokenizer)
    if not (paths.tokenizer / "tokenizer.json").exists():
        texts = domain_of(cfg).tokenizer_texts(cfg, paths)
        tok = train_tiny_tokenizer(texts, cfg.model.tokenizer_vocab)
        with atomic_dir(paths.tokenizer) as tmp:
            tok.save_pretrained(tmp)
    return load_tokenizer(paths.tokenizer)


def make_env(cfg: Config, paths: RunPaths, tokenizer, retriever=None):
    """The run's environment, from its domain (QA: with its retriever, the run's index, a
    server at `retrieval.url`, or the one given; WebShop: the run's shops)."""
    return domain_of(cfg).make_env(cfg, paths, tokenizer, retriever)
