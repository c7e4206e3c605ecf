"""What the learner's update works on: one iteration's trajectories as the learner's rows
(`RolloutBatch`: one flattened tree per trajectory, or, under `trajectory.mode`, one row per
turn or the concatenation; mem1_core.trajectory.modes), the models (`Models`), the per-token
targets of the PPO loss (`Targets`), row selection, micro-batches, the rows of a minibatch of
trajectories, the trajectories' generated tokens in generation order (`TrajectoryTokens`,
what the advantage estimators read), and the batch's statistics before the update."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from mem1_core.rl.advantages import kl_estimate, masked_mean
from mem1_core.rl.critic import Critic
from mem1_core.rl.losses import explained_variance
from mem1_core.trajectory.mismatch import turn_logprob_mismatch
from mem1_core.trajectory.modes import mode_rows
from mem1_core.trajectory.record import Trajectory
from mem1_core.trajectory.tree import FlatBatch, collate


@dataclass
class Models:
    """The learner's networks: the trained policy, the frozen reference, the critic."""

    policy: nn.Module
    reference: nn.Module | None = None
    critic: Critic | None = None


@dataclass(frozen=True)
class RolloutBatch:
    """One iteration's K trajectories as the learner's rows (B rows, L tokens): one flattened
    tree per trajectory (B = K) unless `trajectory.mode` says otherwise."""

    batch: FlatBatch
    scores: Tensor
    """(K,) task reward of each trajectory: EM as a fraction of its objectives."""
    group_ids: Tensor
    """(K,) task group (GRPO: the samples of one task share it)."""
    rollout_logp: Tensor
    """(B, L) log-probs the rollout recorded, at generated tokens; 0 elsewhere."""
    trajectory: Tensor
    """(B,) long trajectory of each row; a trajectory's rows are consecutive, in turn order."""

    @property
    def num_trajectories(self) -> int:
        return int(self.scores.shape[0])

    @property
    def one_row_each(self) -> bool:
        """Whether row k is trajectory k (the tree, the concatenation)."""
        rows = torch.arange(self.num_trajectories, device=self.trajectory.device)
        return self.trajectory.shape == rows.shape and bool((self.trajectory == rows).all())


def minibatch_rows(rb: RolloutBatch, trajectories: Tensor) -> Tensor:
    """The rows of `trajectories` (indices into the batch's K), in their order: a minibatch
    holds whole trajectories whatever the mode, so every mode steps over the same ones."""
    if rb.one_row_each:
        return trajectories
    owner = rb.trajectory
    return torch.cat([torch.nonzero(owner == k).squeeze(1) for k in trajectories.tolist()])


@dataclass(frozen=True)
class TrajectoryTokens:
    """Each trajectory's generated tokens in generation order, one row per trajectory: the
    layout the rewards and advantage estimators run on (K rows, G = the most generated tokens
    of a trajectory), and the way back to the batch's (B, L) rows. When row k is trajectory k
    the two layouts are the same and nothing moves."""

    loss_mask: Tensor
    """(K, G) bool: True on a trajectory's generated tokens, packed to the left."""
    rows: Tensor | None
    """(n,) batch row of each generated token, in (trajectory, generation) order; None: same layout."""
    cols: Tensor | None
    """(n,) its column in that row."""

    @classmethod
    def of(cls, rb: RolloutBatch, loss_mask: Tensor) -> TrajectoryTokens:
        if rb.one_row_each:
            return cls(loss_mask, None, None)
        rows, cols = loss_mask.nonzero(as_tuple=True)  # row-major: rows in turn order
        owner = rb.trajectory[rows]
        order = torch.sort(owner, stable=True).indices  # generation order within each
        rows, cols, owner = rows[order], cols[order], owner[order]
        counts = torch.bincount(owner, minlength=rb.num_trajectories)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(owner.numel(), device=owner.device) - starts[owner]
        packed = torch.zeros(
            rb.num_trajectories,
            int(counts.max()) if owner.numel() else 0,
            dtype=torch.bool,
            device=loss_mask.device,
        )
        packed[owner, slot] = True
        return cls(packed, rows, cols)

    def pack(self, x: Tensor | None) -> Tensor | None:
        """(B, L) -> (K, G): the generated tokens' entries, 0 elsewhere."""
        if x is None or self.rows is None:
            return x
        out = torch.zeros(self.loss_mask.shape, dtype=x.dtype, device=x.device)
        out[self.loss_mask] = x[self.rows, self.cols]
        return out

    def unpack(self, y: Tensor, like: Tensor) -> Tensor:
        """(K, G) -> (B, L) shaped as `like`: back to the batch's rows, 0 off generated tokens."""
        if self.rows is None:
            return y
        out = torch.zeros(like.shape, dtype=y.dtype, device=y.device)
        out[self.rows, self.cols] = y[self.loss_mask]
        return out


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
    mode: str = "tree",
) -> RolloutBatch:
    """Lay each trajectory out as the learner's rows under `mode` (`trajectory.mode`: its
    flattened tree by default) and collate them, the length rounded up to a multiple of
    `seq_bucket`."""
    if not trajs:
        raise ValueError("no trajectories to train on")
    trees, owner = mode_rows(trajs, mode)
    if not trees:
        raise ValueError("no trajectory has a turn to train on")
    batch = collate(trees, pad_id, pad_to_multiple=seq_bucket).to(device)
    rollout_logp = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    mask = batch.loss_mask.cpu()
    turn, offset = batch.gen_turn.cpu(), batch.gen_offset.cpu()
    owners = torch.tensor(owner, dtype=torch.long)
    for k, traj in enumerate(trajs):
        recorded = [lp for t in traj.turns for lp in t.gen_logprobs]
        if len(recorded) != int(mask[owners == k].sum()) or any(
            len(t.gen_logprobs) != len(t.gen_ids) for t in traj.turns
        ):
            raise ValueError(f"trajectory {k}: recorded log-probs do not match its tokens")
    for r, k in enumerate(owner):
        # Every mode keeps each generated token's turn and offset (trajectory.modes).
        turns = trajs[k].turns
        at = zip(turn[r, mask[r]].tolist(), offset[r, mask[r]].tolist(), strict=True)
        recorded = [turns[t].gen_logprobs[o] for t, o in at]
        rollout_logp[r, mask[r]] = torch.tensor(recorded, dtype=torch.float32)
    return RolloutBatch(
        batch=batch,
        scores=torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device),
        group_ids=torch.tensor([t.group for t in trajs], dtype=torch.long, device=device),
        rollout_logp=rollout_logp.to(device),
        trajectory=owners.to(device),
    )


