"""`concat`: the public MEM1 code's scoring (MIT-MI/MEM1), kept as the ablation that
measures what exactness buys. The trajectory is one sequence: the task prompt, then every
turn's generated `<IS>…</IS>` and action and the `<info>` the environment returned, in order,
under plain causal attention with global positions (0 to the sequence's end): the layout of
a full-context agent, whatever memory policy the rollout ran.

What it gets wrong (docs/design.md §6):
- Tokens are scored with context they never saw. Once MEM1 pruned a turn, the rollout
  generated turn t from the prompt, the last `<IS>`/`<query>` and the last `<info>`; here
  turn t reads every earlier turn and `<info>` block too. The official code meant to hide
  them with a 2D mask, but cast it to bf16 1.0/0.0 and passed it as an additive bias, which
  masks nothing (https://github.com/MIT-MI/MEM1/issues/10); this mode is what that code computes.
- Positions grow without bound: turn t's tokens sit at their offset in the whole
  concatenation, not in the context they were generated from (the tree's depths).
So the PPO ratio at the first epoch is not 1 and the learner's log-probs differ from the
rollout's from the first pruned turn on (measured per turn: benchmarks/trajectory_modes.py).
For a full-context trajectory nothing was pruned and the concatenation is its tree.
"""

from __future__ import annotations

from mem1_core.trajectory.modes.base import register_mode
from mem1_core.trajectory.record import (
    SegmentKind,
    SegmentRef,
    Trajectory,
    segment,
)
from mem1_core.trajectory.tree import FlatTree, Segment, flatten


def concat_paths(traj: Trajectory) -> list[list[Segment]]:
    """Turn t's path in the concatenation: the prompt, every earlier turn's generated ids and
    `<info>`, then its own generated ids."""
    paths, history = [], [segment(traj, SegmentRef(SegmentKind.PROMPT), False)]
    for t in range(len(traj.turns)):
        paths.append([*history, segment(traj, SegmentRef(SegmentKind.GEN, t), True)])
        history += [
            segment(traj, SegmentRef(SegmentKind.GEN, t), False),
            segment(traj, SegmentRef(SegmentKind.INFO, t), False),
        ]
    return paths


@register_mode("concat", exact=False)
def concat_rows(traj: Trajectory) -> list[FlatTree]:
    return [flatten(concat_paths(traj))]
