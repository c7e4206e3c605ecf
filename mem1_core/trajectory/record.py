"""Trajectories: what a rollout records, token in / token out (docs/design.md §4.1).

A turn's context is a list of `SegmentRef`s — references to id spans the trajectory already
holds (the task prompt, a span of an earlier turn's generated ids, an earlier info block) —
never text. `turn_paths` turns a trajectory into the per-turn segment paths of the masked
trajectory tree (mem1_core.trajectory.tree), and `context_ids` rebuilds any turn's exact context.

Persistence: one Parquet row per trajectory, per-turn lists (ids, texts, log-probs, context
references, actions, timing), with an explicit schema; `read_trajectories` reads it back
losslessly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.data.metrics import dependency, peak_tokens
from mem1_core.runs import atomic
from mem1_core.trajectory.tree import Segment


class SegmentKind(StrEnum):
    PROMPT = "prompt"
    GEN = "gen"
    """A span of the ids generated at turn `turn` (the whole turn, or the carried <IS><query>)."""
    INFO = "info"
    """The `<info>` block the environment returned after turn `turn`."""


class Action(StrEnum):
    QUERY = "query"
    """A `<query>`: a search (QA's retriever, WebShop's `search[…]`)."""
    ANSWER = "answer"
    CLICK = "click"
    """WebShop's `click[…]`, written in a `<query>` (mem1_core.webshop.env)."""
    INVALID = "invalid"


@dataclass(frozen=True)
class SegmentRef:
    kind: SegmentKind
    turn: int = -1
    start: int = 0
    end: int | None = None  # None: to the end of the segment


@dataclass
class Turn:
    context: list[SegmentRef]
    gen_ids: list[int]
    gen_logprobs: list[float]
    action: Action
    info_ids: list[int] = field(default_factory=list)
    gen_text: str = ""
    info_text: str = ""
    query: str | None = None
    finish: str = "stop"  # "stop" (a stop tag or EOS) or "length" (token budget)
    format_error: str | None = None
    context_tokens: int = 0
    gen_seconds: float = 0.0
    env_seconds: float = 0.0


@dataclass
class Trajectory:
    task_id: str
    memory: str
    """The memory policy that built its contexts (Parquet column `memory`)."""
    prompt_ids: list[int]
    golden_answers: list[list[str]]
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    em: list[float] = field(default_factory=list)
    f1: list[float] = field(default_factory=list)
    done: bool = False
    group: int = 0
    sample: int = 0
    wall_seconds: float = 0.0
    max_turns: int = 0
    score: float | None = None
    """A domain's task reward where it is not exact match per objective (WebShop's goal score,
    0..1); None in QA, whose reward is the EM fraction."""

    @property
    def n_objectives(self) -> int:
        return len(self.golden_answers)

    @property
    def reward(self) -> float:
        """The task reward (0..1): the domain's `score` where it has one, else EM as a
        fraction of objectives."""
        if self.score is not None:
            return self.score
        return sum(self.em) / len(self.em) if self.em else 0.0

    @property
    def em_sum(self) -> float:
        return float(sum(self.em))

    @property
    def format_errors(self) -> int:
        return sum(t.format_error is not None for t in self.turns)

    def segment_ids(self, ref: SegmentRef) -> list[int]:
        if ref.kind is SegmentKind.PROMPT:
            ids = self.prompt_ids
        elif ref.kind is SegmentKind.GEN:
            ids = self.turns[ref.turn].gen_ids
        else:
            ids = self.turns[ref.turn].info_ids
        return ids[ref.start : ref.end]

    def context_ids(self, turn: int) -> list[int]:
        return [i for ref in self.turns[turn].context for i in self.segment_ids(ref)]

    def turn_lengths(self) -> list[tuple[int, int]]:
        return [(t.context_tokens, len(t.gen_ids)) for t in self.turns]

    @property
    def peak_tokens(self) -> int:
        return peak_tokens(self.turn_lengths())

    @property
    def dependency(self) -> int:
        return dependency(self.turn_lengths())


def _key(ref: SegmentRef, traj: Trajectory) -> tuple:
    end = ref.end
    if ref.kind is SegmentKind.GEN and end is None:
        end = len(traj.turns[ref.turn].gen_ids)
    elif ref.kind is SegmentKind.INFO and end is None:
        end = len(traj.turns[ref.turn].info_ids)
    elif ref.kind is SegmentKind.PROMPT and end is None:
        end = len(traj.prompt_ids)
    return (ref.kind.value, ref.turn, ref.start, end)


def segment(traj: Trajectory, ref: SegmentRef, generated: bool = False) -> Segment:
    """A reference as a tree segment: its key (kind, turn, span) and its ids."""
    return Segment(_key(ref, traj), tuple(traj.segment_ids(ref)), generated)


def turn_paths(traj: Trajectory) -> list[list[Segment]]:
    """Each turn as a tree path: its context segments, then its generated segment."""
    paths = []
    for t, turn in enumerate(traj.turns):
        path = [segment(traj, r) for r in turn.context]
        path.append(segment(traj, SegmentRef(SegmentKind.GEN, t), True))
        paths.append(path)
    return paths


# ---- Parquet ------------------------------------------------------------------------------

