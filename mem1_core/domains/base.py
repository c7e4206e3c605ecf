"""What a domain supplies to the pipeline (docs/design.md, "Domains").

The memory policies, the trajectory tree, PPO, SFT, evaluation, the models and the flows are the
same for every domain; each asks the run's Domain (mem1_core.domains.registry.domain_of) for
what differs:
- its tasks and splits (`ensure_tasks`), and the data stage that prepares them (`prepare_data`);
- whether it searches an index the run builds (`uses_index`: the index stage and the
  retriever actors);
- its environment (`make_env`: prompt, actions, observations, reward, its own metrics);
- its scripted teacher's task sources (`has_teacher`, `teacher_sources`);
- the texts a tokenizer it trains is fitted on (`tokenizer_texts`);
- its headline's units (`units`) and any evaluation tables of its own (`evaluation_extras`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Units:
    """How a domain's headline names its figures."""

    score: str
    """The task score's name (QA: "EM"; WebShop: "reward")."""
    objective: str
    """What N counts (QA: "objectives"; WebShop: "goals", one per task)."""


class Domain(ABC):
    """One domain of tasks behind the rollout (see the module's docstring)."""

    name: str = ""
    units: Units = Units("EM", "objectives")

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
