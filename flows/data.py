"""Flow `compose-tasks`: build (or load) the questions and compose N-objective tasks."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task

from flows.common import build_config, publish_markdown, publish_table, run_dir
from mem1_core.compose import compose, write_tasks
from mem1_core.config import Config
from mem1_core.qa_data import load_hotpotqa, load_nq, world_questions
from mem1_core.world import generate_world, write_world


@task(name="build-world", cache_policy=None)
def build_world(cfg: Config, out: Path) -> tuple[Path, float]:
    t0 = time.perf_counter()
    write_world(generate_world(cfg.world), out)
    return out, time.perf_counter() - t0


@task(name="load-questions", retries=2, retry_delay_seconds=5, cache_policy=None)
def load_source_questions(cfg: Config, world_dir: Path | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if cfg.data.source == "world":
        return world_questions(pq.read_table(world_dir / "questions.parquet")).table
    tables = []
    if "hotpotqa" in cfg.data.source:
        tables.append(load_hotpotqa(cfg.data.hotpotqa, cfg.data.hotpotqa_config).table)
    if "nq" in cfg.data.source:
        tables.append(load_nq(cfg.data.nq).table)
    return pa.concat_tables(tables)


@task(name="compose", cache_policy=None)
def compose_one(questions, n: int, split: str | None, cfg: Config, out: Path,
                max_tasks: int | None) -> dict:
    t0 = time.perf_counter()
    table, summary = compose(questions, n, cfg.data.mode, cfg.data.seed, split,
                             max_tasks=max_tasks)
    write_tasks(table, out)
    return {"split": split or "all", **summary.to_dict(), "path": str(out),
            "seconds": round(time.perf_counter() - t0, 3),
            "sample_prompt": table["prompt"][0].as_py()}


@flow(name="compose-tasks", log_prints=True)
def compose_tasks(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    objectives: list[int] | None = None,
    runs_root: str | None = None,
) -> dict:
    """World generation / loading, then N-objective composition for each N, as artifacts."""
    cfg = build_config(profile, config_path, overrides)
    out = run_dir(runs_root, f"data-{profile}")
    world_dir = None
    if cfg.data.source == "world":
        world_dir, seconds = build_world(cfg, out / "world")
        print(f"world written to {world_dir} in {seconds:.2f}s")
    questions = load_source_questions(cfg, world_dir)
    ns = objectives or sorted({cfg.data.train_objectives, *cfg.data.eval_objectives})
    splits = ("train", "test") if cfg.data.source == "world" else (None,)
    results = []
    for split in splits:
        for n in ns:
            cap = cfg.data.max_eval_tasks if split == "test" else cfg.data.max_train_tasks
            path = out / "tasks" / f"{split or 'all'}_n{n}.parquet"
            results.append(compose_one(questions, n, split, cfg, path, cap))
    publish_table(
        f"tasks-{profile}",
        [{k: r[k] for k in ("split", "n_objectives", "tasks", "leftover_dropped", "seconds")}
         | {"sources": ", ".join(f"{s}: {c}" for s, c in r["per_source"].items())}
         for r in results],
        f"N-objective tasks composed for profile {profile}, in {out}",
    )
    sample = results[min(1, len(results) - 1)]
    publish_markdown(
        f"task-sample-{profile}",
        f"# A {sample['n_objectives']}-objective task\n\nFrom `{sample['path']}`:\n\n```\n"
        f"{sample['sample_prompt']}```\n",
        "A sample task prompt",
    )
    return {"dir": str(out), "world_dir": str(world_dir) if world_dir else None,
            "tasks": {f"{r['split']}_n{r['n_objectives']}": r["path"] for r in results}}
