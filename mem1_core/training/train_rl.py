"""The RL training loop (PPO; GRPO, RLOO or REINFORCE++ by `ppo.adv_estimator`), MEM1 §3.3 / §4.

One iteration reads top to bottom: collect rollouts (the environment scores each answer:
EM per objective) -> the learner scores them (old / reference log-probs, values over the
flattened trees), turns rewards into advantages and runs the PPO epochs -> the new weights
go to the rollout workers -> log.

What the run directory gets (trajectories/, eval/, metrics.jsonl, checkpoints/, wandb/) is
mem1_core.runs.layout.RunPaths.

Resume: `resume=True` restores the newest intact checkpoint K (one whose files match the
checksums of its manifest; a corrupt newer one is moved aside with a warning) and deletes
trajectory, evaluation and metrics entries of iterations >= K (written after it, by a run
that then died), so a run killed at any moment and resumed has every iteration exactly
once, and the files of iterations before K are never rewritten.

Overlapped rollouts (`ppo.overlap_rollouts`; verl's one-step off-policy recipe,
AReaL's asynchronous RL with staleness 1): iteration k+1's rollout is started on the workers
before iteration k's update, so the two run side by side; iteration k+1 then trains on
samples of the policy before update k (`rollout_staleness` 1; the first iteration of a run,
and of a resumed run, 0). The rollout importance weights correct for it (`ppo.rollout_is`,
required): the learner's log-probs under its current weights are PPO's old (proximal) policy,
the rollout's recorded ones the behaviour policy. A checkpoint holds what the iterations
before it produced and nothing of the rollout in flight, which no file records until its
iteration ends: a resumed run redoes that rollout with the checkpoint's weights (staleness 0),
so it loses or repeats no iteration but is not bit-identical to an unbroken overlapped run
(the synchronous loop is). A run that its `ppo.minutes` cap ends leaves one rollout unused.

Budget: a run makes `ppo.iterations` iterations; nothing it computes reads the
clock. `ppo.minutes` caps a run far slower than planned: it then ends early with a warning,
and its last metrics row (and the summary) says `stopped_by: minutes` (else `count`).

Faults the loop cannot ride out (the learner process lost, the retrieval server
down past `retrieval.outage_seconds`, a full disk) stop the run with `RunStopped`, whose
message names the fault and the checkpoint a `--resume` continues from; a rollout worker
that dies is restarted inside `Runtime` and its share of the iteration redone.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

from mem1_core.config import Config
from mem1_core.domains.inputs import load_tasks, prepare
from mem1_core.evaluation.summary import training_summary
from mem1_core.models.policy import adopt_init_tokenizer
from mem1_core.retrieval.client import RetrieverUnavailable
from mem1_core.rl.estimators import get_estimator
from mem1_core.rollout.loop import Task
from mem1_core.runs.faults import ActorLost, DiskFull, RunStopped, root_cause
from mem1_core.runs.layout import RunPaths, resolve_init
from mem1_core.training.actor_start import start_runtime
from mem1_core.training.checkpoint import (
    TrainState,
    latest_checkpoint,
    latest_intact_checkpoint,
    read_state,
    remove_partial,
)
from mem1_core.training.iteration_log import (
    MetricsSink,
    clean_record,
    iteration_record,
    wandb_run,
)
from mem1_core.training.runtime import PendingRollout, Runtime
from mem1_core.trajectory.record import write_trajectories

log = logging.getLogger(__name__)

STOPPING_FAULTS = (ActorLost, DiskFull, RetrieverUnavailable)
"""Faults that stop a run with `RunStopped` (a clear line and the way to resume)."""


def select_tasks(tasks: list[Task], iteration: int, k: int, seed: int) -> list[Task]:
    """The iteration's tasks: k drawn without replacement, from a seed fixed per iteration
    (so a resumed run draws what the killed one would have)."""
    return random.Random(seed * 7919 + iteration).sample(tasks, min(k, len(tasks)))


def iteration_objectives(
    iteration: int, iterations: int, curriculum: tuple[int, ...], mixture: bool
) -> tuple[int, ...]:
    """The N iteration `iteration` (0-based, of `iterations`) trains on under `curriculum`
    (ppo.curriculum): all of them in a mixture; stagewise, the stage's one N, the iterations
    split into len(curriculum) consecutive stages whose lengths differ by at most one (the
    first ones longer)."""
    if not curriculum:
        raise ValueError("no curriculum: the run trains on data.train_objectives")
    if mixture:
        return tuple(curriculum)
    stages = len(curriculum)
    base, extra = divmod(iterations, stages)
    end = 0
    for k in range(stages):
        end += base + (k < extra)
        if iteration < end:
            return (curriculum[k],)
    return (curriculum[-1],)


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts that differ by at most one, the first ones larger."""
    base, extra = divmod(total, parts)
    return [base + (k < extra) for k in range(parts)]


