"""The QA environment: reads a generated turn's ids, answers a `<query>` with an `<info>`
block from the retriever, and scores an `<answer>`.

The tags are read through the tokenizer's tag codec (mem1_core.models.tags): as special token
ids (the tiny tokenizer) or in the decoded text of the ids (a hub tokenizer, tags as text).
The rule below is the same for both; "a tag" is a token id or a substring accordingly.

Model output is untrusted. One rule decides each turn, in this order:
1. `length`: the turn hit its token budget without closing an action -> invalid.
2. Only the tags the agent may write count as its action: a turn that writes `<info>` or
   `</info>` (an invented observation) is invalid.
3. The turn must be `<IS> … </IS>` followed by exactly one action, `<query> … </query>` or
   `<answer> … </answer>`, each tag once and in that order, with nothing but white space
   before `<IS>` or between `</IS>` and the action, the closing tag completed by the turn's
   last token (under `text`, characters that token carries after the tag are ignored).
   No tags, an unclosed tag, both actions, a repeated tag, tags out of order, or text outside
   the tags (a pretrained model's preamble, or the `[FORMAT]` hint parroted back, which
   itself contains the tags) -> invalid.
4. An empty query -> invalid. (An empty answer is a valid answer that scores 0.)
An invalid turn gets an `<info>` that says the format was invalid (plus the turns-left hint)
and counts as a format error; what the next context keeps of it is the memory policy's rule
(mem1_core.rollout.memory: MEM1 keeps only a closed `<IS> … </IS>`). On the last turn only an answer ends the episode with a
reward; anything else ends it with reward 0 (the budget is exhausted). Nothing raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mem1_core.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    IS_CLOSE,
    IS_OPEN,
    QUERY_CLOSE,
    QUERY_OPEN,
    TAGS,
    keep_answers_prompt,
    progress_hint,
    turns_left_hint,
)
from mem1_core.evaluation.metrics import score_answer
from mem1_core.models.tags import TagCodec, tag_codec
from mem1_core.retrieval import Hit, Retriever
from mem1_core.trajectory.record import Action

if TYPE_CHECKING:
    from mem1_core.config import Config
    from mem1_core.runs.layout import RunPaths

FORMAT_HINT = (
    f"[FORMAT] Invalid turn. Write {IS_OPEN} state {IS_CLOSE} then either "
    f"{QUERY_OPEN} search {QUERY_CLOSE} or {ANSWER_OPEN} answers {ANSWER_CLOSE}."
)


@dataclass(frozen=True)
class Parsed:
    action: Action
    text: str | None = None  # the query or the answer
    error: str | None = None  # why the turn is invalid


NO_RESULTS = "No results."
"""The body of an `<info>` for a search (or a recall) that found nothing."""


def format_passages(hits: list[Hit]) -> str:
    if not hits:
        return NO_RESULTS
    return "\n".join(f"Doc {i} (Title: {h.title}) {h.text}" for i, h in enumerate(hits, 1))


def info_body(info_text: str) -> str:
    """The body of an `<info>` block that QAEnvironment.info_block wrote (its inverse): the
    text between `<info>` and the newline before the one-line turns-left hint."""
    if not (info_text.startswith(INFO_OPEN) and info_text.endswith(INFO_CLOSE)):
        raise ValueError(f"not an info block: {info_text[:40]!r}")
    inner = info_text[len(INFO_OPEN) : -len(INFO_CLOSE)]
    return inner[: inner.rindex("\n")]


STOP_TAGS = (QUERY_CLOSE, ANSWER_CLOSE)
"""A turn ends with its action: generation stops once one of these is written."""


class QAEnvironment:
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
        self.tok = tokenizer
        self.keep_answers_prompt = keep_answers_prompt
        self.progress_hint = progress_hint
        self.retriever = retriever
        self.topk = topk
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "rollout.chat_template=true, but this tokenizer has no chat template (the tiny "
                "tokenizer, or a base model's): set rollout.chat_template=false"
            )
        self.chat_template = chat_template
        self.codec = codec or tag_codec(tokenizer)
        self.stop_ids, self.stop_strings = self.codec.stops(STOP_TAGS)

    def parse(self, ids: list[int], finish: str) -> Parsed:
        if finish == "length":
            return Parsed(Action.INVALID, error="token budget exhausted")
        spans = self.codec.find(ids)
        counts = {name: 0 for name in TAGS}
        first = {}
        for s in spans:
            counts[s.tag] += 1
            first.setdefault(s.tag, s)
        if counts[INFO_OPEN] or counts[INFO_CLOSE]:
            return Parsed(Action.INVALID, error="wrote an <info> (only the environment does)")
        if counts[IS_OPEN] != 1 or counts[IS_CLOSE] != 1:
            return Parsed(Action.INVALID, error="needs exactly one <IS> … </IS>")
        q, a = counts[QUERY_OPEN] + counts[QUERY_CLOSE], counts[ANSWER_OPEN] + counts[ANSWER_CLOSE]
        if q and a:
            return Parsed(Action.INVALID, error="both a query and an answer")
        if not q and not a:
            return Parsed(Action.INVALID, error="no action")
        opener, closer, action = (
            (QUERY_OPEN, QUERY_CLOSE, Action.QUERY)
            if q
            else (ANSWER_OPEN, ANSWER_CLOSE, Action.ANSWER)
        )
        if counts[opener] != 1 or counts[closer] != 1:
            return Parsed(Action.INVALID, error=f"needs exactly one {opener} … {closer}")
        i_open, i_close, a_open, a_close = (first[t] for t in (IS_OPEN, IS_CLOSE, opener, closer))
        in_order = i_open.start < i_close.start < a_open.start < a_close.start
        if not in_order or a_close.last != len(ids) - 1:
            return Parsed(Action.INVALID, error="tags out of order")
        if self.codec.before(ids, i_open) or self.codec.between(ids, i_close, a_open):
            return Parsed(Action.INVALID, error="text outside the tags")
        text = self.codec.between(ids, a_open, a_close)
        if action is Action.QUERY and not text:
            return Parsed(Action.INVALID, error="empty query")
        return Parsed(action, text=text)

    def info_block(
        self, body: str, turns_left: int, progress: tuple[int, int] | None = None
    ) -> str:
        """An `<info>` block: the body, then one hint line (turns left; with `progress`, the
        task's N and its questions still without an answer in the results: progress_hint)."""
        hint = (
            turns_left_hint(turns_left)
            if progress is None
            else progress_hint(turns_left, *progress)
        )
        return f"{INFO_OPEN}{body}\n{hint}{INFO_CLOSE}"

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The task prompt's ids: the raw text, or (`chat_template`) the prompt as the user's
        message and the assistant's turn opened, as an instruction-tuned model was trained to
        read. Everything after it (turns, `<info>` blocks) continues the assistant's message,
        as in Search-R1 and MEM1's rollouts. With `keep_answers_prompt`, the instructions that ask
        the `<IS>` to keep found answers replace the paper's."""
        if self.keep_answers_prompt:
            prompt = keep_answers_prompt(prompt)
        if not self.chat_template:
            return self.encode(prompt)
        ids = self.tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        # transformers 5 returns a BatchEncoding (a mapping); older versions a list of ids
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def search(self, queries: list[str]) -> list[list[Hit]]:
        return self.retriever.search(queries, self.topk) if queries else []

    @staticmethod
    def score(answer: str | None, golden: list[list[str]]) -> tuple[list[float], list[float]]:
        return score_answer(answer, golden)


def make_env(
    cfg: Config, paths: RunPaths, tokenizer, retriever: Retriever | None = None
) -> QAEnvironment:
    """The environment of a run: its tokenizer, and its retriever (the run's index, a server
    at `retrieval.url`, or the one given)."""
    from mem1_core.retrieval.run_index import make_retriever

    return QAEnvironment(
        tokenizer,
        retriever or make_retriever(cfg, paths),
        cfg.retrieval.topk,
        chat_template=cfg.rollout.chat_template,
        keep_answers_prompt=cfg.rollout.keep_answers_prompt,
        progress_hint=cfg.rollout.progress_hint,
    )
