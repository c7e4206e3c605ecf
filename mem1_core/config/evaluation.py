"""The `eval` section: how the objective-scaling evaluation scores answers and which engine
plays its cells. Its own small module (not sections.py): the evaluation-side settings."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.sections import Section

SCORER_NAMES = ("squad", "mem1-paper")
"""The scorers of mem1_core.data.metrics.SCORERS."""
EVAL_BACKENDS = ("hf", "vllm", "auto")
"""The engines that can play the evaluation's cells (mem1_core.evaluation.vllm_cells)."""


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

    backend: str = "hf"
    """Which engine plays the evaluation's cells (greedy either way). `hf`: Hugging Face in
    this process. `vllm`: one vLLM engine, given each policy's weights in turn, in a process
    of its own under the vLLM venv's Python (`./dev setup-vllm`; found as
    `resources.rollout_python` is), which writes the cells this process reads back; an error
    when there is none. `auto`: vllm where that Python is found and imports vLLM, else hf (the
    log says which). A cell reads back the same under either, so switching resumes at the
    first unfinished cell. vLLM pays one engine start per evaluation (25-50 s on a 2-core CPU;
    each next policy's weights load in about a second); measured on a CPU it was faster on
    long contexts and slower on short ones (docs/performance.md, "Evaluation with vLLM")."""

    def __post_init__(self) -> None:
        if self.backend not in EVAL_BACKENDS:
            raise ValueError(
                f"eval.backend={self.backend!r}: use hf, vllm (needs the vLLM venv: "
                "./dev setup-vllm) or auto"
            )
        if self.scorer not in SCORER_NAMES:
            raise ValueError(
                f"eval.scorer={self.scorer!r}: use {' or '.join(SCORER_NAMES)} "
                "(e.g. --set eval.scorer=mem1-paper)"
            )
