"""How a sample trajectory's outcome reads (`Domain.sample_outcome`), rendered by
mem1_core.evaluation.samples as markdown (the evaluation's sample artifacts) or text
(`mem1 show`): a phrase for its title, then per objective what was asked, the gold, what was
answered and whether it scored (`objectives_outcome`, the default), and any lines of the
domain's own (WebShop: the instruction, what was bought, its reward)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mem1_core.data.prompts import split_answers
from mem1_core.trajectory.record import Trajectory


@dataclass(frozen=True)
class ObjectiveMark:
    """One objective of a task: what was asked, the gold aliases, what the agent answered and
    whether it scored."""

    index: int
    """1-based."""
    question: str | None
    gold: list[str]
    answered: str | None
    right: bool


@dataclass(frozen=True)
class Outcome:
    """A sample trajectory's outcome as a reader sees it."""

    summary: str
    """After the task id in the title: "1/2 objectives right", "reward 0.75, bought …"."""
    marks: tuple[ObjectiveMark, ...] = ()
    """Per objective, in order (QA's view)."""
    facts: tuple[tuple[str, str], ...] = ()
    """(label, text), one line each, in order (WebShop: ("bought", …))."""


def objective_marks(
    traj: Trajectory, questions: Sequence[str] | None = None
) -> list[ObjectiveMark]:
    """Per objective, in order: the answer's part i (split on `;`), the gold, EM > 0."""
    parts = split_answers(traj.answer) if traj.answer is not None else []
    return [
        ObjectiveMark(
            index=i + 1,
            question=questions[i] if questions and i < len(questions) else None,
            gold=list(gold),
            answered=parts[i] if i < len(parts) else None,
            right=bool(traj.em[i] > 0) if i < len(traj.em) else False,
        )
        for i, gold in enumerate(traj.golden_answers)
    ]


def objectives_outcome(traj: Trajectory, questions: Sequence[str] | None = None) -> Outcome:
    """How many objectives came out right, and each one's question, gold and answer."""
    marks = objective_marks(traj, questions)
    right = sum(m.right for m in marks)
    return Outcome(f"{right}/{len(marks)} objectives right", tuple(marks))
