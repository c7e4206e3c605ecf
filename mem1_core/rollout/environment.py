"""What the rollout asks of a domain: the environment interface, and MEM1's turn format that
every domain shares.

An `Environment` gives the rollout (mem1_core.rollout.loop)
- the task's prompt as ids (`encode_prompt`),
- the action a generated turn writes (`parse`, MEM1's format rule below),
- what it ends a turn on (`stop_ids`, `stop_strings`),
- the next observation as an `<info>` block's ids, done and the reward (`step`, one call for
  every live trajectory of a turn, so that a domain can batch its work: the QA retriever
  answers every query of a turn in one call),
- the domain's own metrics of finished trajectories (`metrics`).
Memory policies, the trajectory tree, PPO, SFT, evaluation and the flows read only
trajectories (ids, masks, rewards), never which domain made them (docs/design.md §11). The
domains are `qa` (mem1_core.qa.env) and `webshop` (mem1_core.webshop.env).

MEM1's format (MEM1 §3), the same in every domain. The tags are read through the tokenizer's
tag codec (mem1_core.models.tags): as special token ids (the tiny tokenizer) or in the decoded
text of the ids (a hub tokenizer, tags as text). The rule below is the same for both; "a tag"
is a token id or a substring accordingly.

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
A domain may narrow the rule further (WebShop has no `<answer>`, and its query must be one of
its actions). An invalid turn gets an `<info>` that says the format was invalid (plus the
turns-left hint) and counts as a format error; what the next context keeps of it is the
memory policy's rule (mem1_core.rollout.memory: MEM1 keeps only a closed `<IS> … </IS>`).
Nothing raises.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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
    turns_left_hint,
)
from mem1_core.models.tags import TagCodec, tag_codec
from mem1_core.trajectory.record import Action, Trajectory

STOP_TAGS = (QUERY_CLOSE, ANSWER_CLOSE)
"""A turn ends with its action: generation stops once one of these is written."""

NO_RESULTS = "No results."
"""The body of an `<info>` for a search (or a recall) that found nothing."""


def info_body(info_text: str) -> str:
    """The body of an `<info>` block that `Environment.info_block` wrote (its inverse): the
    text between `<info>` and the newline before the one-line turns-left hint."""
    if not (info_text.startswith(INFO_OPEN) and info_text.endswith(INFO_CLOSE)):
        raise ValueError(f"not an info block: {info_text[:40]!r}")
    inner = info_text[len(INFO_OPEN) : -len(INFO_CLOSE)]
    return inner[: inner.rindex("\n")]


@dataclass(frozen=True)
class Parsed:
    action: Action
    text: str | None = None  # the query or the answer
    error: str | None = None  # why the turn is invalid


class Environment(ABC):
    """A domain behind the rollout. Subclasses implement `step` (and may narrow `parse`)."""

    kind: str = ""
    """The domain's name, as `env.kind` selects it."""

    def __init__(self, tokenizer, codec: TagCodec | None = None, *, chat_template: bool = False):
        self.tok = tokenizer
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "rollout.chat_template=true, but this tokenizer has no chat template (the tiny "
                "tokenizer, or a base model's): set rollout.chat_template=false"
            )
        self.chat_template = chat_template
        self.codec = codec or tag_codec(tokenizer)
        self.stop_ids, self.stop_strings = self.codec.stops(STOP_TAGS)

    # ---- what every domain shares ---------------------------------------------------------

    def parse(self, ids: list[int], finish: str) -> Parsed:
        """MEM1's format rule (the module docstring) applied to one generated turn."""
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

    def info_block(self, body: str, turns_left: int) -> str:
        """An observation as the agent reads it: `<info>` body, the turns-left hint `</info>`."""
        return f"{INFO_OPEN}{body}\n{turns_left_hint(turns_left)}{INFO_CLOSE}"

    def set_info(self, traj: Trajectory, body: str) -> None:
        """Give the trajectory's newest turn its observation (text and ids)."""
        turn = traj.turns[-1]
        turn.info_text = self.info_block(body, traj.max_turns - len(traj.turns))
        turn.info_ids = self.encode(turn.info_text)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The task prompt's ids: the raw text, or (`chat_template`) the prompt as the user's
        message and the assistant's turn opened, as an instruction-tuned model was trained to
        read. Everything after it (turns, `<info>` blocks) continues the assistant's message,
        as in Search-R1 and MEM1's rollouts."""
        if not self.chat_template:
            return self.encode(prompt)
        ids = self.tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        # transformers 5 returns a BatchEncoding (a mapping); older versions a list of ids
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    @staticmethod
    def at_budget(traj: Trajectory) -> bool:
        """The newest turn was the trajectory's last: the turn budget is spent."""
        return len(traj.turns) >= traj.max_turns

    # ---- what each domain defines ---------------------------------------------------------

    @abstractmethod
    def step(self, trajs: list[Trajectory]) -> None:
        """Act on each trajectory's newest turn (already appended, its ids and finish set):
        set the turn's action, text, format error and observation (`set_info`), and, where the
        episode ends, the trajectory's `done` and its outcome (QA: `answer`, `em`, `f1`;
        WebShop: `score`)."""

    def scripted_teacher(self, tasks: list, cfg, *, lapses: bool = True, seed_offset: int = 0):
        """The domain's scripted teacher for `tasks` as a generation backend (the warm start's
        data and the evaluation's reference rows), or None where it cannot play them. `cfg`:
        the run's TeacherConfig; `lapses`: its deliberate errors (SFT's data has them, the
        evaluation's reference rows play without)."""
        return None

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The domain's own summary of finished trajectories (beside reward, peak tokens,
        dependency and time, which every domain reports): none by default."""
        return {}
