"""`tree`: every turn context of a trajectory in one flattened prefix tree (docs/design.md
§4.2, mem1_core.trajectory.tree): one row per trajectory, one exact pass, each token computed
once; positions are depths, so for MEM1 they stay bounded however many turns there are.
The default, and the paper's masked trajectory done exactly."""

from __future__ import annotations

from mem1_core.trajectory.modes.base import register_mode
from mem1_core.trajectory.record import Trajectory, turn_paths
from mem1_core.trajectory.tree import FlatTree, flatten


@register_mode("tree", exact=True)
def tree_rows(traj: Trajectory) -> list[FlatTree]:
    return [flatten(turn_paths(traj))]
