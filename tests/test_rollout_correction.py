"""Truncated importance sampling of the rollout/learner gap (verl's rollout_is) against a
per-token loop: token and sequence weights, the cap, the fraction it truncated, and
environment tokens that never enter."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mem1_core.rl.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights


def turn_mask(n_rows: int, length: int, gen: torch.Generator) -> torch.Tensor:
    mask = torch.zeros(n_rows, length, dtype=torch.bool)
    for b in range(1, n_rows):  # row 0 has no generated token
        pos = int(torch.randint(1, 4, (1,), generator=gen))
        while pos < length - 1:
            n = int(torch.randint(1, 5, (1,), generator=gen))
            mask[b, pos : min(pos + n, length - 1)] = True
            pos += n + int(torch.randint(1, 4, (1,), generator=gen))
    return mask


def ref_weights(old, rollout, mask, level, cap):
    """verl's definition as a loop: w = min(exp(clamp(log-ratio, -20, 20)), cap), the
    log-ratio per token, or summed over the row's generated tokens (`sequence`)."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    truncated = 0
    for b in range(mask.shape[0]):
        idx = [i for i in range(mask.shape[1]) if mask[b, i]]
        seq = sum(float(old[b, i]) - float(rollout[b, i]) for i in idx)
        for i in idx:
            log_w = seq if level == "sequence" else float(old[b, i]) - float(rollout[b, i])
            raw = math.exp(min(max(log_w, -20.0), 20.0))
            out[b, i] = min(raw, cap)
            truncated += raw > cap
    return out, truncated / int(mask.sum())


@pytest.mark.parametrize("level", ROLLOUT_IS_LEVELS)
@pytest.mark.parametrize("cap", [2.0, 1.2])
def test_weights_match_the_loop(level, cap):
    gen = torch.Generator().manual_seed(0)
    mask = turn_mask(6, 24, gen)
    old = -torch.rand(6, 24, generator=gen, dtype=torch.float64) * 3
    rollout = old + 0.5 * torch.randn(6, 24, generator=gen, dtype=torch.float64)
    noise = torch.full_like(old, float("nan"))
    weights, metrics = rollout_is_weights(
        torch.where(mask, old, noise), torch.where(mask, rollout, -noise), mask, level, cap
    )
    expected, frac = ref_weights(old, rollout, mask, level, cap)
    assert_close(weights.double(), expected, rtol=1e-6, atol=1e-6)
    assert metrics["rollout_is_truncated_frac"].item() == pytest.approx(frac)
    assert metrics["rollout_is_mean"].item() == pytest.approx(
        float(expected[mask].mean()), rel=1e-6
    )
    assert metrics["rollout_is_threshold"].item() == cap
    assert (weights[~mask] == 0).all() and 0 < frac < 1
    if level == "sequence":  # one weight per trajectory
        for b in range(1, 6):
            assert weights[b][mask[b]].unique().numel() == 1


def test_no_gap_gives_weight_one_and_bad_settings_say_so():
    mask = torch.tensor([[False, True, True]])
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    weights, metrics = rollout_is_weights(logp, logp, mask, "token", 2.0)
    assert weights.tolist() == [[0.0, 1.0, 1.0]] and metrics["rollout_is_truncated_frac"] == 0
    with pytest.raises(ValueError, match="token"):
        rollout_is_weights(logp, logp, mask, "turn", 2.0)
    with pytest.raises(ValueError, match="> 0"):
        rollout_is_weights(logp, logp, mask, "token", 0.0)
