"""Evaluation: greedy rollouts of a policy on held-out tasks and the metrics of docs/design.md §5
per number of objectives N (EM and F1 as sum over objectives and as fraction, peak tokens,
dependency, inference time per task, format-error rate, turns used)."""

from __future__ import annotations

import time

from mem1_core.evaluation.summary import summarize
from mem1_core.rollout.generation import HFBackend
from mem1_core.rollout.loop import Task, rollout
from mem1_core.trajectory.record import Trajectory


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
        model,
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        max_batch=rollout_cfg.batch_size,
        tokenizer=tokenizer,
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
