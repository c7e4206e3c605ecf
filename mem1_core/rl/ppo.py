"""The learner's side of PPO / GRPO over masked trajectories (MEM1 §3.3, §4).

`update` reads top to bottom: trajectories -> one flattened tree per trajectory ->
old log-probs, reference log-probs and values (one no-grad pass each over the trees) ->
token rewards (task score on the last generated token, minus kl_coef * KL to the reference
unless the KL is a loss term) -> advantages (GAE over generated tokens, or group-relative)
-> PPO epochs over shuffled minibatches, each accumulated over micro-batches.

Choices and departures:
- Old log-probs are recomputed by the learner over the tree, not taken from the rollout;
  the rollout's recorded ones must agree (to ~1e-6 on CPU fp32). Their gap is reported
  every iteration (`logp_mismatch_*`): a silent gap between the sampler and the trainer
  is a known failure of RL stacks, and here it would also expose a wrong tree.
- Micro-batching is exact: every loss divides by the generated-token count of the whole
  minibatch (`normalizer`), so the summed micro-batch gradients equal the full batch's.
- A non-finite loss or gradient norm skips the optimiser step (no parameter moves), is
  logged and counted; `max_nonfinite_in_row` skipped steps in a row raise NonFiniteError.
- Models stay in eval mode while training: the PPO ratio must compare the same function
  that sampled, so dropout (off in Qwen2 anyway) must never differ between the passes.
  (Activation checkpointing flags only the decoder layers as training; model.py.)
- Batches are padded to a multiple of `seq_bucket` tokens (ModelConfig.seq_bucket), and so
  are micro-batches, so a compiled FlexAttention sees a few lengths, not one per step.
  Padding is its own tree node that no real token sees: results do not change.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from mem1_core.config import PPOConfig
from mem1_core.models.model import is_checkpointing
from mem1_core.rl.advantages import (
    kl_estimate,
    masked_mean,
    masked_whiten,
    token_rewards,
)
from mem1_core.rl.critic import Critic
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    entropy_bonus,
    explained_variance,
    kl_loss,
)
from mem1_core.trajectory.logprobs import Attn, forward_tree, tree_attention_mask
from mem1_core.trajectory.mismatch import turn_logprob_mismatch
from mem1_core.trajectory.record import Trajectory, turn_paths
from mem1_core.trajectory.tree import FlatBatch, collate, flatten

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Too many optimiser steps in a row had a non-finite loss or gradient."""


@dataclass
class NonFiniteGuard:
    """Counts skipped (non-finite) steps; raises after `max_in_row` in a row."""

    max_in_row: int
    in_row: int = 0
    total: int = 0

    def record(self, finite: bool, detail: str = "") -> None:
        if finite:
            self.in_row = 0
            return
        self.in_row += 1
        self.total += 1
        log.warning(
            "non-finite %s: update skipped (%d in a row, %d in total)",
            detail or "loss or gradient",
            self.in_row,
            self.total,
        )
        if self.in_row >= self.max_in_row:
            raise NonFiniteError(
                f"{self.in_row} updates in a row had a non-finite {detail or 'loss or gradient'} "
                f"and were skipped (limit ppo.max_nonfinite_in_row={self.max_in_row}). The "
                "weights are the last finite ones: lower ppo.actor_lr / ppo.critic_lr, check the "
                "model dtype and the rewards, or raise the limit."
            )


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


