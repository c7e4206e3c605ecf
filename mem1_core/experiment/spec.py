"""An experiment's settings: which arms train with which seeds, on what profile, evaluated on
which worlds at which N, and the bars its claims are held to. Read from a YAML file beside the
profiles (`data/experiments/<name>.yaml`, each value commented with why), never from code.

    profile: smol                 # the config profile every stage starts from
    set: {ppo.iterations: 16}     # config overrides over the profile (section.field: value)
    arms: {mem1-ppo: [0, 1], full-ppo: [0, 1], mem1-sft: [0]}   # arm -> training seeds
    eval: {worlds: [4242], objectives: [1, 2, 4, 8, 16], objectives_per_n: 128,
           agents: [warm-start, mem1-ppo, full-ppo, mem1-sft], teacher: false}
    curve: {objectives: [8], points: 4}   # the PPO arms' held-out learning curves
    claims: {se: 2.0, peak_ratio: 0.3}
    ray: false
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "data" / "experiments"
"""The repository's `data/experiments/` (overridden by the `MEM1_EXPERIMENTS` variable)."""

ARMS: dict[str, tuple[str, str]] = {
    "mem1-ppo": ("ppo", "mem1"),
    "full-ppo": ("ppo", "full"),
    "mem1-sft": ("sft", "mem1"),
}
"""The trained arms, by the pipeline's agent names: arm -> (trainer, memory policy)."""

AGENTS = ("warm-start", "mem1-ppo", "full-ppo", "truncate-ppo", "mem1-sft")
"""The agents an experiment can evaluate: the warm start, each arm's policy, and the
full-context arm's policy with its context cut to the last turns (`truncate-ppo`)."""

AGENT_ARM = {"mem1-ppo": "mem1-ppo", "full-ppo": "full-ppo", "truncate-ppo": "full-ppo",
             "mem1-sft": "mem1-sft"}  # fmt: skip
