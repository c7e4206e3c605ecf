"""The learner's PPO / GRPO update, checked against definitions on real rollouts of a tiny
model: old log-probs over the tree equal re-running each turn; critic values are those of
the context before each token; lr = 0 changes nothing; micro-batches give the full-batch
gradient; environment tokens never reach the loss; non-finite steps are skipped, counted
and, too many in a row, stop the run; a step lowers the surrogate loss."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from mem1_core.config import ModelConfig, PPOConfig, RolloutConfig
from mem1_core.models.model import build_tiny_model
from mem1_core.rl.batch import Models, Targets, make_rollout_batch
from mem1_core.rl.critic import Critic
from mem1_core.rl.passes import (
    NonFiniteError,
    NonFiniteGuard,
    accumulate_gradients,
    ppo_loss,
    score,
)
from mem1_core.rl.ppo import estimate_advantages, update
from mem1_core.rollout.env import QAEnvironment
from mem1_core.rollout.generation import HFBackend
from mem1_core.rollout.loop import rollout
from mem1_core.trajectory.logprobs import forward_tree, per_turn_logprobs
from mem1_core.trajectory.record import turn_paths

ROLLOUT = RolloutConfig(
    turns_base=1, turns_per_objective=1, gen_tokens_base=10, gen_tokens_per_objective=2
)
PPO = PPOConfig(
    minibatch_size=4,
    micro_batch_size=2,
    ppo_epochs=1,
    kl_coef=0.01,
    entropy_coef=0.01,
    actor_lr=1e-3,
    critic_lr=1e-3,
)
ATTN = "sdpa"


@pytest.fixture(scope="module")
def policy(small_tokenizer):
    return build_tiny_model(
        ModelConfig(
            hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=0
        ),
        small_tokenizer,
    )


@pytest.fixture(scope="module")
def trajs(policy, small_tokenizer, small_index, small_tasks):
    """2 samples of each of 2 tasks; one sample of each task is declared right (EM) so
    that advantages are not all zero."""
    env = QAEnvironment(small_tokenizer, small_index, topk=2)
    backend = HFBackend(policy, small_tokenizer.pad_token_id, small_tokenizer.eos_token_id)
    out = rollout(
        small_tasks[:2],
        backend,
        env,
        ROLLOUT,
        samples_per_task=2,
        generator=torch.Generator().manual_seed(0),
    )
    for t in out:
        t.em = [1.0, 1.0] if t.sample == 0 else [0.0, 1.0]
    return out


def fresh(policy, critic: bool = True, head_seed: int | None = 1) -> Models:
    p = copy.deepcopy(policy)
    c = Critic.from_policy(policy) if critic else None
    if c is not None and head_seed is not None:  # a non-zero head: values vary per token
        torch.manual_seed(head_seed)
        torch.nn.init.normal_(c.value_head.weight, std=0.5)
    return Models(p, copy.deepcopy(policy).requires_grad_(False), c)


def optimizers(models: Models, lr: float) -> dict[str, torch.optim.Optimizer]:
    opts = {"policy": torch.optim.AdamW(models.policy.parameters(), lr=lr, weight_decay=0.0)}
    if models.critic is not None:
        opts["critic"] = torch.optim.AdamW(models.critic.parameters(), lr=lr, weight_decay=0.0)
    return opts


def params(models: Models) -> list[torch.Tensor]:
    mods = [models.policy] + ([models.critic] if models.critic is not None else [])
    return [p.detach().clone() for m in mods for p in m.parameters()]


def prepared(models, trajs, pad_id, estimator="gae"):
    rb = make_rollout_batch(trajs, pad_id)
    targets, _ = estimate_advantages(rb, score(models, rb, ATTN, 2), PPO, estimator)
    return rb, targets


def test_old_logprobs_over_the_tree_equal_each_turn_rerun(policy, trajs, small_tokenizer):
    models = Models(policy)
    rb = make_rollout_batch(trajs, small_tokenizer.pad_token_id)
    old = score(models, rb, ATTN, micro_batch_size=3).old_logp
    batch = rb.batch
    for r, traj in enumerate(trajs):
        definition = per_turn_logprobs(policy, turn_paths(traj))
        for t, expected in enumerate(definition):
            at = (batch.gen_turn[r] == t) & batch.loss_mask[r]
            got = old[r][at][batch.gen_offset[r][at].argsort()]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
            recorded = torch.tensor(traj.turns[t].gen_logprobs)
            torch.testing.assert_close(rb.rollout_logp[r][at], recorded, atol=0, rtol=0)
            torch.testing.assert_close(got, recorded, atol=1e-5, rtol=0)


def test_critic_value_is_that_of_the_context_before_each_token(policy, trajs, small_tokenizer):
    critic = fresh(policy).critic
    rb = make_rollout_batch(trajs[:2], small_tokenizer.pad_token_id)
    values = critic(rb.batch, ATTN)
    for r, traj in enumerate(trajs[:2]):
        for t, turn in enumerate(traj.turns):
            context = traj.context_ids(t)
            at = (rb.batch.gen_turn[r] == t) & rb.batch.loss_mask[r]
            got = values[r][at][rb.batch.gen_offset[r][at].argsort()]
            for o in (0, len(turn.gen_ids) // 2, len(turn.gen_ids) - 1):
                ids = torch.tensor([context + turn.gen_ids[:o]])
                with torch.no_grad():
                    h = critic.backbone(input_ids=ids).last_hidden_state[0, -1]
                    expected = critic.value_head(h).squeeze()
                torch.testing.assert_close(got[o], expected, atol=1e-5, rtol=0)


def test_update_with_zero_lr_changes_nothing(policy, trajs, small_tokenizer):
    models = fresh(policy)
    before = params(models)
    stats = update(
        models,
        optimizers(models, 0.0),
        trajs,
        PPO,
        estimator="gae",
        attn=ATTN,
        pad_id=small_tokenizer.pad_token_id,
        guard=NonFiniteGuard(3),
    )
    assert stats["optimizer_steps"] == 1 and stats["skipped_steps"] == 0
    assert stats["policy_grad_norm"] > 0 and stats["critic_grad_norm"] > 0
    assert stats["logp_mismatch_max"] < 1e-5
    per_turn = [v for k, v in stats.items() if k.startswith("logp_mismatch_max/turn_")]
    assert per_turn and max(per_turn) == pytest.approx(stats["logp_mismatch_max"])
    for a, b in zip(before, params(models), strict=True):
        assert torch.equal(a, b)


def test_micro_batches_give_the_full_batch_gradient(policy, trajs, small_tokenizer):
    models = fresh(policy)
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id)
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = torch.tensor([2, 0, 3, 1])
    grads = []
    for micro in (4, 2, 1):
        cfg = dataclasses.replace(PPO, minibatch_size=4, micro_batch_size=micro)
        metrics, finite = accumulate_gradients(models, rb.batch, targets, rows, cfg, ATTN)
        assert finite
        mods = [models.policy, models.critic]
        grads.append(([p.grad.clone() for m in mods for p in m.parameters()], metrics))
        for m in mods:
            m.zero_grad(set_to_none=True)
    (full, full_metrics), *rest = grads
    assert float(full_metrics["clip_frac"]) > 0  # the clip is exercised
    for micro_grads, metrics in rest:
        for a, b in zip(full, micro_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
        for k, v in full_metrics.items():
            torch.testing.assert_close(metrics[k], v, atol=1e-6, rtol=1e-4)


def test_environment_tokens_never_reach_the_loss(policy, trajs, small_tokenizer):
    models = fresh(policy)
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id)
    env = ~targets.loss_mask
    out = forward_tree(models.policy, rb.batch, ATTN, with_entropy=True)
    values = models.critic(rb.batch, ATTN)
    n = targets.loss_mask.sum()
    clean, _ = ppo_loss(out.logprobs, out.entropy, values, targets, PPO, n)

    def poison(x):
        return torch.where(env, torch.full_like(x, float("nan")), x)

    dirty_targets = Targets(
        targets.loss_mask,
        poison(targets.old_logp),
        poison(targets.advantages),
        poison(targets.returns),
        poison(targets.old_values),
        poison(targets.ref_logp),
    )
    dirty, _ = ppo_loss(
        poison(out.logprobs), poison(out.entropy), poison(values), dirty_targets, PPO, n
    )
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)
    # Values read at environment tokens do not change advantages or returns either.
    shifted = Targets(
        targets.loss_mask,
        targets.old_logp,
        targets.advantages,
        targets.returns,
        torch.where(env, 1e3, targets.old_values),
        targets.ref_logp,
    )
    again, _ = estimate_advantages(rb, shifted, PPO, "gae")
    torch.testing.assert_close(again.advantages, targets.advantages, atol=0, rtol=0)
    torch.testing.assert_close(again.returns, targets.returns, atol=0, rtol=0)


def _poison_hidden(models: Models, when: list[bool]):
    """A hook that turns the policy's hidden states into NaN while training (grad on)."""

    def hook(module, args, output):
        if torch.is_grad_enabled() and when[0]:
            output.last_hidden_state = output.last_hidden_state * float("nan")
        return output

    return models.policy.get_decoder().register_forward_hook(hook)


