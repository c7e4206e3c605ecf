"""Truncated importance sampling of the rollout/learner log-prob gap (verl's rollout
correction, `rollout_is`; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training").

The rollout samples token y with the sampler's numerics (vLLM kernels, bf16, or weights a
step stale), pi_rollout(y); the learner recomputes pi_old(y) over the flattened tree and
trains the PPO ratio against it. The samples then come from pi_rollout, not pi_old, and
the policy gradient is biased by their gap (mem1_core.trajectory.mismatch measures it per
turn). The correction weights every token's policy loss by

    w = min(pi_old(y) / pi_rollout(y), threshold)      (detached)

per token (`token`), or with one weight per trajectory, the product of its tokens' ratios
over all turns (`sequence`; the environment's tokens do not depend on the policy, so they
drop out of the trajectory's ratio). Truncating at the threshold (TIS) trades a little bias
for bounded variance. As in verl, the log-ratio is clamped to +-20 before exp, only the
upper bound truncates, and the weights are constants (no gradient).

With the Hugging Face backend on CPU the two log-probs agree to ~1e-6 (weights ~ 1, none
truncated); the correction matters once vLLM generates, or rollouts run ahead of the
learner.

Rollouts ahead of the learner (`ppo.overlap_rollouts`): iteration k's samples come from the
weights before update k-1, and the learner recomputes pi_old under its weights before update
k. The pair is still (pi_old, pi_rollout), now a policy step apart: three policies, as in
decoupled PPO (Hilton et al. 2021) in verl's decoupled mode (pi_old recomputed, not verl's
`bypass_mode`, which would clip against the stale sampler) and AReaL's decoupled objective
(its proximal policy is our pi_old, its behaviour policy our pi_rollout). The PPO ratio
pi_theta / pi_old stays the trust region around the current weights; w = pi_old / pi_rollout
corrects for the stale sampler. Where they differ: AReaL drops tokens whose weight exceeds
`behav_imp_weight_cap`; this one, verl's TIS, keeps them at the cap.

With `ppo.old_logprobs=rollout` (verl's `bypass_mode`) the learner does not recompute pi_old:
the sampler's recorded log-probs are the old policy, so pi_old = pi_rollout and every weight
here would be 1. The ratio pi_theta / pi_rollout then carries the whole correction from the
behaviour policy to the trained one, and PPO's clip is its truncation; the config refuses
`rollout_is` (and `overlap_rollouts`) with it, since only the three-policy form separates a
sampler that computes otherwise, or an update stale, from the trust region.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mem1_core.config.methods import ROLLOUT_IS_LEVELS
from mem1_core.rl.advantages import check_loss_mask

_MAX_LOG_RATIO = 20.0


@ROLLOUT_IS_LEVELS.register("token")
def _token_log_weights(log_w: Tensor, loss_mask: Tensor) -> Tensor:
    return log_w


@ROLLOUT_IS_LEVELS.register("sequence")
def _sequence_log_weights(log_w: Tensor, loss_mask: Tensor) -> Tensor:
    """One weight per trajectory: the summed log-ratio, broadcast to its generated tokens."""
    return torch.where(loss_mask, log_w.sum(1, keepdim=True), 0)


@torch.no_grad()
def rollout_is_weights(
    old_logp: Tensor, rollout_logp: Tensor, loss_mask: Tensor, level: str, threshold: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated IS weights. old_logp (learner), rollout_logp (sampler), loss_mask: (B, L) -> weights (B, L), metrics.

    weights: min(exp(old_logp - rollout_logp), threshold) per generated token (`token`), or
    min(exp(sum over the row's generated tokens of the same), threshold) broadcast to them
    (`sequence`); 0 on environment tokens. Metrics over generated tokens: rollout_is_mean
    (of the truncated weights), rollout_is_truncated_frac (tokens whose weight the
    threshold cut) and rollout_is_threshold."""
    check_loss_mask(loss_mask, old_logp, rollout_logp)
    if threshold <= 0:
        raise ValueError(f"rollout_is threshold must be > 0, got {threshold}")
    log_w = torch.where(loss_mask, old_logp.float() - rollout_logp.float(), 0)
    log_w = ROLLOUT_IS_LEVELS[level](log_w, loss_mask)
    raw = torch.exp(log_w.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    truncated = loss_mask & (raw > threshold)
    weights = torch.where(loss_mask, raw.clamp(max=threshold), 0)
    n = loss_mask.sum().clamp_min(1)
    metrics = {
        "rollout_is_mean": weights.sum() / n,
        "rollout_is_truncated_frac": truncated.sum() / n,
        "rollout_is_threshold": torch.tensor(float(threshold), dtype=torch.float64),
    }
    return weights, metrics


ROLLOUT_IS_LEVELS.check_complete()
