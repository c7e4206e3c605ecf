"""The QA domain's environment: a `<query>` goes to the retriever and comes back as an
`<info>` block of passages, an `<answer>` is scored by exact match per objective.

The turn format is MEM1's rule, shared by every domain (mem1_core.rollout.environment). On
the last turn only an answer ends the episode with a reward; anything else ends it with
reward 0 (the budget is exhausted). Under a recall memory (`mem1+recall`) a `recall: …` query
is answered from the trajectory's own earlier blocks instead (mem1_core.rollout.recall).

The QA domain (mem1_core.qa.domain) builds it with `qa_environment`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mem1_core.data.metrics import mentions, score_answer
from mem1_core.data.prompts import (
    FORMAT_HINT,
    INFO_CLOSE,
    INFO_OPEN,
    keep_answers_prompt,
    progress_hint,
)
from mem1_core.models.tags import TagCodec
from mem1_core.retrieval import Hit, Retriever
from mem1_core.rollout.environment import (
    NO_RESULTS,
    STOP_TAGS,
    Environment,
    Parsed,
    info_body,
)
from mem1_core.rollout.memory import has_recall
from mem1_core.rollout.recall import recall, recall_query
from mem1_core.trajectory.record import Action, Trajectory

if TYPE_CHECKING:
    from mem1_core.config import Config

__all__ = [
    "NO_RESULTS",
    "STOP_TAGS",
    "Parsed",
    "QAEnvironment",
    "format_passages",
    "info_body",
]


def format_passages(hits: list[Hit]) -> str:
    if not hits:
        return NO_RESULTS
    return "\n".join(f"Doc {i} (Title: {h.title}) {h.text}" for i, h in enumerate(hits, 1))


class QAEnvironment(Environment):
    """Retrieval QA: a `<query>` is sent to the retriever (or, under a recall memory, answered
    from the trajectory's own pruned blocks), an `<answer>` is scored by exact match per
    objective. On the last turn only an answer ends the episode with a reward; anything else
    ends it with reward 0 (the budget is exhausted)."""

    kind = "qa"

    def __init__(
        self,
        tokenizer,
        retriever: Retriever,
        topk: int,
        codec: TagCodec | None = None,
        *,
        chat_template: bool = False,
        keep_answers_prompt: bool = False,
        progress_hint: bool = False,
    ):
        super().__init__(tokenizer, codec, chat_template=chat_template)
        self.keep_answers_prompt = keep_answers_prompt
        self.progress_hint = progress_hint
        self.retriever = retriever
        self.topk = topk

    def step(self, trajs: list[Trajectory]) -> None:
        queries: list[tuple[Trajectory, str]] = []
        for tr in trajs:
            turn = tr.turns[-1]
            parsed = self.parse(turn.gen_ids, turn.finish)
            turn.action, turn.gen_text = parsed.action, self.tok.decode(turn.gen_ids)
            turn.format_error = parsed.error
            if parsed.action is Action.ANSWER:
                tr.answer = parsed.text
                tr.em, tr.f1 = self.score(parsed.text, tr.golden_answers)
                tr.done = True
            elif self.at_budget(tr):  # the budget is exhausted without an answer: reward 0
                tr.em, tr.f1 = self.score(None, tr.golden_answers)
                tr.done = True
            elif parsed.action is Action.QUERY:
                turn.query = parsed.text
                asked = recall_query(parsed.text) if has_recall(tr.memory) else None
                if asked is not None:  # answered from the trajectory's own pruned blocks
                    self.set_info(tr, recall(tr, asked))
                else:
                    queries.append((tr, parsed.text))
            else:
                self.set_info(tr, FORMAT_HINT)
        results = self.search([q for _, q in queries])
        for (tr, _), hits in zip(queries, results, strict=True):
            self.set_info(tr, format_passages(hits))

    def scripted_teacher(self, tasks: list, cfg, *, lapses: bool = True, seed_offset: int = 0):
        """The world's teacher (mem1_core.qa.teacher), which plays only tasks with plans
        (the world's, not real QA data's)."""
        from mem1_core.qa.teacher import ScriptedTeacher, can_play

        if not can_play(tasks):
            return None
        return ScriptedTeacher.from_config(
            self.tok, tasks, cfg, lapses=lapses, seed_offset=seed_offset
        )

    def set_info(self, traj: Trajectory, body: str) -> None:
        """The turn's `<info>`: the body and the turns-left hint; with `progress_hint` (beyond
        the paper) the hint also counts the task's questions no `<info>` has answered yet."""
        if not self.progress_hint:
            return super().set_info(traj, body)
        seen = [info_body(t.info_text) for t in traj.turns[:-1] if t.info_text] + [body]
        unfound = sum(not any(mentions(x, golds) for x in seen) for golds in traj.golden_answers)
        turn = traj.turns[-1]
        turns_left = traj.max_turns - len(traj.turns)
        hint = progress_hint(turns_left, traj.n_objectives, unfound)
        turn.info_text = f"{INFO_OPEN}{body}\n{hint}{INFO_CLOSE}"
        turn.info_ids = self.encode(turn.info_text)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The task prompt's ids (Environment.encode_prompt); with `keep_answers_prompt` (beyond
        the paper), the instructions that ask the `<IS>` to keep found answers replace the
        paper's."""
        if self.keep_answers_prompt:
            prompt = keep_answers_prompt(prompt)
        return super().encode_prompt(prompt)

    def search(self, queries: list[str]) -> list[list[Hit]]:
        return self.retriever.search(queries, self.topk) if queries else []

    @staticmethod
    def score(answer: str | None, golden: list[list[str]]) -> tuple[list[float], list[float]]:
        return score_answer(answer, golden)


def qa_environment(cfg: Config, tokenizer, retriever: Retriever) -> Environment:
    """The QA environment of a run: its tokenizer, the search tool its domain hands it (the
    run's index, a server, a web search API) and the run's prompt settings."""
    return QAEnvironment(
        tokenizer,
        retriever,
        cfg.retrieval.topk,
        chat_template=cfg.rollout.chat_template,
        keep_answers_prompt=cfg.rollout.keep_answers_prompt,
        progress_hint=cfg.rollout.progress_hint,
    )
