"""The learner's side of PPO / GRPO over masked trajectories (MEM1 §3.3, §4).

`update` reads top to bottom: trajectories -> the learner's rows (`trajectory.mode`: one
flattened tree per trajectory by default; mem1_core.trajectory.modes) ->
old log-probs (recomputed, or the rollout's: `ppo.old_logprobs`), reference log-probs and
values (one no-grad pass each over the trees) ->
the rollout correction (optional truncated importance weights of the sampler/learner gap)
-> token rewards (task score on the last generated token, minus kl_coef * KL to the
reference unless the KL is a loss term) -> advantages (`ppo.adv_estimator`: GAE over
generated tokens, group-relative, leave-one-out, REINFORCE++) -> PPO epochs over shuffled
minibatches, each accumulated over micro-batches, with `ppo.policy_loss` (token-level PPO
clip or GSPO's sequence ratio) aggregated by `ppo.loss_agg_mode`.

Choices and departures:
- Old log-probs are recomputed by the learner over the tree by default; the rollout's
  recorded ones must agree (to ~1e-6 on CPU fp32). Their gap is reported every iteration
  (`logp_mismatch_*`): a silent gap between the sampler and the trainer is a known failure
  of RL stacks, and here it would also expose a wrong tree. `ppo.old_logprobs=rollout`
  takes the recorded ones instead and skips that forward (verl's bypass mode).
- Micro-batching is exact, and a non-finite loss or gradient norm skips the step
  (mem1_core.rl.passes, which also holds the one hook by which FSDP ranks split the passes).
- Models stay in eval mode while training: the PPO ratio must compare the same function
  that sampled, so dropout (off in Qwen2 anyway) must never differ between the passes.
  (Activation checkpointing flags only the decoder layers as training; model.py.)
- Batches are padded to a multiple of `seq_bucket` tokens (ModelConfig.seq_bucket), and so
  are micro-batches, so a compiled FlexAttention sees a few lengths, not one per step.
  Padding is its own tree node that no real token sees: results do not change.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from torch import Tensor

from mem1_core.config import PPOConfig
from mem1_core.rl.advantages import masked_whiten, token_rewards
from mem1_core.rl.batch import (
    Models,
    RolloutBatch,
    Targets,
    TrajectoryTokens,
    batch_stats,
    make_rollout_batch,
)
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.passes import NonFiniteGuard, UpdateSettings, ppo_epochs, score
from mem1_core.rl.rollout_correction import rollout_is_weights
from mem1_core.rl.roofline import iteration_work
from mem1_core.trajectory.record import Trajectory


def correct_rollout(rb: RolloutBatch, t: Targets, cfg: PPOConfig) -> tuple[Targets, dict]:
    """`ppo.rollout_is`: the truncated importance weights of the learner's old log-probs
    against the rollout's recorded ones. -> `t` with them (unchanged when off), metrics."""
    if cfg.rollout_is is None:
        return t, {}
    weights, metrics = rollout_is_weights(
        t.old_logp, rb.rollout_logp, t.loss_mask, cfg.rollout_is, cfg.rollout_is_threshold
    )
    return dataclasses.replace(t, is_weights=weights), {k: float(v) for k, v in metrics.items()}


def estimate_advantages(rb: RolloutBatch, t: Targets, s: UpdateSettings) -> tuple[Targets, Tensor]:
    """Token rewards -> advantages and returns (`ppo.adv_estimator`). -> `t` with them filled
    in, and the (B, L) token rewards (for logging).

    Rewards and estimators run over each trajectory's generated tokens in generation order
    (TrajectoryTokens): a trajectory's rows (`trajectory.mode=turns`) form one chain, the
    outcome on its last generated token; with one row per trajectory nothing is moved."""
    cfg = s.ppo
    kl_coef = 0.0 if cfg.kl_in_loss or t.ref_logp is None else s.kl_coef
    tokens = TrajectoryTokens.of(rb, t.loss_mask)
    old_logp, ref_logp = tokens.pack(t.old_logp), tokens.pack(t.ref_logp)
    rewards = token_rewards(rb.scores, tokens.loss_mask, old_logp, ref_logp, kl_coef, cfg.kl_kind)
    est = get_estimator(cfg.adv_estimator)
    adv, returns = est.fn(
        rewards=rewards,
        values=tokens.pack(t.old_values),
        loss_mask=tokens.loss_mask,
        group_ids=rb.group_ids,
        gamma=cfg.gamma,
        lam=cfg.lam,
        eps=1e-6,
    )
    if est.whiten:
        adv = masked_whiten(adv, tokens.loss_mask)
    adv, returns = tokens.unpack(adv, t.loss_mask), tokens.unpack(returns, t.loss_mask)
    rewards = tokens.unpack(rewards, t.loss_mask)
    return dataclasses.replace(t, advantages=adv, returns=returns), rewards


def update(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    trajs: list[Trajectory],
    s: UpdateSettings,
    guard: NonFiniteGuard,
    generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """One learner update on one iteration's trajectories with the settings `s` (the
    driver's: its kl_coef the controller's current one). -> stats (floats), with the
    seconds of each phase (verl's `fit` timers: where a learner's second goes) and each
    phase's work (`work_*`: FLOPs, decoding's bytes; mem1_core.rl.roofline)."""
    cfg = s.ppo
    if get_estimator(cfg.adv_estimator).uses_critic != (models.critic is not None):
        raise ValueError(
            f"ppo.adv_estimator={cfg.adv_estimator!r} and the presence of a critic disagree"
        )
    device = next(models.policy.parameters()).device
    t0 = time.perf_counter()
    rb = make_rollout_batch(trajs, s.pad_id, device, s.seq_bucket, s.trajectory_mode)
    targets = score(models, rb, s)
    t1 = time.perf_counter()
    targets, correction = correct_rollout(rb, targets, cfg)
    targets, rewards = estimate_advantages(rb, targets, s)
    recompute = cfg.old_logprobs == "recompute"
    stats = batch_stats(rb, targets, rewards, cfg.kl_kind, mismatch=recompute) | correction
    stats["kl_coef"] = s.kl_coef
    t2 = time.perf_counter()
    stats["phase_score_seconds"] = t1 - t0  # old / reference log-probs and values
    stats["phase_advantages_seconds"] = t2 - t1
    stats |= ppo_epochs(models, optimizers, rb, targets, s, guard, generator)
    stats["phase_epochs_seconds"] = time.perf_counter() - t2  # the gradient steps
    stats |= iteration_work(models, trajs, rb, cfg)  # each phase's FLOPs or bytes
    return stats | {"nonfinite_total": guard.total}
