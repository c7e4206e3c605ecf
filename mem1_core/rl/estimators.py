"""The advantage-estimator registry: one name -> one estimator, with how it trains.

Every estimator shares one signature (keyword-only (B, L) tensors and scalars in,
(advantages, returns) (B, L) out) and registers with `@register_adv_est(name, ...)`, which
also records whether it needs a critic and whether its advantages are whitened over the
batch (verl's `register_adv_est`, with the training flags beside the function instead of in
a second table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from mem1_core.rl.advantages import check_loss_mask, gae, grpo_advantages


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


ESTIMATORS: dict[str, Estimator] = {}
"""Every registered estimator by name (`ppo`'s `estimator` argument, `mem1 train`'s)."""


def register_adv_est(
    name: str, *, uses_critic: bool, whiten: bool
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register the decorated function as the estimator `name`."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = Estimator(name, fn, uses_critic, whiten)
        return fn

    return add


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}"
        )
    return ESTIMATORS[name]


@register_adv_est("gae", uses_critic=True, whiten=True)  # PPO, the paper's choice
def gae_estimator(
    *, rewards: Tensor, values: Tensor | None, loss_mask: Tensor, gamma: float, lam: float, **_
) -> tuple[Tensor, Tensor]:
    if values is None:
        raise ValueError("the 'gae' estimator needs critic values")
    return gae(rewards, values, loss_mask, gamma, lam)


@register_adv_est("grpo", uses_critic=False, whiten=False)  # group-relative, several samples
def grpo_estimator(
    *,
    rewards: Tensor,
    loss_mask: Tensor,
    group_ids: Tensor | None,
    eps: float,
    normalize_std: bool = True,
    **_,
) -> tuple[Tensor, Tensor]:
    if group_ids is None:
        raise ValueError("the 'grpo' estimators need group_ids (one id per task)")
    check_loss_mask(loss_mask, rewards)
    # The trajectory's score is its summed token reward: with the KL as a loss term
    # (kl_coef = 0 in the rewards, the GRPO way) that is exactly the task score.
    scores = torch.where(loss_mask, rewards, 0).sum(1)
    adv = grpo_advantages(scores, group_ids, loss_mask, eps, normalize_std)
    # No critic: returns are unused; like verl, hand back the advantages.
    return adv, adv


# Dr. GRPO: no division by the group std.
register_adv_est("grpo_mean", uses_critic=False, whiten=False)(
    partial(grpo_estimator, normalize_std=False)
)
