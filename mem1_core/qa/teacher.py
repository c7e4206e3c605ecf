"""The scripted teacher: plays the MEM1 format well on the task world, in the role of the
paper's GPT-4o teacher (MEM1 §4.3, the SFT ablation).

It knows each question's hop structure (the world's `plan`): it issues the right queries,
one lookup a turn, objective after objective; its `<IS>` carries forward every fact found so
far (per question) and names the next step; then it answers all questions at once. Facts are
taken only when the retrieved `<info>` really contains them, so the teacher never shows
knowledge that the context does not hold. It plays behind the generation interface, so it
runs under any memory policy (`mem1` or `full`) through the same rollout and environment as
the model.

Two knobs make it err on purpose, as the paper's GPT-4o teacher does:
- `error_rate`: it answers an objective wrongly (a wrong name, written with confidence);
- `forget_rate`: a memory-consolidation lapse. When it finishes an objective and moves on to
  the next, it folds `Q1: ?` into its `<IS>` instead of the answer it just read, and so
  answers that objective `?`. SFT imitates such habits; RL on the task reward can drop them
  (the paper's RL-vs-SFT contrast, MEM1 §5.4). With the perfect teacher, SFT leaves the
  reward nothing to teach within a CPU budget (docs/training.md).
  The decision is a fixed function of (seed, task, sample, objective), so a turn's text
  depends only on its trajectory, as for every other choice of the teacher.

Under `mem1+recall` (mem1_core.rollout.recall) the teacher uses the backstop where it lapsed:
once every lookup is done, before answering, it replays each forgotten objective's lookups
as recalls (`<query> recall: Island of Zirer</query>`: the entity its question names, then
the fact that recall brought back) and folds the recalled facts into its `<IS>` in place of
`?`, as many objectives as its turn budget allows. Under every other memory it plays exactly
as without recall.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from mem1_core.config import TeacherConfig
from mem1_core.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    IS_CLOSE,
    IS_OPEN,
    QUERY_CLOSE,
    QUERY_OPEN,
    UNKNOWN,
    join_answers,
)
from mem1_core.rollout.generation import Generation
from mem1_core.rollout.loop import Task
from mem1_core.rollout.memory import has_recall
from mem1_core.rollout.recall import RECALL_PREFIX, is_recall
from mem1_core.trajectory.record import Action, Trajectory


@dataclass(frozen=True)
class Step:
    objective: int
    query: str
    title: str
    answer: str


PENDING = "pending"
"""A question the state lists before its first lookup (TeacherConfig.slots)."""


def task_steps(task: Task) -> list[list[Step]]:
    """The lookups of each objective, from the world's plans."""
    out = []
    for i, plan in enumerate(task.plans):
        out.append([Step(i, s["query"], s["title"], s["answer"]) for s in json.loads(plan or "[]")])
    return out


def can_play(tasks: list[Task]) -> bool:
    """Whether the teacher knows how to solve every task: it plays from the world's plans.
    Real QA data (HotpotQA, NQ) has none; there it would answer `?` to every question."""
    return all(all(task_steps(t)) for t in tasks)


def final_answer(steps: list[Step], found: list[str | None]) -> str:
    """The answer an objective's found facts give: a comparison names the earlier entity
    (its two lookups found years), any other question answers with its last hop. An objective
    whose lookups are not all done (the turn budget ran out first) is answered UNKNOWN."""
    if not steps or len(found) < len(steps) or any(f is None for f in found):
        return UNKNOWN
    if _is_comparison(steps):
        years = [int(f) if f.isdigit() else None for f in found]
        if None in years:
            return UNKNOWN
        return steps[0].title if years[0] <= years[1] else steps[1].title
    return found[-1] or UNKNOWN


