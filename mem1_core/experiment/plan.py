"""Where an experiment's stages live in its run directory, and which have finished.

  experiment.json                  the experiment's settings and resolved config
  warm_start/                      the warm start, trained once (its assets beside it)
  warm_start_<name>/               each named warm start an arm or agent needs
  <arm dir>/seed<k>/               each arm × training seed: `<trainer>_<memory>` (ppo_mem1,
                                   ppo_full, sft_mem1) for an arm that is only its trainer and
                                   memory from the plain warm start, `arm_<name>` otherwise
  worlds/<seed>/                   each evaluated world's tasks, tokenizer and index
  eval/world<seed>/                its agents × N cells (trajectories, metrics, headline)
  eval/headline.json, headline.md  the experiment's headline across seeds and worlds
  eval/curves.png, eval/scaling.png

A stage is finished when its record says so (a PPO arm's last metrics row has `stopped_by`
and counts all its iterations; an SFT run has its policy and result.json); a rerun skips it
and resumes the first that is not, at its newest checkpoint. An evaluation resumes at its
first unplayed cell (mem1_core.evaluation.scaling's cell records).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem1_core.experiment.spec import PLAIN, ExperimentSpec, arm_subdir, warm_start_subdir
from mem1_core.runs.atomic import write_json
from mem1_core.runs.layout import WARM_START, RunPaths

ROOT = Path(__file__).resolve().parents[2]
"""The repository the code runs from."""
SPEC_FILE = "experiment.json"
"""A run's record: its experiment's settings and resolved config."""

EVAL_ONLY = ("eval",)
"""Config sections that change no training: a run resumed or reused with other values there
keeps its arms (each evaluation cell records the settings it was played under)."""
NEUTRAL = ("resources", "ppo.checkpoint_every", "ppo.eval_every", "ppo.eval_objectives")
"""Sections and fields that say where and how often, not what, a run trains: the machines
and processes (a run resumed on another cluster layout), the checkpoint cadence (a resume
restores the RNG and optimiser state exactly, whichever checkpoint it starts from) and the
held-out curve's cadence and N (the experiment's `curve:`; every rollout draws from a
generator seeded for its call, so a held-out point takes no randomness from the training
after it: tests/test_checkpoint_resume.py)."""


def training_changes(old: dict, new: dict) -> list[str]:
    """The config fields (`section.field`) whose values differ between two resolved configs
    (config_json's), outside the evaluation-only sections and the NEUTRAL fields; a field the
    old record lacks (added to the code after the run began) differs only off its default
    (mem1_core.config.loader.config_changes)."""
    from mem1_core.config.loader import config_changes

    changed = config_changes(old, new, skip=(*EVAL_ONLY, *NEUTRAL))
    return [k for k in changed if "." in k]


def _record(spec: ExperimentSpec, cfg) -> dict:
    """The run's record: its experiment, resolved config, and the commit its last start ran."""
    from mem1_core.config import config_json

    return {"experiment": spec.to_dict(), "config": json.loads(config_json(cfg)),
            "code": code_commit()}  # fmt: skip


def code_commit(root: Path = ROOT) -> dict[str, Any]:
    """The commit the code runs from, and whether tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def check_run_dir(run_dir: Path, spec: ExperimentSpec, cfg) -> None:
    """Write the run's record (experiment.json) in a new run directory; in an existing one,
    refuse a config that trains differently, or an arm or warm start declared otherwise under
    the same name (its finished stages would be reused under the wrong settings). Other arms,
    seeds, worlds or N may change: what is new runs, what is finished is kept."""
    path = Path(run_dir) / SPEC_FILE
    record = _record(spec, cfg)
    if path.is_file():
        old = json.loads(path.read_text())
        changed = training_changes(old["config"], record["config"])
        changed += arm_changes(old["experiment"], spec)
        if changed:
            raise ValueError(
                f"{run_dir} holds experiment {old['experiment']['name']!r} trained with other "
                f"settings ({', '.join(changed)}); give another run name"
            )
    write_json(record, path)


@dataclass(frozen=True)
class ArmRun:
    """One arm trained under one seed."""

    arm: str
    seed: int
    dir: Path
    trainer: str
    """ppo, grpo or sft (mem1_core.experiment.spec.TRAINERS)."""

    @property
    def label(self) -> str:
        """Its name in the UI and walls.json: `mem1-ppo · seed 1`."""
        return f"{self.arm} · seed {self.seed}"

    @property
    def rl(self) -> bool:
        """Trained by RL (PPO or GRPO: iterations, a held-out curve), not by SFT (steps)."""
        return self.trainer != "sft"


def arm_dir(run_dir: Path, spec: ExperimentSpec, arm: str, seed: int) -> Path:
    if arm not in spec.arms:
        raise ValueError(f"experiment {spec.name}: no arm {arm!r}; its arms are {list(spec.arms)}")
    return Path(run_dir) / arm_subdir(arm, spec.arms[arm]) / f"seed{seed}"


def warm_start_dir(run_dir: Path, name: str = PLAIN) -> Path:
    return Path(run_dir) / warm_start_subdir(name)


def arm_run(spec: ExperimentSpec, run_dir: Path, arm: str, seed: int) -> ArmRun:
    return ArmRun(arm, seed, arm_dir(run_dir, spec, arm, seed), spec.arms[arm].trainer)


def arm_runs(spec: ExperimentSpec, run_dir: Path) -> list[ArmRun]:
    """Every arm × seed in the file's order, RL arms first (the SFT arms are the short ones)."""
    order = sorted(spec.arms, key=lambda a: spec.arms[a].trainer == "sft")
    return [arm_run(spec, run_dir, a, s) for a in order for s in spec.arms[a].seeds]


def arm_count(cfg, trainer: str) -> tuple[int, str]:
    """An arm's count and the metrics key it is in: RL iterations, SFT steps."""
    return (cfg.sft.steps, "step") if trainer == "sft" else (cfg.ppo.iterations, "iteration")


def finished(run: ArmRun, cfg) -> bool:
    """The arm ran its whole count: an RL arm's last metrics row says how it stopped and
    counts every iteration; an SFT arm has its policy and result.json beside its metrics."""
    count, key = arm_count(cfg, run.trainer)
    if not run.rl:
        return (run.dir / "result.json").is_file() and (run.dir / "policy").is_dir()
    rows = RunPaths(run.dir).read_metrics() if run.dir.exists() else []
    return bool(rows) and "stopped_by" in rows[-1] and rows[-1][key] + 1 >= count


def link_reused(spec: ExperimentSpec, cfg, source: Path, run_dir: Path) -> list[str]:
    """Link a finished run's warm starts and arms into `run_dir` (never copied, never trained
    again; their walls come along, marked as reused) -> what was linked. An arm × seed of
    `source` short of its count is refused in one line; one `source` never ran is left to
    train here."""
    from mem1_core.experiment.configs import arm_config
    from mem1_core.experiment.walls import StageWalls

    source, run_dir = Path(source).resolve(), Path(run_dir)
    if not (source / WARM_START).is_dir() or not (source / SPEC_FILE).is_file():
        raise ValueError(
            f"reuse {source}: no {WARM_START}/ and {SPEC_FILE} (not an experiment run)"
        )
    old = json.loads((source / SPEC_FILE).read_text())
    changed = training_changes(old["config"], _record(spec, cfg)["config"])
    if changed:
        raise ValueError(
            f"reuse {source}: it trained with other settings ({', '.join(changed)}); its warm "
            "start and arms would not be this experiment's"
        )
    if not (source / WARM_START / "result.json").is_file():
        # linked unfinished, it would go on training in the other run's directory
        raise ValueError(f"reuse {source}: its warm start has not finished")
    differ = set(arm_changes(old["experiment"], spec))
    run_dir.mkdir(parents=True, exist_ok=True)
    linked = []
    pairs = [(source / WARM_START, run_dir / WARM_START, warm_start_stage(PLAIN))]
    for name in spec.used_warm_starts():
        src = warm_start_dir(source, name)
        if name != PLAIN and name not in differ and (src / "result.json").is_file():
            pairs.append((src, warm_start_dir(run_dir, name), warm_start_stage(name)))
    for run in arm_runs(spec, run_dir):
        src = arm_dir(source, spec, run.arm, run.seed)
        if not src.exists() or run.arm in differ:
            continue
        acfg = arm_config(spec, run.arm, run.seed)
        if not finished(ArmRun(run.arm, run.seed, src, run.trainer), acfg):
            count, key = arm_count(acfg, run.trainer)
            raise ValueError(f"reuse {source}: {run.label} has not finished its {count} {key}s")
        pairs.append((src, run.dir, run.label))
    stages = []
    for src, dst, stage in pairs:
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
            linked.append(str(dst.relative_to(run_dir)))
            stages.append(stage)
    StageWalls(run_dir).adopt(source, stages)
    return linked


def arm_changes(old: dict, spec: ExperimentSpec) -> list[str]:
    """The arms and named warm starts of `spec` that a run record's experiment (`old`, its
    to_dict) declares otherwise: same name, another trainer, memory, warm start or settings
    (seeds aside: another seed is new work)."""
    from mem1_core.experiment.spec import ExperimentSpec as Spec

    before = Spec.from_dict(old)
    out = [w for w, ws in spec.warm_starts.items()
           if w in before.warm_starts and before.warm_starts[w] != ws]  # fmt: skip
    for name, arm in spec.arms.items():
        was = before.arms.get(name)
        if was is None:
            continue
        if (was.trainer, was.memory, was.overrides, was.warm_start) != (
            arm.trainer,
            arm.memory,
            arm.overrides,
            arm.warm_start,
        ) or arm.warm_start in out:
            out.append(name)
    return out


def agent_name(agent: str, seed: int | None) -> str:
    """An evaluated agent's name: `mem1-ppo-s1`, `warm-start` (trained once)."""
    return agent if seed is None else f"{agent}-s{seed}"


def split_agent(name: str, known=None) -> tuple[str, int | None]:
    """`mem1-ppo-s1` -> (`mem1-ppo`, 1); `warm-start` -> (`warm-start`, None). With `known`
    (the experiment's agent names), only a known agent's name is split."""
    base, _, seed = name.rpartition("-s")
    if base and seed.isdigit() and (known is None or base in known):
        return base, int(seed)
    return name, None


def agent_dir(spec: ExperimentSpec, run_dir: Path, agent: str, seed: int | None) -> Path:
    """The directory whose policy agent `agent` plays under training seed `seed`."""
    arm = spec.agent_arm(agent)
    if arm is None:
        return warm_start_dir(run_dir, spec.warm_start_agents()[agent])
    return arm_dir(run_dir, spec, arm, seed)


def eval_agents(spec: ExperimentSpec, run_dir: Path) -> list[tuple[str, str, str]]:
    """(name, policy directory, memory policy) of every agent × seed the final evaluation
    plays: a warm start once, each arm's policy under each of its seeds."""
    from mem1_core.runs.layout import resolve_init

    return [
        (agent_name(a, s), str(resolve_init(agent_dir(spec, run_dir, a, s))), spec.agent_memory(a))
        for a in spec.agents
        for s in spec.seeds(a)
    ]


def world_dirs(run_dir: Path, world: int) -> tuple[Path, Path]:
    """(assets directory, evaluation directory) of world `world`'s final evaluation."""
    return Path(run_dir) / "worlds" / str(world), Path(run_dir) / "eval" / f"world{world}"


def agent_names(spec: ExperimentSpec) -> list[str]:
    """The evaluated name of every agent × seed (`eval_agents`' names, without resolving
    policies that a run still training does not have)."""
    return [agent_name(a, s) for a in spec.agents for s in spec.seeds(a)]


def eval_worlds(spec: ExperimentSpec, cfg) -> list[int]:
    """The run's own world (its test split) first, then the held-out ones."""
    return [cfg.world.seed, *(w for w in spec.worlds if w != cfg.world.seed)]


def spec_of_run(run_dir: Path) -> ExperimentSpec:
    """The experiment a run directory was started with (its experiment.json)."""
    path = Path(run_dir) / SPEC_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not an experiment run (no {SPEC_FILE})")
    return ExperimentSpec.from_dict(json.loads(path.read_text())["experiment"])


@dataclass(frozen=True)
class StageStatus:
    stage: str
    done: int
    total: int
    unit: str

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def __str__(self) -> str:
        mark = "done" if self.finished else f"{self.done} of {self.total} {self.unit}s"
        return f"{self.stage}: {mark}"


def stage_status(spec: ExperimentSpec, cfg, run_dir: Path) -> list[StageStatus]:
    """How far each stage of the run has come, from what it wrote: the warm starts, each arm ×
    seed (iterations or steps in its metrics), each world's evaluation (cells played)."""
    from mem1_core.experiment.configs import arm_config

    run_dir = Path(run_dir)
    out = [
        StageStatus(warm_start_stage(w), int((warm_start_dir(run_dir, w) / "result.json").is_file()),
                    1, "stage")
        for w in spec.used_warm_starts()
    ]  # fmt: skip
    for run in arm_runs(spec, run_dir):
        acfg = arm_config(spec, run.arm, run.seed)
        count, key = arm_count(acfg, run.trainer)
        if finished(run, acfg):
            done = count
        else:
            rows = RunPaths(run.dir).read_metrics() if run.dir.exists() else []
            done = min(count - 1, max((r[key] + 1 for r in rows if key in r), default=0))
        out.append(StageStatus(run.label, done, count, key))
    from mem1_core.evaluation.cells import trajectories_path

    names = agent_names(spec)
    for w in eval_worlds(spec, cfg):
        out_dir = world_dirs(run_dir, w)[1]
        played = sum(
            trajectories_path(out_dir, a, n).is_file() for a in names for n in spec.objectives
        )
        out.append(StageStatus(f"evaluation, world {w}", played, len(names) * len(spec.objectives),
                               "cell"))  # fmt: skip
    return out


def warm_start_stage(name: str) -> str:
    """A warm start's stage name (walls.json, the UI): `warm start`, `warm start upto4`."""
    return "warm start" if name == PLAIN else f"warm start {name}"
