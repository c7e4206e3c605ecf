"""An experiment's settings: its warm starts, its arms (each a trainer, a memory policy, config
overrides and training seeds), the agents it evaluates on which worlds at which N, and the bars
its claims are held to. Read from a YAML file beside the profiles (`data/experiments/<name>.yaml`,
each value commented with why; mem1_core.experiment.parse), never from code: a new variant is a new line in a file.

    profile: smol                 # the config profile every stage starts from
    set: {ppo.iterations: 16}     # config overrides over the profile (section.field: value)
    warm_starts:                  # named warm starts beside the plain one (optional)
      upto4: {set: {sft.warm_start_objectives: [1, 2, 3, 4]}}
    arms:                         # arm -> trainer, memory policy, overrides, warm start, seeds
      mem1-ppo: {trainer: ppo, memory: mem1, seeds: [0, 1, 2]}
      full-ppo: {trainer: ppo, memory: full, seeds: [0, 1, 2]}
      mem1-sft: {trainer: sft, memory: mem1, seeds: [0]}
      mem1-ppo-upto4: {trainer: ppo, memory: mem1, warm_start: upto4, seeds: [0, 1]}
    eval: {worlds: [4242], objectives: [1, 2, 4, 8, 16], objectives_per_n: 128,
           agents: [warm-start, mem1-ppo, full-ppo, mem1-sft, truncate-ppo],
           plays: {truncate-ppo: {arm: full-ppo, memory: truncate}}, teacher: false}
    curve: {objectives: [8], points: 4}   # the PPO arms' held-out learning curves
    claims: {se: 2.0, peak_ratio: 0.3, mem1: mem1-ppo, full: full-ppo, sft: mem1-sft,
             full_at: [8, 16], full_test: above, peak_at: 16,
             above: [{a: mem1-ppo-upto4, b: mem1-ppo, objectives: [4, 8]}]}
    ray: false

An arm's config is the profile, the experiment's `set:`, its warm start's `set:`, its trainer's
defaults (`mem1 train grpo`'s group of 4), its own `set:`, then its memory policy and seed. The
agents an experiment evaluates are named: `warm-start` (the plain warm start, under MEM1's
memory), `warm-start-<name>` (a named one), an arm (its policy under its memory, one agent per
seed), or an entry of `eval.plays` (an arm's policy under another memory). A warm start is
evaluated under the memory it was trained under: MEM1's, or its own `rollout.memory` setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "data" / "experiments"
"""The repository's `data/experiments/` (overridden by the `MEM1_EXPERIMENTS` variable)."""

TRAINERS = ("ppo", "grpo", "sft")
"""How an arm trains from its warm start: PPO (GAE, a critic), GRPO (group-relative, no critic;
`mem1 train grpo`'s defaults) or SFT on the teacher's trajectories at the training N."""
PLAIN = "plain"
"""The warm start every arm starts from unless it names another: the profile's."""
WARM_START_AGENT = "warm-start"
"""The plain warm start's agent name; a named warm start's is `warm-start-<name>`."""
WARM_START_MEMORY = "mem1"
"""The memory policy a warm start is evaluated under (it learnt MEM1's format)."""

LEGACY_ARMS = {"mem1-ppo": ("ppo", "mem1"), "full-ppo": ("ppo", "full"),
               "mem1-sft": ("sft", "mem1")}  # fmt: skip
"""What a run record written before arms were data meant by its arm names (its `arms:` was
arm -> seeds); read only from such a record (`ExperimentSpec.from_dict`)."""
LEGACY_PLAYS = {"truncate-ppo": ("full-ppo", "truncate")}
"""Likewise its one agent that played an arm under another memory."""


@dataclass(frozen=True)
class WarmStart:
    """A named warm start: the plain one's config with `overrides` (its file's `set:`)."""

    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Arm:
    """One arm: how it trains, under which memory policy, from which warm start, with which
    config overrides, under which training seeds (`model.seed`)."""

    trainer: str
    memory: str
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    """`section.field=value` over the experiment's (and its warm start's) settings."""
    warm_start: str = PLAIN

    def to_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "memory": self.memory, "seeds": list(self.seeds),
                "set": list(self.overrides), "warm_start": self.warm_start}  # fmt: skip


@dataclass(frozen=True)
class Play:
    """An evaluated agent that plays arm `arm`'s policy under memory policy `memory` (the
    full-context arm's policy with its context cut to the last turns, for one)."""

    arm: str
    memory: str