class ScriptedTeacher:
    """A generation backend that writes teacher turns for the trajectories it is given."""

    reads_trajectories = True

    def __init__(
        self,
        tokenizer,
        tasks: list[Task],
        error_rate: float = 0.0,
        seed: int = 0,
        forget_rate: float = 0.0,
        counting: bool = False,
        slots: bool = False,
    ):
        if not can_play(tasks):
            # it would answer `?` to every question, and SFT would teach exactly that
            raise ValueError(
                "the scripted teacher plays only the world's tasks (their plans); these have "
                "none (real QA data): learn from them with RL (`mem1 train ppo`), not SFT"
            )
        self.tok = tokenizer
        self.tasks = {t.task_id: t for t in tasks}
        self.error_rate = error_rate
        self.forget_rate = forget_rate
        self.counting = counting
        """TeacherConfig.counting: the state says how many questions there are."""
        self.slots = slots
        """TeacherConfig.slots: the state lists every question, `pending` until looked up."""
        self.seed = seed
        self.rng = random.Random(seed)

    @classmethod
    def from_config(
        cls,
        tokenizer,
        tasks: list[Task],
        cfg: TeacherConfig,
        *,
        lapses: bool = True,
        seed_offset: int = 0,
    ) -> ScriptedTeacher:
        """The teacher `cfg` describes: its state format always (what the run's models
        learned to write), its lapses (`error_rate`, `forget_rate`) only with `lapses` — SFT's
        data has them, the evaluation's reference rows play without."""
        return cls(
            tokenizer, tasks,
            error_rate=cfg.error_rate if lapses else 0.0,
            forget_rate=cfg.forget_rate if lapses else 0.0,
            seed=cfg.seed + seed_offset, counting=cfg.counting, slots=cfg.slots,
        )  # fmt: skip

    def generate(self, contexts, params, generator=None, trajectories=None) -> list[Generation]:
        if trajectories is None:
            raise ValueError("the scripted teacher needs the trajectories it plays")
        out = []
        for traj in trajectories:
            ids = self.tok.encode(self.turn_text(traj, params), add_special_tokens=False)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def turn_text(self, traj: Trajectory, params) -> str:
        task = self.tasks[traj.task_id]
        steps = task_steps(task)
        order = [s for obj in steps for s in obj]
        lookups, recalls = [], []  # recalls: only under a recall memory
        for t, turn in enumerate(traj.turns):
            if turn.action is Action.QUERY:
                (recalls if is_recall(traj, t) else lookups).append(turn)
        found: list[list[str | None]] = [[] for _ in steps]
        for step, turn in zip(order, lookups, strict=False):
            found[step.objective].append(step.answer if step.answer in turn.info_text else None)
        done = len(lookups)
        last_turn = len(traj.turns) + 1 >= traj.max_turns
        forgotten = self.forgotten(traj, steps, found)
        plan = self.recall_plan(traj, steps, forgotten) if has_recall(traj.memory) else []
        # What the recalls brought back replaces a forgotten objective's `?` (facts taken, as
        # from any <info>, only when the recalled block holds them).
        back: list[list[str | None]] = [[] for _ in steps]
        for step, turn in zip(plan, recalls, strict=False):
            back[step.objective].append(step.answer if step.answer in turn.info_text else None)
        held = [b or f for f, b in zip(found, back, strict=True)]
        lapsed = {i for i in forgotten if not back[i]}
        state = self.state_text(task, steps, held, lapsed, slots=self.slots)
        of = f" of {len(steps)}" if self.counting else ""
        if done < len(order) and not last_turn:
            nxt = order[done]
            # a bridge's second hop queries the first hop's finding (copied from the state)
            query = nxt.query
            return (
                f"{IS_OPEN} {state} Next: Q{nxt.objective + 1}{of}. {IS_CLOSE}"
                f"{QUERY_OPEN} {query}{QUERY_CLOSE}"
            )
        if len(recalls) < len(plan) and not last_turn:
            # the forgotten objective's lookups again, asked of the trajectory's own blocks:
            # the first names an entity of its question, the next the fact just recalled
            nxt = plan[len(recalls)]
            return (
                f"{IS_OPEN} {state} Next: Q{nxt.objective + 1}{of}. {IS_CLOSE}"
                f"{QUERY_OPEN} {RECALL_PREFIX} {nxt.query}{QUERY_CLOSE}"
            )
        if self.counting:  # the stopping rule as an equality: "Done: 2 of 2."
            state = f"{state} Done: {len(steps)}{of}."
        # A space after <query> / <answer>: the tiny tokenizer's words carry their leading
        # space (▁), and a word glued to a tag is other tokens ("<answer>1718" is 1,7,1,8
        # where the state and the documents say ▁1718), so copying a name or a year into
        # the action would be a spelling lesson per entity instead of a copy of the same ids.
        answers = [
            UNKNOWN if i in lapsed else self._maybe_wrong(final_answer(s, f), s)
            for i, (s, f) in enumerate(zip(steps, held, strict=True))
        ]
        return f"{IS_OPEN} {state} {IS_CLOSE}{ANSWER_OPEN} {join_answers(answers)}{ANSWER_CLOSE}"

    @staticmethod
    def recall_plan(traj: Trajectory, steps: list[list[Step]], forgotten: set[int]) -> list[Step]:
        """The recalls the teacher makes once every lookup is done, in order: each forgotten
        objective's lookups replayed against the store, for as many whole objectives (in
        question order) as the turn budget leaves room for before the answer turn."""
        spare = traj.max_turns - sum(len(obj) for obj in steps) - 1
        plan: list[Step] = []
        for i in sorted(forgotten):
            if len(plan) + len(steps[i]) <= spare:
                plan += steps[i]
        return plan

    def forgotten(
        self, traj: Trajectory, steps: list[list[Step]], found: list[list[str | None]]
    ) -> set[int]:
        """The finished objectives this trajectory's teacher failed to fold into its state.
        Only an objective it moved on from: the last one is answered in the turn after its
        last lookup, straight from the context."""
        if self.forget_rate <= 0:
            return set()
        out = set()
        for i, (obj, f) in enumerate(zip(steps[:-1], found[:-1], strict=True)):
            draw = random.Random(f"{self.seed}:{traj.task_id}:{traj.sample}:{i}").random()
            if obj and len(f) == len(obj) and draw < self.forget_rate:
                out.add(i)
        return out

    @staticmethod
    def state_text(
        task: Task,
        steps: list[list[Step]],
        found: list[list[str | None]],
        forgotten: set[int] = frozenset(),
        slots: bool = False,
    ) -> str:
        """The consolidated memory: per question only what is still needed — its answer once
        every lookup is done (`?` if `forgotten`), else the facts found so far (MEM1 §3: fold,
        don't append). A question not yet looked up is left out, or with `slots` listed as
        `pending`."""
        parts = []
        for i, (obj, f) in enumerate(zip(steps, found, strict=True)):
            if not f:  # nothing known yet
                if slots:
                    parts.append(f"Q{i + 1}: {PENDING}.")
                continue
            if i in forgotten:
                facts = UNKNOWN
            elif len(f) == len(obj):
                facts = final_answer(obj, f)
            elif _is_comparison(obj):  # one of two lookups done: keep the name and its year
                facts = f"{obj[0].title} {f[0] or UNKNOWN}"
            else:  # a bridge's first hop: the entity the next lookup is about
                facts = f[-1] or UNKNOWN
            parts.append(f"Q{i + 1}: {facts}.")
        return " ".join(parts) if parts else "Start."

    def _maybe_wrong(self, answer: str, steps: list[Step]) -> str:
        if self.error_rate <= 0 or self.rng.random() >= self.error_rate:
            return answer
        wrong = [s.query for s in steps if s.query != answer] or [UNKNOWN]
        return self.rng.choice(wrong)


def _is_comparison(steps: list[Step]) -> bool:
    """Two independent lookups (the second does not follow from the first's answer)."""
    return len(steps) == 2 and steps[1].query != steps[0].answer
