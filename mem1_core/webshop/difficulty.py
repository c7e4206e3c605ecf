"""Reward and peak tokens against instruction difficulty: WebShop's stand-in for N.

A WebShop task is one objective, so the objective-scaling axis (N) is flat there. What grows
is how much an instruction asks for: its attributes plus its options (`Goal.difficulty`),
each one more thing to find, click and keep in memory. `by_difficulty` groups an evaluation's
trajectories by that count, per agent: tasks, mean reward ×100 with its standard error,
success rate, mean peak tokens; `difficulty_plot` draws reward and peak tokens against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mem1_core.evaluation.summary import standard_error  # noqa: E402
from mem1_core.runs import atomic  # noqa: E402
from mem1_core.trajectory.record import Trajectory  # noqa: E402


def by_difficulty(
    trajs_by_agent: Mapping[str, Sequence[Trajectory]], difficulty: Mapping[str, int]
) -> list[dict]:
    """One row per (agent, difficulty): tasks, reward_x100, reward_x100_se, success_rate,
    peak_tokens. difficulty: task id -> its goal's attributes plus options."""
    rows = []
    for agent, trajs in trajs_by_agent.items():
        groups: dict[int, list[Trajectory]] = {}
        for t in trajs:
            if t.task_id not in difficulty:
                raise KeyError(f"task {t.task_id!r} has no difficulty (not in the task file)")
            groups.setdefault(difficulty[t.task_id], []).append(t)
        for d in sorted(groups):
            g = groups[d]
            rewards = [t.reward for t in g]
            rows.append(
                {
                    "agent": agent,
                    "difficulty": d,
                    "tasks": len(g),
                    "reward_x100": 100.0 * sum(rewards) / len(g),
                    "reward_x100_se": 100.0 * standard_error(rewards),
                    "success_rate": sum(r == 1.0 for r in rewards) / len(g),
                    "peak_tokens": sum(t.peak_tokens for t in g) / len(g),
                }
            )
    return rows


def difficulty_plot(rows: list[dict], path: str | Path) -> Path:
    """Reward ×100 (± SE) and peak tokens against difficulty, one line per agent."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for agent in dict.fromkeys(r["agent"] for r in rows):
        mine = [r for r in rows if r["agent"] == agent]
        xs = [r["difficulty"] for r in mine]
        se = [
            0.0 if r["reward_x100_se"] != r["reward_x100_se"] else r["reward_x100_se"] for r in mine
        ]
        left.errorbar(
            xs, [r["reward_x100"] for r in mine], yerr=se, marker="o", capsize=3, label=agent
        )
        right.plot(xs, [r["peak_tokens"] for r in mine], marker="o", label=agent)
    ticks = sorted({r["difficulty"] for r in rows})
    for ax, label in ((left, "reward ×100 (± SE)"), (right, "peak tokens (mean per task)")):
        ax.set_xticks(ticks)
        ax.set_xlabel("instruction difficulty (attributes + options)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    left.set_title("Reward vs difficulty")
    right.set_title("Peak tokens vs difficulty")
    left.legend()
    fig.tight_layout()
    return atomic.write_figure(fig, path)


def write_difficulty(
    trajs_by_agent: Mapping[str, Sequence[Trajectory]], difficulty: Mapping[str, int], out_dir: Path
) -> dict[str, str]:
    """`difficulty.json` and `difficulty.png` in `out_dir`; returns their paths."""
    rows = by_difficulty(trajs_by_agent, difficulty)
    table = atomic.write_json(rows, Path(out_dir) / "difficulty.json")
    return {
        "table": str(table),
        "plot": str(difficulty_plot(rows, Path(out_dir) / "difficulty.png")),
    }
