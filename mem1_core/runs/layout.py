"""The layout of a run directory: where every stage reads and writes.

  run.json, summary.{json,md}    the pipeline's parameters and summary (flows/pipeline.py)
  world/                corpus.parquet, questions.parquet (the embedded profile)
  tasks/                {train,test}_n{N}.parquet
  tokenizer/            the tiny tokenizer (save_pretrained)
  indexes/              retrieval indexes, one per corpus fingerprint and kind
  teacher_worlds/       extra worlds of fresh names for the teacher's SFT data
                        (sft.teacher_worlds), each laid out like a run directory
  checkpoints/iter_{K:06d}/   training state after K iterations (mem1_core.training.checkpoint)
  trajectories/iter_{i:06d}.parquet   a training run's iteration i trajectories
  eval/iter_{i:06d}.parquet           its greedy held-out trajectories, when evaluated
  metrics.jsonl         one JSON line per training iteration, rewritten atomically
  policy/               a trained policy (SFT output; a checkpoint holds one too)
  vllm_init/            rollout.backend=vllm without --init: the initial policy for vLLM
  wandb/                the W&B run (offline unless WANDB_MODE says otherwise)

A pipeline run puts each training stage in a subdirectory laid out the same way
(`warm_start/`, `ppo_mem1/`, ...); the stages share the assets of the run directory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem1_core.runs.atomic import write_text

# Checkpoint directory names (their contents: mem1_core.training.checkpoint). Here, not there, so
# that finding a run's checkpoints imports no torch: `prefect deploy` and a flow run's start
# import the flows, which import this module (torch there cost 20 s of imports per deploy).
PREFIX = "iter_"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")
STATE_FILE = "state.json"
CORRUPT_SUFFIX = ".corrupt"
"""A checkpoint that failed verification is renamed `iter_K.corrupt`: kept for a post-mortem,
invisible to `list_checkpoints`, never deleted by keep-last-K."""


def checkpoint_name(iteration: int) -> str:
    return f"{PREFIX}{iteration:06d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (staging directories start with `.`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


CHECKPOINTS = "checkpoints"
POLICY = "policy"

# A pipeline run's stage directories, each laid out like a run directory.
WARM_START, PPO_MEM1, PPO_FULL, SFT_MEM1, EVAL, ABLATION = (
    "warm_start",
    "ppo_mem1",
    "ppo_full",
    "sft_mem1",
    "eval",
    "ablation",
)


@dataclass(frozen=True)
class RunPaths:
    """A run directory's paths, and the per-iteration outputs of a training run in it."""

    root: Path

    @property
    def world(self) -> Path:
        return self.root / "world"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def indexes(self) -> Path:
        return self.root / "indexes"

    @property
    def teacher_worlds(self) -> Path:
        return self.root / "teacher_worlds"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    def task_file(self, split: str, n: int) -> Path:
        return self.tasks / f"{split}_n{n}.parquet"

    # ---- a training run's per-iteration outputs

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

    def eval_part(self, i: int, n: int | None = None) -> Path:
        """Iteration i's held-out trajectories: at the training N in eval/, at another N
        (`ppo.eval_objectives`) in eval/n{N}/."""
        folder = self.evals if n is None else self.evals / f"n{n}"
        return folder / f"iter_{i:06d}.parquet"

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
        for folder in (self.trajectories, self.evals, *self.evals.glob("n*/")):
            for p in folder.glob(".iter_*.tmp"):
                p.unlink()
            for p in folder.glob("iter_*.parquet"):
                if int(p.stem.removeprefix("iter_")) >= start:
                    p.unlink()
        for p in self.root.glob(f".{self.metrics.name}.*.tmp"):
            p.unlink()
        if self.metrics.exists():
            self.write_metrics([r for r in self.read_metrics() if r["iteration"] < start])


def resolve_init(init: str | Path | None) -> Path | None:
    """`--init` -> a policy directory: a checkpoint or SFT output (its `policy/`), a run
    directory (its latest checkpoint's policy) or a save_pretrained model directory."""
    if init is None:
        return None
    from mem1_core.models.model import check_model_dir

    p = Path(init).resolve()
    found = None
    if (p / POLICY / "config.json").is_file():
        found = p / POLICY
    elif (p / CHECKPOINTS).is_dir() and (ckpt := latest_checkpoint(p / CHECKPOINTS)):
        found = ckpt / POLICY
    elif (p / "config.json").is_file():
        found = p
    if found is not None:  # checked here, before a run directory is touched
        try:
            return check_model_dir(found)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"--init {init}: {e}") from None
    raise FileNotFoundError(
        f"--init {init}: expected a model directory (config.json), a checkpoint or SFT output "
        "(policy/config.json) or a run directory with checkpoints/"
    )


def newest_checkpoint_under(runs_root: str | Path) -> Path | None:
    """The newest checkpoint of any run under `runs_root`: in `runs_root/*/checkpoints/` or
    a stage's `runs_root/*/*/checkpoints/` (e.g. `run/ppo_mem1/checkpoints/`), by
    modification time (ties: by path), or None. Entries starting with `.` are skipped:
    atomic writes stage there; so are checkpoints set aside as corrupt (`iter_K.corrupt*`).
    (Within one run: `latest_checkpoint`.)"""
    root = Path(runs_root)
    if not root.is_dir():
        return None
    found = [
        entry
        for pattern in (f"*/{CHECKPOINTS}", f"*/*/{CHECKPOINTS}")
        for ckdir in root.glob(pattern)
        if ckdir.is_dir()
        for entry in ckdir.iterdir()
        if not entry.name.startswith(".") and CORRUPT_SUFFIX not in entry.name
    ]
    return max(found, key=lambda p: (p.stat().st_mtime, str(p)), default=None)