def test_nonfinite_loss_skips_the_update_and_is_counted(policy, trajs, small_tokenizer):
    models = fresh(policy)
    opts, guard = optimizers(models, 1e-3), NonFiniteGuard(max_in_row=2)
    poison = [True]
    handle = _poison_hidden(models, poison)
    kw = {"estimator": "gae", "attn": ATTN, "pad_id": small_tokenizer.pad_token_id, "guard": guard}
    before = params(models)
    stats = update(models, opts, trajs, PPO, **kw)
    assert (stats["skipped_steps"], stats["optimizer_steps"], guard.total) == (1, 0, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))
    assert all(p.grad is None for p in models.policy.parameters())
    poison[0] = False  # a finite step resets the run of failures and moves the weights
    stats = update(models, opts, trajs, PPO, **kw)
    assert (stats["optimizer_steps"], guard.in_row, guard.total) == (1, 0, 1)
    assert not all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))
    poison[0] = True
    update(models, opts, trajs, PPO, **kw)
    after_one = params(models)
    with pytest.raises(NonFiniteError, match="2 updates in a row.*max_nonfinite_in_row=2"):
        update(models, opts, trajs, PPO, **kw)
    assert guard.total == 3
    assert all(torch.equal(a, b) for a, b in zip(after_one, params(models), strict=True))
    handle.remove()