"""The arm whose policy an agent plays (the warm start's is no arm's)."""


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: arms × training seeds × held-out worlds, and the claims' bars."""

    name: str
    """The file's stem (`smol` for data/experiments/smol.yaml)."""
    profile: str
    """The config profile every stage starts from."""
    overrides: tuple[str, ...] = ()
    """`section.field=value` over the profile, from the file's `set:` mapping."""
    arms: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Arm -> its training seeds (`model.seed` of each arm run; the warm start trains once)."""
    worlds: tuple[int, ...] = ()
    """Held-out world seeds no stage trained on, evaluated beside the run's own test split."""
    objectives: tuple[int, ...] = (1, 2, 4, 8, 16)
    """The N of the final evaluation."""
    objectives_per_n: int = 128
    """Objectives per N of the final evaluation: ceil(this / N) test tasks."""
    agents: tuple[str, ...] = ("warm-start", "mem1-ppo", "full-ppo", "mem1-sft")
    """The agents evaluated (AGENTS); each trained arm's under each of its seeds."""
    teacher: bool = False
    """Also evaluate the scripted teacher (perfect play, under MEM1 and the full context)."""
    eval_overrides: tuple[str, ...] = ()
    """`section.field=value` for the final evaluation only (the file's `eval.set:`), after the
    experiment's own: settings that change no training (a scorer, a generation backend)."""
    curve_objectives: tuple[int, ...] = (8,)
    """The longer N of the PPO arms' held-out curve (beside the training N)."""
    curve_points: int = 4
    """Held-out evaluations per PPO arm over its iterations (`ppo.eval_every`)."""
    se_bar: float = 2.0
    """A difference claim holds where it exceeds this many of its (paired) standard errors."""
    peak_ratio_bar: float = 0.3
    """MEM1's peak tokens relative to the full context's hold at or under this (paper: 0.27)."""
    ray: bool = False
    """Train the PPO arms on Ray actors (a cluster); False: in the flow's own process."""

    def __post_init__(self) -> None:
        unknown = set(self.arms) - set(ARMS)
        if unknown:
            raise ValueError(
                f"experiment {self.name}: arms {sorted(unknown)} unknown; known: {list(ARMS)}"
            )
        if not any(s for s in self.arms.values()):
            raise ValueError(f"experiment {self.name}: give at least one arm with a seed")
        bad = set(self.agents) - set(AGENTS)
        if bad:
            raise ValueError(
                f"experiment {self.name}: agents {sorted(bad)} unknown; known: {list(AGENTS)}"
            )
        untrained = {a for a in self.agents if a in AGENT_ARM and AGENT_ARM[a] not in self.arms}
        if untrained:
            raise ValueError(
                f"experiment {self.name}: agents {sorted(untrained)} play an arm the experiment "
                f"does not train (arms: {list(self.arms)}); add the arm or drop the agent"
            )
        if self.objectives_per_n < 1 or not self.objectives or min(self.objectives) < 1:
            raise ValueError(
                f"experiment {self.name}: objectives and objectives_per_n must be >= 1"
            )

    def seeds(self, agent: str) -> tuple[int, ...]:
        """The training seeds an agent is evaluated under (the warm start: one, None)."""
        return self.arms[AGENT_ARM[agent]] if agent in AGENT_ARM else (None,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "profile": self.profile, "overrides": list(self.overrides),
            "arms": {a: list(s) for a, s in self.arms.items()}, "worlds": list(self.worlds),
            "objectives": list(self.objectives), "objectives_per_n": self.objectives_per_n,
            "agents": list(self.agents), "teacher": self.teacher,
            "eval_overrides": list(self.eval_overrides),
            "curve_objectives": list(self.curve_objectives), "curve_points": self.curve_points,
            "se_bar": self.se_bar, "peak_ratio_bar": self.peak_ratio_bar, "ray": self.ray,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExperimentSpec:
        """The spec `to_dict` wrote (a run's experiment.json)."""
        tuples = ("overrides", "worlds", "objectives", "agents", "eval_overrides",
                  "curve_objectives")  # fmt: skip
        return cls(**{
            **d, **{k: tuple(d[k]) for k in tuples if k in d},
            "arms": {a: tuple(s) for a, s in d["arms"].items()},
        })  # fmt: skip


def experiments_dir() -> Path:
    return Path(os.environ.get("MEM1_EXPERIMENTS") or EXPERIMENTS_DIR)


def experiment_path(name_or_path: str) -> Path:
    """`smol` -> data/experiments/smol.yaml; a path to a YAML file as it is."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise FileNotFoundError(f"experiment file {p} does not exist")
        return p
    found = experiments_dir() / f"{name_or_path}.yaml"
    if not found.is_file():
        names = sorted(x.stem for x in experiments_dir().glob("*.yaml"))
        raise ValueError(f"experiment {name_or_path!r}: no {found}; the experiments are {names}")
    return found


_KEYS = {"profile", "set", "arms", "eval", "curve", "claims", "ray"}
_EVAL_KEYS = {"worlds", "objectives", "objectives_per_n", "agents", "teacher", "set"}


def _setting(key: str, value: Any) -> str:
    """A `set:` entry as the loader's override (`ppo.critic_layers=null`)."""
    return f"{key}={json.dumps(value)}"


SPEC_PREFIX = "experiment."
"""An override of the experiment file itself, not of the config: `experiment.eval.worlds=[7]`,
`experiment.arms.mem1-ppo=[0,1,2]`."""


def _apply_spec_overrides(raw: dict, overrides: list[str]) -> None:
    for item in overrides:
        key, sep, value = item.removeprefix(SPEC_PREFIX).partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: write {SPEC_PREFIX}key.subkey=value")
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part} is not a mapping in the experiment")
        node[leaf] = yaml.safe_load(value) if value.strip() else ""