@dataclass(frozen=True)
class Above:
    """A claim of the file's own: agent `a` above agent `b` in EM at each N of `objectives`."""

    a: str
    b: str
    objectives: tuple[int, ...]


FULL_TESTS = ("above", "not_below")
"""How MEM1 is held against the full context (`claims.full_test`): `above`, its EM higher by
more than the bar (QA, the paper's Table 1), or `not_below`, no deficit beyond the bar (WebShop:
70.87 against AgentLM-13B's 70.80, a match at a fraction of the tokens)."""


@dataclass(frozen=True)
class PaperClaims:
    """Where the paper's claims are read in an experiment's domain (its file's `claims:`): MEM1
    against the full context at each N of `full_at` under `full_test` (FULL_TESTS), MEM1's peak
    tokens against the full context's at N=`peak_at`. The defaults are the QA paper's."""

    full_at: tuple[int, ...] = (8, 16)
    full_test: str = "above"
    peak_at: int = 16


CLAIM_ROLES = {"mem1": "mem1-ppo", "full": "full-ppo", "sft": "mem1-sft",
               "start": WARM_START_AGENT}  # fmt: skip
"""The paper's claims' agents by role (defaults): MEM1 trained by RL, the full-context agent,
the SFT agent and MEM1's start (mem1_core.experiment.headline.claims_for)."""


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: arms × training seeds × held-out worlds, and the claims' bars."""

    name: str
    """The file's stem (`smol` for data/experiments/smol.yaml)."""
    profile: str
    """The config profile every stage starts from."""
    overrides: tuple[str, ...] = ()
    """`section.field=value` over the profile, from the file's `set:` mapping."""
    arms: dict[str, Arm] = field(default_factory=dict)
    """Arm name -> the arm (its trainer, memory, overrides, warm start, seeds)."""
    warm_starts: dict[str, WarmStart] = field(default_factory=dict)
    """Named warm starts beside the plain one (PLAIN), each with its overrides."""
    plays: dict[str, Play] = field(default_factory=dict)
    """Agent name -> an arm's policy played under another memory policy."""
    worlds: tuple[int, ...] = ()
    """Held-out world seeds no stage trained on, evaluated beside the run's own test split."""
    objectives: tuple[int, ...] = (1, 2, 4, 8, 16)
    """The N of the final evaluation."""
    objectives_per_n: int = 128
    """Objectives per N of the final evaluation: ceil(this / N) test tasks."""
    agents: tuple[str, ...] = (WARM_START_AGENT, "mem1-ppo", "full-ppo", "mem1-sft")
    """The agents evaluated (see the module's docstring); each arm's under each of its seeds."""
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
    roles: dict[str, str] = field(default_factory=lambda: dict(CLAIM_ROLES))
    """The paper's claims' agents by role (CLAIM_ROLES); a claim whose agents the experiment
    does not evaluate is left out."""
    paper: PaperClaims = field(default_factory=PaperClaims)
    """At which N, and how, the paper's claims against the full context are read."""
    above: tuple[Above, ...] = ()
    """The file's own claims: an agent above another at some N (a lever above the paper's
    setting)."""
    effects: tuple[Above, ...] = ()
    """Differences the experiment measures and reports (per seed and pooled, ± paired SE)
    without claiming them: a lever's effect against the paper's setting, on fewer seeds than a
    claim needs. They are no part of the claims' family (no verdict, no correction)."""
    ray: bool = False
    """Train the PPO arms on Ray actors (a cluster); False: in the flow's own process."""
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Named parts (the file's `parts:`): part -> the arms it trains, where one training seed of
    every arm is more than a machine should run at once (mem1_core.experiment.parts)."""
    pair_across_starts: bool = False
    """Merging parts whose warm starts' weights differ is meant (the file's `merge:`): their
    arms are compared with the first part's warm start. False: such a merge is refused."""
    selection: dict[str, Any] | None = None
    """The part of the experiment this spec runs (`{"seeds": [...], "part": NAME}`:
    mem1_core.experiment.parts.select_part); None: the whole experiment."""
    whole: dict[str, Any] | None = field(default=None, compare=False)
    """The whole experiment (its to_dict) where this spec is one part of it: what a merge of
    parts judges the claims by."""

    def __post_init__(self) -> None:
        from mem1_core.config.sections import MEMORIES

        where = f"experiment {self.name}"
        if not self.arms or not any(a.seeds for a in self.arms.values()):
            raise ValueError(f"{where}: give at least one arm with a seed")
        if PLAIN in self.warm_starts:
            raise ValueError(
                f"{where}: warm start {PLAIN!r} is the profile's; name yours otherwise"
            )
        for name, arm in self.arms.items():
            if arm.trainer not in TRAINERS:
                raise ValueError(
                    f"{where}: arm {name} has trainer {arm.trainer!r}; use one of {list(TRAINERS)}"
                )
            if arm.memory not in MEMORIES:
                raise ValueError(
                    f"{where}: arm {name} has memory {arm.memory!r}; use one of {list(MEMORIES)}"
                )
            if arm.warm_start != PLAIN and arm.warm_start not in self.warm_starts:
                raise ValueError(
                    f"{where}: arm {name} starts from warm start {arm.warm_start!r}, which "
                    f"`warm_starts:` does not declare (declared: {list(self.warm_starts)})"
                )
        dirs: dict[str, str] = {}
        for name, arm in self.arms.items():
            other = dirs.setdefault(arm_subdir(name, arm), name)
            if other != name:
                raise ValueError(
                    f"{where}: arms {other} and {name} train the same thing (trainer, memory, "
                    "no `set:`, the plain warm start): keep one"
                )
        for name, play in self.plays.items():
            if name in self.arms or name in self.warm_start_agents():
                raise ValueError(
                    f"{where}: eval.plays {name} is also an arm's or warm start's name"
                )
            # an entry no agent plays may name an arm an override dropped (smol.yaml's
            # truncate-ppo under `experiment.arms={mem1-ppo: …}`)
            if play.arm not in self.arms and name in self.agents:
                raise ValueError(
                    f"{where}: eval.plays {name} plays arm {play.arm!r}, which the experiment "
                    f"does not train (arms: {list(self.arms)})"
                )
            if play.memory not in MEMORIES:
                raise ValueError(
                    f"{where}: eval.plays {name} has memory {play.memory!r}; use one of "
                    f"{list(MEMORIES)}"
                )
        known = [*self.warm_start_agents(), *self.arms, *self.plays]
        bad = [a for a in self.agents if a not in known]
        if bad:
            raise ValueError(
                f"{where}: agents {bad} are no warm start, arm or eval.plays entry of the "
                f"experiment (known: {known}); add the arm or drop the agent"
            )
        for c in (*self.above, *self.effects):
            missing = [x for x in (c.a, c.b) if x not in self.agents]
            if missing or not c.objectives:
                raise ValueError(
                    f"{where}: claims.above {c.a} over {c.b} needs both among eval.agents "
                    f"(missing {missing}) and at least one N"
                )
        if self.paper.full_test not in FULL_TESTS:
            raise ValueError(
                f"{where}: claims.full_test {self.paper.full_test!r}; use one of {list(FULL_TESTS)}"
            )
        unknown_roles = set(self.roles) - set(CLAIM_ROLES)
        if unknown_roles:
            raise ValueError(
                f"{where}: claims roles {sorted(unknown_roles)} unknown; known: {list(CLAIM_ROLES)}"
            )
        if self.objectives_per_n < 1 or not self.objectives or min(self.objectives) < 1:
            raise ValueError(f"{where}: objectives and objectives_per_n must be >= 1")
        for part, arms in self.parts.items():
            unknown = [a for a in arms if a not in self.arms]
            if not arms or (unknown and self.selection is None):
                raise ValueError(
                    f"{where}: part {part} trains arms {list(arms)}; give at least one of the "
                    f"experiment's arms ({list(self.arms)})"
                )

    def warm_start_agents(self) -> dict[str, str]:
        """Agent name -> warm start name (`warm-start` -> PLAIN)."""
        return {WARM_START_AGENT: PLAIN, **{f"{WARM_START_AGENT}-{w}": w for w in self.warm_starts}}

    def agent_arm(self, agent: str) -> str | None:
        """The arm whose policy an agent plays (None: a warm start's)."""
        if agent in self.arms:
            return agent
        return self.plays[agent].arm if agent in self.plays else None

    def agent_memory(self, agent: str) -> str:
        """The memory policy an agent plays under: an arm's, a play's, or the one its warm
        start was trained under (its `rollout.memory` setting, MEM1's by default)."""
        if agent in self.plays:
            return self.plays[agent].memory
        if agent in self.arms:
            return self.arms[agent].memory
        ws = self.warm_start_agents().get(agent, PLAIN)
        own = [] if ws == PLAIN else [o.partition("=")[2] for o in self.warm_starts[ws].overrides
                                      if o.startswith("rollout.memory=")]  # fmt: skip
        if not own:
            return WARM_START_MEMORY
        return str(yaml.safe_load(own[-1]))  # the loader's reading of a `set:` value

    def seeds(self, agent: str) -> tuple[int | None, ...]:
        """The training seeds an agent is evaluated under (a warm start: one, None)."""
        arm = self.agent_arm(agent)
        return (None,) if arm is None else self.arms[arm].seeds

    def used_warm_starts(self) -> list[str]:
        """The warm starts a run trains, each an arm or agent needs: the plain one first."""
        wanted = {a.warm_start for a in self.arms.values()}
        wanted |= {
            self.warm_start_agents()[a] for a in self.agents if a in self.warm_start_agents()
        }
        return [w for w in (PLAIN, *self.warm_starts) if w in wanted]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "profile": self.profile, "overrides": list(self.overrides),
            "arms": {a: arm.to_dict() for a, arm in self.arms.items()},
            "arm_order": list(self.arms),  # a run record's JSON sorts its keys
            "warm_starts": {w: {"set": list(ws.overrides)} for w, ws in self.warm_starts.items()},
            "plays": {p: {"arm": x.arm, "memory": x.memory} for p, x in self.plays.items()},
            "worlds": list(self.worlds),
            "objectives": list(self.objectives), "objectives_per_n": self.objectives_per_n,
            "agents": list(self.agents), "teacher": self.teacher,
            "eval_overrides": list(self.eval_overrides),
            "curve_objectives": list(self.curve_objectives), "curve_points": self.curve_points,
            "se_bar": self.se_bar, "peak_ratio_bar": self.peak_ratio_bar,
            "roles": dict(self.roles),
            "paper": {"full_at": list(self.paper.full_at), "full_test": self.paper.full_test,
                      "peak_at": self.paper.peak_at},
            "above": [{"a": c.a, "b": c.b, "objectives": list(c.objectives)} for c in self.above],
            "effects": [{"a": c.a, "b": c.b, "objectives": list(c.objectives)}
                        for c in self.effects],
            "ray": self.ray,
            "parts": {p: list(arms) for p, arms in self.parts.items()},
            "pair_across_starts": self.pair_across_starts,
            "selection": self.selection,
            "whole": self.whole,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExperimentSpec:
        """The spec `to_dict` wrote (a run's experiment.json), or one a run recorded before
        arms were data (arm -> seeds, by the LEGACY_ARMS names)."""
        tuples = ("overrides", "worlds", "objectives", "agents", "eval_overrides",
                  "curve_objectives")  # fmt: skip
        arms, plays = {}, {p: Play(**x) for p, x in (d.get("plays") or {}).items()}
        d = dict(d)
        order = d.pop("arm_order", None) or list(d["arms"])
        for a, v in ((a, d["arms"][a]) for a in order):
            if isinstance(v, dict):
                arms[a] = Arm(v["trainer"], v["memory"], tuple(v["seeds"]), tuple(v.get("set", ())),
                              v.get("warm_start", PLAIN))  # fmt: skip
            else:
                arms[a] = Arm(*LEGACY_ARMS[a], seeds=tuple(v))
        for p, (arm, memory) in LEGACY_PLAYS.items():
            if p in d.get("agents", ()) and p not in plays:
                plays[p] = Play(arm, memory)
        return cls(**{
            **d, **{k: tuple(d[k]) for k in tuples if k in d},
            "arms": arms, "plays": plays,
            "parts": {p: tuple(x) for p, x in (d.get("parts") or {}).items()},
            "paper": PaperClaims(**{k: tuple(v) if k == "full_at" else v
                                    for k, v in (d.get("paper") or {}).items()}),
            "warm_starts": {w: WarmStart(tuple(x.get("set", ())))
                            for w, x in (d.get("warm_starts") or {}).items()},
            **{k: tuple(Above(c["a"], c["b"], tuple(c["objectives"])) for c in d.get(k, ()))
               for k in ("above", "effects")},
        })  # fmt: skip


def arm_subdir(name: str, arm: Arm) -> str:
    """An arm's directory under the run: `<trainer>_<memory>` (ppo_mem1, ppo_full, sft_mem1,
    the pipeline's stage names) for an arm that is only its trainer and memory from the plain
    warm start, so that runs made before arms were data resume; `arm_<name>` for any other."""
    if not arm.overrides and arm.warm_start == PLAIN:
        return f"{arm.trainer}_{arm.memory}"
    return f"arm_{name}"


def warm_start_subdir(name: str) -> str:
    """A warm start's directory under the run: `warm_start` (the plain one), `warm_start_<name>`."""
    from mem1_core.runs.layout import WARM_START

    return WARM_START if name == PLAIN else f"{WARM_START}_{name}"
