"""The learner's passes over the models, one implementation for every learner: scoring
(old / reference log-probs and values), the PPO loss of a micro-batch, gradient accumulation
over a minibatch, the optimiser step (or its skip), and the epoch loop.

How the passes are split over processes is one hook, `Split`: the single learner runs every
row itself (`LOCAL`); an FSDP rank runs its share and sums over ranks
(mem1_core.training.fsdp_learner.RankSplit).

- Micro-batching is exact: every loss divides by the generated-token and trajectory counts
  of the whole minibatch (`minibatch_agg`, a LossAgg), so the summed micro-batch gradients
  equal the full batch's in every `ppo.loss_agg_mode` (a trajectory never straddles two
  micro-batches), and, split over ranks, so does the sum of the ranks' gradients.
- A non-finite loss or gradient norm skips the optimiser step (no parameter moves), is
  logged and counted; `max_nonfinite_in_row` skipped steps in a row raise NonFiniteError.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mem1_core.config import PPOConfig
from mem1_core.models.model import is_checkpointing
from mem1_core.rl.batch import (
    Models,
    RolloutBatch,
    Targets,
    micro_batches,
    minibatch_rows,
    select_rows,
)
from mem1_core.rl.losses import (
    POLICY_LOSSES,
    LossAgg,
    clipped_value_loss,
    entropy_bonus,
    kl_loss,
)
from mem1_core.trajectory.logprobs import Attn, forward_tree, mask_dtype, tree_attention_mask
from mem1_core.trajectory.tree import FlatBatch

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


def one_pass_mask(model: nn.Module, batch: FlatBatch, attn: str) -> object | None:
    """The mask a pass of `model` over `batch` should be given: None (forward_tree picks
    the shared-prefix forward under sdpa/eager, a BlockMask under flex) unless the pass
    needs the one-pass tree mask: under activation checkpointing with gradients on, a
    checkpointed layer drops the KV cache that the shared-prefix forward hands from the
    trunk to the branches (Hugging Face does so: a recompute would write it twice)."""
    if Attn(attn) is Attn.FLEX or (torch.is_grad_enabled() and is_checkpointing(model)):
        return tree_attention_mask(batch, attn, mask_dtype(model))
    return None


@dataclass(frozen=True)
class Split:
    """How a learner's passes are split over processes: the one hook through which the FSDP
    ranks (mem1_core.training.fsdp_learner.RankSplit) differ from the single learner, which
    is this class as it is (`LOCAL`): every row in this process, nothing to reduce.

    - `micro_batches`: this process's micro-batches of `rows`, each with its cut length and
      whether it is real (False: a stand-in whose loss mask is emptied, so that every rank
      runs the same number of passes);
    - `mask`: the attention mask a pass is given (None: forward_tree picks);
    - `forward`: the policy's tree forward;
    - `reduce`: sum a tensor over processes, in place;
    - `stop_early`: stop a minibatch's backward passes at the first non-finite loss (a rank
      must not: the others would wait in its reduce-scatter)."""

    stop_early: bool = True

    def micro_batches(
        self, rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int, tokens: int | None = None
    ) -> list[tuple[Tensor, int, bool]]:
        plan = micro_batches(rows, size, batch, seq_bucket, tokens)
        return [(chunk, cut, True) for chunk, cut in plan]

    def mask(self, model: nn.Module, batch: FlatBatch, attn: str) -> object | None:
        return one_pass_mask(model, batch, attn)

    def forward(self, model: nn.Module, batch: FlatBatch, attn: str, **kwargs: Any) -> Any:
        return forward_tree(model, batch, attn, **kwargs)

    def reduce(self, x: Tensor) -> Tensor:
        return x


LOCAL = Split()
"""The single learner: all rows here."""


@dataclass(frozen=True)
class UpdateSettings:
    """Everything one learner update runs with, fixed by the driver (Learner.update) and
    handed unchanged from `ppo.update` down to the loss: the algorithm's config, the values
    the run resolves for this update, and how the passes run. One argument instead of
    eight threaded by hand; nothing here rewrites the config."""

    ppo: PPOConfig
    """The algorithm (`ppo` section), as loaded."""
    attn: str
    """The attention implementation of the passes (`model.attn`)."""
    kl_coef: float
    """The KL coefficient of this update: the KL controller's current one (starts at
    `ppo.kl_coef`; mem1_core.rl.kl_control)."""
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm's normaliser, resolved (Config.loss_scale_factor)."""
    pad_id: int = 0
    """The tokenizer's pad id, for the rows of a flattened batch."""
    temperature: float = 1.0
    """The rollout's sampling temperature: log-probs are those of the distribution sampled
    from (`rollout.temperature`, 1 when greedy)."""
    seq_bucket: int = 1
    """Pad flattened batches and micro-batches to a multiple of this (ModelConfig.seq_bucket)."""
    split: Split = LOCAL
    """How the passes are split over processes (an FSDP rank's RankSplit; LOCAL: none)."""
    trajectory_mode: str = "tree"
    """How trajectories become the learner's rows (`trajectory.mode`; mem1_core.trajectory.modes)."""

    @classmethod
    def of(cls, ppo: PPOConfig, attn: str, **settings: Any) -> UpdateSettings:
        """Settings whose kl_coef and loss_scale_factor are `ppo`'s own unless given."""
        settings.setdefault("kl_coef", ppo.kl_coef)
        settings.setdefault("loss_scale_factor", ppo.loss_scale_factor)
        return cls(ppo, attn, **settings)


