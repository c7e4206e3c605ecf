"""`ppo.old_logprobs`: the PPO ratio against the rollout's recorded log-probs (`rollout`,
verl's bypass mode) against the learner's recompute (`recompute`). With one epoch and one
minibatch in float32 the two give the same update on a real rollout of a tiny model built
from config: the same old log-probs, advantages, loss, metrics and gradients; under
`rollout` the policy's scoring forward never runs and no sampler/learner gap is claimed.
Settings under which the switch would be silently wrong are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_ppo import PPO, S, fresh, optimizers, policy, trajs  # noqa: F401 (fixtures)

from mem1_core.config import Config, PPOConfig, TrajectoryConfig
from mem1_core.rl.batch import make_rollout_batch
from mem1_core.rl.passes import NonFiniteGuard, accumulate_gradients, score
from mem1_core.rl.ppo import correct_rollout, estimate_advantages, update
from mem1_core.trajectory.logprobs import logprob_tolerance

ONE_STEP = dataclasses.replace(PPO, minibatch_size=4, micro_batch_size=2, ppo_epochs=1)
"""One epoch, one minibatch of the fixture's four trajectories (two micro-batches)."""


def _decoder_calls(models) -> list[int]:
    calls = [0]

    def hook(module, args, output):
        calls[0] += 1

    models.policy.get_decoder().register_forward_hook(hook)
    return calls


def _one_step(policy, trajs, pad_id: int, source: str):  # noqa: F811 (the fixture's name)
    """Score, advantages and the one minibatch's gradients under `ppo.old_logprobs=source`."""
    models = fresh(policy)
    cfg = dataclasses.replace(ONE_STEP, old_logprobs=source)
    rb = make_rollout_batch(trajs, pad_id)
    calls = _decoder_calls(models)
    targets, _ = correct_rollout(rb, score(models, rb, S(cfg)), cfg)
    scoring_calls = calls[0]
    targets, _ = estimate_advantages(rb, targets, S(cfg))
    rows = torch.arange(len(trajs))
    metrics, finite = accumulate_gradients(models, rb.batch, targets, rows, S(cfg))
    assert finite
    grads = [p.grad.clone() for m in (models.policy, models.critic) for p in m.parameters()]
    return targets, metrics, grads, scoring_calls


def test_rollout_logprobs_give_the_recomputed_update(policy, trajs, small_tokenizer):  # noqa: F811
    pad = small_tokenizer.pad_token_id
    recomputed, rec_metrics, rec_grads, rec_calls = _one_step(policy, trajs, pad, "recompute")
    recorded, metrics, grads, calls = _one_step(policy, trajs, pad, "rollout")
    assert rec_calls > 0 and calls == 0  # the policy's scoring forward is gone
    tol = logprob_tolerance(policy.config.num_hidden_layers)
    mask = recorded.loss_mask
    assert torch.equal(mask, recomputed.loss_mask) and mask.any()
    torch.testing.assert_close(recorded.old_logp, recomputed.old_logp, atol=tol, rtol=0)
    assert not recorded.old_logp[~mask].any()  # environment tokens carry nothing
    for name in ("advantages", "returns", "old_values", "ref_logp"):
        torch.testing.assert_close(
            getattr(recorded, name), getattr(recomputed, name), atol=tol, rtol=0
        )
    assert rec_metrics.keys() == metrics.keys()
    for k, v in rec_metrics.items():  # pg_loss, vf_loss, approx_kl, clip_frac, ...
        torch.testing.assert_close(metrics[k], v, atol=1e-6, rtol=1e-5, msg=k)
    assert abs(float(metrics["approx_kl"])) < 1e-10  # the ratio starts at 1 either way
    for a, b in zip(rec_grads, grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def test_the_update_under_rollout_logs_no_gap_it_did_not_measure(policy, trajs, small_tokenizer):  # noqa: F811
    out = {}
    for source in ("recompute", "rollout"):
        models = fresh(policy)
        cfg = dataclasses.replace(ONE_STEP, old_logprobs=source)
        settings = S(cfg, pad_id=small_tokenizer.pad_token_id)
        out[source] = update(models, optimizers(models, 1e-3), trajs, settings, NonFiniteGuard(3))
    rec, byp = out["recompute"], out["rollout"]
    assert rec["logp_mismatch_max"] < 1e-5
    assert not [k for k in byp if k.startswith("logp_mismatch")]
    assert byp["optimizer_steps"] == rec["optimizer_steps"] == 1
    for k in ("pg_loss", "vf_loss", "kl_ref", "advantage_mean", "policy_grad_norm"):
        assert byp[k] == pytest.approx(rec[k], rel=1e-4, abs=1e-6), k


def test_settings_the_switch_would_make_wrong_are_refused():
    PPOConfig(old_logprobs="rollout")  # the plain switch
    with pytest.raises(ValueError, match="use recompute or rollout"):
        PPOConfig(old_logprobs="sampler")
    with pytest.raises(ValueError, match="set ppo.rollout_is=null"):
        PPOConfig(old_logprobs="rollout", rollout_is="token")
    with pytest.raises(ValueError, match="an update stale"):
        PPOConfig(old_logprobs="rollout", overlap_rollouts=True, rollout_is="token")
    with pytest.raises(ValueError, match="trajectory.mode=concat"):
        Config(ppo=PPOConfig(old_logprobs="rollout"), trajectory=TrajectoryConfig(mode="concat"))
    assert PPOConfig().old_logprobs == "recompute"  # the default until learning is compared
