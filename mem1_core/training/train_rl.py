"""The RL training loop (PPO, or GRPO with estimator "grpo"), MEM1 §3.3 / §4.

One iteration reads top to bottom: collect rollouts (the environment scores each answer:
EM per objective) -> the learner scores them (old / reference log-probs, values over the
flattened trees), turns rewards into advantages and runs the PPO epochs -> the new weights
go to the rollout workers -> log.

What a run directory `out` gets, besides the assets of mem1_core.runs.assets:
  trajectories/iter_{i:06d}.parquet   iteration i's training trajectories (atomic)
  eval/iter_{i:06d}.parquet           greedy held-out trajectories, when evaluated
  metrics.jsonl                       one JSON line per iteration, rewritten atomically
  checkpoints/iter_{K:06d}/           state after K iterations (mem1_core.runs.checkpoint)
  wandb/                              the W&B run (offline unless WANDB_MODE says otherwise)
  vllm_init/                          rollout.backend=vllm without --init: the initial policy,
                                      saved for the vLLM engines to start from

Resume: `resume=True` restores the newest checkpoint K and deletes trajectory, evaluation
and metrics entries of iterations >= K (written after it, by a run that then died), so a
run killed at any moment and resumed has every iteration exactly once, and the files of
iterations before K are never rewritten.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mem1_core.config import Config
from mem1_core.evaluation.metrics import unknown_rate
from mem1_core.rl.estimators import get_estimator
from mem1_core.rollout.loop import Task
from mem1_core.runs.assets import RunPaths, adopt_init_tokenizer, load_tasks, prepare
from mem1_core.runs.atomic import write_text
from mem1_core.runs.checkpoint import TrainState, latest_checkpoint, read_state, remove_partial
from mem1_core.training.ray_runtime import Runtime, resolve_init
from mem1_core.trajectory.record import Trajectory, write_trajectories

log = logging.getLogger(__name__)

GRPO_DEFAULTS: tuple[str, ...] = ("ppo.samples_per_task=4", "ppo.kl_in_loss=true", "ppo.kl_kind=k3")
"""Overrides `mem1 train grpo` applies before the user's: a group of 4 samples per task,
the KL as a k3 loss term (DeepSeekMath §4.1). Explicit `--set` values win."""


@dataclass(frozen=True)
class RunFiles:
    """The per-iteration outputs of a training run."""

    root: Path

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def evals(self) -> Path:
        return self.root / "eval"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    def part(self, i: int) -> Path:
        return self.trajectories / f"iter_{i:06d}.parquet"

    def eval_part(self, i: int) -> Path:
        return self.evals / f"iter_{i:06d}.parquet"

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.is_file():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line]

    def write_metrics(self, rows: list[dict[str, Any]]) -> None:
        write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), self.metrics)

    def append_metrics(self, record: dict[str, Any]) -> None:
        rows = [r for r in self.read_metrics() if r["iteration"] < record["iteration"]]
        self.write_metrics([*rows, record])

    def has_progress(self) -> bool:
        return self.metrics.exists() or any(self.trajectories.glob("iter_*.parquet"))

    def truncate(self, start: int) -> None:
        """Forget iterations >= start (and any half-written temporaries)."""
        for folder in (self.trajectories, self.evals):
            for p in folder.glob(".iter_*.tmp"):
                p.unlink()
            for p in folder.glob("iter_*.parquet"):
                if int(p.stem.removeprefix("iter_")) >= start:
                    p.unlink()
        for p in self.root.glob(f".{self.metrics.name}.*.tmp"):
            p.unlink()
        if self.metrics.exists():
            self.write_metrics([r for r in self.read_metrics() if r["iteration"] < start])


def select_tasks(tasks: list[Task], iteration: int, k: int, seed: int) -> list[Task]:
    """The iteration's tasks: k drawn without replacement, from a seed fixed per iteration
    (so a resumed run draws what the killed one would have)."""
    return random.Random(seed * 7919 + iteration).sample(tasks, min(k, len(tasks)))


def rollout_stats(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Task-level means of a batch of trajectories."""
    n = max(len(trajs), 1)
    turns = sum(len(t.turns) for t in trajs)
    return {
        f"{prefix}reward": sum(t.reward for t in trajs) / n,
        f"{prefix}em_sum": sum(t.em_sum for t in trajs) / n,
        f"{prefix}f1": sum(sum(t.f1) / max(len(t.f1), 1) for t in trajs) / n,
        f"{prefix}answered": sum(t.answer is not None for t in trajs) / n,
        f"{prefix}unknown_rate": unknown_rate([t.answer for t in trajs]),
        f"{prefix}format_error_rate": sum(t.format_errors for t in trajs) / max(turns, 1),
        f"{prefix}turns": turns / n,
        f"{prefix}peak_tokens": sum(t.peak_tokens for t in trajs) / n,
        f"{prefix}gen_tokens": float(sum(len(x.gen_ids) for t in trajs for x in t.turns)),
    }