def test_nonfinite_gradient_with_finite_loss_is_skipped(policy, trajs, small_tokenizer):
    models = fresh(policy)
    guard = NonFiniteGuard(max_in_row=3)
    weight = models.policy.get_decoder().layers[0].mlp.down_proj.weight
    handle = weight.register_hook(lambda g: g * float("inf"))
    before = params(models)
    stats = update(
        models,
        optimizers(models, 1e-3),
        trajs,
        PPO,
        estimator="gae",
        attn=ATTN,
        pad_id=small_tokenizer.pad_token_id,
        guard=guard,
    )
    handle.remove()
    assert (stats["skipped_steps"], guard.total) == (1, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))


def test_a_grpo_step_lowers_the_surrogate_and_favours_rewarded_samples(
    policy, trajs, small_tokenizer
):
    models = fresh(policy, critic=False)
    cfg = dataclasses.replace(
        PPO, kl_coef=0.0, entropy_coef=0.0, minibatch_size=4, micro_batch_size=4
    )
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id, estimator="grpo")
    mask, adv = targets.loss_mask, targets.advantages
    assert bool((adv[mask] != 0).all())  # one rewarded sample per group: no zero advantage

    def surrogate_and_logp():
        with torch.no_grad():
            logp = forward_tree(models.policy, rb.batch, ATTN).logprobs
        return float(-(adv * logp)[mask].sum() / mask.sum()), logp

    loss0, logp0 = surrogate_and_logp()
    stats = update(
        models,
        optimizers(models, 1e-4),
        trajs,
        cfg,
        estimator="grpo",
        attn=ATTN,
        pad_id=small_tokenizer.pad_token_id,
        guard=NonFiniteGuard(3),
    )
    assert stats["optimizer_steps"] == 1 and "vf_loss" not in stats
    loss1, logp1 = surrogate_and_logp()
    assert loss1 < loss0
    delta = torch.where(mask, logp1 - logp0, 0).sum(1)
    rewarded = torch.tensor([t.sample == 0 for t in trajs])
    assert float(delta[rewarded].sum()) > 0 > float(delta[~rewarded].sum())
    assert math.isfinite(stats["kl_ref"])


def _grads(models: Models) -> list[torch.Tensor]:
    mods = [models.policy] + ([models.critic] if models.critic is not None else [])
    return [p.grad.clone() for m in mods for p in m.parameters()]


