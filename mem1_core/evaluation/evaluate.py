"""Evaluation: greedy rollouts of a policy on held-out tasks and the metrics of docs/design.md §5
per number of objectives N (EM and F1 as sum over objectives and as fraction, peak tokens,
dependency, inference time per task, format-error rate, turns used)."""

from __future__ import annotations

import statistics
import time

from mem1_core.evaluation.metrics import unknown_rate
from mem1_core.rollout.generation import HFBackend
from mem1_core.rollout.loop import Task, rollout
from mem1_core.trajectory.record import Trajectory


def summarize(trajs: list[Trajectory], seconds: float) -> dict:
    """Mean metrics of a set of trajectories (one N)."""
    n_turns = sum(len(t.turns) for t in trajs)
    return {
        "tasks": len(trajs),
        "em_sum": statistics.mean(t.em_sum for t in trajs),
        "em_frac": statistics.mean(t.reward for t in trajs),
        "f1_sum": statistics.mean(sum(t.f1) for t in trajs),
        "f1_frac": statistics.mean(sum(t.f1) / len(t.f1) for t in trajs),
        "peak_tokens": statistics.mean(t.peak_tokens for t in trajs),
        "peak_tokens_max": max(t.peak_tokens for t in trajs),
        "dependency": statistics.mean(t.dependency for t in trajs),
        "seconds_per_task": seconds / len(trajs),
        "format_error_rate": sum(t.format_errors for t in trajs) / max(n_turns, 1),
        "answered_rate": statistics.mean(t.answer is not None for t in trajs),
        "unknown_rate": unknown_rate([t.answer for t in trajs]),
        "turns": statistics.mean(len(t.turns) for t in trajs),
    }


def evaluate_policy(
    model,
    tokenizer,
    env,
    tasks: list[Task],
    rollout_cfg,
    *,
    memory: str,
    backend=None,
    progress: bool = False,
) -> dict:
    """Greedy rollout of `tasks` (one N or several) and their summary metrics."""
    trajs, seconds = run_eval(
        model, tokenizer, env, tasks, rollout_cfg, memory=memory, backend=backend, progress=progress
    )
    return summarize(trajs, seconds)


def run_eval(
    model,
    tokenizer,
    env,
    tasks: list[Task],
    rollout_cfg,
    *,
    memory: str,
    backend=None,
    progress: bool = False,
) -> tuple[list[Trajectory], float]:
    backend = backend or HFBackend(
        model, tokenizer.pad_token_id, tokenizer.eos_token_id, max_batch=rollout_cfg.batch_size
    )
    was_training = getattr(model, "training", False)
    if model is not None:
        model.eval()
    t0 = time.perf_counter()
    trajs = rollout(tasks, backend, env, rollout_cfg, memory=memory, greedy=True, progress=progress)
    seconds = time.perf_counter() - t0
    if was_training:
        model.train()
    return trajs, seconds