def emptied(micro: FlatBatch, targets: Targets | None = None) -> tuple[FlatBatch, Targets | None]:
    """A stand-in micro-batch: no generated token, so no log-prob is read and the loss is 0."""
    no_tokens = torch.zeros_like(micro.loss_mask)
    targets = None if targets is None else dataclasses.replace(targets, loss_mask=no_tokens)
    return dataclasses.replace(micro, loss_mask=no_tokens), targets


@torch.no_grad()
def score(models: Models, rollout: RolloutBatch, settings: UpdateSettings) -> Targets:
    """Old log-probs, reference log-probs and values, all over the tree, log-probs at the
    rollout's sampling temperature (the distribution sampled from). The old log-probs are the
    current policy's (`ppo.old_logprobs=recompute`) or the sampler's as the rollout recorded
    them (`rollout`: the policy's forward is skipped). Advantages and returns are left empty
    (zeros) for `estimate_advantages`. Split over processes, each scores its rows and the
    sums over processes fill the whole batch (a row is non-zero on the one process that
    scored it)."""
    num_rows, length = rollout.batch.input_ids.shape
    device = rollout.batch.input_ids.device
    recompute = settings.ppo.old_logprobs == "recompute"
    old_logp = torch.zeros(num_rows, length, device=device) if recompute else None
    ref_logp = (
        torch.zeros(num_rows, length, device=device) if models.reference is not None else None
    )
    values = torch.zeros(num_rows, length, device=device) if models.critic is not None else None
    split, attn = settings.split, settings.attn
    plan = split.micro_batches(
        torch.arange(num_rows),
        settings.ppo.micro_batch_size,
        rollout.batch,
        settings.seq_bucket,
        settings.ppo.micro_batch_tokens,
    )
    if old_logp is None and ref_logp is None and values is None:
        plan = []  # nothing to score (every process alike)
    for rows, cut, real in plan:
        micro = select_rows(rollout.batch, rows, cut)
        micro = micro if real else emptied(micro)[0]
        # A BlockMask (flex) is built once and read by all three models.
        mask = split.mask(models.policy, micro, attn)
        scored = {}
        if old_logp is not None:
            scored["old"] = split.forward(
                models.policy, micro, attn, temperature=settings.temperature, mask=mask
            ).logprobs
        if ref_logp is not None:
            scored["ref"] = split.forward(
                models.reference, micro, attn, temperature=settings.temperature, mask=mask
            ).logprobs
        if values is not None:
            scored["values"] = models.critic(micro, attn, mask=mask)
        if not real:
            continue
        for name, out in (("old", old_logp), ("ref", ref_logp), ("values", values)):
            if out is not None:
                out[rows, :cut] = scored[name]
    for out in (old_logp, ref_logp, values):
        if out is not None:
            split.reduce(out)
    if old_logp is None:  # every process holds the whole batch's recorded log-probs
        old_logp = rollout.rollout_logp.clone()
    zeros = torch.zeros_like(old_logp)
    return Targets(rollout.batch.loss_mask, old_logp, zeros, zeros, values, ref_logp)