def test_gradient_checkpointing_gives_the_same_gradients(policy, trajs, small_tokenizer):
    # Issue #7: activation checkpointing recomputes each layer in backward; the PPO
    # gradient (policy and critic) must not change. It must also really be on: the MLP of a
    # checkpointed layer runs twice per micro-batch (forward, then the recompute).
    from mem1_core.models.model import enable_gradient_checkpointing, is_checkpointing

    models = fresh(policy)
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id)
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = torch.tensor([2, 0, 3, 1])
    metrics, _ = accumulate_gradients(models, rb.batch, targets, rows, PPO, ATTN)
    plain = _grads(models)
    checkpointed = Models(
        enable_gradient_checkpointing(copy.deepcopy(models.policy)),
        models.reference,
        copy.deepcopy(models.critic),
    )
    enable_gradient_checkpointing(checkpointed.critic.backbone)
    for m in (checkpointed.policy, checkpointed.critic):
        m.zero_grad(set_to_none=True)
    assert is_checkpointing(checkpointed.policy) and not is_checkpointing(models.policy)
    layer = checkpointed.policy.get_decoder().layers[0]
    assert layer.training and not any(m.training for m in layer.children())
    calls = [0]
    mlp = checkpointed.policy.get_decoder().layers[0].mlp
    mlp_forward = mlp.forward

    def counted(x):  # not a forward hook: the recompute does not run module hooks
        calls[0] += 1
        return mlp_forward(x)

    mlp.forward = counted
    again, _ = accumulate_gradients(checkpointed, rb.batch, targets, rows, PPO, ATTN)
    del mlp.forward
    assert calls[0] == 2 * len(rows) // PPO.micro_batch_size
    for a, b in zip(plain, _grads(checkpointed), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for k, v in metrics.items():
        torch.testing.assert_close(again[k], v, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # no gradient, no checkpointing: scoring is unchanged
        torch.testing.assert_close(
            score(checkpointed, rb, ATTN, 2).old_values, targets.old_values, atol=1e-5, rtol=0
        )


def test_sequence_bucketing_changes_no_logprob_value_or_gradient(policy, trajs, small_tokenizer):
    # Issue #7: padding L to a multiple of seq_bucket (so a compiled FlexAttention sees few
    # lengths) is invisible: padding is its own tree node that no real token attends to.
    models = fresh(policy)
    pad = small_tokenizer.pad_token_id
    plain = make_rollout_batch(trajs, pad)
    bucketed = make_rollout_batch(trajs, pad, seq_bucket=64)
    length = plain.batch.input_ids.shape[1]
    assert bucketed.batch.input_ids.shape[1] % 64 == 0
    assert bucketed.batch.input_ids.shape[1] > length
    t1 = score(models, plain, ATTN, 2)
    t2 = score(models, bucketed, ATTN, 2, seq_bucket=64)
    for name in ("old_logp", "ref_logp", "old_values"):
        a, b = getattr(t1, name), getattr(t2, name)
        torch.testing.assert_close(b[:, :length], a, atol=1e-5, rtol=0)
        assert (b[:, length:] == 0).all()
    t1, _ = estimate_advantages(plain, t1, PPO, "gae")
    t2, _ = estimate_advantages(bucketed, t2, PPO, "gae")
    rows = torch.tensor([2, 0, 3, 1])
    m1, _ = accumulate_gradients(models, plain.batch, t1, rows, PPO, ATTN)
    g1 = _grads(models)
    for m in (models.policy, models.critic):
        m.zero_grad(set_to_none=True)
    m2, _ = accumulate_gradients(models, bucketed.batch, t2, rows, PPO, ATTN, seq_bucket=64)
    for a, b in zip(g1, _grads(models), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for k, v in m1.items():
        torch.testing.assert_close(m2[k], v, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flex_learner_on_cuda_equals_the_dense_cpu_learner(trajs, small_tokenizer):
    # The learner's GPU path (issue #7): FlexAttention (BlockMask), activation checkpointing
    # and sequence buckets on CUDA give the old log-probs, values and PPO gradients of the
    # CPU reference path (sdpa, no checkpointing, no buckets), in float32.
    from mem1_core.models.model import enable_gradient_checkpointing

    torch.backends.cuda.matmul.allow_tf32 = False
    # head_dim 16: FlexAttention's CUDA kernels need at least 16.
    cpu_policy = build_tiny_model(
        ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=128, seed=0),
        small_tokenizer,
    )  # fmt: skip
    cpu = fresh(cpu_policy)
    pad = small_tokenizer.pad_token_id
    rb, targets = prepared(cpu, trajs, pad)
    gpu = Models(*(copy.deepcopy(m).cuda() for m in (cpu.policy, cpu.reference, cpu.critic)))
    enable_gradient_checkpointing(gpu.policy)
    enable_gradient_checkpointing(gpu.critic.backbone)
    rb_gpu = make_rollout_batch(trajs, pad, "cuda", seq_bucket=128)
    t_gpu = score(gpu, rb_gpu, "flex_attention", 2, seq_bucket=128)
    length = rb.batch.input_ids.shape[1]
    for name in ("old_logp", "ref_logp", "old_values"):
        got = getattr(t_gpu, name)[:, :length].cpu()
        torch.testing.assert_close(got, getattr(targets, name), atol=1e-4, rtol=0)
    t_gpu, _ = estimate_advantages(rb_gpu, t_gpu, PPO, "gae")
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for a, b in zip(cpu.policy.parameters(), gpu.policy.parameters(), strict=True):
            a.add_(0.05 * torch.randn_like(a))
            b.copy_(a)
    rows = torch.tensor([2, 0, 3, 1])
    accumulate_gradients(cpu, rb.batch, targets, rows, PPO, ATTN)
    accumulate_gradients(
        gpu, rb_gpu.batch, t_gpu, rows.cuda(), PPO, "flex_attention", seq_bucket=128
    )
    for a, b in zip(_grads(cpu), _grads(gpu), strict=True):
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-3)
