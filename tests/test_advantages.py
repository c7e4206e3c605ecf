"""Advantages, token rewards and KL estimators against slow reference loops and formulas."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from mem1_core.rl.advantages import (
    KL_ESTIMATORS,
    discounted_returns,
    gae,
    grpo_advantages,
    kl_estimate,
    last_generated_index,
    masked_mean,
    masked_var,
    masked_whiten,
    rloo_advantages,
    token_rewards,
)
from mem1_core.rl.estimators import ESTIMATORS, get_estimator, register_adv_est

# ------------------------------------------------------------------- fixtures


def turn_mask(n_rows: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Masks shaped like flattened MEM1 trajectories: a prompt, then turns of generated
    tokens separated by environment tokens (memory re-read, info), then padding. Row 0
    has no generated token, row 1 is all generated."""
    mask = torch.zeros(n_rows, length, dtype=torch.bool)
    for b in range(2, n_rows):
        pos = int(torch.randint(1, 6, (1,), generator=gen))  # prompt
        end = length - int(torch.randint(0, 6, (1,), generator=gen))  # padding
        while pos < end:
            n = int(torch.randint(1, 6, (1,), generator=gen))
            mask[b, pos : min(pos + n, end)] = True
            pos += n + int(torch.randint(1, 5, (1,), generator=gen))
    if n_rows > 1:
        mask[1] = True
    return mask


