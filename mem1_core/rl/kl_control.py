"""KL coefficient controllers (`ppo.kl_ctrl`; verl's `algorithm.kl_ctrl.type`).

- `fixed`: the coefficient stays `ppo.kl_coef` (the paper's 1e-3).
- `adaptive`: Ziegler et al. 2019 (§2.2, "Fine-tuning language models from human
  preferences"), verl's AdaptiveKLController: once per iteration, from the KL measured on
  that iteration's batch,
      e = clip(KL / target_kl - 1, -0.2, 0.2),   coef <- coef * (1 + e * n_steps / horizon)
  with n_steps the iteration's trajectories (verl passes its batch size). The coefficient
  grows while the policy runs further from the reference than the target, and shrinks
  while it stays closer.

The measured KL is the one verl feeds its controller: the `ppo.kl_kind` estimate of
KL(pi_old || pi_ref), a token mean per trajectory, then the mean over trajectories
(`mem1_core.rl.ppo.batch_stats`'s `kl_ctrl_measured`). verl adapts only the KL in the reward;
here the one `ppo.kl_coef` is adapted wherever the KL goes (reward, or loss with
`ppo.kl_in_loss`). The learner holds the coefficient and checkpoints it, so a resumed run
continues with the coefficient it had.
"""

from __future__ import annotations

from mem1_core.config.methods import KL_CONTROLLERS

_MAX_PROPORTIONAL_ERROR = 0.2  # Ziegler et al.'s clip of the proportional error


@KL_CONTROLLERS.register("fixed")
def fixed_kl_coef(coef: float, kl: float, n_steps: int, target_kl: float, horizon: int) -> float:
    return coef


@KL_CONTROLLERS.register("adaptive")
def adaptive_kl_coef(coef: float, kl: float, n_steps: int, target_kl: float, horizon: int) -> float:
    """The next coefficient after a batch of `n_steps` trajectories whose KL was `kl`."""
    if target_kl <= 0 or horizon <= 0:
        raise ValueError(
            f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}"
        )
    error = min(max(kl / target_kl - 1.0, -_MAX_PROPORTIONAL_ERROR), _MAX_PROPORTIONAL_ERROR)
    return coef * (1.0 + error * n_steps / horizon)


KL_CONTROLLERS.check_complete()
