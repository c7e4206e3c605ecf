"""An iteration's record and where it goes: the row of metrics.jsonl (each phase's seconds and
work, the learner's statistics, the held-out point), W&B (one run id across resumes) and the
one-line progress a person reads while a run trains (mem1_core.training.train_rl)."""

from __future__ import annotations

import logging
import math
import os
import uuid
from dataclasses import asdict
from typing import Any

from tqdm.auto import tqdm

from mem1_core.config import Config
from mem1_core.evaluation.summary import training_summary
from mem1_core.runs.atomic import write_text
from mem1_core.runs.layout import RunPaths
from mem1_core.runs.progress import Progress as StageProgress
from mem1_core.training.runtime import PendingRollout
from mem1_core.trajectory.record import Trajectory

log = logging.getLogger(__name__)


def clean_record(record: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: an undefined statistic (e.g. explained variance of constant returns)
    # is written as null.
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }


class MetricsSink:
    """Where an iteration's record goes: metrics.jsonl (atomically), W&B (offline unless
    WANDB_MODE says otherwise; one run id across resumes) and the progress bar."""

    def __init__(self, cfg: Config, files: RunPaths, estimator: str, start: int, show: bool):
        import wandb

        self.files = files
        id_file = files.root / "wandb" / "run_id"
        if not id_file.is_file():
            write_text(uuid.uuid4().hex[:12], id_file)

        def open_run(run_id: str):
            return wandb.init(
                project=os.environ.get("WANDB_PROJECT", "mem1"),
                name=f"{files.root.name}-{estimator}",
                id=run_id,
                resume="allow",
                dir=str(files.root),
                mode=os.environ.get("WANDB_MODE") or "offline",
                config=asdict(cfg) | {"estimator": estimator},
                settings=wandb.Settings(console="off", quiet=True, silent=True, disable_git=True),
            )

        try:
            self.run = open_run(id_file.read_text().strip())
        except Exception as e:  # W&B raises its own server errors
            if "in use" not in str(e):
                raise
            # A killed process's W&B run can still hold its id (seen when a crashed flow run is
            # retried at once): the run goes on under a new W&B run; metrics.jsonl is whole.
            log.warning("W&B run %s is still held (%s): logging to a new W&B run", id_file, e)
            write_text(uuid.uuid4().hex[:12], id_file)
            self.run = open_run(id_file.read_text().strip())
        self.run.define_metric("*", step_metric="iteration")
        self.bar = tqdm(
            total=cfg.ppo.iterations,
            initial=start,
            desc=estimator,
            unit="it",
            disable=not show,
            dynamic_ncols=True,
        )
        self.stage = StageProgress(
            f"ppo ({cfg.rollout.memory})"
            if estimator == "gae"
            else f"{estimator} ({cfg.rollout.memory})",
            total=cfg.ppo.iterations,
            start=start,
            unit="iteration",
            budget_seconds=cfg.ppo.minutes * 60,
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
        if record.get("no_signal"):  # the learner sees it only as zero advantages
            log.warning(
                "iteration %d: every trajectory earned reward %.3f: no learning signal (the "
                "policy never answers right, or always does; a warm start that teaches the "
                "format, or harder/easier tasks, gives PPO something to compare)",
                record["iteration"],
                record["reward"],
            )
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{record['reward']:.3f}",
            kl=f"{record['kl']:.4f}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )
        self.stage.update(
            record["iteration"] + 1,
            reward=round(record["reward"], 3),
            kl=round(record["kl"], 4),
            phases=phase_line(record),
            **({"held_out": round(record["eval/reward"], 3)} if "eval/reward" in record else {}),
            **({"signal": "NONE (all rewards equal)"} if record.get("no_signal") else {}),
        )

    def close(self) -> None:
        self.bar.close()
        self.stage.close()
        self.run.finish()


def wandb_run(files: RunPaths, estimator: str) -> dict[str, str] | None:
    """Where this run's W&B run is: project, name, id, and the directory `wandb sync`
    uploads from (offline runs land under `<out>/wandb/`)."""
    id_file = files.root / "wandb" / "run_id"
    if not id_file.is_file():
        return None
    return {
        "project": os.environ.get("WANDB_PROJECT", "mem1"),
        "name": f"{files.root.name}-{estimator}",
        "id": id_file.read_text().strip(),
        "mode": os.environ.get("WANDB_MODE") or "offline",
        "sync": f"wandb sync {files.root / 'wandb'}/offline-run-*",
    }


def iteration_record(
    it: int,
    trajs: list[Trajectory],
    stats: dict[str, Any],
    seconds: float,
    rollout_seconds: float,
    elapsed_seconds: float,
    rollout: PendingRollout,
    staleness: int,
) -> dict[str, Any]:
    """One metrics.jsonl line: rollout means, learner stats (train/*), timing. Timing:
    `seconds` the iteration's wall time; `rollout_seconds` what of it the iteration waited
    for its rollout; `rollout_busy_seconds` the rollout's own time (the longest worker share;
    under overlap mostly hidden behind the update before); `train/update_seconds` the
    learner's. `rollout_staleness`: updates between the sampling weights and the learner's.
    `no_signal`: 1 when every trajectory earned the same reward (all 0, say), so the reward
    says nothing about which actions to prefer; `no_signal_groups`: the fraction of tasks
    whose samples all earned the same reward (a grouped estimator's advantages are 0 there)."""
    return {
        "iteration": it,
        **training_summary(trajs),
        **reward_signal(trajs),
        **{f"train/{k}": v for k, v in stats.items()},
        "kl": stats.get("kl_ref", 0.0),
        "rollout_staleness": staleness,
        "seconds": seconds,
        "rollout_seconds": rollout_seconds,
        "rollout_busy_seconds": rollout.busy_seconds,
        "elapsed_seconds": elapsed_seconds,
        "tokens_per_s": stats["gen_tokens"] / seconds,
    }


PHASES = {
    "rollout": "rollout_seconds",
    "old-logp": "train/phase_score_seconds",
    "adv": "train/phase_advantages_seconds",
    "update": "train/phase_epochs_seconds",
}
"""An iteration's named phases (verl's `fit` timers) -> their metrics.jsonl keys."""


def phase_line(record: dict[str, Any]) -> str:
    """`rollout 1.2s old-logp 0.3s adv 0.0s update 2.1s`: where an iteration's time went."""
    return " ".join(f"{name} {record[key]:.1f}s" for name, key in PHASES.items() if key in record)


def reward_signal(trajs: list[Trajectory]) -> dict[str, float]:
    """Whether an iteration's rewards can teach anything (iteration_record's `no_signal*`;
    `no_signal_groups` only where tasks have several samples, a grouped estimator's case)."""
    groups: dict[int, list[float]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t.reward)
    out = {"no_signal": int(len({t.reward for t in trajs}) <= 1)}
    sampled = [r for r in groups.values() if len(r) > 1]
    if sampled:
        out["no_signal_groups"] = sum(len(set(r)) == 1 for r in sampled) / len(sampled)
    return out
