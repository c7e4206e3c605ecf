"""PPO losses over a masked trajectory: clipped policy (token-level PPO, or GSPO's
sequence-level ratio) and value losses, entropy, KL.

Every loss reads its inputs only at the generated tokens (`loss_mask` True): log-probs,
values or logits at environment tokens (prompt, re-read memory, `<info>`, padding) change
neither the loss nor any gradient (inputs are masked with `torch.where` *before* any
exp/square, so even inf there stays out of the forward pass).

Aggregation (`agg_loss`, verl's `loss_agg_mode`): a per-token loss becomes a scalar as
  token-mean               sum over tokens / tokens (the default; the paper's)
  seq-mean-token-mean      mean over sequences of each one's token mean (GRPO's paper form)
  seq-mean-token-sum       mean over sequences of each one's token sum
  seq-mean-token-sum-norm  mean over sequences of token sum / scale_factor (Dr. GRPO: a
                           fixed normaliser, so no length bias)
A "sequence" is one trajectory (a row: all its turns' generated tokens).

Micro-batching: each loss divides by the counts of a `LossAgg`, by default those of the
call's own rows. Pass the generated-token and sequence counts of the whole minibatch
instead (`LossAgg.of(minibatch_mask, ...)`), and the per-micro-batch losses (and their
gradients, and every metric) add up to exactly the full-batch values. Metrics (clip
fractions, approximate KL) are token means whatever the mode, as in verl.
`explained_variance` is the one diagnostic that is not additive: compute it once on the
full batch.

The paper (MEM1 §4) uses PPO with the KL to the reference in the reward; `kl_loss` is
the GRPO-style alternative (KL as a loss term, DeepSeekMath §4.1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from mem1_core.config.methods import LOSS_AGG_MODES, POLICY_LOSSES
from mem1_core.rl.advantages import check_loss_mask, kl_estimate, masked_var

# Same guard as the KL estimators: keeps exp() finite; no PPO step moves a token's
# log-prob by 20 nats while the clip is doing its job.
_MAX_LOG_RATIO = 20.0
# GSPO's sequence ratio: verl clamps its log at 10 (`compute_policy_loss_gspo`).
_MAX_SEQ_LOG_RATIO = 10.0


@dataclass(frozen=True)
class LossAgg:
    """How a per-token loss becomes a scalar: the mode, and the counts it divides by."""

    mode: str = "token-mean"
    tokens: float | Tensor | None = None
    """Generated tokens of the whole minibatch; None: those of the call's rows."""
    seqs: float | Tensor | None = None
    """Rows of the whole minibatch with at least one generated token; None: the call's."""
    scale_factor: float | None = None
    """`seq-mean-token-sum-norm`'s fixed per-sequence normaliser (verl's loss_scale_factor)."""

    @classmethod
    def of(cls, loss_mask: Tensor, mode: str = "token-mean", scale_factor: float | None = None):
        """The counts of `loss_mask` (B, L): pass it the whole minibatch's mask."""
        tokens = loss_mask.sum().clamp_min(1)
        return cls(mode, tokens, loss_mask.any(1).sum().clamp_min(1), scale_factor)


Normalizer = LossAgg | float | int | Tensor | None
"""A LossAgg, or a number: the token count of token-mean (the call's own when None)."""


def _as_agg(normalizer: Normalizer) -> LossAgg:
    if isinstance(normalizer, LossAgg):
        return normalizer
    if normalizer is not None and not isinstance(normalizer, Tensor) and normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a generated-token count), got {normalizer}")
    return LossAgg(tokens=normalizer)