def minibatch_agg(targets: Targets, rows: Tensor, settings: UpdateSettings) -> LossAgg:
    """How the losses of minibatch `rows` aggregate (`ppo.loss_agg_mode`), over its counts."""
    mode = settings.ppo.loss_agg_mode
    if mode == "seq-mean-token-sum-norm" and settings.loss_scale_factor is None:
        raise ValueError(
            "ppo.loss_agg_mode=seq-mean-token-sum-norm needs a loss_scale_factor; the "
            "learner resolves it from the rollout budget (Config.loss_scale_factor)"
        )
    return LossAgg.of(targets.loss_mask[rows], mode, settings.loss_scale_factor)


def ppo_loss(
    logp: Tensor,
    entropy: Tensor | None,
    values: Tensor | None,
    targets: Targets,
    settings: UpdateSettings,
    normalizer: LossAgg,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The minibatch objective on one micro-batch. logp, entropy, values: (b, l) and the
    matching Targets -> scalar loss (policy + value + KL/entropy terms), metrics. Only
    generated tokens enter; `normalizer` holds the whole minibatch's counts (minibatch_agg)."""
    cfg = settings.ppo
    low, high = cfg.clip_range
    loss, policy_metrics = POLICY_LOSSES[cfg.policy_loss](
        logp,
        targets.old_logp,
        targets.advantages,
        targets.loss_mask,
        low,
        clip_eps_high=high,
        dual_clip=cfg.clip_ratio_c,
        is_weights=targets.is_weights,
        normalizer=normalizer,
    )
    metrics = {"pg_loss": loss.detach(), **policy_metrics}
    if values is not None:
        value_loss, value_metrics = clipped_value_loss(
            values,
            targets.old_values,
            targets.returns,
            targets.loss_mask,
            cfg.value_clip_eps,
            normalizer=normalizer,
        )
        loss = loss + value_loss
        metrics |= {"vf_loss": value_loss.detach(), **value_metrics}
    if cfg.entropy_coef and entropy is not None:
        bonus = entropy_bonus(entropy, targets.loss_mask, normalizer)
        loss = loss - cfg.entropy_coef * bonus
        metrics["entropy"] = bonus.detach()
    if cfg.kl_in_loss and targets.ref_logp is not None:
        kl, _ = kl_loss(
            logp, targets.ref_logp, targets.loss_mask, cfg.kl_kind, normalizer=normalizer
        )
        loss = loss + settings.kl_coef * kl
        metrics["kl_loss"] = kl.detach()
    return loss, metrics


def accumulate_gradients(
    models: Models,
    batch: FlatBatch,
    targets: Targets,
    rows: Tensor,
    settings: UpdateSettings,
) -> tuple[dict[str, Tensor], bool]:
    """Backward of one minibatch (`rows`; this process's share of it), micro-batch by
    micro-batch, into `.grad`. -> the summed metrics, and whether every loss was finite."""
    cfg, split, attn = settings.ppo, settings.split, settings.attn
    normalizer = minibatch_agg(targets, rows, settings)  # the whole minibatch's counts
    total: dict[str, Tensor] = {}
    finite = True
    plan = split.micro_batches(
        rows, cfg.micro_batch_size, batch, settings.seq_bucket, cfg.micro_batch_tokens
    )
    for micro_rows, cut, real in plan:
        micro, micro_targets = select_rows(batch, micro_rows, cut), targets.rows(micro_rows, cut)
        if not real:
            micro, micro_targets = emptied(micro, micro_targets)
        mask = split.mask(models.policy, micro, attn)
        out = split.forward(
            models.policy,
            micro,
            attn,
            with_entropy=cfg.entropy_coef > 0,
            temperature=settings.temperature,
            mask=mask,
        )
        # The critic always runs one pass; it reuses the policy's mask when there is one.
        values = models.critic(micro, attn, mask=mask) if models.critic is not None else None
        loss, metrics = ppo_loss(
            out.logprobs, out.entropy, values, micro_targets, settings, normalizer
        )
        finite = finite and bool(torch.isfinite(loss))
        if not finite and split.stop_early:
            break
        loss.backward()
        for name, value in metrics.items():
            total[name] = total.get(name, 0.0) + value
    return total, finite


def trainable_parameters(models: Models) -> dict[str, list[nn.Parameter]]:
    groups = {"policy": [p for p in models.policy.parameters() if p.requires_grad]}
    if models.critic is not None:
        groups["critic"] = [p for p in models.critic.parameters() if p.requires_grad]
    return groups


def _full_norm(norm: Tensor) -> float:
    """A gradient norm as a float; over sharded (DTensor) parameters it is a DTensor."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def optimizer_step(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    settings: UpdateSettings,
    guard: NonFiniteGuard,
    metrics: dict[str, Tensor],
    finite_loss: bool,
) -> dict[str, float] | None:
    """Clip and step every optimiser, or none: a non-finite loss (on any process) or
    gradient norm skips the whole step. Gradients are cleared either way. -> the metrics
    (summed over processes) and gradient norms, or None when the step was skipped."""
    names = sorted(metrics)
    device = next(models.policy.parameters()).device
    flag = torch.tensor(0.0 if finite_loss else 1.0, device=device)
    summed = settings.split.reduce(
        torch.stack(
            [flag, *(torch.as_tensor(metrics[name]).detach().float().to(device) for name in names)]
        )
    )
    loss_ok = bool(summed[0] == 0)
    norms: dict[str, float] = {}
    if loss_ok:
        for name, params in trainable_parameters(models).items():
            norms[f"{name}_grad_norm"] = _full_norm(
                torch.nn.utils.clip_grad_norm_(params, settings.ppo.grad_clip)
            )
    finite = loss_ok and all(math.isfinite(v) for v in norms.values())
    guard.record(finite, "gradient norm" if loss_ok else "loss")
    if finite:
        for opt in optimizers.values():
            opt.step()
        # The learner runs a whole update in one autocast context (Learner.update), and
        # autocast keeps its low-precision copy of each float32 master weight until the
        # outermost context exits: without this, every pass after the first step of an update
        # computes with the weights from before it (the next minibatch's PPO ratio exactly 1,
        # its gradient a step old, the critic's too). A no-op outside autocast.
        torch.clear_autocast_cache()
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    if not finite:
        return None
    return dict(zip(names, summed[1:].tolist(), strict=True)) | norms


def ppo_epochs(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    rollout: RolloutBatch,
    targets: Targets,
    settings: UpdateSettings,
    guard: NonFiniteGuard,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """`ppo.ppo_epochs` passes over the batch in shuffled minibatches of `ppo.minibatch_size`
    trajectories (all their rows; the same order in every process: the same generator), each
    accumulated and stepped, or skipped when non-finite. -> the metrics averaged over the
    steps taken, and the counts."""
    device = rollout.batch.input_ids.device
    sums: dict[str, float] = {}
    steps = skipped = 0
    for _ in range(settings.ppo.ppo_epochs):
        order = torch.randperm(rollout.num_trajectories, generator=generator).to(device)
        for trajectories in order.split(settings.ppo.minibatch_size):
            rows = minibatch_rows(rollout, trajectories)
            if not len(rows):  # trajectories without a turn: nothing to train on
                continue
            metrics, finite = accumulate_gradients(models, rollout.batch, targets, rows, settings)
            done = optimizer_step(models, optimizers, settings, guard, metrics, finite)
            if done is None:
                skipped += 1
                continue
            steps += 1
            for name, value in done.items():
                sums[name] = sums.get(name, 0.0) + value
    out = {name: total / max(steps, 1) for name, total in sums.items()}
    return out | {"optimizer_steps": steps, "skipped_steps": skipped}