def garbage_like(x: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x with environment positions replaced by large noise, inf and NaN."""
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype) * 1e4
    noise[..., ::7] = float("inf")
    noise[..., 3::11] = float("nan")
    return torch.where(mask, x, noise)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# ------------------------------------------------------------ reference loops


def ref_last_index(mask: torch.Tensor) -> list[int]:
    out = []
    for row in mask.tolist():
        idx = -1
        for i, m in enumerate(row):
            if m:
                idx = i
        out.append(idx)
    return out


def ref_gae(rewards, values, mask, gamma, lam):
    batch, length = mask.shape
    adv = torch.zeros(batch, length, dtype=torch.float64)
    ret = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        pos = [i for i in range(length) if mask[b, i]]
        running, next_value = 0.0, 0.0
        for i in reversed(pos):
            r, v = float(rewards[b, i]), float(values[b, i])
            delta = r + gamma * next_value - v
            running = delta + gamma * lam * running
            adv[b, i] = running
            ret[b, i] = running + v
            next_value = v
    return adv, ret


def ref_grpo(scores, group_ids, mask, eps, normalize_std):
    batch, length = mask.shape
    out = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        group = [float(scores[j]) for j in range(batch) if int(group_ids[j]) == int(group_ids[b])]
        if len(group) == 1:
            a = 0.0
        else:
            a = float(scores[b]) - statistics.fmean(group)
            if normalize_std:
                a /= statistics.stdev(group) + eps
        for i in range(length):
            if mask[b, i]:
                out[b, i] = a
    return out


def ref_rloo(scores, group_ids, mask):
    """RLOO (Ahmadian et al. 2024): each sample's score minus the mean of the others'."""
    batch, length = mask.shape
    out = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        others = [
            float(scores[j])
            for j in range(batch)
            if j != b and int(group_ids[j]) == int(group_ids[b])
        ]
        a = float(scores[b]) - statistics.fmean(others) if others else 0.0
        for i in range(length):
            if mask[b, i]:
                out[b, i] = a
    return out


def ref_reward_to_go(rewards, mask, gamma):
    """REINFORCE++'s return along a row's generated tokens, environment tokens skipped."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        pos = [i for i in range(mask.shape[1]) if mask[b, i]]
        for k, i in enumerate(pos):
            out[b, i] = sum(gamma**j * float(rewards[b, p]) for j, p in enumerate(pos[k:]))
    return out


def verl_reinforce_pp_returns(rewards, mask, gamma):
    """verl's compute_reinforce_plus_plus_outcome_advantage loop: the running return is
    reset after every token outside the response mask."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        running = 0.0
        for t in reversed(range(mask.shape[1])):
            running = float(rewards[b, t]) + gamma * running
            out[b, t] = running
            running *= float(mask[b, t])
    return out


# ---------------------------------------------------------------------- masks


def test_last_generated_index_matches_loop(gen):
    mask = turn_mask(9, 30, gen)
    assert last_generated_index(mask).tolist() == ref_last_index(mask)
    assert last_generated_index(mask)[0] == -1
    assert last_generated_index(torch.zeros(3, 0, dtype=torch.bool)).tolist() == [-1, -1, -1]


def test_float_masks_are_refused():
    with pytest.raises(TypeError):
        last_generated_index(torch.ones(2, 3))


# ------------------------------------------------------------------------- KL


def test_kl_estimators_match_formulas(gen):
    logp = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 3
    ref = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 3
    for b in range(4):
        for i in range(7):
            p, q = float(logp[b, i]), float(ref[b, i])
            r = math.exp(q - p)
            assert kl_estimate(logp, ref, "k1")[b, i].item() == pytest.approx(p - q)
            assert kl_estimate(logp, ref, "k2")[b, i].item() == pytest.approx(0.5 * (p - q) ** 2)
            k3 = min(r - 1 - math.log(r), 10.0)  # verl clips k3 to +-10 (kl_penalty)
            assert kl_estimate(logp, ref, "k3")[b, i].item() == pytest.approx(k3)
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert set(KL_ESTIMATORS) >= {"k1", "k3"}
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(logp, ref, "k9")


def test_k3_is_clipped_to_10_like_verl():
    """verl's low_var_kl clamps the log-ratio to +-20, then the k3 value to +-10: a token far
    from the reference adds at most 10 (and no gradient) to the KL."""
    logp = torch.tensor([[0.0, 0.0, 0.0, -12.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, 2.0, -30.0, 0.0]], dtype=torch.float64)
    k3 = kl_estimate(logp, ref, "k3")
    # ref - logp = -1, 2, -30 (clamped to -20), 12: k3 = 0.37, 4.39, then 19 and e^12 - 13,
    # both clipped to 10
    expected = [math.exp(-1) - 1 + 1, math.exp(2) - 3, 10.0, 10.0]
    assert k3[0].tolist() == pytest.approx(expected)
    k3.sum().backward()
    assert logp.grad[0, 2:].tolist() == [0.0, 0.0]  # clipped: no gradient, as in verl
    assert logp.grad[0, :2].tolist() == pytest.approx([1 - math.exp(-1), 1 - math.exp(2)])


def test_k1_k3_are_unbiased_estimates_of_kl(gen):
    """Sampling from p, E[k1] = E[k3] = KL(p || q) (Schulman 2020)."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[x][None], q.log()[x][None]
    for kind in ("k1", "k3"):
        assert kl_estimate(logp, logq, kind).mean().item() == pytest.approx(exact, abs=5e-3)


# -------------------------------------------------------------------- rewards


def test_token_rewards_match_loop_and_ignore_environment_tokens(gen):
    mask = turn_mask(8, 25, gen)
    scores = torch.randn(8, generator=gen, dtype=torch.float64)
    logp = -torch.rand(8, 25, generator=gen, dtype=torch.float64) * 4
    ref = -torch.rand(8, 25, generator=gen, dtype=torch.float64) * 4
    coef = 1e-3
    for kind in ("k1", "k3"):
        got = token_rewards(scores, mask, logp, ref, kl_coef=coef, kl_kind=kind)
        expected = torch.zeros(8, 25, dtype=torch.float64)
        last = ref_last_index(mask)
        for b in range(8):
            for i in range(25):
                if mask[b, i]:
                    p, q = float(logp[b, i]), float(ref[b, i])
                    kl = p - q if kind == "k1" else min(math.exp(q - p) - 1 - (q - p), 10.0)
                    expected[b, i] = -coef * kl + (float(scores[b]) if i == last[b] else 0.0)
        assert_close(got, expected)
        # Garbage (inf, NaN) at environment tokens changes nothing.
        dirty = token_rewards(
            scores, mask, garbage_like(logp, mask, gen), garbage_like(ref, mask, gen), coef, kind
        )
        assert_close(dirty, expected)
    assert (got[0] == 0).all()  # row without generated tokens: zero, no crash


def test_score_lands_on_last_generated_token_not_on_trailing_environment():
    # prompt, turn 1, info, turn 2 (final answer), padding
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    rewards = token_rewards(torch.tensor([2.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 2.0, 0, 0]]
    with pytest.raises(ValueError, match="ref_logp"):
        token_rewards(torch.tensor([2.0]), mask, kl_coef=1e-3)


# ------------------------------------------------------------------------ GAE


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0)])
def test_gae_matches_reference_loop(gen, gamma, lam):
    mask = turn_mask(10, 40, gen)
    rewards = torch.randn(10, 40, generator=gen, dtype=torch.float64)
    values = torch.randn(10, 40, generator=gen, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = ref_gae(torch.where(mask, rewards, 0), values, mask, gamma, lam)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


def test_gae_ignores_values_and_rewards_at_environment_tokens(gen):
    mask = turn_mask(10, 40, gen)
    rewards = torch.randn(10, 40, generator=gen)
    values = torch.randn(10, 40, generator=gen)
    adv, ret = gae(rewards, values, mask, 0.97, 0.9)
    dirty = gae(garbage_like(rewards, mask, gen), garbage_like(values, mask, gen), mask, 0.97, 0.9)
    assert_close(dirty[0], adv)
    assert_close(dirty[1], ret)
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_environment_tokens_do_not_break_the_chain(gen):
    """A row with environment tokens interleaved gives the same advantages, at the
    generated tokens, as the same generated tokens packed contiguously."""
    n = 12
    r = torch.randn(n, generator=gen, dtype=torch.float64)
    v = torch.randn(n, generator=gen, dtype=torch.float64)
    packed = gae(r[None], v[None], torch.ones(1, n, dtype=torch.bool), 0.9, 0.8)
    where = torch.tensor([1, 2, 3, 6, 7, 8, 9, 13, 14, 17, 18, 19])  # turns with gaps
    mask = torch.zeros(1, 22, dtype=torch.bool)
    mask[0, where] = True
    spread_r = torch.full((1, 22), 5.0, dtype=torch.float64)
    spread_v = torch.full((1, 22), -7.0, dtype=torch.float64)
    spread_r[0, where], spread_v[0, where] = r, v
    spread = gae(spread_r, spread_v, mask, 0.9, 0.8)
    assert_close(spread[0][0, where], packed[0][0])
    assert_close(spread[1][0, where], packed[1][0])


def test_gae_hand_example_reward_to_go():
    """Paper setting gamma = lam = 1 with zero values: the advantage of every generated
    token is its reward-to-go; with values, the return is the reward-to-go and the
    advantage is reward-to-go minus the value."""
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    rewards = torch.tensor([[9.0, -0.1, -0.2, 9.0, 9.0, -0.3, 1.0, 9.0]])
    adv, ret = gae(rewards, torch.zeros(1, 8), mask, 1.0, 1.0)
    assert_close(adv, torch.tensor([[0, 0.4, 0.5, 0, 0, 0.7, 1.0, 0]]))
    assert_close(ret, adv)
    values = torch.tensor([[3.0, 0.2, 0.1, 3.0, 3.0, 0.5, 0.4, 3.0]])
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    assert_close(ret, torch.tensor([[0, 0.4, 0.5, 0, 0, 0.7, 1.0, 0]]))
    assert_close(adv, torch.tensor([[0, 0.2, 0.4, 0, 0, 0.2, 0.6, 0]]))
    # gamma = 0.5, lam = 1, values 0: discounted reward-to-go 1, 0.5, 0.25, 0.125 from the end.
    adv, _ = gae(
        torch.where(mask, 0.0, rewards) + torch.eye(8)[6], torch.zeros(1, 8), mask, 0.5, 1.0
    )
    assert_close(adv, torch.tensor([[0, 0.125, 0.25, 0, 0, 0.5, 1.0, 0]]))


def test_gae_edge_shapes():
    empty = torch.zeros(3, 5, dtype=torch.bool)
    adv, ret = gae(torch.randn(3, 5), torch.randn(3, 5), empty, 1.0, 1.0)
    assert (adv == 0).all() and (ret == 0).all()
    adv, ret = gae(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.bool), 1, 1)
    assert adv.shape == (0, 4)
    # bf16 values are computed in float32
    adv, _ = gae(torch.ones(1, 3), torch.zeros(1, 3, dtype=torch.bfloat16), ~empty[:1, :3], 1, 1)
    assert adv.dtype == torch.float32


