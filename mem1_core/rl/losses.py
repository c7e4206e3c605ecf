"""PPO losses over a masked trajectory: clipped policy and value losses, entropy, KL.

Every loss is a token mean over the generated tokens (`loss_mask` True) of the
(mini)batch, and reads its inputs only there: log-probs, values or logits at environment
tokens (prompt, re-read memory, `<info>`, padding) change neither the loss nor any
gradient (inputs are masked with `torch.where` *before* any exp/square, so even inf there
stays out of the forward pass).

Micro-batching: each loss divides a masked sum by `normalizer`, by default the number of
generated tokens in the call. Pass the generated-token count of the whole minibatch
instead, and the per-micro-batch losses (and their gradients, and every metric) add up
to exactly the full-batch values. `explained_variance` is the one diagnostic that is not
additive: compute it once on the full batch.

The paper (MEM1 §4) uses PPO with the KL to the reference in the reward; `kl_loss` is
the GRPO-style alternative (KL as a loss term, DeepSeekMath §4.1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mem1_core.rl.advantages import check_loss_mask, kl_estimate, masked_var

# Same guard as the KL estimators: keeps exp() finite; no PPO step moves a token's
# log-prob by 20 nats while the clip is doing its job.
_MAX_LOG_RATIO = 20.0

Normalizer = float | int | Tensor | None


def token_mean(x: Tensor, loss_mask: Tensor, normalizer: Normalizer = None) -> Tensor:
    """Sum of x over generated tokens / normalizer (default: their count). x, loss_mask: (B, L) -> scalar."""
    check_loss_mask(loss_mask, x)
    if normalizer is None:
        normalizer = loss_mask.sum().clamp_min(1)
    elif not isinstance(normalizer, Tensor) and normalizer <= 0:
        raise ValueError(f"normalizer must be > 0 (a generated-token count), got {normalizer}")
    return torch.where(loss_mask, x, 0).sum() / normalizer


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log softmax(logits)[token], logits already aligned to the token they score. logits: (B, L, V), tokens: (B, L) -> (B, L).

    Computed in float32 at least; tokens at environment positions must still be valid ids."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits). logits: (B, L, V) -> (B, L).

    Safe with -inf logits (banned tokens): 0 * log 0 is taken as 0 in value and gradient."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # Double-where: p * where(p > 0, logp, 0) keeps -inf out of both passes.
    return -(p * torch.where(p > 0, logp, 0)).sum(-1)


def entropy_bonus(entropy: Tensor, loss_mask: Tensor, normalizer: Normalizer = None) -> Tensor:
    """Token-mean entropy over generated tokens; subtract coef * this from the loss. entropy, loss_mask: (B, L) -> scalar."""
    return token_mean(entropy, loss_mask, normalizer)


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    loss_mask: Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    normalizer: Normalizer = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip surrogate. logp, old_logp, adv, loss_mask: (B, L) -> scalar loss, metrics.

    per token: max(-A r, -A clip(r, 1 - clip_eps, 1 + clip_eps_high)), r = exp(logp - old_logp);
    clip_eps_high defaults to clip_eps (DAPO's clip-higher when larger). dual_clip = c > 1
    also caps the loss of negative-advantage tokens at -A c (Ye et al. 2020, "dual-clip"),
    so a huge ratio cannot blow up the step. Gradient flows into logp only.
    Metrics (detached, additive over micro-batches): approx_kl (k3 estimate of
    KL(old || new) = mean((r - 1) - log r)), approx_kl_k1 (mean(-log r)), clip_frac
    (tokens where the clip binds, i.e. their gradient is cut), and dual_clip_frac."""
    check_loss_mask(loss_mask, logp, old_logp, adv)
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if high <= 0.0:
        raise ValueError(f"clip_eps_high must be > 0, got {high}")
    log_ratio = torch.where(loss_mask, logp - old_logp.detach(), 0)
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
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
    loss = token_mean(per_token, loss_mask, normalizer)
    with torch.no_grad():
        metrics["approx_kl"] = token_mean(ratio - 1 - log_ratio, loss_mask, normalizer)
        metrics["approx_kl_k1"] = token_mean(-log_ratio, loss_mask, normalizer)
        binding = (loss_clipped > loss_unclipped).float()
        metrics["clip_frac"] = token_mean(binding, loss_mask, normalizer)
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
    form; clip_eps=None gives the plain 0.5 (V - R)^2. Gradient flows into values only.
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
    loss = 0.5 * token_mean(per_token, loss_mask, normalizer)
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

    Token mean of the `kind` estimator (see `KL_ESTIMATORS`; "k3" as in DeepSeekMath).
    Gradient flows into logp only. Metrics: kl (the same value, detached)."""
    check_loss_mask(loss_mask, logp, ref_logp)
    kl = kl_estimate(
        torch.where(loss_mask, logp, 0), torch.where(loss_mask, ref_logp.detach(), 0), kind
    )
    loss = token_mean(kl, loss_mask, normalizer)
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