def evaluate(
    runtime: Runtime, tasks: list[Task], out: Path, prefix: str = "eval/"
) -> dict[str, float]:
    """Greedy rollouts on held-out tasks, written to `out`; -> their means under `prefix`."""
    trajs = runtime.rollout(tasks, seed=0, greedy=True)
    write_trajectories(trajs, out)
    return training_summary(trajs, prefix)


def _resume_state(paths: RunPaths, resume: bool, init: Path | None):
    """-> (checkpoint or None, init): check the run directory and clean up after a kill."""
    if not resume:
        if latest_checkpoint(paths.checkpoints) is not None or paths.has_progress():
            raise ValueError(
                f"{paths.root} already holds a training run: pass --resume to "
                "continue it, or choose a new --out"
            )
        return None, init
    remove_partial(paths.checkpoints)
    ckpt = latest_intact_checkpoint(paths.checkpoints)
    if ckpt is not None:
        saved = read_state(ckpt).extra.get("init")
        if init is not None and str(init) != saved:
            raise ValueError(f"--init {init} differs from the run's warm start {saved}")
        init = Path(saved) if saved else None
    paths.truncate(read_state(ckpt).iteration if ckpt else 0)
    return ckpt, init


def _stopped(error: BaseException, paths: RunPaths) -> str:
    """The one line a stopped run prints: the fault, and where `--resume` goes on from."""
    cause = str(root_cause(error)).strip().splitlines()[0].rstrip(".")
    ckpt = latest_checkpoint(paths.checkpoints)
    since = f"checkpoint {ckpt.name}" if ckpt else "the start (no checkpoint yet)"
    return (
        f"training stopped: {cause}. Rerun the same command with --resume: it continues from "
        f"{since} and redoes what came after it"
    )