def agg_loss(
    x: Tensor,
    loss_mask: Tensor,
    mode: str = "token-mean",
    tokens: float | Tensor | None = None,
    seqs: float | Tensor | None = None,
    scale_factor: float | None = None,
) -> Tensor:
    """A per-token loss as a scalar, verl's `agg_loss`. x, loss_mask: (B, L) -> scalar.

    token-mean: sum_bt x / tokens; seq-mean-token-mean: sum_b (sum_t x_bt / n_b) / seqs;
    seq-mean-token-sum: sum_bt x / seqs; seq-mean-token-sum-norm: sum_bt x / (seqs *
    scale_factor). n_b: row b's generated tokens; tokens / seqs default to the counts of
    `loss_mask` (pass the whole minibatch's for exact micro-batching). Rows without a
    generated token count as no sequence. Departure from verl: its seq-mean-token-sum-norm
    sums the rows of a micro-batch (/ scale_factor) and then divides by the number of
    gradient-accumulation steps, which is ours times the micro-batch size; ours is the
    Dr. GRPO objective (1/B) sum_b sum_t x / scale_factor, whatever the micro-batching."""
    check_loss_mask(loss_mask, x)
    masked = torch.where(loss_mask, x, 0)
    if tokens is None:
        tokens = loss_mask.sum().clamp_min(1)
    if seqs is None:
        seqs = loss_mask.any(1).sum().clamp_min(1)
    return LOSS_AGG_MODES[mode](masked, loss_mask, tokens, seqs, scale_factor)


# The modes (`ppo.loss_agg_mode`): (masked per-token loss, loss_mask, tokens, seqs,
# scale_factor) -> scalar.
@LOSS_AGG_MODES.register("token-mean")
def _token_mean(masked: Tensor, loss_mask: Tensor, tokens, seqs, scale_factor) -> Tensor:
    return masked.sum() / tokens


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(masked: Tensor, loss_mask: Tensor, tokens, seqs, scale_factor) -> Tensor:
    return (masked.sum(1) / loss_mask.sum(1).clamp_min(1)).sum() / seqs


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(masked: Tensor, loss_mask: Tensor, tokens, seqs, scale_factor) -> Tensor:
    return masked.sum() / seqs


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(masked: Tensor, loss_mask: Tensor, tokens, seqs, scale_factor):
    if scale_factor is None or scale_factor <= 0:
        raise ValueError(
            f"seq-mean-token-sum-norm needs a fixed scale_factor > 0, got {scale_factor}"
        )
    return masked.sum() / (seqs * scale_factor)


def _agg(x: Tensor, loss_mask: Tensor, normalizer: Normalizer) -> Tensor:
    a = _as_agg(normalizer)
    return agg_loss(x, loss_mask, a.mode, a.tokens, a.seqs, a.scale_factor)


def token_mean(x: Tensor, loss_mask: Tensor, normalizer: Normalizer = None) -> Tensor:
    """Sum of x over generated tokens / their count (the normalizer's, whatever its mode). x, loss_mask: (B, L) -> scalar."""
    return agg_loss(x, loss_mask, "token-mean", _as_agg(normalizer).tokens)


def entropy_bonus(entropy: Tensor, loss_mask: Tensor, normalizer: Normalizer = None) -> Tensor:
    """Aggregated entropy over generated tokens; subtract coef * this from the loss. entropy, loss_mask: (B, L) -> scalar."""
    return _agg(entropy, loss_mask, normalizer)


def _log_ratio(logp: Tensor, old_logp: Tensor, loss_mask: Tensor) -> Tensor:
    log_ratio = torch.where(loss_mask, logp - old_logp.detach(), 0)
    return log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _weighted(per_token: Tensor, is_weights: Tensor | None, loss_mask: Tensor) -> Tensor:
    """The rollout-correction weights (mem1_core.rl.rollout_correction) multiply each token's
    loss, detached, after the clip (verl's `rollout_is_weights`)."""
    if is_weights is None:
        return per_token
    check_loss_mask(loss_mask, is_weights)
    return per_token * torch.where(loss_mask, is_weights.detach(), 0)