# ----------------------------------------------------------------------- GRPO


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_matches_reference_loop(gen, normalize_std):
    mask = turn_mask(12, 20, gen)
    scores = torch.randint(0, 3, (12,), generator=gen).double()
    group_ids = torch.tensor([7, 7, 7, -2, -2, 40, 3, 3, 3, 3, 7, 99])  # 40, 99: alone
    got = grpo_advantages(scores, group_ids, mask, 1e-6, normalize_std)
    assert_close(got, ref_grpo(scores, group_ids, mask, 1e-6, normalize_std))
    alone = (group_ids == 40) | (group_ids == 99)
    assert (got[alone] == 0).all()


def test_grpo_broadcasts_to_every_turn(gen):
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 0, 1, 1]], dtype=torch.bool)
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, eps=0.0)
    # mean 0.5, unbiased std sqrt(0.5)
    a = 0.5 / math.sqrt(0.5)
    assert_close(adv, torch.tensor([[0, a, a, 0, a, 0], [0, 0, -a, 0, -a, -a]]))
    same = grpo_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), mask)
    assert (same == 0).all()  # equal scores: no signal, no division by zero


# --------------------------------------------------------------- RLOO, REINFORCE++


def test_rloo_matches_reference_loop(gen):
    mask = turn_mask(12, 20, gen)
    scores = torch.randint(0, 3, (12,), generator=gen).double()
    group_ids = torch.tensor([7, 7, 7, -2, -2, 40, 3, 3, 3, 3, 7, 99])  # 40, 99: alone
    got = rloo_advantages(scores, group_ids, mask)
    assert_close(got, ref_rloo(scores, group_ids, mask))
    # verl's form: n / (n - 1) * (score - group mean)
    rows = (group_ids == 3).nonzero().squeeze(1)
    expected = 4 / 3 * (scores[rows] - scores[rows].mean())
    for b, e in zip(rows.tolist(), expected.tolist(), strict=True):
        assert got[b][mask[b]].tolist() == pytest.approx([e] * int(mask[b].sum()))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reward_to_go_matches_loop_and_runs_through_environment_tokens(gen, gamma):
    mask = turn_mask(9, 30, gen)
    rewards = torch.randn(9, 30, generator=gen, dtype=torch.float64)
    got = discounted_returns(garbage_like(rewards, mask, gen), mask, gamma)
    assert_close(got, ref_reward_to_go(rewards, mask, gamma))
    # A single-turn response (one block, then padding) is verl's case: the same returns.
    single = torch.zeros(3, 12, dtype=torch.bool)
    single[:, :7] = True
    single[2, 5:] = False
    r = torch.where(single, rewards[:3, :12], 0)
    verl = verl_reinforce_pp_returns(r, single, gamma)
    assert_close(discounted_returns(r, single, gamma), torch.where(single, verl, 0))
    # With turns, verl's reset cuts the earlier turns off from the final score; ours
    # carries it back to every turn (the documented departure).
    turns = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    score = token_rewards(torch.tensor([1.0], dtype=torch.float64), turns)
    assert discounted_returns(score, turns, 1.0)[0, 1].item() == 1.0
    assert verl_reinforce_pp_returns(score, turns, 1.0)[0, 1].item() == 0.0


