"""Rollout/learner log-prob mismatch per turn index.

The rollout records each generated token's log-prob (HF KV-cached batches, or vLLM's own
kernels); the learner recomputes it over the flattened tree (mem1_core.trajectory.logprobs). With the
same weights the two agree to float tolerance (docs/design.md §4.2), so a gap measures the
inference/training numerics mismatch (bf16, different kernels, a stale weight sync). Per
turn index, because a bug in how a context is rebuilt shows up from a given turn on
(MEM1's carried `<IS>` first matters at turn 1), not as a uniform shift.

`turn_logprob_mismatch` is the tensor form for the trainer's (B, L) layout;
`rollout_logprob_mismatch` takes trajectories and the learner's values per trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mem1_core.trajectory.record import Trajectory


def turn_logprob_mismatch(
    rollout_logp: Tensor,
    learner_logp: Tensor,
    turn: Tensor,
    mask: Tensor,
    n_turns: int | None = None,
) -> dict[str, Tensor]:
    """Mean and max |rollout - learner| log-prob over the generated tokens of each turn index.
    rollout_logp, learner_logp, turn (turn index of each token), mask (bool): (B, L) ->
    {"mean", "max", "tokens"}: (T,) each, T = n_turns or 1 + the largest turn under `mask`;
    a turn index with no tokens has mean = max = 0."""
    sel = mask & (turn >= 0)
    t = turn[sel].long()
    gap = (rollout_logp - learner_logp)[sel].abs().float()
    if n_turns is None:
        n_turns = int(t.max()) + 1 if t.numel() else 0
    zeros = torch.zeros(n_turns, dtype=torch.float32, device=gap.device)
    tokens = zeros.index_add(0, t, torch.ones_like(gap))
    total = zeros.index_add(0, t, gap)
    largest = zeros.scatter_reduce(0, t, gap, "amax")  # gaps are >= 0: a zero start is exact
    return {"mean": total / tokens.clamp(min=1), "max": largest, "tokens": tokens}


def rollout_logprob_mismatch(
    trajectories: Sequence[Trajectory], learner_logprobs: Sequence[Tensor | Sequence[float]]
) -> dict[str, Tensor]:
    """Per turn index, mean and max |recorded - learner| log-prob (see turn_logprob_mismatch).

    learner_logprobs: one flat sequence per trajectory, the learner's log-probs of its
    generated tokens in generation order (turn, then offset): row r of the trainer's
    (B, L) tensor at its loss mask (`logp[r][loss_mask[r]]`, the tree keeps that order), or
    the turns of `per_turn_logprobs` concatenated."""
    if len(learner_logprobs) != len(trajectories):
        raise ValueError(
            f"{len(learner_logprobs)} learner rows for {len(trajectories)} trajectories"
        )
    rows = []
    for r, (traj, learner) in enumerate(zip(trajectories, learner_logprobs, strict=True)):
        recorded = [lp for turn in traj.turns for lp in turn.gen_logprobs]
        turns = [k for k, turn in enumerate(traj.turns) for _ in turn.gen_logprobs]
        learner = torch.as_tensor(learner, dtype=torch.float32).flatten().cpu()
        if learner.numel() != len(recorded):
            raise ValueError(
                f"trajectory {r}: {learner.numel()} learner log-probs for {len(recorded)} "
                "generated tokens"
            )
        rows.append((torch.tensor(recorded, dtype=torch.float32), learner, torch.tensor(turns)))
    width = max((len(rec) for rec, _, _ in rows), default=0)
    shape = (len(rows), width)
    rollout, learner = torch.zeros(shape), torch.zeros(shape)
    turn = torch.full(shape, -1, dtype=torch.long)
    for r, (rec, lrn, tu) in enumerate(rows):
        rollout[r, : len(rec)], learner[r, : len(rec)], turn[r, : len(rec)] = rec, lrn, tu
    n_turns = max((len(t.turns) for t in trajectories), default=0)
    return turn_logprob_mismatch(rollout, learner, turn, turn >= 0, n_turns)
