"""Token rewards, KL estimators and advantage estimators over a masked trajectory.

A MEM1 trajectory is flattened into one sequence of length L (batch padded to B x L).
`loss_mask` (B, L, bool) is True exactly on the tokens the policy generated, in the order
they were generated, turn after turn; every other token (prompt, re-read `<IS>`/`<query>`,
`<info>`, padding) is an environment token whose logp/value entries are arbitrary. Every
function here reads tensors only at generated positions and writes 0 elsewhere.

What it implements (MEM1 §3.3 / §4 trains with PPO, token-level rewards, gamma = lam = 1,
KL coefficient 1e-3):
- `token_rewards`: the task score on the last generated token of the final turn, minus a
  KL penalty to the reference policy on every generated token.
- `gae`: generalized advantage estimation along the generated tokens only. Environment
  tokens neither carry values nor break the chain: the value that bootstraps the last
  token of turn t is the value of the first generated token of turn t+1. Search-R1's
  `compute_advantage` (which the public MEM1 code inherits) runs GAE over the whole
  response, info tokens included, reading critic values there; with gamma = lam = 1 the
  two agree (the sum telescopes), otherwise they differ, and ours does not depend on
  values the critic was never trained on.
- `grpo_advantages`: the group-relative alternative (DeepSeekMath GRPO) for several
  samples per task, broadcast to every generated token of the trajectory (all turns).
  Departure from verl: a group of size 1 gets advantage 0 (no baseline exists), not
  its raw score.
- `rloo_advantages`: leave-one-out baseline within the group (RLOO); `discounted_returns`:
  the reward-to-go along generated tokens (REINFORCE++'s return).
- `masked_mean` / `masked_var` / `masked_whiten`: statistics over generated tokens only.

KL variants are chosen by name through `KL_ESTIMATORS` (mem1_core.config.methods); advantage estimators are registered
by name in mem1_core.rl.estimators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mem1_core.config.methods import KL_ESTIMATORS

# exp() of a log-ratio above ~88 overflows float32; |log-ratio| > 20 means the two
# policies disagree by a factor of 5e8 and the estimate is meaningless anyway. verl's
# low-variance KL (k3) clamps its log-ratio to the same +-20, and then clips the k3 value
# itself to +-10 (`kl_penalty`, "low_var_kl"): one token far off the reference cannot
# dominate a batch's KL. Ours does both; k3 >= 0, so only the upper bound ever binds, and
# there its gradient is 0, as in verl.
_MAX_LOG_RATIO = 20.0
_MAX_K3 = 10.0


def check_loss_mask(loss_mask: Tensor, *tensors: Tensor) -> None:
    """Masks are booleans (docs/design.md §4.3), and every (B, L) tensor matches the mask."""
    if loss_mask.dtype != torch.bool:
        raise TypeError(f"loss_mask must be a bool tensor, got {loss_mask.dtype}")
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be (B, L), got shape {tuple(loss_mask.shape)}")
    for t in tensors:
        if t.shape != loss_mask.shape:
            raise ValueError(
                f"expected shape {tuple(loss_mask.shape)} like loss_mask, got {tuple(t.shape)}"
            )


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """At least float32: advantages from bf16 values would lose the reward's precision."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


# --------------------------------------------------------------------------- masks


def last_generated_index(loss_mask: Tensor) -> Tensor:
    """Index of the last generated token per row, -1 if none. loss_mask: (B, L) -> (B,)."""
    check_loss_mask(loss_mask)
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    if loss_mask.shape[1] == 0:
        return torch.full((loss_mask.shape[0],), -1, dtype=torch.long, device=loss_mask.device)
    return torch.where(loss_mask, positions, -1).amax(dim=1)


