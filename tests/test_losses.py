"""PPO losses against per-token reference loops, hand examples, and the two invariances:
inputs at environment tokens change nothing; micro-batches add up to the full batch."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mem1_core.rl.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    LossAgg,
    agg_loss,
    clipped_policy_loss,
    clipped_value_loss,
    entropy_bonus,
    explained_variance,
    gspo_policy_loss,
    kl_loss,
    token_mean,
)
from mem1_core.trajectory.logprobs import entropy_of


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] in float32 at least: what the trainer computes over the tree
    (mem1_core.trajectory.logprobs), written here over plain logits for synthetic batches."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The trainer's entropy (mem1_core.trajectory.logprobs.entropy_of) of softmax(logits)."""
    return entropy_of(torch.log_softmax(logits.float(), -1))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def turn_mask(n_rows: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Prompt, turns of generated tokens between environment tokens, padding; row 0 has
    no generated token."""
    mask = torch.zeros(n_rows, length, dtype=torch.bool)
    for b in range(1, n_rows):
        pos, end = int(torch.randint(1, 5, (1,), generator=gen)), length - b % 3
        while pos < end:
            n = int(torch.randint(1, 5, (1,), generator=gen))
            mask[b, pos : min(pos + n, end)] = True
            pos += n + int(torch.randint(1, 4, (1,), generator=gen))
    return mask


def garbage_like(x: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype) * 1e3
    noise[..., ::5] = float("inf")
    noise[..., 2::7] = float("nan")
    return torch.where(mask, x, noise)


def rollout_batch(gen: torch.Generator, n_rows: int = 8, length: int = 24, vocab: int = 11):
    """A synthetic PPO batch: logits/values are the trainable leaves, the rest constants."""
    mask = turn_mask(n_rows, length, gen)
    logits = torch.randn(n_rows, length, vocab, generator=gen)
    tokens = torch.randint(0, vocab, (n_rows, length), generator=gen)
    logp = token_logprobs(logits, tokens)
    return dict(
        mask=mask,
        logits=logits,
        tokens=tokens,
        old_logp=logp + 0.3 * torch.randn(n_rows, length, generator=gen),
        ref_logp=logp + 0.3 * torch.randn(n_rows, length, generator=gen),
        adv=torch.randn(n_rows, length, generator=gen),
        values=torch.randn(n_rows, length, generator=gen),
        old_values=torch.randn(n_rows, length, generator=gen),
        returns=torch.randn(n_rows, length, generator=gen),
    )


def total_loss(logits, values, batch, rows=slice(None), normalizer=None):
    """What a trainer minimises: policy + value - entropy + KL, and the metrics."""
    m = batch["mask"][rows]
    logp = token_logprobs(logits, batch["tokens"][rows])
    pg, pg_metrics = clipped_policy_loss(
        logp,
        batch["old_logp"][rows],
        batch["adv"][rows],
        m,
        0.2,
        dual_clip=3.0,
        normalizer=normalizer,
    )
    vf, vf_metrics = clipped_value_loss(
        values, batch["old_values"][rows], batch["returns"][rows], m, 0.2, normalizer=normalizer
    )
    ent = entropy_bonus(entropy_from_logits(logits), m, normalizer)
    kl, kl_metrics = kl_loss(logp, batch["ref_logp"][rows], m, "k3", normalizer=normalizer)
    loss = pg + 0.5 * vf - 0.01 * ent + 0.1 * kl
    return loss, {**pg_metrics, **vf_metrics, **kl_metrics, "entropy": ent.detach()}


# ------------------------------------------------------------- log-probs, entropy


def test_token_logprobs_and_entropy_match_definitions(gen):
    logits = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 7, (3, 5), generator=gen)
    p = torch.softmax(logits, -1)
    for b in range(3):
        for i in range(5):
            probs = p[b, i].tolist()
            assert token_logprobs(logits, tokens)[b, i].item() == pytest.approx(
                math.log(probs[tokens[b, i]])
            )
            assert entropy_from_logits(logits)[b, i].item() == pytest.approx(
                -sum(q * math.log(q) for q in probs)
            )
    assert token_logprobs(logits.bfloat16(), tokens).dtype == torch.float32


def test_entropy_with_banned_tokens_is_finite_in_value_and_gradient():
    logits = torch.tensor([[[0.0, 0.0, -math.inf, -math.inf]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    assert ent.item() == pytest.approx(math.log(2))
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


# ------------------------------------------------------------------ policy loss


def ref_policy_loss(logp, old_logp, adv, mask, eps_low, eps_high, dual):
    total, clipped, n = 0.0, 0, int(mask.sum())
    for b, i in mask.nonzero().tolist():
        a, r = float(adv[b, i]), math.exp(float(logp[b, i]) - float(old_logp[b, i]))
        unclipped, clip = -a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high)
        loss = max(unclipped, clip)
        if dual is not None and a < 0:
            loss = min(loss, -a * dual)
        clipped += clip > unclipped
        total += loss
    return total / n, clipped / n


@pytest.mark.parametrize(("eps_high", "dual"), [(None, None), (0.28, None), (None, 2.0)])
def test_policy_loss_matches_loop(gen, eps_high, dual):
    mask = turn_mask(6, 20, gen)
    logp = -torch.rand(6, 20, generator=gen, dtype=torch.float64) * 3
    old_logp = logp + torch.randn(6, 20, generator=gen, dtype=torch.float64)  # many clipped
    adv = torch.randn(6, 20, generator=gen, dtype=torch.float64)
    loss, metrics = clipped_policy_loss(
        logp, old_logp, adv, mask, 0.2, clip_eps_high=eps_high, dual_clip=dual
    )
    ref_loss, ref_clip = ref_policy_loss(logp, old_logp, adv, mask, 0.2, eps_high or 0.2, dual)
    assert loss.item() == pytest.approx(ref_loss)
    assert metrics["clip_frac"].item() == pytest.approx(ref_clip)
    assert 0 < ref_clip < 1
    log_r = (logp - old_logp)[mask]
    assert metrics["approx_kl"].item() == pytest.approx(float((log_r.exp() - 1 - log_r).mean()))
    assert metrics["approx_kl_k1"].item() == pytest.approx(float((-log_r).mean()))
    assert ("dual_clip_frac" in metrics) == (dual is not None)


def test_policy_loss_hand_example_and_gradient():
    """Four tokens, eps 0.2: (A, r) = (1, 1.5) clipped at 1.2; (1, 0.9) unclipped;
    (-1, 0.5) clipped at 0.8; (-1, 1.1) unclipped. Gradient -A r / N where unclipped."""
    ratio = torch.tensor([[1.5, 0.9, 0.5, 1.1]], dtype=torch.float64)
    logp = ratio.log().requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, metrics = clipped_policy_loss(
        logp, torch.zeros(1, 4, dtype=torch.float64), adv, mask, 0.2
    )
    assert loss.item() == pytest.approx((-1.2 - 0.9 + 0.8 + 1.1) / 4)
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    assert_close(logp.grad, torch.tensor([[0.0, -0.9 / 4, 0.0, 1.1 / 4]], dtype=torch.float64))


# ------------------------------------------------------------------- value loss


@pytest.mark.parametrize("clip_eps", [0.2, None])
def test_value_loss_matches_loop(gen, clip_eps):
    mask = turn_mask(6, 20, gen)
    values, old, ret = (torch.randn(6, 20, generator=gen, dtype=torch.float64) for _ in range(3))
    loss, metrics = clipped_value_loss(values, old, ret, mask, clip_eps)
    total, clipped, n = 0.0, 0, int(mask.sum())
    for b, i in mask.nonzero().tolist():
        v, o, r = float(values[b, i]), float(old[b, i]), float(ret[b, i])
        plain = (v - r) ** 2
        clip = plain if clip_eps is None else (o + min(max(v - o, -clip_eps), clip_eps) - r) ** 2
        total += 0.5 * max(plain, clip)
        clipped += clip > plain
    assert loss.item() == pytest.approx(total / n)
    assert metrics["vf_clip_frac"].item() == pytest.approx(clipped / n)


def test_kl_loss_matches_formula_and_gradient(gen):
    mask = turn_mask(4, 10, gen)
    logp = (-torch.rand(4, 10, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    ref = -torch.rand(4, 10, generator=gen, dtype=torch.float64) * 3
    loss, metrics = kl_loss(logp, ref, mask, "k3")
    d = (ref - logp.detach())[mask]
    n = int(mask.sum())
    assert loss.item() == pytest.approx(float((d.exp() - 1 - d).mean()))
    assert metrics["kl"].item() == pytest.approx(loss.item())
    loss.backward()
    expected = torch.where(mask, (1 - (ref - logp.detach()).exp()) / n, 0)
    assert_close(logp.grad, expected)


def test_explained_variance(gen):
    mask = turn_mask(5, 16, gen)
    ret = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    values = ret + 0.5 * torch.randn(5, 16, generator=gen, dtype=torch.float64)
    y, yhat = ret[mask], values[mask]
    expected = 1 - ((y - yhat).var() / y.var()).item()
    assert explained_variance(garbage_like(values, mask, gen), ret, mask).item() == pytest.approx(
        expected
    )
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)
    assert math.isnan(explained_variance(values, torch.ones_like(ret), mask).item())


def test_token_mean_normalizer():
    mask = torch.tensor([[True, False, True]])
    x = torch.tensor([[1.0, 100.0, 2.0]])
    assert token_mean(x, mask).item() == 1.5
    assert token_mean(x, mask, normalizer=6).item() == 0.5
    assert token_mean(x, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError):
        token_mean(x, mask, normalizer=0)


# ------------------------------------------------------------------ invariances


def test_environment_tokens_change_no_loss_and_no_gradient(gen):
    batch = rollout_batch(gen)
    mask = batch["mask"]
    logits = batch["logits"].clone().requires_grad_()
    values = batch["values"].clone().requires_grad_()
    loss, metrics = total_loss(logits, values, batch)
    loss.backward()

    dirty = dict(batch)
    for key in ("old_logp", "ref_logp", "adv", "old_values", "returns"):
        dirty[key] = garbage_like(batch[key], mask, gen)  # constants: inf and NaN allowed
    # Trainable leaves get large finite noise (an inf logit would make its own
    # position's softmax NaN, which no masking of the loss can undo in autograd).
    noise_logits = torch.randn(batch["logits"].shape, generator=gen) * 1e3
    noise_values = torch.randn(batch["values"].shape, generator=gen) * 1e3
    dirty_logits = torch.where(mask[..., None], batch["logits"], noise_logits).requires_grad_()
    dirty_values = torch.where(mask, batch["values"], noise_values).requires_grad_()
    dirty_loss, dirty_metrics = total_loss(dirty_logits, dirty_values, dirty)
    dirty_loss.backward()

    assert torch.isfinite(loss)
    assert_close(dirty_loss, loss)
    assert_close(dirty_metrics, metrics)
    assert_close(dirty_logits.grad, logits.grad)
    assert_close(dirty_values.grad, values.grad)
    assert (logits.grad[~mask] == 0).all() and (values.grad[~mask] == 0).all()


def test_micro_batches_sum_to_the_full_batch(gen):
    batch = rollout_batch(gen, n_rows=8)
    n_tokens = int(batch["mask"].sum())

    logits = batch["logits"].clone().requires_grad_()
    values = batch["values"].clone().requires_grad_()
    full_loss, full_metrics = total_loss(logits, values, batch)
    full_loss.backward()

    micro_logits = batch["logits"].clone().requires_grad_()
    micro_values = batch["values"].clone().requires_grad_()
    summed_loss = torch.zeros(())
    summed_metrics = {k: torch.zeros(()) for k in full_metrics}
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):  # row 0 has no generated token
        loss, metrics = total_loss(
            micro_logits[rows], micro_values[rows], batch, rows, normalizer=n_tokens
        )
        loss.backward()  # gradients accumulate, as in gradient accumulation
        summed_loss += loss.detach()
        summed_metrics = {k: summed_metrics[k] + metrics[k] for k in metrics}

    assert_close(summed_loss, full_loss.detach(), atol=1e-6, rtol=1e-6)
    assert_close(summed_metrics, full_metrics, atol=1e-6, rtol=1e-6)
    assert_close(micro_logits.grad, logits.grad, atol=1e-6, rtol=1e-6)
    assert_close(micro_values.grad, values.grad, atol=1e-6, rtol=1e-6)


# ------------------------------------------------- aggregation (verl's loss_agg_mode)

SCALE = 7.0  # seq-mean-token-sum-norm's fixed normaliser in these tests


def ref_agg(x, mask, mode, scale=SCALE):
    """verl's agg_loss, written as loops over rows and tokens (rows without a generated
    token are no sequence)."""
    rows = [[float(x[b, i]) for i in range(mask.shape[1]) if mask[b, i]] for b in range(len(x))]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    assert mode == "seq-mean-token-sum-norm"
    return sum(sum(r) / scale for r in rows) / len(rows)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_matches_loop_and_ignores_environment_tokens(gen, mode):
    mask = turn_mask(7, 18, gen)
    x = torch.randn(7, 18, generator=gen, dtype=torch.float64)
    got = agg_loss(garbage_like(x, mask, gen), mask, mode, scale_factor=SCALE)
    assert got.item() == pytest.approx(ref_agg(x, mask, mode))
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO's normaliser is fixed, never inferred
        with pytest.raises(ValueError, match="scale_factor"):
            agg_loss(x, mask, mode)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(x, mask, "seq-sum")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_sum_to_the_full_batch_in_every_mode(gen, mode):
    batch = rollout_batch(gen, n_rows=8)
    agg = LossAgg.of(batch["mask"], mode, SCALE)

    logits = batch["logits"].clone().requires_grad_()
    values = batch["values"].clone().requires_grad_()
    full_loss, full_metrics = total_loss(logits, values, batch, normalizer=agg)
    full_loss.backward()
    # The whole objective in this mode, against the loops: every term aggregates alike.
    m = batch["mask"]
    logp = token_logprobs(batch["logits"], batch["tokens"])
    ent = entropy_from_logits(batch["logits"])
    assert full_metrics["entropy"].item() == pytest.approx(ref_agg(ent, m, mode), rel=1e-5)

    micro_logits = batch["logits"].clone().requires_grad_()
    micro_values = batch["values"].clone().requires_grad_()
    summed_loss = torch.zeros(())
    summed_metrics = {k: torch.zeros(()) for k in full_metrics}
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):  # row 0 has no generated token
        loss, metrics = total_loss(
            micro_logits[rows], micro_values[rows], batch, rows, normalizer=agg
        )
        loss.backward()
        summed_loss += loss.detach()
        summed_metrics = {k: summed_metrics[k] + metrics[k] for k in metrics}
    assert_close(summed_loss, full_loss.detach(), atol=1e-6, rtol=1e-6)
    assert_close(summed_metrics, full_metrics, atol=1e-6, rtol=1e-6)
    assert_close(micro_logits.grad, logits.grad, atol=1e-6, rtol=1e-6)
    assert_close(micro_values.grad, values.grad, atol=1e-6, rtol=1e-6)
    # Metrics are token means whatever the mode (verl): clip_frac is the loop's.
    _, ref_clip = ref_policy_loss(logp, batch["old_logp"], batch["adv"], m, 0.2, 0.2, 3.0)
    assert full_metrics["clip_frac"].item() == pytest.approx(ref_clip)


# ------------------------------------------------- rollout correction in the loss


def test_is_weights_multiply_each_tokens_clipped_loss(gen):
    mask = turn_mask(5, 16, gen)
    logp = -torch.rand(5, 16, generator=gen, dtype=torch.float64) * 3
    old_logp = logp + 0.5 * torch.randn(5, 16, generator=gen, dtype=torch.float64)
    adv = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    w = torch.rand(5, 16, generator=gen, dtype=torch.float64) * 2
    loss, _ = clipped_policy_loss(
        logp, old_logp, adv, mask, 0.2, dual_clip=3.0, is_weights=garbage_like(w, mask, gen)
    )
    total = 0.0
    for b, i in mask.nonzero().tolist():
        a, r = float(adv[b, i]), math.exp(float(logp[b, i]) - float(old_logp[b, i]))
        token = max(-a * r, -a * min(max(r, 0.8), 1.2))
        if a < 0:
            token = min(token, -a * 3.0)
        total += float(w[b, i]) * token
    assert loss.item() == pytest.approx(total / int(mask.sum()))


# ------------------------------------------------------------------------ GSPO


def ref_gspo(logp, old_logp, adv, mask, low, high):
    """GSPO's sequence objective with verl's aggregation: per row, s = exp(mean log-ratio),
    each token's loss max(-A s, -A clip(s)); the mean over the row, then over rows."""
    rows = []
    for b in range(mask.shape[0]):
        idx = [i for i in range(mask.shape[1]) if mask[b, i]]
        if not idx:
            continue
        s = math.exp(sum(float(logp[b, i]) - float(old_logp[b, i]) for i in idx) / len(idx))
        losses = []
        for i in idx:
            a = float(adv[b, i])
            losses.append(max(-a * s, -a * min(max(s, 1 - low), 1 + high)))
        rows.append(sum(losses) / len(losses))
    return sum(rows) / len(rows)


