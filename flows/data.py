"""Flow `compose-tasks`: build (or load) the questions and compose N-objective tasks, in the
run layout of mem1_core.qa.tasks (world/, tasks/{split}_n{N}.parquet)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect import flow, task

from flows.common import build_config, publish_markdown, publish_table, run_dir, stage_run_name
from mem1_core.config import Config
from mem1_core.runs.layout import RunPaths


@task(name="build-world", cache_policy=None)
def prepare_data(cfg: Config, paths: RunPaths) -> tuple[Path | None, float]:
    """What the run's domain builds before its tasks (the embedded world), and its seconds."""
    from mem1_core.domains.registry import domain_of

    t0 = time.perf_counter()
    return domain_of(cfg).prepare_data(cfg, paths), time.perf_counter() - t0


@task(name="compose", retries=2, retry_delay_seconds=5, cache_policy=None)
def compose_one(cfg: Config, paths: RunPaths, split: str, n: int) -> dict:
    """Compose (or reuse) one task file; retried because hub datasets load over the network."""
    from mem1_core.domains.registry import domain_of

    t0 = time.perf_counter()
    path = domain_of(cfg).ensure_tasks(cfg, paths, split, n)
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    return {
        "split": split,
        "n_objectives": n,
        "tasks": table.num_rows,
        "path": str(path),
        "seconds": round(time.perf_counter() - t0, 3),
        "sources": ", ".join(sorted({s for row in table["sources"].to_pylist() for s in row})),
        "generator": meta.get(b"generator", b"").decode(),
        "sample_prompt": table["prompt"][0].as_py(),
    }


@flow(name="compose-tasks", flow_run_name=stage_run_name, log_prints=True)
def compose_tasks(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    objectives: list[int] | None = None,
    runs_root: str | None = None,
    out_dir: str | None = None,
    config: dict[str, Any] | None = None,
) -> dict:
    """World generation / loading, then N-objective composition for each N, as artifacts.
    With `out_dir` (the pipeline's run directory) the files go there; else under
    `runs_root/data-<profile>`. `config`: the parent flow's resolved config (built once)."""
    cfg = build_config(profile, config_path, overrides, config)
    paths = RunPaths(Path(out_dir).resolve() if out_dir else run_dir(runs_root, f"data-{profile}"))
    world_dir = None
    world_dir, seconds = prepare_data(cfg, paths)  # QA's world; WebShop: its tasks bring shops
    if world_dir is not None:
        print(f"world ready in {world_dir} ({seconds:.2f}s)")
    # N=1 is the warm start's (QA); a WebShop task is one objective, N=1 only
    train_ns = sorted({cfg.data.train_objectives, 1, *(objectives or [])})
    test_ns = sorted({cfg.data.train_objectives, *cfg.data.eval_objectives, *(objectives or [])})
    results = [compose_one(cfg, paths, "train", n) for n in train_ns]
    results += [compose_one(cfg, paths, "test", n) for n in test_ns]
    publish_table(
        f"tasks-{profile}",
        [
            {k: r[k] for k in ("split", "n_objectives", "tasks", "sources", "seconds")}
            for r in results
        ],
        f"N-objective tasks composed for profile {profile}, in {paths.tasks}",
    )
    sample = next((r for r in results if r["n_objectives"] == 2), results[0])
    publish_markdown(
        f"task-sample-{profile}",
        f"# A {sample['n_objectives']}-objective task\n\nFrom `{sample['path']}`:\n\n```\n"
        f"{sample['sample_prompt']}```\n",
        "A sample task prompt",
    )
    return {
        "dir": str(paths.root),
        "world_dir": str(world_dir) if world_dir else None,
        "tasks": {f"{r['split']}_n{r['n_objectives']}": r["path"] for r in results},
    }
