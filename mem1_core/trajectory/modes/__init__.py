"""Three ways to score a trajectory whose contexts were pruned (`trajectory.mode`), one small
module each behind a registry (the RL toolbox's pattern, mem1_core.rl.estimators):

- `tree` (tree.py): all turn contexts in one flattened prefix tree; exact; cost ~ unique tokens.
- `turns` (turns.py): each turn its own row with its real context; exact; cost = every
  context in full; a trajectory's rows share its outcome and GAE chains across them.
- `concat` (concat.py): the public MEM1 code's one causal sequence with global positions;
  each token scored with context it never saw once a turn was pruned (the ablation).

The rollout is the same for all three; only the learner's rows differ (`mode_rows`).
"""

from __future__ import annotations

from mem1_core.trajectory.modes import concat, tree, turns  # noqa: F401  (they register)
from mem1_core.trajectory.modes.base import MODES, TrajectoryMode, register_mode
from mem1_core.trajectory.record import Trajectory
from mem1_core.trajectory.tree import FlatTree

MODES.check_complete()


def get_mode(name: str) -> TrajectoryMode:
    return MODES[name]


def mode_rows(trajs: list[Trajectory], mode: str) -> tuple[list[FlatTree], list[int]]:
    """The learner's rows of `trajs` under `mode`, trajectory after trajectory. -> the rows
    and, per row, the index of its trajectory in `trajs`."""
    rows_of = get_mode(mode).rows
    rows, owner = [], []
    for i, traj in enumerate(trajs):
        mine = rows_of(traj)
        rows += mine
        owner += [i] * len(mine)
    return rows, owner


__all__ = ["MODES", "TrajectoryMode", "get_mode", "mode_rows", "register_mode"]