def cut_length(batch: FlatBatch, rows: Tensor, seq_bucket: int = 1) -> int:
    """The length `rows` are cut to: their longest, rounded up to a multiple of `seq_bucket`
    (at most the batch's length)."""
    return _bucketed(int(batch.seq_lens[rows].max()), batch, seq_bucket)


def _bucketed(n: int, batch: FlatBatch, seq_bucket: int) -> int:
    """A row length `n` rounded up to a multiple of `seq_bucket`, at least 1 and at most the
    batch's length."""
    return min(-(-max(n, 1) // seq_bucket) * seq_bucket, batch.input_ids.shape[1])


def micro_batches(
    rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int = 1, tokens: int | None = None
) -> list[tuple[Tensor, int]]:
    """`rows` in chunks of `size`, each with the length it is cut to (`cut_length`). With
    `tokens`: in order, each chunk as many rows as keep (rows x cut length) within `tokens`,
    at least one (`ppo.micro_batch_tokens`)."""
    if tokens is None:
        chunks = list(rows.split(size))
    else:
        chunks, start, longest = [], 0, 0
        for i, n in enumerate(batch.seq_lens[rows].tolist()):
            grown = max(longest, n)
            if i > start and (i - start + 1) * _bucketed(grown, batch, seq_bucket) > tokens:
                chunks.append(rows[start:i])
                start, grown = i, n
            longest = grown
        if len(rows):
            chunks.append(rows[start:])
    return [(m, cut_length(batch, m, seq_bucket)) for m in chunks]


def logp_mismatch(rb: RolloutBatch, t: Targets) -> dict[str, float]:
    """The gap between the learner's old log-probs and the rollout's, over generated tokens:
    mean and max, and per turn index (a context rebuilt wrongly from some turn on, MEM1's
    carried <IS>, shows there, not as a uniform shift; mem1_core.trajectory.mismatch)."""
    mask = t.loss_mask
    gap = (t.old_logp - rb.rollout_logp).abs()
    stats = {
        "logp_mismatch_mean": float(masked_mean(gap, mask)),
        "logp_mismatch_max": float(torch.where(mask, gap, 0).max()) if mask.any() else 0.0,
    }
    per_turn = turn_logprob_mismatch(rb.rollout_logp, t.old_logp, rb.batch.gen_turn, mask)
    pairs = zip(per_turn["mean"].tolist(), per_turn["max"].tolist(), strict=True)
    for k, (m, x) in enumerate(pairs):
        stats[f"logp_mismatch_mean/turn_{k}"] = m
        stats[f"logp_mismatch_max/turn_{k}"] = x
    return stats


def batch_stats(
    rb: RolloutBatch, t: Targets, rewards: Tensor, kl_kind: str = "k1", mismatch: bool = True
) -> dict[str, float]:
    """What the iteration's data looked like before the update (all over generated tokens).
    `kl_kind`: the estimator of the KL the adaptive controller reads (`kl_ctrl_measured`).
    `mismatch`: the old log-probs are the learner's own (`ppo.old_logprobs=recompute`), so
    their gap to the rollout's is measured (`logp_mismatch_*`)."""
    mask = t.loss_mask
    stats = {
        "reward": float(rb.scores.mean()),
        "gen_tokens": int(mask.sum()),
        "tree_tokens": int(rb.batch.seq_lens.sum()),
        "token_reward_sum": float(torch.where(mask, rewards, 0).sum(1).mean()),
        "advantage_mean": float(masked_mean(t.advantages, mask)),
    }
    if mismatch:
        stats |= logp_mismatch(rb, t)
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
