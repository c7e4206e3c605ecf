"""Objective-scaling evaluation (MEM1 §5): evaluate agents on test tasks with N objectives
for each N, under a memory policy, greedy, with a turn budget that grows with N; every
trajectory to Parquet, the metrics table to Parquet and CSV, and the plots a reader wants
(peak tokens vs N per agent, EM vs N per agent, training reward curves)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: plots are files
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from mem1_core.domains.base import Units  # noqa: E402
from mem1_core.evaluation.cells import (  # noqa: E402
    Cell,
    cell_record,
    finished_cell,
    trajectories_path,
    write_cell,
)
from mem1_core.evaluation.evaluate import run_eval  # noqa: E402
from mem1_core.evaluation.summary import summarize  # noqa: E402
from mem1_core.rollout.loop import Task  # noqa: E402
from mem1_core.runs import atomic  # noqa: E402
from mem1_core.runs.progress import Progress as StageProgress  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Agent:
    """One row family of the table: a model (or the teacher) under a memory policy."""

    name: str
    memory: str
    model: object | None  # a causal LM; None with `backend` (the scripted teacher) or `load`
    backend: object | None = None
    source: str = ""
    """What the agent plays from (its weights' identity; the teacher's settings): an
    evaluation resumed with `key` reuses a cell only when this is unchanged."""
    policy: str | None = None
    """The saved policy directory `model` comes from: what another process (a vLLM engine,
    `evaluate_scaling`'s `player`) loads to play this agent's cells."""
    load: Callable[[], object] | None = None
    """Builds `model` when it is None and a cell must be played in this process: an agent
    whose cells are all reused or played elsewhere is never loaded."""
    env: object | None = None
    """Its own environment and rollout settings (an experiment's arm trained with another
    prompt plays under it); None: the evaluation's."""
    rollout: object | None = None


CellPlayer = Callable[[list[Cell], Callable[[Cell], None]], None]
"""Plays cells in another process: writes each one's files (mem1_core.evaluation.cells) and
calls back with each cell it finished; a cell it leaves unwritten is played here."""


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
    player: CellPlayer | None = None,
    settings: dict | None = None,
) -> pd.DataFrame:
    """Every agent on every N, answers scored by `scorer`; writes
    trajectories/<agent>_n<N>.parquet and metrics.{parquet,csv}.

    With `key` (what else decides the play: the settings, the world), each finished cell also
    writes trajectories/<agent>_n<N>.cell.json, and a rerun into the same `out_dir` reuses a
    cell whose record matches (key, the agent's source and memory, the scorer, the same tasks
    in the same order) instead of playing it again: an interrupted evaluation resumes at the
    cell it stopped in. Anything else is played afresh and overwritten. `settings` (the config
    the key hashes, as JSON) go into the record too, so that a cell whose key differs only by
    config fields added since, each at its default, is still reused (cells.finished_cell).

    With `player`, the cells still to play of every agent with a `policy` go to it first (the
    vLLM engine in its own venv: mem1_core.evaluation.vllm_cells); the cells it finished are
    read back from their files like reused ones, and any it did not finish play here."""
    out = Path(out_dir)
    cells = [
        Cell(agent.name, n, tasks, trajectories_path(out, agent.name, n),
             cell_record(key, agent.source, agent.memory, scorer, tasks, settings),
             agent.policy)
        for agent in agents for n, tasks in sorted(tasks_by_n.items()) if tasks
    ]  # fmt: skip
    by_name = {a.name: a for a in agents}
    total = len(agents) * sum(len(t) for t in tasks_by_n.values())
    reused = {c.path: finished_cell(c) for c in cells} if key is not None else {}
    start = sum(len(c.tasks) for c in cells if reused.get(c.path) is not None)
    watch = StageProgress("evaluation", total=total, start=start, unit="task")
    elsewhere: dict[Path, tuple] = {}
    todo = [c for c in cells if reused.get(c.path) is None and c.policy]
    if player is not None and todo:

        def played(cell: Cell) -> None:
            watch.update(watch.done + len(cell.tasks), agent=cell.agent, N=cell.n)

        player(todo, played)
        elsewhere = {c.path: done for c in todo if (done := finished_cell(c)) is not None}
    rows = []
    models: dict[str, object] = {}
    for cell in cells:
        agent = by_name[cell.agent]
        if (done := reused.get(cell.path) or elsewhere.get(cell.path)) is not None:
            trajs, seconds = done
        else:
            watch.update(watch.done, agent=agent.name, N=cell.n)
            if agent.model is None and agent.load is not None and agent.name not in models:
                models = {agent.name: agent.load()}  # one loaded policy at a time
            trajs, seconds = run_eval(
                agent.model if agent.model is not None else models.get(agent.name),
                tokenizer,
                agent.env or env,
                cell.tasks,
                agent.rollout or rollout_cfg,
                memory=agent.memory,
                backend=agent.backend,
                progress=progress,
                scorer=scorer,
            )
            engine = "hf" if agent.backend is None else type(agent.backend).__name__
            write_cell(trajs, seconds, cell, record=key is not None, backend=engine)
        rows.append(
            {
                "agent": agent.name,
                "memory": agent.memory,
                "n_objectives": cell.n,
                "scorer": scorer,
                **summarize(trajs, seconds),
            }
        )
        if cell.path not in elsewhere and reused.get(cell.path) is None:
            # the player's callback counted the cells it played; `start`, the reused ones
            watch.update(
                watch.done + len(cell.tasks), agent=agent.name, N=cell.n,
                em=round(rows[-1]["em_frac"], 3),
            )  # fmt: skip
    watch.close()
    if names := [f"{c.agent} N={c.n}" for c in cells if reused.get(c.path) is not None]:
        log.info("evaluation resumed: reused %d finished cells (%s)", len(names), ", ".join(names))
    table = pd.DataFrame(rows)
    write_table(table, out / "metrics")
    return table


def write_table(table: pd.DataFrame, stem: Path) -> None:
    atomic.write_parquet(
        pa.Table.from_pandas(table, preserve_index=False), stem.with_suffix(".parquet")
    )
    atomic.write_text(table.to_csv(index=False), stem.with_suffix(".csv"))


def _save(fig, path: Path) -> Path:
    return atomic.write_figure(fig, path)


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


def scaling_plots(
    table: pd.DataFrame, out_dir: Path, units: Units | None = None
) -> dict[str, Path]:
    """Peak tokens and the score against N, the score in the domain's `units` (QA's EM
    fraction by default; WebShop's reward ×100)."""
    units = units or Units()
    scored = table.assign(score=table["em_frac"] * units.scale)
    if "em_frac_se" in table:
        scored["score_se"] = table["em_frac_se"] * units.scale
    return {
        "peak_tokens": plot_metric_vs_n(
            table,
            "peak_tokens",
            "peak tokens (mean per task)",
            "Peak tokens vs objectives",
            out_dir / "peak_tokens.png",
        ),
        "em": plot_metric_vs_n(
            scored,
            "score",
            f"{units.column} (± standard error)",
            f"{units.column} vs {units.objective}",
            out_dir / "em.png",
            err="score_se",
        ),
    }


def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