def _clean(record: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: an undefined statistic (e.g. explained variance of constant returns)
    # is written as null.
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }


class Progress:
    """Where an iteration's record goes: metrics.jsonl (atomically), W&B (offline unless
    WANDB_MODE says otherwise; one run id across resumes) and the progress bar."""

    def __init__(self, cfg: Config, files: RunFiles, estimator: str, start: int, show: bool):
        import wandb

        self.files = files
        id_file = files.root / "wandb" / "run_id"
        if not id_file.is_file():
            write_text(uuid.uuid4().hex[:12], id_file)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "mem1"),
            name=f"{files.root.name}-{estimator}",
            id=id_file.read_text().strip(),
            resume="allow",
            dir=str(files.root),
            mode=os.environ.get("WANDB_MODE") or "offline",
            config=asdict(cfg) | {"estimator": estimator},
            settings=wandb.Settings(console="off", quiet=True, silent=True, disable_git=True),
        )
        self.run.define_metric("*", step_metric="iteration")
        self.bar = tqdm(
            total=cfg.ppo.iterations,
            initial=start,
            desc=estimator,
            unit="it",
            disable=not show,
            dynamic_ncols=True,
        )

    def log(self, record: dict[str, Any]) -> None:
        self.files.append_metrics(record)
        self.run.log({k: v for k, v in record.items() if isinstance(v, (int, float))})
        if record["train/skipped_steps"]:  # the learner logs it too, in its own process
            log.warning(
                "iteration %d: %d non-finite updates skipped (%d in the run)",
                record["iteration"],
                record["train/skipped_steps"],
                record["train/nonfinite_total"],
            )
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{record['reward']:.3f}",
            kl=f"{record['kl']:.4f}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )

    def close(self) -> None:
        self.bar.close()
        self.run.finish()


def iteration_record(
    it: int,
    trajs: list[Trajectory],
    stats: dict[str, Any],
    seconds: float,
    rollout_seconds: float,
    elapsed_seconds: float,
) -> dict[str, Any]:
    """One metrics.jsonl line: rollout means, learner stats (train/*), timing."""
    return {
        "iteration": it,
        **rollout_stats(trajs),
        **{f"train/{k}": v for k, v in stats.items()},
        "kl": stats.get("kl_ref", 0.0),
        "seconds": seconds,
        "rollout_seconds": rollout_seconds,
        "elapsed_seconds": elapsed_seconds,
        "tokens_per_s": stats["gen_tokens"] / seconds,
    }


def evaluate(runtime: Runtime, tasks: list[Task], out: Path) -> dict[str, float]:
    """Greedy rollouts on held-out tasks, written to `out`; -> eval/* means."""
    trajs = runtime.rollout(tasks, seed=0, greedy=True)
    write_trajectories(trajs, out)
    return rollout_stats(trajs, "eval/") | {"eval/tasks": len(trajs)}