# ------------------------------------------------------------------- registry


def test_registry_shares_one_signature(gen):
    mask = turn_mask(6, 15, gen)
    scores = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    rewards = token_rewards(scores, mask)
    values = torch.randn(6, 15, generator=gen)
    kwargs = dict(rewards=rewards, values=values, loss_mask=mask, group_ids=group_ids)
    hyper = dict(gamma=1.0, lam=1.0, eps=1e-6)
    assert set(ESTIMATORS) >= {"gae", "grpo"}
    adv, ret = ESTIMATORS["gae"].fn(**kwargs, **hyper)
    assert_close((adv, ret), gae(rewards, values, mask, 1.0, 1.0))
    adv, _ = ESTIMATORS["grpo"].fn(**kwargs, **hyper)
    # Row 0 has no generated token, so its score never reached the rewards: it counts as 0.
    assert_close(adv, grpo_advantages(scores * mask.any(1), group_ids, mask, 1e-6))
    adv, _ = ESTIMATORS["grpo_mean"].fn(**kwargs, **hyper)
    assert_close(adv, grpo_advantages(scores * mask.any(1), group_ids, mask, 1e-6, False))
    with pytest.raises(ValueError, match="values"):
        ESTIMATORS["gae"].fn(**{**kwargs, "values": None}, **hyper)
    adv, _ = ESTIMATORS["rloo"].fn(**kwargs, **hyper)
    assert_close(adv, rloo_advantages(scores * mask.any(1), group_ids, mask))
    adv, ret = ESTIMATORS["reinforce_plus_plus"].fn(**{**kwargs, "values": None}, **hyper)
    assert_close((adv, ret), (discounted_returns(rewards, mask, 1.0),) * 2)
    adv, _ = ESTIMATORS["reinforce_plus_plus_baseline"].fn(**kwargs, **hyper)
    assert_close(adv, grpo_advantages(scores * mask.any(1), group_ids, mask, normalize_std=False))
    flags = {k: (e.uses_critic, e.whiten, e.grouped) for k, e in ESTIMATORS.items()}
    assert flags == {
        "gae": (True, True, False),
        "grpo": (False, False, True),
        "grpo_mean": (False, False, True),
        "rloo": (False, False, True),
        # verl whitens both REINFORCE++ variants over the batch (masked_whiten)
        "reinforce_plus_plus": (False, True, False),
        "reinforce_plus_plus_baseline": (False, True, True),
    }
    assert get_estimator("gae").uses_critic and not get_estimator("grpo").uses_critic
    with pytest.raises(ValueError, match="registered twice"):
        register_adv_est("gae", uses_critic=True, whiten=True)(lambda **_: None)
    with pytest.raises(ValueError, match="choose one of"):
        get_estimator("nope")


# ---------------------------------------------------------- masked statistics


def test_masked_statistics_match_selected_elements(gen):
    mask = turn_mask(6, 30, gen)
    x = torch.randn(6, 30, generator=gen, dtype=torch.float64)
    sel = x[mask]
    dirty = garbage_like(x, mask, gen)
    assert_close(masked_mean(dirty, mask), sel.mean())
    assert_close(masked_var(dirty, mask), sel.var(unbiased=True))
    assert_close(masked_var(dirty, mask, unbiased=False), sel.var(unbiased=False))
    rows = masked_mean(dirty, mask, dim=1)
    for b in range(6):
        expected = x[b][mask[b]].mean() if mask[b].any() else torch.tensor(0.0, dtype=x.dtype)
        assert_close(rows[b], expected)
    white = masked_whiten(dirty, mask)
    assert_close(white[mask], (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8))
    assert (white[~mask] == 0).all()
    scaled = masked_whiten(dirty, mask, shift_mean=False)
    assert_close(scaled[mask], (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8) + sel.mean())
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
