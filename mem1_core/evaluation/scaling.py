"""Objective-scaling evaluation (MEM1 §5): evaluate agents on test tasks with N objectives
for each N, under a memory policy, greedy, with a turn budget that grows with N; every
trajectory to Parquet, the metrics table to Parquet and CSV, and the plots a reader wants
(peak tokens vs N per agent, EM vs N per agent, training reward curves)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from mem1_core.evaluation.evaluate import run_eval  # noqa: E402
from mem1_core.evaluation.summary import summarize  # noqa: E402
from mem1_core.rollout.loop import Task  # noqa: E402
from mem1_core.runs import atomic  # noqa: E402
from mem1_core.runs.progress import Progress as StageProgress  # noqa: E402
from mem1_core.trajectory.record import read_trajectories, write_trajectories  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Agent:
    """One row family of the table: a model (or the teacher) under a memory policy."""

    name: str
    memory: str
    model: object | None  # a causal LM; None with `backend` (the scripted teacher)
    backend: object | None = None
    source: str = ""
    """What the agent plays from (its weights' identity; the teacher's settings): an
    evaluation resumed with `key` reuses a cell only when this is unchanged."""


def evaluate_scaling(
    agents: list[Agent],
    tokenizer,
    env,
    tasks_by_n: dict[int, list[Task]],
    rollout_cfg,
    out_dir: str | Path,
    progress: bool = True,
    scorer: str = "squad",
    key: str | None = None,
) -> pd.DataFrame:
    """Every agent on every N, answers scored by `scorer`; writes
    trajectories/<agent>_n<N>.parquet and metrics.{parquet,csv}.

    With `key` (what else decides the play: the settings, the world), each finished cell also
    writes trajectories/<agent>_n<N>.cell.json, and a rerun into the same `out_dir` reuses a
    cell whose record matches (key, the agent's source and memory, the scorer, the same tasks
    in the same order) instead of playing it again: an interrupted evaluation resumes at the
    cell it stopped in. Anything else is played afresh and overwritten."""
    out = Path(out_dir)
    rows = []
    total = len(agents) * sum(len(t) for t in tasks_by_n.values())
    watch = StageProgress("evaluation", total=total, unit="task")
    reused = []
    for agent in agents:
        for n, tasks in sorted(tasks_by_n.items()):
            if not tasks:
                continue
            traj_path = out / "trajectories" / f"{agent.name}_n{n}.parquet"
            record = {
                "key": key,
                "source": agent.source,
                "memory": agent.memory,
                "scorer": scorer,
                "task_ids": [t.task_id for t in tasks],
            }
            done = _finished_cell(traj_path, record) if key is not None else None
            if done is not None:
                trajs, seconds = done
                reused.append(f"{agent.name} N={n}")
            else:
                watch.update(watch.done, agent=agent.name, N=n)
                trajs, seconds = run_eval(
                    agent.model,
                    tokenizer,
                    env,
                    tasks,
                    rollout_cfg,
                    memory=agent.memory,
                    backend=agent.backend,
                    progress=progress,
                    scorer=scorer,
                )
                write_trajectories(trajs, traj_path)
                if key is not None:
                    atomic.write_json({**record, "seconds": seconds}, _cell_path(traj_path))
            rows.append(
                {
                    "agent": agent.name,
                    "memory": agent.memory,
                    "n_objectives": n,
                    "scorer": scorer,
                    **summarize(trajs, seconds),
                }
            )
            watch.update(
                watch.done + len(tasks), agent=agent.name, N=n, em=round(rows[-1]["em_frac"], 3)
            )
    watch.close()
    if reused:
        log.info(
            "evaluation resumed: reused %d finished cells (%s)", len(reused), ", ".join(reused)
        )
    table = pd.DataFrame(rows)
    write_table(table, out / "metrics")
    return table


def _cell_path(traj_path: Path) -> Path:
    return traj_path.with_name(traj_path.name.removesuffix(".parquet") + ".cell.json")


def _finished_cell(traj_path: Path, record: dict) -> tuple[list, float] | None:
    """A cell an earlier run of the same evaluation finished: its trajectories and wall
    seconds, or None when there is none or it was played by anything else (another key,
    agent source, memory, scorer or task list) or its files do not read back whole."""
    cell = _cell_path(traj_path)
    if not (cell.is_file() and traj_path.is_file()):
        return None
    try:
        saved = json.loads(cell.read_text())
        seconds = float(saved["seconds"])
        trajs = read_trajectories(traj_path)
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException):
        return None
    if {k: saved.get(k) for k in record} != record:
        return None
    if [t.task_id for t in trajs] != record["task_ids"]:
        return None
    return trajs, seconds


def write_table(table: pd.DataFrame, stem: Path) -> None:
    atomic.write_parquet(
        pa.Table.from_pandas(table, preserve_index=False), stem.with_suffix(".parquet")
    )
    atomic.write_text(table.to_csv(index=False), stem.with_suffix(".csv"))


def _save(fig, path: Path) -> Path:
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_metric_vs_n(
    table: pd.DataFrame,
    metric: str,
    ylabel: str,
    title: str,
    path: Path,
    logy: bool = False,
    err: str | None = None,
) -> Path:
    """One line per agent over N; `err` names a standard-error column drawn as error bars."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for agent, g in table.groupby("agent", sort=False):
        g = g.sort_values("n_objectives")
        yerr = g[err].fillna(0) if err and err in g else None
        ax.errorbar(g["n_objectives"], g[metric], yerr=yerr, marker="o", capsize=3, label=agent)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["n_objectives"].unique()))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("objectives per task (N)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_curves(
    curves: dict[str, list[dict]], x: str, y: str, ylabel: str, title: str, path: Path
) -> Path:
    """Training curves (e.g. reward per iteration) of several runs on one plot."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in curves.items():
        pts = [(r[x], r[y]) for r in rows if r.get(y) is not None and r.get(x) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=".", label=name)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def held_out_series(evals: list[dict]) -> dict[int, list[tuple[int, float, float]]]:
    """Per N, the (step, EM, SE) points of a base's held-out evaluations (`em_n{N}` and
    `se_n{N}` keys, as `mem1 pretrain` records them), in step order; a point that did not
    measure an N is left out of that N's series."""
    series: dict[int, list[tuple[int, float, float]]] = {}
    for row in sorted(evals, key=lambda r: r["step"]):
        for key, em in row.items():
            if key.startswith("em_n"):
                n = int(key[4:])
                series.setdefault(n, []).append((row["step"], em, row.get(f"se_n{n}", 0.0)))
    return dict(sorted(series.items()))