def _micro_batches(
    rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int = 1
) -> list[tuple[Tensor, int]]:
    """`rows` in chunks of `size`, each with the length it is cut to: its longest row,
    rounded up to a multiple of `seq_bucket` (at most the batch's length)."""
    length = batch.input_ids.shape[1]
    out = []
    for m in rows.split(size):
        n = max(int(batch.seq_lens[m].max()), 1)
        out.append((m, min(-(-n // seq_bucket) * seq_bucket, length)))
    return out


def one_pass_mask(model: nn.Module, batch: FlatBatch, attn: str) -> object | None:
    """The mask a pass of `model` over `batch` should be given: None (forward_tree picks
    the shared-prefix forward under sdpa/eager, a BlockMask under flex) unless the pass
    needs the one-pass tree mask: under activation checkpointing with gradients on, a
    checkpointed layer drops the KV cache that the shared-prefix forward hands from the
    trunk to the branches (Hugging Face does so: a recompute would write it twice)."""
    if Attn(attn) is Attn.FLEX or (torch.is_grad_enabled() and is_checkpointing(model)):
        return tree_attention_mask(batch, attn, next(model.parameters()).dtype)
    return None


@torch.no_grad()
def score(
    models: Models,
    rb: RolloutBatch,
    attn: str,
    micro_batch_size: int,
    temperature: float = 1.0,
    *,
    seq_bucket: int = 1,
) -> Targets:
    """Old log-probs (current policy), reference log-probs and values, all over the tree,
    log-probs at the rollout's sampling temperature (the distribution sampled from).
    Advantages and returns are left empty (zeros) for `estimate_advantages`."""
    b, length = rb.batch.input_ids.shape
    old = torch.zeros(b, length, device=rb.batch.input_ids.device)
    ref = torch.zeros_like(old) if models.reference is not None else None
    values = torch.zeros_like(old) if models.critic is not None else None
    for rows, n in _micro_batches(torch.arange(b), micro_batch_size, rb.batch, seq_bucket):
        mb = select_rows(rb.batch, rows, n)
        # A BlockMask (flex) is built once and read by all three models.
        mask = one_pass_mask(models.policy, mb, attn)
        out = forward_tree(models.policy, mb, attn, temperature=temperature, mask=mask)
        old[rows, :n] = out.logprobs
        if ref is not None:
            ref[rows, :n] = forward_tree(
                models.reference, mb, attn, temperature=temperature, mask=mask
            ).logprobs
        if values is not None:
            values[rows, :n] = models.critic(mb, attn, mask=mask)
    zeros = torch.zeros_like(old)
    return Targets(rb.batch.loss_mask, old, zeros, zeros, values, ref)


def estimate_advantages(
    rb: RolloutBatch, t: Targets, cfg: PPOConfig, estimator: str
) -> tuple[Targets, Tensor]:
    """Token rewards -> advantages and returns. -> `t` with them filled in, and the (B, L)
    token rewards (for logging)."""
    kl_coef = 0.0 if cfg.kl_in_loss or t.ref_logp is None else cfg.kl_coef
    rewards = token_rewards(rb.scores, t.loss_mask, t.old_logp, t.ref_logp, kl_coef, cfg.kl_kind)
    est = get_estimator(estimator)
    adv, returns = est.fn(
        rewards=rewards,
        values=t.old_values,
        loss_mask=t.loss_mask,
        group_ids=rb.group_ids,
        gamma=cfg.gamma,
        lam=cfg.lam,
        eps=1e-6,
    )
    if est.whiten:
        adv = masked_whiten(adv, t.loss_mask)
    return Targets(t.loss_mask, t.old_logp, adv, returns, t.old_values, t.ref_logp), rewards


def ppo_loss(
    logp: Tensor,
    entropy: Tensor | None,
    values: Tensor | None,
    t: Targets,
    cfg: PPOConfig,
    normalizer: int | Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The minibatch objective on one micro-batch. logp, entropy, values: (b, l) and the
    matching Targets -> scalar loss (policy + value + KL/entropy terms), metrics. Only
    generated tokens enter; `normalizer` is the whole minibatch's generated-token count."""
    loss, m = clipped_policy_loss(
        logp, t.old_logp, t.advantages, t.loss_mask, cfg.clip_eps, normalizer=normalizer
    )
    metrics = {"pg_loss": loss.detach(), **m}
    if values is not None:
        vf, vm = clipped_value_loss(
            values, t.old_values, t.returns, t.loss_mask, cfg.value_clip_eps, normalizer=normalizer
        )
        loss = loss + vf
        metrics |= {"vf_loss": vf.detach(), **vm}
    if cfg.entropy_coef and entropy is not None:
        ent = entropy_bonus(entropy, t.loss_mask, normalizer)
        loss = loss - cfg.entropy_coef * ent
        metrics["entropy"] = ent.detach()
    if cfg.kl_in_loss and t.ref_logp is not None:
        kl, _ = kl_loss(logp, t.ref_logp, t.loss_mask, cfg.kl_kind, normalizer=normalizer)
        loss = loss + cfg.kl_coef * kl
        metrics["kl_loss"] = kl.detach()
    return loss, metrics


def accumulate_gradients(
    models: Models,
    batch: FlatBatch,
    t: Targets,
    rows: Tensor,
    cfg: PPOConfig,
    attn: str,
    temperature: float = 1.0,
    *,
    seq_bucket: int = 1,
) -> dict[str, Tensor] | None:
    """Backward of one minibatch (`rows`), micro-batch by micro-batch, into `.grad`.
    Returns the summed metrics, or None as soon as a loss is non-finite."""
    normalizer = t.loss_mask[rows].sum().clamp_min(1)
    total: dict[str, Tensor] = {}
    for micro, n in _micro_batches(rows, cfg.micro_batch_size, batch, seq_bucket):
        mb = select_rows(batch, micro, n)
        mask = one_pass_mask(models.policy, mb, attn)
        out = forward_tree(
            models.policy,
            mb,
            attn,
            with_entropy=cfg.entropy_coef > 0,
            temperature=temperature,
            mask=mask,
        )
        # The critic always runs one pass; it reuses the policy's mask when there is one.
        values = models.critic(mb, attn, mask=mask) if models.critic is not None else None
        loss, metrics = ppo_loss(
            out.logprobs, out.entropy, values, t.rows(micro, n), cfg, normalizer
        )
        if not torch.isfinite(loss):
            return None
        loss.backward()
        for k, v in metrics.items():
            total[k] = total.get(k, 0.0) + v
    return total


def trainable_parameters(models: Models) -> dict[str, list[nn.Parameter]]:
    groups = {"policy": [p for p in models.policy.parameters() if p.requires_grad]}
    if models.critic is not None:
        groups["critic"] = [p for p in models.critic.parameters() if p.requires_grad]
    return groups


def optimizer_step(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    cfg: PPOConfig,
    guard: NonFiniteGuard,
    metrics: dict[str, Tensor] | None,
) -> dict[str, float]:
    """Clip and step every optimiser, or none: a non-finite loss (metrics None) or gradient
    norm skips the whole step. Gradients are cleared either way."""
    norms = {}
    if metrics is not None:
        for name, params in trainable_parameters(models).items():
            norms[f"{name}_grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            )
    finite = metrics is not None and all(math.isfinite(v) for v in norms.values())
    guard.record(finite, "loss" if metrics is None else "gradient norm")
    if finite:
        for opt in optimizers.values():
            opt.step()
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    return norms if finite else {}


def ppo_epochs(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    rb: RolloutBatch,
    t: Targets,
    cfg: PPOConfig,
    attn: str,
    guard: NonFiniteGuard,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    *,
    seq_bucket: int = 1,
) -> dict[str, float]:
    """`cfg.ppo_epochs` passes over shuffled minibatches of trajectories. -> mean metrics."""

    def step(rows: Tensor) -> dict[str, float] | None:
        metrics = accumulate_gradients(
            models, rb.batch, t, rows, cfg, attn, temperature, seq_bucket=seq_bucket
        )
        norms = optimizer_step(models, optimizers, cfg, guard, metrics)
        if not norms:
            return None
        return {**{k: float(v) for k, v in metrics.items()}, **norms}

    return run_epochs(rb.batch.input_ids, cfg, generator, step)


def run_epochs(
    input_ids: Tensor,
    cfg: PPOConfig,
    generator: torch.Generator | None,
    step: Callable[[Tensor], dict[str, float] | None],
) -> dict[str, float]:
    """The epoch loop of every learner: `cfg.ppo_epochs` passes over the batch's rows in
    shuffled minibatches; `step(rows)` trains on one and returns its metrics, or None when
    it skipped the update. -> the metrics averaged over the steps taken, and the counts."""
    sums: dict[str, float] = {}
    steps = skipped = 0
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(input_ids.shape[0], generator=generator).to(input_ids.device)
        for rows in order.split(cfg.minibatch_size):
            done = step(rows)
            if done is None:
                skipped += 1
                continue
            steps += 1
            for k, v in done.items():
                sums[k] = sums.get(k, 0.0) + v
    out = {k: v / max(steps, 1) for k, v in sums.items()}
    return out | {"optimizer_steps": steps, "skipped_steps": skipped}


def batch_stats(rb: RolloutBatch, t: Targets, rewards: Tensor) -> dict[str, float]:
    """What the iteration's data looked like before the update (all over generated tokens)."""
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
    if t.old_values is not None:
        stats["value_mean"] = float(masked_mean(t.old_values, mask))
        stats["return_mean"] = float(masked_mean(t.returns, mask))
        stats["explained_variance"] = float(explained_variance(t.old_values, t.returns, mask))
    return stats


def update(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    trajs: list[Trajectory],
    cfg: PPOConfig,
    *,
    estimator: str,
    attn: str,
    pad_id: int,
    guard: NonFiniteGuard,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    seq_bucket: int = 1,
    score_fn: Callable[..., Targets] = score,
    epochs_fn: Callable[..., dict[str, float]] = ppo_epochs,
) -> dict[str, Any]:
    """One learner update on one iteration's trajectories. -> stats (floats).
    seq_bucket: pad flattened batches to a multiple of it (ModelConfig.seq_bucket).
    score_fn / epochs_fn: the two passes over the models, `score` and `ppo_epochs` in one
    process; an FSDP rank passes their sharded forms (mem1_core.training.fsdp_learner)."""
    if get_estimator(estimator).uses_critic != (models.critic is not None):
        raise ValueError(f"estimator {estimator!r} and the presence of a critic disagree")
    device = next(models.policy.parameters()).device
    rb = make_rollout_batch(trajs, pad_id, device, seq_bucket)
    targets = score_fn(
        models, rb, attn, cfg.micro_batch_size, temperature=temperature, seq_bucket=seq_bucket
    )
    targets, rewards = estimate_advantages(rb, targets, cfg, estimator)
    stats = batch_stats(rb, targets, rewards)
    stats |= epochs_fn(
        models,
        optimizers,
        rb,
        targets,
        cfg,
        attn,
        guard,
        generator=generator,
        temperature=temperature,
        seq_bucket=seq_bucket,
    )
    return stats | {"nonfinite_total": guard.total}
