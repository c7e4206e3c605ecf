"""Where an experiment's stages live in its run directory, and which have finished.

  experiment.json                  the experiment's settings and resolved config
  warm_start/                      the warm start, trained once (its assets beside it)
  <arm dir>/seed<k>/               each arm × training seed (ppo_mem1, ppo_full, sft_mem1)
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
from dataclasses import dataclass
from pathlib import Path

from mem1_core.experiment.spec import AGENT_ARM, ARMS, ExperimentSpec
from mem1_core.runs.atomic import write_json
from mem1_core.runs.layout import PPO_FULL, PPO_MEM1, SFT_MEM1, WARM_START, RunPaths

ARM_DIRS = {"mem1-ppo": PPO_MEM1, "full-ppo": PPO_FULL, "mem1-sft": SFT_MEM1}
"""Each arm's directory under the run (the pipeline's stage names)."""

AGENT_MEMORY = {"warm-start": "mem1", "mem1-ppo": "mem1", "full-ppo": "full",
                "truncate-ppo": "truncate", "mem1-sft": "mem1"}  # fmt: skip
"""The memory policy each agent plays under."""

SPEC_FILE = "experiment.json"
"""A run's record: its experiment's settings and resolved config."""

EVAL_ONLY = ("eval",)
"""Config sections that change no training: a run resumed or reused with other values there
keeps its arms (each evaluation cell records the settings it was played under)."""
NEUTRAL = ("resources", "ppo.checkpoint_every")
"""Sections and fields that say where and how often, not what, a run trains: the machines
and processes (a run resumed on another cluster layout) and the checkpoint cadence (a resume
restores the RNG and optimiser state exactly, whichever checkpoint it starts from)."""


def training_changes(old: dict, new: dict) -> list[str]:
    """The config fields (`section.field`) whose values differ between two resolved configs
    (config_json's), outside the evaluation-only sections and the NEUTRAL fields."""
    return sorted(
        f"{s}.{k}"
        for s, sec in new.items()
        if isinstance(sec, dict) and s not in EVAL_ONLY and s not in NEUTRAL
        for k in sec
        if f"{s}.{k}" not in NEUTRAL and (old.get(s) or {}).get(k) != sec[k]
    )


def _record(spec: ExperimentSpec, cfg) -> dict:
    from mem1_core.config import config_json

    return {"experiment": spec.to_dict(), "config": json.loads(config_json(cfg))}


def check_run_dir(run_dir: Path, spec: ExperimentSpec, cfg) -> None:
    """Write the run's record (experiment.json) in a new run directory; in an existing one,
    refuse a config that trains differently (its finished stages would be reused under the
    wrong settings). Other arms, seeds, worlds or N may change: what is new runs, what is
    finished is kept."""
    path = Path(run_dir) / SPEC_FILE
    record = _record(spec, cfg)
    if path.is_file():
        old = json.loads(path.read_text())
        changed = training_changes(old["config"], record["config"])
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

    @property
    def trainer(self) -> str:
        return ARMS[self.arm][0]

    @property
    def memory(self) -> str:
        return ARMS[self.arm][1]

    @property
    def label(self) -> str:
        """Its name in the UI: `ppo-mem1 · seed 1`."""
        trainer, memory = ARMS[self.arm]
        return f"{trainer}-{memory} · seed {self.seed}"


def arm_dir(run_dir: Path, arm: str, seed: int) -> Path:
    return Path(run_dir) / ARM_DIRS[arm] / f"seed{seed}"


def arm_runs(spec: ExperimentSpec, run_dir: Path) -> list[ArmRun]:
    """Every arm × seed, PPO arms first (the SFT arm is the short one)."""
    order = sorted(spec.arms, key=lambda a: (ARMS[a][0] != "ppo", list(ARMS).index(a)))
    return [ArmRun(a, s, arm_dir(run_dir, a, s)) for a in order for s in spec.arms[a]]


def arm_count(cfg, arm: str) -> tuple[int, str]:
    """An arm's count and the metrics key it is in: PPO iterations, SFT steps."""
    return (cfg.ppo.iterations, "iteration") if ARMS[arm][0] == "ppo" else (cfg.sft.steps, "step")


def finished(run: ArmRun, cfg) -> bool:
    """The arm ran its whole count: a PPO arm's last metrics row says how it stopped and
    counts every iteration; an SFT arm has its policy and result.json beside its metrics."""
    count, key = arm_count(cfg, run.arm)
    if run.trainer == "sft":
        return (run.dir / "result.json").is_file() and (run.dir / "policy").is_dir()
    rows = RunPaths(run.dir).read_metrics() if run.dir.exists() else []
    return bool(rows) and "stopped_by" in rows[-1] and rows[-1][key] + 1 >= count


def link_reused(spec: ExperimentSpec, cfg, source: Path, run_dir: Path) -> list[str]:
    """Link a finished run's warm start and arms into `run_dir` (never copied, never trained
    again) -> what was linked. An arm × seed of `source` short of its count is refused in one
    line; one `source` never ran is left to train here."""
    source, run_dir = Path(source).resolve(), Path(run_dir)
    if not (source / WARM_START).is_dir() or not (source / SPEC_FILE).is_file():
        raise ValueError(
            f"reuse {source}: no {WARM_START}/ and {SPEC_FILE} (not an experiment run)"
        )
    changed = training_changes(
        json.loads((source / SPEC_FILE).read_text())["config"], _record(spec, cfg)["config"]
    )
    if changed:
        raise ValueError(
            f"reuse {source}: it trained with other settings ({', '.join(changed)}); its warm "
            "start and arms would not be this experiment's"
        )
    if not (source / WARM_START / "result.json").is_file():
        # linked unfinished, it would go on training in the other run's directory
        raise ValueError(f"reuse {source}: its warm start has not finished")
    run_dir.mkdir(parents=True, exist_ok=True)
    linked = []
    pairs = [(source / WARM_START, run_dir / WARM_START)]
    for run in arm_runs(spec, run_dir):
        src = arm_dir(source, run.arm, run.seed)
        if not src.exists():
            continue
        if not finished(ArmRun(run.arm, run.seed, src), cfg):
            count, key = arm_count(cfg, run.arm)
            raise ValueError(f"reuse {source}: {run.label} has not finished its {count} {key}s")
        pairs.append((src, run.dir))
    for src, dst in pairs:
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
            linked.append(str(dst.relative_to(run_dir)))
    return linked


def agent_name(agent: str, seed: int | None) -> str:
    """An evaluated agent's name: `mem1-ppo-s1`, `warm-start` (trained once)."""
    return agent if seed is None else f"{agent}-s{seed}"


def split_agent(name: str) -> tuple[str, int | None]:
    """`mem1-ppo-s1` -> (`mem1-ppo`, 1); `warm-start` -> (`warm-start`, None)."""
    base, _, seed = name.rpartition("-s")
    if base in AGENT_ARM and seed.isdigit():
        return base, int(seed)
    return name, None


def eval_agents(spec: ExperimentSpec, run_dir: Path) -> list[tuple[str, str, str]]:
    """(name, policy directory, memory policy) of every agent × seed the final evaluation
    plays: the warm start once, each arm's policy under each of its seeds."""
    from mem1_core.runs.layout import resolve_init

    out = []
    for agent in spec.agents:
        for seed in spec.seeds(agent):
            d = (
                Path(run_dir) / WARM_START
                if seed is None
                else arm_dir(run_dir, AGENT_ARM[agent], seed)
            )
            out.append((agent_name(agent, seed), str(resolve_init(d)), AGENT_MEMORY[agent]))
    return out


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
    """How far each stage of the run has come, from what it wrote: the warm start, each arm ×
    seed (iterations or steps in its metrics), each world's evaluation (cells played)."""
    from mem1_core.experiment.spec import arm_config

    run_dir = Path(run_dir)
    out = [StageStatus("warm start", int((run_dir / WARM_START / "result.json").is_file()), 1,
                       "stage")]  # fmt: skip
    for run in arm_runs(spec, run_dir):
        acfg = arm_config(spec, run.arm, run.seed)
        count, key = arm_count(acfg, run.arm)
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