def _ratio_metrics(
    ratio: Tensor, log_ratio: Tensor, binding: Tensor, loss_mask: Tensor, normalizer: Normalizer
) -> dict[str, Tensor]:
    with torch.no_grad():
        return {
            "approx_kl": token_mean(ratio - 1 - log_ratio, loss_mask, normalizer),
            "approx_kl_k1": token_mean(-log_ratio, loss_mask, normalizer),
            "clip_frac": token_mean(binding.float(), loss_mask, normalizer),
        }


@POLICY_LOSSES.register("vanilla")  # token-level PPO-clip (+ clip-higher, dual-clip)
def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    loss_mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    is_weights: Tensor | None = None,
    normalizer: Normalizer = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip surrogate. logp, old_logp, adv, loss_mask (, is_weights): (B, L) -> scalar loss, metrics.

    per token: max(-A r, -A clip(r, 1 - clip_eps, 1 + clip_eps_high)), r = exp(logp - old_logp);
    clip_eps_high defaults to clip_eps (DAPO's clip-higher when larger). dual_clip = c > 1
    also caps the loss of negative-advantage tokens at -A c (Ye et al. 2020, "dual-clip"),
    so a huge ratio cannot blow up the step. `is_weights` (detached) multiply each token's
    loss (the rollout correction). Aggregated by the normalizer's mode (`agg_loss`).
    Gradient flows into logp only.
    Metrics (detached, additive over micro-batches, token means): approx_kl (k3 estimate of
    KL(old || new) = mean((r - 1) - log r)), approx_kl_k1 (mean(-log r)), clip_frac
    (tokens where the clip binds, i.e. their gradient is cut), and dual_clip_frac."""
    check_loss_mask(loss_mask, logp, old_logp, adv)
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if high <= 0.0:
        raise ValueError(f"clip_eps_high must be > 0, got {high}")
    log_ratio = _log_ratio(logp, old_logp, loss_mask)
    adv = torch.where(loss_mask, adv.detach(), 0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    metrics: dict[str, Tensor] = {}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = -adv * dual_clip
        capped = (adv < 0) & (per_token > cap)
        per_token = torch.where(capped, cap, per_token)
        metrics["dual_clip_frac"] = token_mean(capped.float(), loss_mask, normalizer).detach()
    loss = _agg(_weighted(per_token, is_weights, loss_mask), loss_mask, normalizer)
    binding = loss_clipped > loss_unclipped
    return loss, metrics | _ratio_metrics(ratio, log_ratio, binding, loss_mask, normalizer)


@POLICY_LOSSES.register("gspo")  # sequence-level ratio
def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    loss_mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    is_weights: Tensor | None = None,
    normalizer: Normalizer = None,
    **_: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025), verl's `compute_policy_loss_gspo`. logp, old_logp, adv, loss_mask (, is_weights): (B, L) -> scalar loss, metrics.

    The importance ratio is the sequence's: s_b = exp(mean over row b's generated tokens of
    (logp - old_logp)), the length-normalised ratio of the whole trajectory (all turns: the
    environment's tokens do not depend on the policy, so they cancel out of the trajectory's
    likelihood ratio, and the task reward is the trajectory's). Per token it enters as
    s_bt = sg[s_b] * pi / sg[pi] (value s_b, gradient s_b * grad log pi: "GSPO-token", which
    is GSPO's gradient when the advantage is constant along the row), clipped to
    [1 - clip_eps, 1 + clip_eps_high] (GSPO uses small ranges: 3e-4 / 4e-4). Aggregated
    seq-mean-token-mean whatever the normalizer's mode, as in verl (which makes the
    per-token form the paper's sequence objective); no dual-clip. `is_weights` as in
    `clipped_policy_loss`. Metrics as `clipped_policy_loss`'s (clip_frac counts tokens:
    the clip binds on whole sequences), plus seq_ratio_dev: the mean |s_b - 1| per token."""
    check_loss_mask(loss_mask, logp, old_logp, adv)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 < clip_eps < 1.0 or high <= 0.0:
        raise ValueError(f"GSPO clip ranges must be in (0, 1) and > 0, got {clip_eps}, {high}")
    log_ratio = _log_ratio(logp, old_logp, loss_mask)
    seq_log_ratio = log_ratio.sum(1) / loss_mask.sum(1).clamp_min(1)
    logp = torch.where(loss_mask, logp, 0)
    log_s = (logp - logp.detach() + seq_log_ratio.detach()[:, None]).clamp(max=_MAX_SEQ_LOG_RATIO)
    s = torch.exp(torch.where(loss_mask, log_s, 0))
    adv = torch.where(loss_mask, adv.detach(), 0)
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - clip_eps, 1.0 + high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    agg = replace(_as_agg(normalizer), mode="seq-mean-token-mean")
    loss = _agg(_weighted(per_token, is_weights, loss_mask), loss_mask, agg)
    binding = loss_clipped > loss_unclipped
    metrics = _ratio_metrics(torch.exp(log_ratio), log_ratio, binding, loss_mask, normalizer)
    metrics["seq_ratio_dev"] = token_mean((s.detach() - 1).abs(), loss_mask, normalizer)
    return loss, metrics


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    clip_eps: float | None,
    *,
    normalizer: Normalizer = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss. values, old_values, returns, loss_mask: (B, L) -> scalar loss, metrics.

    per token: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), the PPO2
    form; clip_eps=None gives the plain 0.5 (V - R)^2. Aggregated by the normalizer's mode
    (verl's critic follows the actor's loss_agg_mode). Gradient flows into values only.
    Metrics (detached, additive): vf_clip_frac (tokens where the clipped branch binds)."""
    check_loss_mask(loss_mask, values, old_values, returns)
    v = torch.where(loss_mask, values, 0)
    target = torch.where(loss_mask, returns.detach(), 0)
    loss_unclipped = (v - target) ** 2
    if clip_eps is None:
        per_token = loss_unclipped
        binding = torch.zeros_like(loss_mask)
    else:
        if clip_eps <= 0.0:
            raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
        old = torch.where(loss_mask, old_values.detach(), 0)
        v_clipped = old + (v - old).clamp(-clip_eps, clip_eps)
        loss_clipped = (v_clipped - target) ** 2
        per_token = torch.maximum(loss_unclipped, loss_clipped)
        binding = loss_clipped > loss_unclipped
    loss = 0.5 * _agg(per_token, loss_mask, normalizer)
    with torch.no_grad():
        metrics = {"vf_clip_frac": token_mean(binding.float(), loss_mask, normalizer)}
    return loss, metrics


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    loss_mask: Tensor,
    kind: str = "k3",
    *,
    normalizer: Normalizer = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL to the reference as a loss term (GRPO style). logp, ref_logp, loss_mask: (B, L) -> scalar loss, metrics.

    The `kind` estimator (see `KL_ESTIMATORS`; "k3" as in DeepSeekMath), aggregated by the
    normalizer's mode (as verl's kl_loss). Gradient flows into logp only. Metrics: kl (the
    same value, detached)."""
    check_loss_mask(loss_mask, logp, ref_logp)
    kl = kl_estimate(
        torch.where(loss_mask, logp, 0), torch.where(loss_mask, ref_logp.detach(), 0), kind
    )
    loss = _agg(kl, loss_mask, normalizer)
    return loss, {"kl": loss.detach()}


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(returns - values) / Var(returns) over masked tokens. values, returns, mask: (B, L) -> scalar.

    1 is a perfect critic, 0 no better than a constant, < 0 worse; NaN when the returns
    do not vary. Not additive over micro-batches: call it on the full batch."""
    check_loss_mask(mask, values, returns)
    var_returns = masked_var(returns, mask)
    var_residual = masked_var(returns - values, mask)
    nan = torch.full_like(var_returns, float("nan"))
    return torch.where(var_returns > 0, 1 - var_residual / var_returns, nan)


LOSS_AGG_MODES.check_complete()
POLICY_LOSSES.check_complete()