def train_rl(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    init: str | Path | None = None,
    use_ray: bool = True,
    show: bool = True,
) -> dict[str, Any]:
    """Train with `cfg.ppo.adv_estimator` (gae: PPO with a critic; grpo, rloo, ...) into
    `out_dir`; `show` draws the progress bar. -> summary: out, estimator, iterations done,
    last metrics, checkpoint."""
    estimator = cfg.ppo.adv_estimator
    if get_estimator(estimator).grouped and cfg.ppo.samples_per_task < 2:
        raise ValueError(
            f"ppo.adv_estimator={estimator} compares the samples of a task: set "
            "ppo.samples_per_task >= 2 (`mem1 train grpo` sets 4)"
        )
    out = Path(out_dir).resolve()
    paths = RunPaths(out)
    ckpt, init_dir = _resume_state(paths, resume, resolve_init(init))
    adopt_init_tokenizer(cfg, paths, init_dir)
    prepare(cfg, out)
    train_tasks = load_tasks(cfg, paths, "train", cfg.data.train_objectives)
    curriculum = tuple(cfg.ppo.curriculum)
    by_n = {n: load_tasks(cfg, paths, "train", n) for n in curriculum}
    eval_tasks = load_tasks(cfg, paths, "test", cfg.data.train_objectives)
    more_evals = {
        n: load_tasks(cfg, paths, "test", n)
        for n in cfg.ppo.eval_objectives
        if n != cfg.data.train_objectives
    }
    runtime = start_runtime(cfg, paths, init=init_dir, use_ray=use_ray)
    progress = None
    try:
        # W&B starts while the actors are still importing (their first call blocks).
        progress = MetricsSink(
            cfg, paths, estimator, read_state(ckpt).iteration if ckpt else 0, show
        )
        state = runtime.restore(ckpt) if ckpt else TrainState(0)
        runtime.sync_weights()  # workers start from the learner's weights, resumed or not
        rollout_info = runtime.rollout_info()  # the backend, vLLM's version, the Python
        log.info("rollout workers: %s", rollout_info)
        extra, t_start = {"init": None if init_dir is None else str(init_dir)}, time.perf_counter()
        done = paths.read_metrics()
        record: dict[str, Any] = done[-1] if done else {}
        overlap = cfg.ppo.overlap_rollouts
        if overlap and not use_ray:
            log.warning(
                "ppo.overlap_rollouts without Ray: the overlapped schedule (each rollout one "
                "update stale) runs one step after the other here; no time is saved"
            )

        def start(i: int) -> PendingRollout:  # iteration i's rollout, on the latest weights
            tasks = select_tasks(train_tasks, i, cfg.ppo.tasks_per_iteration, cfg.data.seed)
            if curriculum:  # beyond the paper: the N of the iteration's curriculum stage
                ns = iteration_objectives(
                    i, cfg.ppo.iterations, curriculum, cfg.ppo.curriculum_mixture
                )
                k = split_evenly(cfg.ppo.tasks_per_iteration, len(ns))
                tasks = [t for n, kn in zip(ns, k, strict=True)
                         for t in select_tasks(by_n[n], i, kn, cfg.data.seed + 1009 * n)]  # fmt: skip
            seed = cfg.model.seed * 1_000_003 + i
            return runtime.start_rollout(
                tasks, seed=seed, samples_per_task=cfg.ppo.samples_per_task
            )

        ahead = start(state.iteration) if overlap else None  # a rollout started early
        for it in range(state.iteration, cfg.ppo.iterations):
            t0 = time.perf_counter()
            # Collect rollouts; the environment has scored every answer (EM per objective).
            rollout = ahead if ahead is not None else start(it)
            trajs = runtime.collect(rollout)
            staleness = runtime.weights_version - rollout.weights_version
            t_rollout = time.perf_counter() - t0
            # Overlap: the next rollout samples with the current weights while the learner
            # updates them (the workers run it before the weights of this update load).
            ahead = start(it + 1) if overlap and it + 1 < cfg.ppo.iterations else None
            # Learner: old / reference log-probs and values -> rewards -> advantages -> epochs.
            stats = runtime.update(trajs, it)
            runtime.sync_weights(wait=not overlap)  # learner -> object store -> workers
            elapsed = state.elapsed_seconds + time.perf_counter() - t_start
            # The count decides; the minutes only cap a run far slower than planned.
            capped = it + 1 < cfg.ppo.iterations and elapsed >= cfg.ppo.minutes * 60
            last = it + 1 >= cfg.ppo.iterations or capped
            seconds = time.perf_counter() - t0
            record = iteration_record(
                it, trajs, stats, seconds, t_rollout, elapsed, rollout, staleness
            )
            if curriculum:  # the N this iteration trained on, the longest trained so far
                ns = iteration_objectives(
                    it, cfg.ppo.iterations, curriculum, cfg.ppo.curriculum_mixture
                )
                record["train_objectives"] = list(ns)
                record["horizon"] = max(
                    n
                    for j in range(it + 1)
                    for n in iteration_objectives(
                        j, cfg.ppo.iterations, curriculum, cfg.ppo.curriculum_mixture
                    )
                )
            if last:
                record["stopped_by"] = "minutes" if capped else "count"
            if capped:
                log.warning(
                    "%s: its %.4g-minute cap stopped it after %d of %d iterations (a slow or "
                    "busy machine; raise ppo.minutes to run all its iterations)",
                    progress.stage.stage,
                    cfg.ppo.minutes,
                    it + 1,
                    cfg.ppo.iterations,
                )
            if last or (cfg.ppo.eval_every and (it + 1) % cfg.ppo.eval_every == 0):
                record |= evaluate(runtime, eval_tasks, paths.eval_part(it))
                for n, tasks in more_evals.items():
                    record |= evaluate(runtime, tasks, paths.eval_part(it, n), f"eval/n{n}/")
            # Asked again each iteration: a worker Ray restarted elsewhere has a new node.
            record = clean_record({"estimator": estimator, **runtime.rollout_info(), **record})
            write_trajectories(trajs, paths.part(it))
            progress.log(record)
            if last or (it + 1) % cfg.ppo.checkpoint_every == 0:
                runtime.save(TrainState(it + 1, elapsed, extra))
            if last:
                break
    except STOPPING_FAULTS as e:
        raise RunStopped(_stopped(e, paths)) from e
    finally:
        if progress is not None:
            progress.close()
        runtime.shutdown()
    final = latest_checkpoint(paths.checkpoints)
    return {
        "out": str(out),
        "estimator": estimator,
        "wandb": wandb_run(paths, estimator),
        "metrics": record,
        "iterations": record.get("iteration", -1) + 1,
        "stopped_by": record.get("stopped_by"),
        "checkpoint": None if final is None else str(final),
    }