# ---------------------------------------------------------------- masked statistics


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x where mask is True. x, mask: (B, L) -> scalar, or reduced over `dim`.

    An empty selection gives 0 rather than NaN (a row with no generated token)."""
    check_loss_mask(mask, x)
    total = torch.where(mask, x, 0).sum() if dim is None else torch.where(mask, x, 0).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp_min(1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of x over the masked entries. x, mask: (B, L) -> scalar.

    Unbiased (Bessel) like verl's `masked_var`; fewer than two entries give the biased
    value (0 for one entry, 0 for none)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = mask.sum()
    if unbiased:
        var = torch.where(n > 1, var * n / (n - 1).clamp_min(1), var)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over the masked entries; 0 outside the mask. x, mask: (B, L) -> (B, L).

    With shift_mean=False the mean is added back (only the scale is normalised).
    Whiten over the whole minibatch before splitting it into micro-batches."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, 0)


# ------------------------------------------------------------------------------ KL


# Schulman, "Approximating KL divergence" (2020). Samples come from the policy whose logp is
# the first argument; all estimate KL(policy || ref).
@KL_ESTIMATORS.register("k1")  # log(p/q): unbiased, high variance, can be negative
def _kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")  # 0.5 log(p/q)^2: biased, low variance, its gradient is the KL's
def _kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")  # (r - 1) - log r, r = q/p: unbiased, low variance, >= 0 (GRPO)
def _kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_r = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.expm1(log_r) - log_r).clamp(-_MAX_K3, _MAX_K3)


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL(policy || ref) estimate, elementwise. logp, ref_logp: (B, L) -> (B, L).

    Does not mask: mask the inputs (or the result) at environment tokens."""
    return KL_ESTIMATORS[kind](logp, ref_logp)


# ----------------------------------------------------------------------- rewards


@torch.no_grad()
def token_rewards(
    scores: Tensor,
    loss_mask: Tensor,
    logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k1",
) -> Tensor:
    """Token-level rewards. scores: (B,); loss_mask, logp, ref_logp: (B, L) -> rewards (B, L).

    rewards = -kl_coef * KL on generated tokens, plus the score on the last generated
    token of the row (the end of the final turn); 0 on environment tokens. `logp` is the
    rollout policy's (old) log-prob. Rows with no generated token get all zeros. With
    kl_coef = 0 (KL as a loss term instead, GRPO style) logp/ref_logp may be None.
    Inputs are treated as constants (no gradient)."""
    check_loss_mask(loss_mask)
    if scores.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"scores must be (B,) = {tuple(loss_mask.shape[:1])}, got {tuple(scores.shape)}"
        )
    dtype = _float_dtype(scores)
    rewards = torch.zeros(loss_mask.shape, dtype=dtype, device=loss_mask.device)
    if kl_coef != 0.0:
        if logp is None or ref_logp is None:
            raise ValueError("kl_coef != 0 needs logp and ref_logp")
        check_loss_mask(loss_mask, logp, ref_logp)
        # Mask before estimating: garbage (even inf) at environment tokens never enters.
        kl = kl_estimate(
            torch.where(loss_mask, logp.to(dtype), 0),
            torch.where(loss_mask, ref_logp.to(dtype), 0),
            kl_kind,
        )
        rewards = torch.where(loss_mask, -kl_coef * kl, 0)
    last = last_generated_index(loss_mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] += scores.to(dtype)[rows]
    return rewards


# -------------------------------------------------------------------- estimators