_REF = pa.struct(
    [("kind", pa.string()), ("turn", pa.int32()), ("start", pa.int32()), ("end", pa.int32())]
)
TRAJECTORY_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("memory", pa.string()),
        ("group", pa.int32()),
        ("sample", pa.int32()),
        ("n_objectives", pa.int32()),
        ("golden_answers", pa.list_(pa.list_(pa.string()))),
        ("prompt_ids", pa.list_(pa.int32())),
        ("answer", pa.string()),
        ("em", pa.list_(pa.float64())),
        ("f1", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("done", pa.bool_()),
        ("num_turns", pa.int32()),
        ("format_errors", pa.int32()),
        ("peak_tokens", pa.int64()),
        ("dependency", pa.int64()),
        ("wall_seconds", pa.float64()),
        ("max_turns", pa.int32()),
        ("score", pa.float64()),
        ("turn_context", pa.list_(pa.list_(_REF))),
        ("turn_gen_ids", pa.list_(pa.list_(pa.int32()))),
        ("turn_gen_logprobs", pa.list_(pa.list_(pa.float32()))),
        ("turn_info_ids", pa.list_(pa.list_(pa.int32()))),
        ("turn_action", pa.list_(pa.string())),
        ("turn_gen_text", pa.list_(pa.string())),
        ("turn_info_text", pa.list_(pa.string())),
        ("turn_query", pa.list_(pa.string())),
        ("turn_finish", pa.list_(pa.string())),
        ("turn_format_error", pa.list_(pa.string())),
        ("turn_context_tokens", pa.list_(pa.int32())),
        ("turn_gen_seconds", pa.list_(pa.float64())),
        ("turn_env_seconds", pa.list_(pa.float64())),
    ]
)


def to_table(trajs: list[Trajectory]) -> pa.Table:
    rows = []
    for tr in trajs:
        ts = tr.turns
        rows.append(
            {
                "task_id": tr.task_id,
                "memory": tr.memory,
                "group": tr.group,
                "sample": tr.sample,
                "n_objectives": tr.n_objectives,
                "golden_answers": tr.golden_answers,
                "prompt_ids": tr.prompt_ids,
                "answer": tr.answer,
                "em": tr.em,
                "f1": tr.f1,
                "reward": tr.reward,
                "done": tr.done,
                "num_turns": len(ts),
                "format_errors": tr.format_errors,
                "peak_tokens": tr.peak_tokens,
                "dependency": tr.dependency,
                "wall_seconds": tr.wall_seconds,
                "max_turns": tr.max_turns,
                "score": tr.score,
                "turn_context": [
                    [
                        {"kind": r.kind.value, "turn": r.turn, "start": r.start, "end": r.end}
                        for r in t.context
                    ]
                    for t in ts
                ],
                "turn_gen_ids": [t.gen_ids for t in ts],
                "turn_gen_logprobs": [t.gen_logprobs for t in ts],
                "turn_info_ids": [t.info_ids for t in ts],
                "turn_action": [t.action.value for t in ts],
                "turn_gen_text": [t.gen_text for t in ts],
                "turn_info_text": [t.info_text for t in ts],
                "turn_query": [t.query for t in ts],
                "turn_finish": [t.finish for t in ts],
                "turn_format_error": [t.format_error for t in ts],
                "turn_context_tokens": [t.context_tokens for t in ts],
                "turn_gen_seconds": [t.gen_seconds for t in ts],
                "turn_env_seconds": [t.env_seconds for t in ts],
            }
        )
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def from_table(table: pa.Table) -> list[Trajectory]:
    out = []
    for r in table.to_pylist():
        turns = [
            Turn(
                context=[
                    SegmentRef(SegmentKind(c["kind"]), c["turn"], c["start"], c["end"])
                    for c in r["turn_context"][i]
                ],
                gen_ids=r["turn_gen_ids"][i],
                gen_logprobs=r["turn_gen_logprobs"][i],
                action=Action(r["turn_action"][i]),
                info_ids=r["turn_info_ids"][i],
                gen_text=r["turn_gen_text"][i],
                info_text=r["turn_info_text"][i],
                query=r["turn_query"][i],
                finish=r["turn_finish"][i],
                format_error=r["turn_format_error"][i],
                context_tokens=r["turn_context_tokens"][i],
                gen_seconds=r["turn_gen_seconds"][i],
                env_seconds=r["turn_env_seconds"][i],
            )
            for i in range(r["num_turns"])
        ]
        out.append(
            Trajectory(
                task_id=r["task_id"],
                memory=r["memory"],
                prompt_ids=r["prompt_ids"],
                golden_answers=r["golden_answers"],
                turns=turns,
                answer=r["answer"],
                em=r["em"],
                f1=r["f1"],
                done=r["done"],
                group=r["group"],
                sample=r["sample"],
                wall_seconds=r["wall_seconds"],
                max_turns=r["max_turns"],
                score=r.get("score"),  # files written before domains had scores lack it
            )
        )
    return out


def write_trajectories(trajs: list[Trajectory], path: str | Path) -> Path:
    return atomic.write_parquet(to_table(trajs), path)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    return from_table(pq.read_table(path))