def plot_base_curves(bases: dict[str, dict], path: Path) -> Path:
    """Pretraining curves of one or more bases: held-out EM (± standard error, shaded) over
    steps, one panel per N, one line per base; the training loss in the last panel.
    `bases` maps a name to a manifest-like dict with `held_out` and `curve`."""
    per_base = {name: held_out_series(b.get("held_out", [])) for name, b in bases.items()}
    ns = sorted({n for s in per_base.values() for n in s})
    fig, axes = plt.subplots(1, len(ns) + 1, figsize=(3.2 * (len(ns) + 1), 3.2), squeeze=False)
    axes = axes[0]
    for ax, n in zip(axes, ns, strict=False):
        for name, series in per_base.items():
            pts = series.get(n)
            if not pts:
                continue
            steps, em, se = (list(c) for c in zip(*pts, strict=True))
            (line,) = ax.plot(steps, em, marker=".", label=name)
            lo = [max(0.0, e - s) for e, s in zip(em, se, strict=True)]
            hi = [min(1.0, e + s) for e, s in zip(em, se, strict=True)]
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"held-out EM, N={n}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    loss_ax = axes[-1]
    for name, b in bases.items():
        pts = [(r["step"], r["loss"]) for r in b.get("curve", []) if r.get("loss") is not None]
        if pts:
            loss_ax.plot(*zip(*pts, strict=True), label=name, linewidth=0.8)
    loss_ax.set_yscale("log")
    loss_ax.set_title("training loss")
    loss_ax.set_xlabel("step")
    loss_ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return _save(fig, path)


def scaling_plots(table: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    return {
        "peak_tokens": plot_metric_vs_n(
            table,
            "peak_tokens",
            "peak tokens (mean per task)",
            "Peak tokens vs objectives",
            out_dir / "peak_tokens.png",
        ),
        "em": plot_metric_vs_n(
            table,
            "em_frac",
            "EM fraction (± standard error)",
            "Exact match vs objectives",
            out_dir / "em.png",
            err="em_frac_se",
        ),
    }


def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
