"""What every stage of a run needs, built once per run directory and reused: the world (or
questions), the composed tasks, the tokenizer, the retrieval index, the policy model. The
directory's layout is mem1_core.runs.layout.RunPaths. Each piece is built only if missing,
so stages can run (and re-run) independently.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from mem1_core.config import Config
from mem1_core.data.compose import COMPOSER_VERSION, compose, write_tasks
from mem1_core.data.prompts import task_prompt
from mem1_core.data.qa_data import Loaded, load_hotpotqa, load_nq, world_questions
from mem1_core.data.world import generate_world, write_world
from mem1_core.deprecated import moved_names
from mem1_core.models.model import build_tiny_model, load_model
from mem1_core.models.tokenizer import load_tokenizer, train_tiny_tokenizer
from mem1_core.retrieval import Retriever, load_index
from mem1_core.rollout.env import QAEnvironment
from mem1_core.rollout.loop import Task, tasks_from_table
from mem1_core.runs.layout import RunPaths

__getattr__ = moved_names(__name__)  # old names (mem1_core.deprecated.MOVED)


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
    sources of DataConfig.question_source)."""
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
    import json

    meta = pq.read_schema(task_file).metadata or {}
    cap = json.loads(meta.get(b"config", b"{}")).get("max_tasks")
    return cap is None or pq.read_metadata(task_file).num_rows < cap


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


def ensure_tokenizer(cfg: Config, paths: RunPaths):
    """The run's tokenizer: a hub model's; else the base's (`model.base`: one tokenizer for
    every run and world); else the tiny tokenizer trained on the world corpus and prompts."""
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
        world = ensure_world(cfg, paths)
        corpus = pq.read_table(world / "corpus.parquet")["contents"].to_pylist()
        questions = pq.read_table(world / "questions.parquet")["question"].to_pylist()
        prompts = [task_prompt(questions[i : i + 2]) for i in range(0, len(questions), 2)]
        tok = train_tiny_tokenizer(corpus + prompts, cfg.model.tokenizer_vocab)
        from mem1_core.runs.atomic import atomic_dir

        with atomic_dir(paths.tokenizer) as tmp:
            tok.save_pretrained(tmp)
    return load_tokenizer(paths.tokenizer)


ADOPTED = "mem1-adopted-from"
"""A file in the run's tokenizer directory naming the policy it was copied from: that run
reads with the policy's tokenizer under any profile (the profile's base yields to it)."""


def adopt_init_tokenizer(cfg: Config, paths: RunPaths, init: Path | None) -> None:
    """A trained policy brings its tokenizer: a run that starts from it must tokenise with
    the same one, under any profile. The run's tokenizer is copied from `init` if it has none
    yet; a different one is an error (a model read through another tokenizer's ids is silently
    garbage: the tiny tokenizer is retrained per run directory, and its training data can
    change between versions)."""
    if init is None or not (init / "tokenizer.json").exists():
        return
    from mem1_core.models.base import resolve_base

    is_base = cfg.model.base is not None and resolve_base(cfg.model.base) == Path(init).resolve()
    theirs = load_tokenizer(init)
    if (paths.tokenizer / "tokenizer.json").exists():
        if load_tokenizer(paths.tokenizer).get_vocab() != theirs.get_vocab():
            raise ValueError(
                f"{init} was trained with another tokenizer than {paths.tokenizer}: start from "
                "a policy of this run, or use a fresh run directory (it adopts the policy's)"
            )
        return
    from mem1_core.runs.atomic import atomic_dir

    with atomic_dir(paths.tokenizer) as tmp:
        theirs.save_pretrained(tmp)
        if not is_base:
            (tmp / ADOPTED).write_text(f"{init}\n")


def index_options(cfg: Config) -> dict:
    """The index options a retrieval config implies (the encoder of a dense index)."""
    return {"model": cfg.retrieval.encoder} if cfg.retrieval.kind == "dense" else {}


def prebuilt_index(cfg: Config) -> Path:
    """`retrieval.index`, checked to be an index of `retrieval.kind`."""
    from mem1_core.retrieval import read_manifest

    index_dir = Path(cfg.retrieval.index)
    kind = read_manifest(index_dir).kind.value  # not an index: says so
    if kind != cfg.retrieval.kind:
        raise ValueError(
            f"retrieval.index={index_dir} is a {kind} index: set retrieval.kind={kind}, "
            f"or point retrieval.index at a {cfg.retrieval.kind} index"
        )
    return index_dir


def ensure_run_index(cfg: Config, paths: RunPaths) -> Path:
    """The run's index: `retrieval.index` if given (never rebuilt), else one under
    `indexes/`, reused while the corpus fingerprint is unchanged."""
    from mem1_core.retrieval import ensure_index as ensure

    if cfg.retrieval.index is not None:
        return prebuilt_index(cfg)
    index_dir, _built = ensure(
        corpus_path(cfg, paths),
        cfg.retrieval.kind,
        paths.indexes,
        show_progress=False,
        **index_options(cfg),
    )
    return index_dir


def make_retriever(cfg: Config, paths: RunPaths) -> Retriever:
    if cfg.retrieval.url:
        from mem1_core.retrieval import HttpRetriever

        return HttpRetriever(cfg.retrieval.url, outage_s=cfg.retrieval.outage_seconds)
    return load_index(ensure_run_index(cfg, paths))


def make_env(cfg: Config, paths: RunPaths, tokenizer, retriever: Retriever | None = None):
    return QAEnvironment(
        tokenizer,
        retriever or make_retriever(cfg, paths),
        cfg.retrieval.topk,
        chat_template=cfg.rollout.chat_template,
    )


def initial_policy(cfg: Config, tokenizer):
    """The starting point: the hub model, the shipped base (`model.base`), or the tiny model
    from config with random weights."""
    if cfg.model.base is not None:
        from mem1_core.models.base import check_base, resolve_base

        check_base(cfg.model.base)
        return load_model(resolve_base(cfg.model.base), cfg.model, tokenizer)
    if cfg.model.name_or_path is None:
        return build_tiny_model(cfg.model, tokenizer)
    return load_model(cfg.model.name_or_path, cfg.model, tokenizer)


def load_policy(cfg: Config, tokenizer: Any, init: Path | None, device: torch.device):
    """The policy a run starts from (`init`, else the initial policy) on `device`, in eval mode."""
    model = (
        initial_policy(cfg, tokenizer) if init is None else load_model(init, cfg.model, tokenizer)
    )
    return model.to(device).eval()


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
    if cfg.retrieval.url is None:  # a retrieval server holds its own index
        ensure_run_index(cfg, paths)
    return paths
