"""The advantage-estimator registry: one name -> one estimator, with how it trains.

Every estimator shares one signature (keyword-only (B, L) tensors and scalars in,
(advantages, returns) (B, L) out) and registers with `@register_adv_est(name, ...)`, which
also records whether it needs a critic, whether its advantages are whitened over the
batch and whether it needs a group of samples per task (verl's `register_adv_est`, with
the training flags beside the function instead of in a second table). `ppo.adv_estimator`
picks one by name (verl: `algorithm.adv_estimator`).

Rewards: `rewards` are token-level (mem1_core.rl.advantages.token_rewards: the task score on
the last generated token of the final turn, minus kl_coef * KL on every generated token
unless the KL is a loss term). `gae` and `reinforce_plus_plus` run along the generated
tokens (environment tokens between turns are skipped, not chain breaks); the group
estimators (`grpo`, `grpo_mean`, `rloo`, `reinforce_plus_plus_baseline`) score a trajectory
by its summed token reward, as verl does, and broadcast one advantage to all its turns.
Whatever `trajectory.mode` lays a trajectory out as (one tree, one row per turn, the
concatenation), an estimator sees one row per trajectory, its generated tokens in generation
order (mem1_core.rl.ppo.estimate_advantages): under `turns` GAE and the reward-to-go chain
across the turn rows, and a group estimator's advantage reaches every row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from mem1_core.config.methods import ADV_ESTIMATORS
from mem1_core.rl.advantages import (
    check_loss_mask,
    discounted_returns,
    gae,
    grpo_advantages,
    rloo_advantages,
)


class AdvantageFn(Protocol):
    """The one signature: keyword-only (B, L) tensors and scalars in, (advantages, returns)
    (B, L) out. Every estimator is called with all of these and reads the ones it needs
    (the others land in its `**_`)."""

    def __call__(
        self,
        *,
        rewards: Tensor,
        values: Tensor | None,
        loss_mask: Tensor,
        group_ids: Tensor | None,
        gamma: float,
        lam: float,
        eps: float,
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator and how it trains."""

    name: str
    fn: AdvantageFn
    uses_critic: bool
    whiten: bool
    """Whiten the advantages over the batch (PPO); GRPO's are already normalised per group."""
    grouped: bool = False
    """Needs several samples per task (`ppo.samples_per_task` >= 2): its baseline is the group."""


ESTIMATORS = ADV_ESTIMATORS
"""Every estimator by name (`ppo.adv_estimator`): mem1_core.config.methods.ADV_ESTIMATORS,
whose names the config checks."""


def register_adv_est(
    name: str, *, uses_critic: bool, whiten: bool, grouped: bool = False
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register the decorated function as the estimator `name`."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        ESTIMATORS.add(name, Estimator(name, fn, uses_critic, whiten, grouped))
        return fn

    return add


def get_estimator(name: str) -> Estimator:
    return ESTIMATORS[name]


@register_adv_est("gae", uses_critic=True, whiten=True)  # PPO, the paper's choice
def gae_estimator(
    *, rewards: Tensor, values: Tensor | None, loss_mask: Tensor, gamma: float, lam: float, **_
) -> tuple[Tensor, Tensor]:
    if values is None:
        raise ValueError("the 'gae' estimator needs critic values")
    return gae(rewards, values, loss_mask, gamma, lam)


def _scores(rewards: Tensor, loss_mask: Tensor, group_ids: Tensor | None, name: str) -> Tensor:
    """(B,) trajectory scores: the summed token rewards. With the KL as a loss term (kl_coef
    = 0 in the rewards, the GRPO way) that is exactly the task score."""
    if group_ids is None:
        raise ValueError(f"the {name!r} estimator needs group_ids (one id per task)")
    check_loss_mask(loss_mask, rewards)
    return torch.where(loss_mask, rewards, 0).sum(1)


@register_adv_est("grpo", uses_critic=False, whiten=False, grouped=True)  # group-relative
def grpo_estimator(
    *,
    rewards: Tensor,
    loss_mask: Tensor,
    group_ids: Tensor | None,
    eps: float,
    normalize_std: bool = True,
    **_,
) -> tuple[Tensor, Tensor]:
    scores = _scores(rewards, loss_mask, group_ids, "grpo")
    adv = grpo_advantages(scores, group_ids, loss_mask, eps, normalize_std)
    # No critic: returns are unused; like verl, hand back the advantages.
    return adv, adv


# Dr. GRPO: no division by the group std (verl: algorithm.norm_adv_by_std_in_grpo=False).
register_adv_est("grpo_mean", uses_critic=False, whiten=False, grouped=True)(
    partial(grpo_estimator, normalize_std=False)
)


@register_adv_est("rloo", uses_critic=False, whiten=False, grouped=True)  # leave-one-out
def rloo_estimator(
    *, rewards: Tensor, loss_mask: Tensor, group_ids: Tensor | None, **_
) -> tuple[Tensor, Tensor]:
    adv = rloo_advantages(_scores(rewards, loss_mask, group_ids, "rloo"), group_ids, loss_mask)
    return adv, adv


# REINFORCE++ (Hu 2025): no critic, no group; the token-level reward-to-go (KL penalty
# included), whitened over the batch. The returns are its advantages before whitening.
@register_adv_est("reinforce_plus_plus", uses_critic=False, whiten=True)
def reinforce_plus_plus_estimator(
    *, rewards: Tensor, loss_mask: Tensor, gamma: float, **_
) -> tuple[Tensor, Tensor]:
    returns = discounted_returns(rewards, loss_mask, gamma)
    return returns, returns


# REINFORCE++-baseline: the trajectory score minus its group's mean, broadcast to every
# generated token, then whitened over the batch (verl's
# `compute_reinforce_plus_plus_baseline_outcome_advantage`).
@register_adv_est("reinforce_plus_plus_baseline", uses_critic=False, whiten=True, grouped=True)
def reinforce_plus_plus_baseline_estimator(
    *, rewards: Tensor, loss_mask: Tensor, group_ids: Tensor | None, **_
) -> tuple[Tensor, Tensor]:
    scores = _scores(rewards, loss_mask, group_ids, "reinforce_plus_plus_baseline")
    adv = grpo_advantages(scores, group_ids, loss_mask, normalize_std=False)
    return adv, adv


ESTIMATORS.check_complete()
