"""One summary of a batch of trajectories: the task-level means that training logs every
iteration (metrics.jsonl, `eval/*` for its held-out rollouts) and evaluation writes per agent
and N (eval/metrics.{parquet,csv}), under one set of names (docs/design.md §5)."""

from __future__ import annotations

from collections.abc import Sequence

from mem1_core.data.metrics import unknown_rate
from mem1_core.rollout.recall import recall_count
from mem1_core.trajectory.record import Trajectory

TRAINING_NAMES: dict[str, str] = {"reward": "em_frac", "f1": "f1_frac", "answered": "answered_rate"}
"""The names training's metrics.jsonl has always used for three of the means (old name ->
summary name); its records carry both."""


def summarize(trajs: Sequence[Trajectory], seconds: float | None = None) -> dict[str, float]:
    """Task-level means of `trajs` (0 for an empty batch); with `seconds` (their wall time)
    also the time per task."""
    n = max(len(trajs), 1)
    turns = sum(len(t.turns) for t in trajs)
    out = {
        "tasks": len(trajs),
        "em_sum": sum(t.em_sum for t in trajs) / n,
        "em_frac": sum(t.reward for t in trajs) / n,
        "em_frac_se": standard_error([t.reward for t in trajs]),
        "f1_sum": sum(sum(t.f1) for t in trajs) / n,
        "f1_frac": sum(sum(t.f1) / max(len(t.f1), 1) for t in trajs) / n,
        "answered_rate": sum(t.answer is not None for t in trajs) / n,
        "unknown_rate": unknown_rate([t.answer for t in trajs]),
        "format_error_rate": sum(t.format_errors for t in trajs) / max(turns, 1),
        "turns": turns / n,
        "recalls": sum(recall_count(t) for t in trajs) / n,  # 0 but under mem1+recall
        "peak_tokens": sum(t.peak_tokens for t in trajs) / n,
        "peak_tokens_se": standard_error([float(t.peak_tokens) for t in trajs]),
        # MIT-MI/MEM1 inference/eval.py averages peak tokens only over tasks with EM > 0 (its
        # compute_peak_token_* return None otherwise): the paper's figure, kept beside ours
        "peak_tokens_credited": _mean([float(t.peak_tokens) for t in trajs if t.em_sum > 0]),
        "credited_tasks": sum(t.em_sum > 0 for t in trajs),
        "peak_tokens_max": max((t.peak_tokens for t in trajs), default=0),
        "dependency": sum(t.dependency for t in trajs) / n,
        "gen_tokens": float(sum(len(x.gen_ids) for t in trajs for x in t.turns)),
    }
    scored = [t.score for t in trajs if t.score is not None]
    if scored:  # a domain with its own reward (WebShop): the paper's columns for it
        out["reward_x100"] = 100.0 * sum(scored) / len(scored)
        out["reward_x100_se"] = 100.0 * standard_error(scored)
        out["success_rate"] = sum(s == 1.0 for s in scored) / len(scored)
    if seconds is not None:
        out["seconds_per_task"] = seconds / n
    return out


def _mean(xs: list[float]) -> float:
    """The mean (NaN for none: no task to average over, not a peak of 0)."""
    return sum(xs) / len(xs) if xs else float("nan")


def standard_error(xs: list[float]) -> float:
    """The standard error of the mean over tasks (NaN below two tasks: no spread to see)."""
    if len(xs) < 2:
        return float("nan")
    mean = sum(xs) / len(xs)
    return (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5


def numeric_metrics(record: dict) -> dict[str, int | float]:
    """The numeric entries of a record (int or float, not bool): what a metrics table shows."""
    return {
        k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def training_summary(trajs: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """`summarize` under `prefix`, plus the training names of `TRAINING_NAMES`."""
    means = summarize(trajs)
    means |= {old: means[new] for old, new in TRAINING_NAMES.items()}
    return {f"{prefix}{k}": v for k, v in means.items()}