def load_experiment(name_or_path: str, overrides: list[str] | None = None) -> ExperimentSpec:
    """An experiment from its YAML file. `overrides`: `section.field=value` go to the config
    after the file's `set:` (a user's --set wins); `experiment.key=value` replace the file's
    own keys (`experiment.eval.objectives_per_n=512`)."""
    path = experiment_path(name_or_path)
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict) or "profile" not in raw:
        raise ValueError(f"{path}: an experiment is a mapping with at least `profile:`")
    own = [o for o in overrides or [] if o.startswith(SPEC_PREFIX)]
    overrides = [o for o in overrides or [] if not o.startswith(SPEC_PREFIX)]
    _apply_spec_overrides(raw, own)
    for where, keys, allowed in (("", raw, _KEYS), ("eval.", raw.get("eval") or {}, _EVAL_KEYS)):
        extra = set(keys) - allowed
        if extra:
            raise ValueError(
                f"{path}: unknown keys {sorted(where + k for k in extra)}; known: {sorted(allowed)}"
            )
    ev, curve, claims = raw.get("eval") or {}, raw.get("curve") or {}, raw.get("claims") or {}
    spec = ExperimentSpec(
        name=path.stem,
        profile=str(raw["profile"]),
        overrides=(
            *(_setting(k, v) for k, v in (raw.get("set") or {}).items()),
            *(overrides or []),
        ),
        arms={str(a): tuple(int(s) for s in seeds) for a, seeds in (raw.get("arms") or {}).items()},
        worlds=tuple(int(w) for w in ev.get("worlds", ())),
        objectives=tuple(int(n) for n in ev.get("objectives", (1, 2, 4, 8, 16))),
        objectives_per_n=int(ev.get("objectives_per_n", 128)),
        agents=tuple(ev.get("agents", ("warm-start", "mem1-ppo", "full-ppo", "mem1-sft"))),
        teacher=bool(ev.get("teacher", False)),
        eval_overrides=tuple(_setting(k, v) for k, v in (ev.get("set") or {}).items()),
        curve_objectives=tuple(int(n) for n in curve.get("objectives", (8,))),
        curve_points=int(curve.get("points", 4)),
        se_bar=float(claims.get("se", 2.0)),
        peak_ratio_bar=float(claims.get("peak_ratio", 0.3)),
        ray=bool(raw.get("ray", False)),
    )
    return spec


def base_config(spec: ExperimentSpec):
    """The config every stage of the experiment starts from: the profile, the held-out curve's
    cadence (`curve_points` over the iterations, at the training N and `curve_objectives`),
    then the experiment's settings, which win."""
    from mem1_core.config import load_config

    first = load_config(spec.profile, None, list(spec.overrides))
    every = max(1, first.ppo.iterations // max(spec.curve_points, 1))
    curve = [f"ppo.eval_every={every}", f"ppo.eval_objectives={list(spec.curve_objectives)}"]
    return load_config(spec.profile, None, [*curve, *spec.overrides])


def arm_config(spec: ExperimentSpec, arm: str, seed: int):
    """An arm run's config: the experiment's, its memory policy, `model.seed` its seed."""
    from dataclasses import replace

    cfg = base_config(spec)
    memory = ARMS[arm][1]
    return replace(
        cfg, model=replace(cfg.model, seed=seed), rollout=replace(cfg.rollout, memory=memory)
    )


def eval_config(spec: ExperimentSpec, world: int):
    """The final evaluation's config on world `world` (its seed), at the experiment's N and
    objectives per N, with the evaluation's own settings (`eval.set:`) last."""
    from mem1_core.config import load_config

    cfg = base_config(spec)
    return load_config(
        spec.profile,
        None,
        [
            *spec.overrides,
            f"ppo.eval_every={cfg.ppo.eval_every}",
            f"ppo.eval_objectives={list(cfg.ppo.eval_objectives)}",
            f"world.seed={world}",
            f"data.eval_objectives={list(spec.objectives)}",
            f"data.eval_objectives_per_n={spec.objectives_per_n}",
            *spec.eval_overrides,
        ],
    )