@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.2, 0.28)])
def test_gspo_matches_the_sequence_objective_in_value_and_gradient(gen, low, high):
    mask = turn_mask(6, 20, gen)
    logp0 = -torch.rand(6, 20, generator=gen, dtype=torch.float64) * 3
    old_logp = logp0 + 0.02 * torch.randn(6, 20, generator=gen, dtype=torch.float64)
    # One advantage per trajectory (an outcome estimator broadcasts it to every token).
    adv = torch.randn(6, 1, generator=gen, dtype=torch.float64).expand(6, 20).clone()
    logp = garbage_like(logp0, mask, gen).requires_grad_()
    loss, metrics = gspo_policy_loss(
        logp, old_logp, adv, mask, low, clip_eps_high=high, loss_agg_mode="token-mean"
    )
    assert loss.item() == pytest.approx(ref_gspo(logp0, old_logp, adv, mask, low, high))
    loss.backward()
    # The gradient is that of the sequence-level objective (1/B) sum_b max(-A s_b, -A clip(s_b)),
    # s_b a differentiable function of the row's log-probs.
    direct = logp0.clone().requires_grad_()
    total, n_rows = 0.0, 0
    for b in range(6):
        m = mask[b]
        if not m.any():
            continue
        s = torch.exp((direct[b][m] - old_logp[b][m]).mean())
        a = adv[b, 0]
        total = total + torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high))
        n_rows += 1
    (total / n_rows).backward()
    assert_close(logp.grad, direct.grad)
    assert (logp.grad[~mask] == 0).all()
    assert 0 <= metrics["clip_frac"].item() <= 1 and metrics["seq_ratio_dev"].item() > 0
    if low == 3e-4:  # GSPO's small ranges clip most sequences at a 0.02 log-prob noise
        assert metrics["clip_frac"].item() > 0


def test_gspo_equals_token_ppo_on_the_first_step_and_registry():
    """At ratio 1 (the first minibatch of an iteration) GSPO and PPO give the same loss in
    seq-mean-token-mean; the registry holds both under verl's loss_mode names."""
    gen = torch.Generator().manual_seed(1)
    mask = turn_mask(4, 12, gen)
    logp = (-torch.rand(4, 12, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    agg = LossAgg(mode="seq-mean-token-mean")
    gspo, _ = POLICY_LOSSES["gspo"](logp, logp.detach(), adv, mask, 3e-4, clip_eps_high=4e-4)
    ppo, _ = POLICY_LOSSES["vanilla"](logp, logp.detach(), adv, mask, 0.2, normalizer=agg)
    assert_close(gspo, ppo)
    assert set(POLICY_LOSSES) == {"vanilla", "gspo"}
