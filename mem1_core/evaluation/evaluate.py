"""Evaluation: greedy rollouts of a policy on held-out tasks and the metrics of docs/design.md §5
per number of objectives N (EM and F1 as sum over objectives and as fraction, peak tokens,
dependency, inference time per task, format-error rate, turns used)."""

from __future__ import annotations

import dataclasses
import time

from mem1_core.data.metrics import SCORERS
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
    scorer: str = "squad",
) -> tuple[list[Trajectory], float]:
    """Greedy rollout of `tasks`, each trajectory's objectives scored by `scorer`
    (`eval.scorer`), and the rollout's wall time."""
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
    return rescore(trajs, scorer), seconds


def rescore(trajs: list[Trajectory], scorer: str) -> list[Trajectory]:
    """`trajs` with EM and F1 per objective from the scorer `scorer` (the rollout scored them
    with the training reward, `squad`); the trajectories themselves are left as they were. A
    domain with its own score (WebShop) keeps what its environment recorded."""
    score = SCORERS[scorer]
    out = []
    for t in trajs:
        if t.score is not None:
            out.append(t)
            continue
        em, f1 = score(t.answer, t.golden_answers)
        out.append(dataclasses.replace(t, em=em, f1=f1))
    return out
