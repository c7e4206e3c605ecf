"""`turns`: each turn its own row, its real context as the prompt and the loss on the tokens
it generated (the per-turn samples of TRL's `rollout_protocol="message"`, AReaL and SkyRL's
step-wise mode). Exact, like the tree; it pays for every context in full, so the shared
prompt is computed once per turn instead of once per trajectory.

A row is the chain `C_t + [G_t]`, plain causal, positions 0.. (the rollout's own), and its
generated tokens keep their turn index `t`.

How the rows of one trajectory train together (mem1_core.rl.ppo, mem1_core.rl.batch):
- Rewards and advantages run over the trajectory, not the row: its rows' generated tokens,
  in generation order, form one chain. The outcome reward sits on the final row's last
  generated token. Under GAE the value at a row's last generated token bootstraps from the
  next row's first generated token (and from 0 after the final row):
      delta = r_k + gamma * V_next - V_k,  A_k = delta + gamma * lam * A_next,
  with k running over the trajectory's generated tokens, row after row. The tree's GAE is
  the same recursion over the same tokens, so, given the same values, the advantages and
  returns are equal. The group estimators (GRPO, RLOO, REINFORCE++-baseline) score the
  trajectory once and give every row its advantage; REINFORCE++'s reward-to-go runs along
  the same chain. (SkyRL's step-wise mode refuses GAE and REINFORCE++; here both chain.)
- Minibatches hold whole trajectories (all their rows), so every mode takes the same
  optimiser steps over the same trajectories; micro-batches count rows.
- Departure from the tree: under the `seq-mean-*` loss aggregations, GSPO's sequence ratio
  and `ppo.rollout_is=sequence` a "sequence" is a row, so a turn here, as in the per-turn
  frameworks (SkyRL's step-wise GSPO works over one turn likewise). Under
  `token-mean` (the default, the paper's) the loss is the tree's.
"""

from __future__ import annotations

import dataclasses

import torch

from mem1_core.trajectory.modes.base import register_mode
from mem1_core.trajectory.record import Trajectory, turn_paths
from mem1_core.trajectory.tree import IGNORE, FlatTree, flatten


@register_mode("turns", exact=True)
def turn_rows(traj: Trajectory) -> list[FlatTree]:
    rows = []
    for t, path in enumerate(turn_paths(traj)):
        row = flatten([path])  # one path: a chain, positions 0.., plain causal
        gen_turn = torch.where(row.gen_turn >= 0, t, IGNORE)
        rows.append(dataclasses.replace(row, gen_turn=gen_turn))
    return rows
