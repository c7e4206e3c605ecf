"""What a trajectory mode is: how one trajectory becomes the learner's rows.

A mode maps a Trajectory to one or more flattened trees (`FlatTree`), each a row of the
learner's batch. Whatever the mode, the rows of a trajectory hold its generated tokens in
generation order (row by row, then along each row), and every generated token keeps its
turn (`gen_turn`) and its offset in that turn (`gen_offset`): the learner reads the
rollout's recorded log-probs, the rewards and the advantages through them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mem1_core.config.methods import TRAJECTORY_MODES
from mem1_core.trajectory.record import Trajectory
from mem1_core.trajectory.tree import FlatTree

RowsFn = Callable[[Trajectory], list[FlatTree]]
"""One trajectory -> its rows (flattened trees), in generation order."""


@dataclass(frozen=True)
class TrajectoryMode:
    """A way to score a trajectory whose contexts were pruned (`trajectory.mode`)."""

    name: str
    rows: RowsFn
    exact: bool
    """Whether every generated token is scored with the context the rollout generated it
    from (its learner log-prob equals the rollout's to float rounding)."""


MODES = TRAJECTORY_MODES
"""Every mode by name (`trajectory.mode`): mem1_core.config.methods.TRAJECTORY_MODES."""


def register_mode(name: str, *, exact: bool) -> Callable[[RowsFn], RowsFn]:
    """Register the decorated function (a trajectory -> its rows) as the mode `name`."""

    def add(fn: RowsFn) -> RowsFn:
        MODES.add(name, TrajectoryMode(name, fn, exact))
        return fn

    return add
