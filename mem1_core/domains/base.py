"""What a domain supplies to the pipeline (docs/design.md, "Domains").

The memory policies, the trajectory tree, PPO, SFT, evaluation, the models and the flows are the
same for every domain; each asks the run's Domain (mem1_core.domains.registry.domain_of) for
what differs:
- its tasks and splits (`ensure_tasks`), and the data stage that prepares them (`prepare_data`);
- whether it searches an index the run builds (`uses_index`: the index stage and the
  retriever actors), over which corpus (`index_corpus`), and the index (`ensure_index`);
- its environment (`make_env`: prompt, actions, observations, reward, its own metrics);
- its scripted teacher's task sources (`has_teacher`, `teacher_sources`);
- the texts a tokenizer it trains is fitted on (`tokenizer_texts`);
- its headline's units (`units`), how a sample trajectory's outcome reads (`sample_outcome`)
  and any evaluation tables of its own (`evaluation_extras`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mem1_core.domains.outcome import Outcome


@dataclass(frozen=True)
class Units:
    """How a domain's headline names and scales its figures (mem1_core.evaluation.report
    renders them). The defaults are QA's: the units of a headline written before headlines
    recorded theirs."""

    score: str = "EM"
    """The task score's name (QA: "EM"; WebShop: "reward")."""
    objective: str = "objectives"
    """What N counts (QA: "objectives"; WebShop: "goals", one per task)."""
    scale: float = 1.0
    """The headline shows the mean task score times this (WebShop: 100, the scale WebShop's
    and MEM1's papers report reward on); 1: a fraction."""
    success: float | None = None
    """A task succeeds when its score equals this (WebShop: 1.0, everything the goal asks for
    bought, WebShop's success rate); None: the domain reports no success rate."""
    per_objective: bool = True
    """A task's score is the share of its N objectives right, so the headline also sums it over
    them (QA's EM sum, the paper's 0..N scale); False where a task is one goal (WebShop)."""
    held_out: str = "tasks (entities no training task mentions)"
    """What the evaluation's held-out tasks are, for the headline's first line."""
    scoring: str = (
        "Scored with `{scorer}` (eval.scorer); EM sum = EM fraction × N, the paper's scale."
    )
    """How the tasks were scored, for the headline (`{scorer}`: the evaluation's eval.scorer)."""
    credited: str = "tasks with EM > 0 (paper)"
    """The tasks the credited peak averages over (the tasks with any objective right: in
    WebShop, whose one objective records success, the successful ones)."""

    @property
    def scaled(self) -> str:
        """The score's short name on the headline's scale: "EM", "reward ×100"."""
        return self.score if self.scale == 1 else f"{self.score} ×{self.scale:g}"

    @property
    def column(self) -> str:
        """The score's column in the headline: "EM fraction" (a 0..1 score), "reward ×100"."""
        return f"{self.score} fraction" if self.scale == 1 else self.scaled

    @property
    def figures(self) -> str:
        """What the headline reports, for its first line: "EM", "reward ×100 and success rate"."""
        return self.scaled + (" and success rate" if self.success is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Units:
        """The units a headline recorded (QA's where it recorded none)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in known})


class Domain(ABC):
    """One domain of tasks behind the rollout (see the module's docstring)."""

    name: str = ""
    units: Units = Units()

    def check(self, cfg) -> None:
        """Refuse, with the field to change, a config the domain cannot run (called whenever a
        run's domain is looked up, so before any stage does work). By default: nothing to
        refuse."""
        return None

    @abstractmethod
    def ensure_tasks(self, cfg, paths, split: str, n: int) -> Path:
        """The split's N-objective tasks file, made if missing."""

    @abstractmethod
    def make_env(self, cfg, paths, tokenizer, retriever=None):
        """The run's environment (mem1_core.rollout.environment.Environment)."""

    def uses_index(self, cfg) -> bool:
        """Whether the run builds and searches a retrieval index of its own (QA on its index;
        not where a server or a web search API answers, nor WebShop, whose environment searches
        its shop by itself)."""
        return False

    def index_corpus(self, cfg, paths) -> Path:
        """The corpus file the run's index is built over (made if missing), where `uses_index`."""
        raise ValueError(f"env.kind={self.name}: the domain searches no index of the run's own")

    def ensure_index(self, cfg, paths) -> Path:
        """The run's index (built, or reused while its corpus is unchanged), where `uses_index`."""
        from mem1_core.retrieval.run_index import ensure_run_index

        return ensure_run_index(cfg, paths, lambda: self.index_corpus(cfg, paths))

    def prepare_data(self, cfg, paths) -> Path | None:
        """What the data stage builds before composing tasks (QA: the world); None: nothing."""
        return None

    def has_teacher(self, cfg) -> bool:
        """Whether the run's tasks have scripted teacher trajectories (SFT needs them)."""
        return False

    def teacher_sources(self, cfg, paths, tokenizer) -> list[tuple[Any, Any]]:
        """(config, run paths) of sources of teacher tasks beyond the run's own."""
        return []

    def tokenizer_texts(self, cfg, paths) -> list[str] | None:
        """The texts a tokenizer trained for the run is fitted on; None: the default's."""
        return None

    def evaluation_extras(self, cfg, paths, out: Path, agents: list[str], ns) -> dict[str, Any]:
        """Evaluation tables of the domain's own, beside the objective-scaling table."""
        return {}

    def sample_outcome(self, traj, questions: Sequence[str] | None = None) -> Outcome:
        """How a sample trajectory's outcome reads (mem1_core.domains.outcome.Outcome): by
        default per objective, what was asked, the gold, what was answered and whether it
        scored. `questions`: the task's, where known."""
        from mem1_core.domains.outcome import objectives_outcome

        return objectives_outcome(traj, questions)