@torch.no_grad()
def gae(
    rewards: Tensor, values: Tensor, loss_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE over generated tokens in generation order. rewards, values, loss_mask: (B, L) -> advantages, returns: (B, L).

    For the k-th generated token of a row (k = 0..n-1, environment tokens skipped):
      delta_k = r_k + gamma * V_{k+1} - V_k,  with V_n = 0 (the episode ends),
      A_k = delta_k + gamma * lam * A_{k+1},  returns_k = A_k + V_k.
    Both outputs are 0 on environment tokens; inputs there are ignored."""
    check_loss_mask(loss_mask, rewards, values)
    dtype = _float_dtype(rewards, values)
    batch, length = loss_mask.shape
    # A stable sort on "is environment" moves each row's generated positions to the
    # front, keeping their generation order: the chain then runs over columns.
    order = torch.sort((~loss_mask).to(torch.int8), dim=1, stable=True).indices
    n_gen = int(loss_mask.sum(1).max()) if batch * length else 0
    order = order[:, :n_gen]
    valid = loss_mask.gather(1, order)
    # Slots past a row's last generated token hold r = V = 0, so they add nothing and the
    # bootstrap value after the last generated token is 0.
    r = torch.where(valid, rewards.gather(1, order).to(dtype), 0)
    v = torch.where(valid, values.gather(1, order).to(dtype), 0)
    running = torch.zeros(batch, dtype=dtype, device=loss_mask.device)
    next_value = torch.zeros_like(running)
    packed = []
    for k in range(n_gen - 1, -1, -1):
        delta = r[:, k] + gamma * next_value - v[:, k]
        running = delta + gamma * lam * running
        packed.append(running)
        next_value = v[:, k]
    adv_packed = torch.stack(packed[::-1], dim=1) if packed else r
    advantages = torch.zeros((batch, length), dtype=dtype, device=loss_mask.device)
    advantages.scatter_(1, order, adv_packed)
    advantages = torch.where(loss_mask, advantages, 0)
    returns = torch.where(loss_mask, advantages + values.to(dtype), 0)
    return advantages, returns


def _check_group_inputs(scores: Tensor, group_ids: Tensor, loss_mask: Tensor) -> None:
    check_loss_mask(loss_mask)
    if scores.shape != loss_mask.shape[:1] or group_ids.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"scores and group_ids must be (B,) = {tuple(loss_mask.shape[:1])}, "
            f"got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )


def _group_deviation(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """scores, group_ids: (B,) -> (score - its group's mean, its group's size, the group's
    index per row), all (B,)."""
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.numel(), dtype=scores.dtype, device=scores.device)
    sums.index_add_(0, group, scores)
    return scores - (sums / counts)[group], counts[group], group


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> Tensor:
    """Group-relative advantages. scores, group_ids: (B,); loss_mask: (B, L) -> advantages (B, L).

    A_b = (score_b - mean_g) / (std_g + eps) over the rows g sharing b's group id
    (unbiased std, as DeepSeekMath/verl/TRL), or score_b - mean_g with
    normalize_std=False (Dr. GRPO). Broadcast to every generated token of row b, 0 on
    environment tokens. A group of one row gets 0."""
    _check_group_inputs(scores, group_ids, loss_mask)
    scores = scores.to(_float_dtype(scores))
    deviation, n, group = _group_deviation(scores, group_ids)
    if normalize_std:
        square = torch.zeros(int(group.max()) + 1, dtype=scores.dtype, device=scores.device)
        square.index_add_(0, group, deviation**2)
        std = torch.sqrt(square[group] / (n - 1).clamp_min(1))
        adv = deviation / (std + eps)
    else:
        adv = deviation
    adv = torch.where(n > 1, adv, 0)
    return torch.where(loss_mask, adv[:, None], 0)


@torch.no_grad()
def rloo_advantages(scores: Tensor, group_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Leave-one-out advantages (RLOO, Ahmadian et al. 2024). scores, group_ids: (B,); loss_mask: (B, L) -> advantages (B, L).

    A_b = score_b - mean of the other rows of b's group = n / (n - 1) * (score_b - mean_g)
    (verl's `compute_rloo_outcome_advantage`), broadcast to every generated token of row b
    (all turns), 0 on environment tokens. A group of one row gets 0, as in `grpo_advantages`
    (verl passes its raw score through)."""
    _check_group_inputs(scores, group_ids, loss_mask)
    scores = scores.to(_float_dtype(scores))
    deviation, n, _ = _group_deviation(scores, group_ids)
    adv = torch.where(n > 1, deviation * n / (n - 1).clamp_min(1), 0)
    return torch.where(loss_mask, adv[:, None], 0)


@torch.no_grad()
def discounted_returns(rewards: Tensor, loss_mask: Tensor, gamma: float) -> Tensor:
    """Reward-to-go over generated tokens in generation order. rewards, loss_mask: (B, L) -> returns (B, L).

    G_k = sum_j>=k gamma^(j-k) r_j over a row's generated tokens k, j (environment tokens
    skipped: gamma discounts per generated token), 0 on environment tokens; REINFORCE++'s
    return (Hu 2025). This is GAE with V = 0 and lam = 1. Departure from verl's
    `compute_reinforce_plus_plus_outcome_advantage`: verl resets the running return at
    every token outside the response mask, which in a single-turn response is only the
    padding after EOS, but in a multi-turn trajectory would cut every turn but the last
    off from the task score (it sits on the final turn's last token); here the chain runs
    through the environment tokens, as our (and verl's, since its PR #2337) GAE does."""
    check_loss_mask(loss_mask, rewards)
    return gae(rewards, torch.zeros_like(rewards), loss_mask, gamma, 1.0)[0]


KL_ESTIMATORS.check_complete()
