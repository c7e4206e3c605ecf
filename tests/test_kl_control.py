"""The KL controllers (verl's FixedKLController / AdaptiveKLController, Ziegler et al.
2019) against their update rule written out."""

from __future__ import annotations

import numpy as np
import pytest

from mem1_core.rl.kl_control import KL_CONTROLLERS, adaptive_kl_coef


class VerlAdaptive:
    """The controller as verl writes it (numpy clip, value updated in place)."""

    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl, n_steps):
        proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def test_adaptive_follows_verl_over_a_run():
    verl, coef = VerlAdaptive(1e-3, 0.05, 1000), 1e-3
    for kl in (0.0, 0.01, 0.05, 0.06, 0.2, 1.0, 0.049):
        verl.update(kl, 64)
        coef = adaptive_kl_coef(coef, kl, 64, 0.05, 1000)
        assert coef == pytest.approx(verl.value, rel=1e-12)


def test_adaptive_moves_at_most_20_percent_per_horizon_and_fixed_stays():
    assert adaptive_kl_coef(1.0, 100.0, 10, 0.1, 10) == pytest.approx(1.2)  # capped at +20%
    assert adaptive_kl_coef(1.0, 0.0, 10, 0.1, 10) == pytest.approx(0.8)  # and at -20%
    assert adaptive_kl_coef(1.0, 0.1, 10, 0.1, 10) == 1.0  # on target: unchanged
    assert KL_CONTROLLERS["fixed"](1e-3, 5.0, 64, 0.1, 10) == 1e-3
    assert set(KL_CONTROLLERS) == {"fixed", "adaptive"}
    with pytest.raises(ValueError, match="target_kl"):
        adaptive_kl_coef(1.0, 0.1, 10, 0.0, 10)
