"""Memory policies: given a trajectory so far, the next turn's context as segments.

One signature, four policies over the same rollout, trainer and evaluation (docs/design.md §4.4):
- `mem1`: the task prompt + the last turn's `<IS>…</IS><query>…</query>` + its `<info>`.
  Everything older is pruned; the internal state is the agent's only memory (MEM1 §3).
- `full`: the prompt and every earlier turn and info block (the ReAct / Search-R1 baseline).
- `truncate`: the prompt + the last k turns with their info blocks.
- `mem1+recall`: MEM1's context, and a query written `recall: …` is answered from the
  trajectory's own pruned `<info>` blocks instead of the retriever (mem1_core.rollout.recall).
  Its contexts are MEM1's; the difference is in the environment step.

MEM1 carries an exact slice of the last turn's generated ids, from its `<IS>` tag to the end
of the turn. Where `<IS>` starts is the tag codec's answer (`opts["state_start"]`,
mem1_core.models.tags): with tags as text the slice starts at the token holding its `<`,
whatever that token carries before.

After an invalid turn MEM1 keeps only a memory, never the malformed action: that turn's
closed `<IS> … </IS>` if it wrote one (`opts["state_span"]`), else the state the agent last
wrote closed (an earlier turn's, re-read), else nothing; then the turn's `<info>`, which
carries the format hint. Carrying the whole invalid turn (an earlier rule) let a
pretrained model's 100-token ramble, or a parroted hint, fill the next context, and the model
then continued it. The full-context and truncate agents keep invalid turns whole: their
context is the history as it happened.
"""

from __future__ import annotations

from collections.abc import Callable

from mem1_core.trajectory.record import Action, SegmentKind, SegmentRef, Trajectory

MemoryPolicy = Callable[[Trajectory, dict], list[SegmentRef]]


def _turn_refs(t: int) -> list[SegmentRef]:
    return [SegmentRef(SegmentKind.GEN, t), SegmentRef(SegmentKind.INFO, t)]


def mem1_context(traj: Trajectory, opts: dict) -> list[SegmentRef]:
    ctx = [SegmentRef(SegmentKind.PROMPT)]
    if not traj.turns:
        return ctx
    t = len(traj.turns) - 1
    if traj.turns[t].action is not Action.INVALID:
        start = opts["state_start"](traj.turns[t].gen_ids)
        return ctx + [SegmentRef(SegmentKind.GEN, t, start, None), SegmentRef(SegmentKind.INFO, t)]
    state = _last_state(traj, t, opts)
    return ctx + ([state] if state else []) + [SegmentRef(SegmentKind.INFO, t)]


def _last_state(traj: Trajectory, t: int, opts: dict) -> SegmentRef | None:
    """The newest closed `<IS> … </IS>` written at or before turn t, as a slice of its turn."""
    for k in range(t, -1, -1):
        span = opts["state_span"](traj.turns[k].gen_ids)
        if span is not None:
            return SegmentRef(SegmentKind.GEN, k, span[0], span[1])
    return None


def full_context(traj: Trajectory, opts: dict) -> list[SegmentRef]:
    ctx = [SegmentRef(SegmentKind.PROMPT)]
    for t in range(len(traj.turns)):
        ctx += _turn_refs(t)
    return ctx


def truncate_context(traj: Trajectory, opts: dict) -> list[SegmentRef]:
    k = opts["truncate_turns"]
    ctx = [SegmentRef(SegmentKind.PROMPT)]
    for t in range(max(0, len(traj.turns) - k), len(traj.turns)):
        ctx += _turn_refs(t)
    return ctx


MEMORY_POLICIES: dict[str, MemoryPolicy] = {
    "mem1": mem1_context,
    "full": full_context,
    "truncate": truncate_context,
    "mem1+recall": mem1_context,
}

RECALL_MEMORIES = frozenset({"mem1+recall"})
"""Memories whose environment answers `<query> recall: …</query>` from the trajectory's store
(mem1_core.rollout.recall); under the others such a query is an ordinary search."""


def has_recall(memory: str) -> bool:
    return memory in RECALL_MEMORIES


def get_memory(name: str) -> MemoryPolicy:
    if name not in MEMORY_POLICIES:
        raise ValueError(f"unknown memory policy {name!r}; choose one of {sorted(MEMORY_POLICIES)}")
    return MEMORY_POLICIES[name]
