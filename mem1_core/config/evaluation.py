"""The `eval` section: how the objective-scaling evaluation scores answers. Its own small
module (not sections.py) because it is the only evaluation-side setting so far."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.sections import Section

SCORER_NAMES = ("squad", "mem1-paper")
"""The scorers of mem1_core.evaluation.metrics.SCORERS."""


@dataclass(frozen=True)
class EvalConfig(Section):
    """The objective-scaling evaluation (`mem1 evaluate`, the pipeline's evaluation stage,
    the nightly evaluation)."""

    scorer: str = "squad"
    """`squad`: SQuAD normalisation, the training reward (MEM1's and Search-R1's EM), so a
    run's evaluation reads like its training curves. `mem1-paper`: MIT-MI/MEM1's
    `inference/eval.py`, stricter (punctuation to spaces, articles kept, a task with the wrong
    number of `;`-separated answers scores 0, F1 over word sets), for numbers set beside the
    paper's tables."""

    def __post_init__(self) -> None:
        if self.scorer not in SCORER_NAMES:
            raise ValueError(
                f"eval.scorer={self.scorer!r}: use {' or '.join(SCORER_NAMES)} "
                "(e.g. --set eval.scorer=mem1-paper)"
            )