def _resume_state(paths: RunPaths, files: RunFiles, resume: bool, init: Path | None):
    """-> (checkpoint or None, init): check the run directory and clean up after a kill."""
    ckpt = latest_checkpoint(paths.checkpoints)
    if not resume:
        if ckpt is not None or files.has_progress():
            raise ValueError(
                f"{paths.root} already holds a training run: pass --resume to "
                "continue it, or choose a new --out"
            )
        return None, init
    remove_partial(paths.checkpoints)
    if ckpt is not None:
        saved = read_state(ckpt).extra.get("init")
        if init is not None and str(init) != saved:
            raise ValueError(f"--init {init} differs from the run's warm start {saved}")
        init = Path(saved) if saved else None
    files.truncate(read_state(ckpt).iteration if ckpt else 0)
    return ckpt, init


def train_rl(
    cfg: Config,
    out_dir: str | Path,
    *,
    estimator: str = "gae",
    resume: bool = False,
    init: str | Path | None = None,
    use_ray: bool = True,
    show: bool = True,
) -> dict[str, Any]:
    """Train with PPO (estimator "gae") or GRPO ("grpo") into `out_dir`; `show` draws the
    progress bar. -> summary: out, estimator, iterations done, last metrics, checkpoint."""
    if get_estimator(estimator).uses_critic is False and cfg.ppo.samples_per_task < 2:
        raise ValueError(f"estimator {estimator!r} needs a group: set ppo.samples_per_task >= 2")
    out = Path(out_dir).resolve()
    paths, files = RunPaths(out), RunFiles(out)
    ckpt, init_dir = _resume_state(paths, files, resume, resolve_init(init))
    adopt_init_tokenizer(cfg, paths, init_dir)
    prepare(cfg, out)
    train_tasks = load_tasks(cfg, paths, "train", cfg.data.train_objectives)
    eval_tasks = load_tasks(cfg, paths, "test", cfg.data.train_objectives)
    runtime = Runtime.start(cfg, paths, init=init_dir, estimator=estimator, use_ray=use_ray)
    progress = None
    try:
        # W&B starts while the actors are still importing (their first call blocks).
        progress = Progress(cfg, files, estimator, read_state(ckpt).iteration if ckpt else 0, show)
        state = runtime.restore(ckpt) if ckpt else TrainState(0)
        runtime.sync_weights()  # workers start from the learner's weights, resumed or not
        extra, t_start = {"init": None if init_dir is None else str(init_dir)}, time.perf_counter()
        done = files.read_metrics()
        record: dict[str, Any] = done[-1] if done else {}
        for it in range(state.iteration, cfg.ppo.iterations):
            t0 = time.perf_counter()
            tasks = select_tasks(train_tasks, it, cfg.ppo.tasks_per_iteration, cfg.data.seed)
            # Collect rollouts; the environment has scored every answer (EM per objective).
            trajs = runtime.rollout(
                tasks,
                seed=cfg.model.seed * 1_000_003 + it,
                samples_per_task=cfg.ppo.samples_per_task,
            )
            t_rollout = time.perf_counter() - t0
            # Learner: old / reference log-probs and values -> rewards -> advantages -> epochs.
            stats = runtime.update(trajs, it)
            runtime.sync_weights()  # learner weights -> object store -> rollout workers
            elapsed = state.elapsed_seconds + time.perf_counter() - t_start
            last = it + 1 >= cfg.ppo.iterations or elapsed >= cfg.ppo.minutes * 60
            seconds = time.perf_counter() - t0
            record = iteration_record(it, trajs, stats, seconds, t_rollout, elapsed)
            if last or (cfg.ppo.eval_every and (it + 1) % cfg.ppo.eval_every == 0):
                record |= evaluate(runtime, eval_tasks, files.eval_part(it))
            record = _clean({"estimator": estimator, **record})
            write_trajectories(trajs, files.part(it))
            progress.log(record)
            if last or (it + 1) % cfg.ppo.checkpoint_every == 0:
                runtime.save(TrainState(it + 1, elapsed, extra))
            if last:
                break
    finally:
        if progress is not None:
            progress.close()
        runtime.shutdown()
    final = latest_checkpoint(paths.checkpoints)
    return {
        "out": str(out),
        "estimator": estimator,
        "metrics": record,
        "iterations": record.get("iteration", -1) + 1,
        "checkpoint": None if final is None else str(final),
    }
