"""What the learner's update works on: one iteration's trajectories as a flattened tree
batch (`RolloutBatch`), the models (`Models`), the per-token targets of the PPO loss
(`Targets`), row selection and micro-batches, and the batch's statistics before the update."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from mem1_core.rl.advantages import kl_estimate, masked_mean
from mem1_core.rl.critic import Critic
from mem1_core.rl.losses import explained_variance
from mem1_core.trajectory.mismatch import turn_logprob_mismatch
from mem1_core.trajectory.record import Trajectory, turn_paths
from mem1_core.trajectory.tree import FlatBatch, collate, flatten


@dataclass
class Models:
    """The learner's networks: the trained policy, the frozen reference, the critic."""

    policy: nn.Module
    reference: nn.Module | None = None
    critic: Critic | None = None


@dataclass(frozen=True)
class RolloutBatch:
    """One iteration's trajectories as flattened trees (B rows, L tokens)."""

    batch: FlatBatch
    scores: Tensor
    """(B,) task reward of each trajectory: EM as a fraction of its objectives."""
    group_ids: Tensor
    """(B,) task group (GRPO: the samples of one task share it)."""
    rollout_logp: Tensor
    """(B, L) log-probs the rollout recorded, at generated tokens; 0 elsewhere."""


@dataclass(frozen=True)
class Targets:
    """Per-token (B, L) tensors fixed before the PPO epochs."""

    loss_mask: Tensor
    old_logp: Tensor
    advantages: Tensor
    returns: Tensor
    old_values: Tensor | None
    ref_logp: Tensor | None
    is_weights: Tensor | None = None
    """Truncated importance weights of the rollout correction (`ppo.rollout_is`), or None."""

    def rows(self, rows: Tensor, length: int) -> Targets:
        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[rows, :length]

        return Targets(**{f.name: pick(getattr(self, f.name)) for f in fields(self)})


def select_rows(batch: FlatBatch, rows: Tensor, length: int) -> FlatBatch:
    """Rows of a FlatBatch, cut to `length` tokens (dropping padding only: the caller picks
    length >= the longest selected row). The padding node stays the last node."""
    out = {}
    for f in fields(batch):
        x = getattr(batch, f.name)[rows]
        out[f.name] = x[:, :length] if x.dim() == 2 else x  # (B, L) fields; not (B, N, N)
    return FlatBatch(**out)


def make_rollout_batch(
    trajs: list[Trajectory],
    pad_id: int,
    device: torch.device | str = "cpu",
    seq_bucket: int = 1,
) -> RolloutBatch:
    """Flatten each trajectory's turn contexts into its tree and collate them, the length
    rounded up to a multiple of `seq_bucket`."""
    if not trajs:
        raise ValueError("no trajectories to train on")
    trees = [flatten(turn_paths(t)) for t in trajs]
    batch = collate(trees, pad_id, pad_to_multiple=seq_bucket).to(device)
    rollout_logp = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    mask = batch.loss_mask.cpu()
    for r, traj in enumerate(trajs):
        recorded = [lp for turn in traj.turns for lp in turn.gen_logprobs]
        # The tree keeps generated tokens in generation order along the row (tree.py).
        if len(recorded) != int(mask[r].sum()):
            raise ValueError(f"trajectory {r}: recorded log-probs do not match its tokens")
        rollout_logp[r, mask[r]] = torch.tensor(recorded, dtype=torch.float32)
    return RolloutBatch(
        batch=batch,
        scores=torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device),
        group_ids=torch.tensor([t.group for t in trajs], dtype=torch.long, device=device),
        rollout_logp=rollout_logp.to(device),
    )


def cut_length(batch: FlatBatch, rows: Tensor, seq_bucket: int = 1) -> int:
    """The length `rows` are cut to: their longest, rounded up to a multiple of `seq_bucket`
    (at most the batch's length)."""
    n = max(int(batch.seq_lens[rows].max()), 1)
    return min(-(-n // seq_bucket) * seq_bucket, batch.input_ids.shape[1])


def micro_batches(
    rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int = 1
) -> list[tuple[Tensor, int]]:
    """`rows` in chunks of `size`, each with the length it is cut to (`cut_length`)."""
    return [(m, cut_length(batch, m, seq_bucket)) for m in rows.split(size)]


def batch_stats(
    rb: RolloutBatch, t: Targets, rewards: Tensor, kl_kind: str = "k1"
) -> dict[str, float]:
    """What the iteration's data looked like before the update (all over generated tokens).
    `kl_kind`: the estimator of the KL the adaptive controller reads (`kl_ctrl_measured`)."""
    mask = t.loss_mask
    gap = (t.old_logp - rb.rollout_logp).abs()
    stats = {
        "reward": float(rb.scores.mean()),
        "gen_tokens": int(mask.sum()),
        "tree_tokens": int(rb.batch.seq_lens.sum()),
        "logp_mismatch_mean": float(masked_mean(gap, mask)),
        "logp_mismatch_max": float(torch.where(mask, gap, 0).max()) if mask.any() else 0.0,
        "token_reward_sum": float(torch.where(mask, rewards, 0).sum(1).mean()),
        "advantage_mean": float(masked_mean(t.advantages, mask)),
    }
    # Per turn index too: a context rebuilt wrongly from some turn on (MEM1's carried <IS>)
    # shows there, not as a uniform shift (mem1_core.trajectory.mismatch).
    per_turn = turn_logprob_mismatch(rb.rollout_logp, t.old_logp, rb.batch.gen_turn, mask)
    pairs = zip(per_turn["mean"].tolist(), per_turn["max"].tolist(), strict=True)
    for k, (m, x) in enumerate(pairs):
        stats[f"logp_mismatch_mean/turn_{k}"] = m
        stats[f"logp_mismatch_max/turn_{k}"] = x
    if t.ref_logp is not None:
        stats["kl_ref"] = float(masked_mean(kl_estimate(t.old_logp, t.ref_logp, "k1"), mask))
        # What the adaptive KL controller reads (mem1_core.rl.kl_control): the kl_kind
        # estimate, a token mean per trajectory, then the mean over trajectories (verl).
        kl = kl_estimate(
            torch.where(mask, t.old_logp, 0), torch.where(mask, t.ref_logp, 0), kl_kind
        )
        stats["kl_ctrl_measured"] = float(masked_mean(kl, mask, dim=1).mean())
    if t.old_values is not None:
        stats["value_mean"] = float(masked_mean(t.old_values, mask))
        stats["return_mean"] = float(masked_mean(t.returns, mask))
        stats["explained_variance"] = float(explained_variance(t.old_values, t.returns, mask))
    return stats
