"""An evaluation cell: one agent at one N on its tasks, the unit the objective-scaling
evaluation plays, saves and resumes at.

A finished cell is two files under `<out>/trajectories/`: `<agent>_n<N>.parquet` (its
trajectories) and `<agent>_n<N>.cell.json` (its record: what played it, on which tasks, and
its wall seconds). A rerun reuses the cell only when the record still matches. The record is
also how a cell played in another process (mem1_core.evaluation.vllm_cells) comes back: that
process writes both files and this one reads them back as it reads a reused cell. No plotting
or Prefect here: the vLLM venv imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from mem1_core.rollout.loop import Task
from mem1_core.runs import atomic
from mem1_core.trajectory.record import Trajectory, read_trajectories, write_trajectories


@dataclass(frozen=True)
class Cell:
    """One agent at one N: where it is saved and the record a saved copy must match."""

    agent: str
    n: int
    tasks: list[Task]
    path: Path
    """trajectories/<agent>_n<N>.parquet"""
    record: dict[str, Any]
    """key, source, memory, scorer, task_ids (`cell_record`)."""
    policy: str | None = None
    """The agent's saved policy directory, where it has one (what another process loads)."""


def cell_record(
    key: str | None,
    source: str,
    memory: str,
    scorer: str,
    tasks: list[Task],
    settings: dict | None = None,
) -> dict:
    """What decides a cell's play: the evaluation's key (its settings, its world), the agent's
    source (its weights' identity) and memory, the scorer, and the tasks in order; with
    `settings`, the config the key hashes (JSON), which lets a cell recorded before a config
    field existed count where that field keeps its default."""
    record = {
        "key": key,
        "source": source,
        "memory": memory,
        "scorer": scorer,
        "task_ids": [t.task_id for t in tasks],
    }
    return record | ({"settings": settings} if settings is not None else {})


def _same_settings(saved: dict, wanted: dict) -> bool:
    """Two keys differ, yet the settings behind them are the same but for config fields added
    since the saved cell was played, each at its default (config_changes' rule)."""
    from mem1_core.config.loader import config_changes

    old, new = saved.get("settings"), wanted.get("settings")
    return old is not None and new is not None and not config_changes(old, new)


def trajectories_path(out_dir: str | Path, agent: str, n: int) -> Path:
    return Path(out_dir) / "trajectories" / f"{agent}_n{n}.parquet"


def record_path(traj_path: Path) -> Path:
    return traj_path.with_name(traj_path.name.removesuffix(".parquet") + ".cell.json")


def write_cell(
    trajs: list[Trajectory], seconds: float, cell: Cell, *, record: bool = True, **extra: Any
) -> None:
    """The cell's trajectories, then (with `record`) its record with its wall seconds and
    `extra` (e.g. the backend that played it): the record last, so a cell killed between the
    two files is played again."""
    write_trajectories(trajs, cell.path)
    if record:
        atomic.write_json({**cell.record, "seconds": seconds, **extra}, record_path(cell.path))


def finished_cell(cell: Cell) -> tuple[list[Trajectory], float] | None:
    """A cell an earlier run of the same evaluation (or another process) finished: its
    trajectories and wall seconds, or None when there is none or it was played by anything
    else (another key, agent source, memory, scorer or task list) or its files do not read
    back whole."""
    path, meta = cell.path, record_path(cell.path)
    if not (meta.is_file() and path.is_file()):
        return None
    try:
        saved = json.loads(meta.read_text())
        seconds = float(saved["seconds"])
        trajs = read_trajectories(path)
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException):
        return None
    exact = {k: v for k, v in cell.record.items() if k not in ("key", "settings")}
    if {k: saved.get(k) for k in exact} != exact:
        return None
    if saved.get("key") != cell.record.get("key") and not _same_settings(saved, cell.record):
        return None
    if [t.task_id for t in trajs] != cell.record["task_ids"]:
        return None
    return trajs, seconds
