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
from mem1_core.qa.env import QAEnvironment
from mem1_core.rl.batch import Models, Targets, make_rollout_batch
from mem1_core.rl.critic import Critic
from mem1_core.rl.passes import (
    NonFiniteError,
    NonFiniteGuard,
    UpdateSettings,
    accumulate_gradients,
    ppo_loss,
    score,
)
from mem1_core.rl.ppo import correct_rollout, estimate_advantages, update
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


def S(cfg: PPOConfig = PPO, attn: str = ATTN, **settings) -> UpdateSettings:
    """The update settings of these tests: `cfg`'s own kl_coef and loss_scale_factor."""
    return UpdateSettings.of(cfg, attn, **settings)


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


def fresh(
    policy, critic: bool = True, head_seed: int | None = 1, critic_layers: int | None = None
) -> Models:
    p = copy.deepcopy(policy)
    c = Critic.from_policy(policy, critic_layers) if critic else None
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


def prepared(models, trajs, pad_id, estimator="gae", cfg=PPO, gap=0.0):
    """Scored targets; `gap`: noise of that size on the rollout's recorded log-probs (a
    sampler that disagrees with the learner), for the rollout correction."""
    rb = make_rollout_batch(trajs, pad_id)
    if gap:
        noise = gap * torch.randn(rb.rollout_logp.shape, generator=torch.Generator().manual_seed(0))
        rb = dataclasses.replace(rb, rollout_logp=rb.rollout_logp + noise * rb.batch.loss_mask)
    cfg = dataclasses.replace(cfg, adv_estimator=estimator)
    targets, _ = correct_rollout(rb, score(models, rb, S(cfg)), cfg)
    targets, _ = estimate_advantages(rb, targets, S(cfg))
    return rb, targets


def test_old_logprobs_over_the_tree_equal_each_turn_rerun(policy, trajs, small_tokenizer):
    models = Models(policy)
    rb = make_rollout_batch(trajs, small_tokenizer.pad_token_id)
    old = score(
        models, rb, S(dataclasses.replace(PPO, minibatch_size=3, micro_batch_size=3))
    ).old_logp
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


@pytest.mark.parametrize("critic_layers", [None, 1])
def test_critic_value_is_that_of_the_context_before_each_token(
    policy, trajs, small_tokenizer, critic_layers
):
    critic = fresh(policy, critic_layers=critic_layers).critic
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


def test_a_shallow_critic_is_the_policys_first_layers(policy, trajs, tmp_path):
    """ppo.critic_layers=1 of a 2-layer policy: the critic's hidden state is the policy's
    after its first layer (through the final norm); the policy keeps both; the critic saves
    and loads as a 1-layer model; a count the policy has not, or a saved critic of another
    depth, is an error."""
    from mem1_core.rl.critic import check_critic_layers

    critic = Critic.from_policy(policy, 1)
    decoder = policy.get_decoder()
    assert len(decoder.layers) == policy.config.num_hidden_layers == 2  # the policy untouched
    assert len(critic.backbone.layers) == critic.backbone.config.num_hidden_layers == 1
    ids = torch.tensor([trajs[0].context_ids(0) + trajs[0].turns[0].gen_ids])
    with torch.no_grad():
        after_first = decoder(input_ids=ids, output_hidden_states=True).hidden_states[1]
        got = critic.backbone(input_ids=ids).last_hidden_state
        torch.testing.assert_close(got, decoder.norm(after_first), atol=1e-6, rtol=0)
        # its own weights: training the critic leaves the policy's first layer as it was
        critic.backbone.layers[0].mlp.down_proj.weight.add_(1.0)
        assert not torch.equal(
            critic.backbone.layers[0].mlp.down_proj.weight, decoder.layers[0].mlp.down_proj.weight
        )
    loaded = Critic.load(critic.save(tmp_path / "critic"))
    assert len(loaded.backbone.layers) == 1
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.backbone(input_ids=ids).last_hidden_state,
            critic.backbone(input_ids=ids).last_hidden_state,
        )
    check_critic_layers(loaded, 1, tmp_path)
    check_critic_layers(loaded, None, tmp_path)  # a saved critic continues as it is
    with pytest.raises(ValueError, match="holds a critic of 1 layers but ppo.critic_layers=2"):
        check_critic_layers(loaded, 2, tmp_path)
    with pytest.raises(ValueError, match="the policy has 2 decoder layers"):
        Critic.from_policy(policy, 3)
    with pytest.raises(ValueError, match="keep at least 1"):
        PPOConfig(critic_layers=0)


def test_update_with_zero_lr_changes_nothing(policy, trajs, small_tokenizer):
    models = fresh(policy)
    before = params(models)
    stats = update(
        models,
        optimizers(models, 0.0),
        trajs,
        S(PPO, pad_id=small_tokenizer.pad_token_id),
        NonFiniteGuard(3),
    )
    assert stats["optimizer_steps"] == 1 and stats["skipped_steps"] == 0
    assert stats["policy_grad_norm"] > 0 and stats["critic_grad_norm"] > 0
    # the named phase timers reach the progress line (rollout's is the driver's)
    from mem1_core.training.iteration_log import phase_line

    record = {"rollout_seconds": 1.25, **{f"train/{k}": v for k, v in stats.items()}}
    assert phase_line(record).startswith("rollout 1.2s old-logp ")
    assert " adv " in phase_line(record) and " update " in phase_line(record)
    assert stats["logp_mismatch_max"] < 1e-5
    per_turn = [v for k, v in stats.items() if k.startswith("logp_mismatch_max/turn_")]
    assert per_turn and max(per_turn) == pytest.approx(stats["logp_mismatch_max"])
    for a, b in zip(before, params(models), strict=True):
        assert torch.equal(a, b)


def test_a_pass_after_a_step_computes_with_the_stepped_weights_under_autocast(
    policy, trajs, small_tokenizer
):
    """The learner runs a whole update inside one bf16 autocast context over float32 master
    weights (Learner.update, models.model.master_weights). Autocast keeps its bf16 copy of each
    weight while the context lasts, so a pass after an optimiser step must see the stepped
    weights: after two steps, the log-probs and values scored inside the update's context equal
    those scored in a fresh one."""
    from mem1_core.models.model import master_weights

    models = fresh(policy)
    context = master_weights(models.policy, "bfloat16")
    master_weights(models.critic, "bfloat16")
    settings = S(dataclasses.replace(PPO, minibatch_size=2), pad_id=small_tokenizer.pad_token_id)
    rb = make_rollout_batch(trajs, small_tokenizer.pad_token_id)
    with context:
        stats = update(models, optimizers(models, 1e-2), trajs, settings, NonFiniteGuard(3))
        inside = score(models, rb, settings)
    assert stats["optimizer_steps"] == 2
    with master_weights(models.policy, "bfloat16"):
        fresh_scores = score(models, rb, settings)
    assert torch.equal(inside.old_logp, fresh_scores.old_logp)
    assert torch.equal(inside.old_values, fresh_scores.old_values)


# RL-toolbox options whose losses must stay exact under micro-batching: every mode divides
# by the whole minibatch's counts, GSPO's sequence mean needs whole rows in a micro-batch.
EXACT_OPTIONS = {
    "token-mean": {},
    "seq-mean-token-mean": {"loss_agg_mode": "seq-mean-token-mean"},
    "seq-mean-token-sum": {"loss_agg_mode": "seq-mean-token-sum"},
    "seq-mean-token-sum-norm": {
        "loss_agg_mode": "seq-mean-token-sum-norm",
        "loss_scale_factor": 64.0,
    },
    "gspo": {"policy_loss": "gspo", "clip_ratio_low": 0.05, "clip_ratio_high": 0.05},
    "rollout_is": {"rollout_is": "token", "rollout_is_threshold": 1.05},
    "clip-higher": {"clip_ratio_low": 0.1, "clip_ratio_high": 0.28, "clip_ratio_c": 1.5},
}


@pytest.mark.parametrize("option", EXACT_OPTIONS)
def test_micro_batches_give_the_full_batch_gradient(policy, trajs, small_tokenizer, option):
    models = fresh(policy)
    base = dataclasses.replace(PPO, **EXACT_OPTIONS[option])
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id, cfg=base, gap=0.1)
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = torch.tensor([2, 0, 3, 1])
    grads = []
    longest = int(rb.batch.seq_lens.max())
    # rows, then tokens (ppo.micro_batch_tokens): one row a pass, and passes of up to two rows
    splits = [{"micro_batch_size": m} for m in (4, 2, 1)] + [
        {"micro_batch_size": 4, "micro_batch_tokens": t} for t in (1, 2 * longest)
    ]
    for split in splits:
        cfg = dataclasses.replace(base, minibatch_size=4, **split)
        metrics, finite = accumulate_gradients(models, rb.batch, targets, rows, S(cfg))
        assert finite
        mods = [models.policy, models.critic]
        grads.append(([p.grad.clone() for m in mods for p in m.parameters()], metrics))
        for m in mods:
            m.zero_grad(set_to_none=True)
    (full, full_metrics), *rest = grads
    assert float(full_metrics["clip_frac"]) > 0  # the clip is exercised
    # float32 sums in another order: token sums per trajectory (seq-mean-token-sum) give
    # gradients ~30x a token mean's, and so ~30x its rounding.
    atol = 3e-5 if option == "seq-mean-token-sum" else 1e-6
    for micro_grads, metrics in rest:
        for a, b in zip(full, micro_grads, strict=True):
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)
        for k, v in full_metrics.items():
            torch.testing.assert_close(metrics[k], v, atol=1e-6, rtol=1e-4)


def test_token_micro_batches_keep_the_order_and_stay_within_the_budget(trajs, small_tokenizer):
    """`ppo.micro_batch_tokens`: the rows in order, each pass within the budget (rows x the
    length they are cut to) unless one row alone exceeds it, and no pass could take its
    successor's first row without exceeding it."""
    from mem1_core.rl.batch import cut_length, micro_batches

    batch = make_rollout_batch(trajs, small_tokenizer.pad_token_id).batch
    rows = torch.tensor([3, 1, 0, 2, 1, 3, 0])  # rows of several lengths, repeated
    lens = sorted({int(x) for x in batch.seq_lens})
    for budget in (1, lens[0], lens[-1], 2 * lens[-1], 3 * lens[-1] - 1, 10**6):
        for bucket in (1, 8):
            plan = micro_batches(rows, 4, batch, bucket, tokens=budget)
            assert torch.equal(torch.cat([chunk for chunk, _ in plan]), rows)
            for i, (chunk, cut) in enumerate(plan):
                assert cut == cut_length(batch, chunk, bucket)
                assert len(chunk) == 1 or len(chunk) * cut <= budget, (budget, chunk)
                if i + 1 < len(plan):
                    grown = torch.cat([chunk, plan[i + 1][0][:1]])
                    assert len(grown) * cut_length(batch, grown, bucket) > budget
    assert len(micro_batches(rows, 4, batch, tokens=10**6)) == 1
    assert [len(c) for c, _ in micro_batches(rows, 4, batch, tokens=1)] == [1] * len(rows)


def test_token_micro_batches_are_refused_with_fsdp_ranks():
    from mem1_core.config import load_config

    with pytest.raises(ValueError, match="micro_batch_tokens"):
        load_config(
            "smoke",
            overrides=[
                "ppo.micro_batch_tokens=2048",
                "resources.learner_strategy=fsdp",
                "resources.learner_ranks=2",
            ],
        )
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        load_config("smoke", overrides=["ppo.micro_batch_tokens=0"])
    assert (
        load_config("smoke", overrides=["ppo.micro_batch_tokens=2048"]).ppo.micro_batch_tokens
        == 2048
    )


def test_environment_tokens_never_reach_the_loss(policy, trajs, small_tokenizer):
    models = fresh(policy)
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id)
    env = ~targets.loss_mask
    out = forward_tree(models.policy, rb.batch, ATTN, with_entropy=True)
    values = models.critic(rb.batch, ATTN)
    n = targets.loss_mask.sum()
    clean, _ = ppo_loss(out.logprobs, out.entropy, values, targets, S(), n)

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
        poison(out.logprobs), poison(out.entropy), poison(values), dirty_targets, S(), n
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
    again, _ = estimate_advantages(rb, shifted, S())
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
    settings = S(pad_id=small_tokenizer.pad_token_id)
    before = params(models)
    stats = update(models, opts, trajs, settings, guard)
    assert (stats["skipped_steps"], stats["optimizer_steps"], guard.total) == (1, 0, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))
    assert all(p.grad is None for p in models.policy.parameters())
    poison[0] = False  # a finite step resets the run of failures and moves the weights
    stats = update(models, opts, trajs, settings, guard)
    assert (stats["optimizer_steps"], guard.in_row, guard.total) == (1, 0, 1)
    assert not all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))
    poison[0] = True
    update(models, opts, trajs, settings, guard)
    after_one = params(models)
    with pytest.raises(NonFiniteError, match="2 updates in a row.*max_nonfinite_in_row=2"):
        update(models, opts, trajs, settings, guard)
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
        S(PPO, pad_id=small_tokenizer.pad_token_id),
        guard,
    )
    handle.remove()
    assert (stats["skipped_steps"], guard.total) == (1, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))


def test_a_grpo_step_lowers_the_surrogate_and_favours_rewarded_samples(
    policy, trajs, small_tokenizer
):
    models = fresh(policy, critic=False)
    cfg = dataclasses.replace(
        PPO,
        kl_coef=0.0,
        entropy_coef=0.0,
        minibatch_size=4,
        micro_batch_size=4,
        adv_estimator="grpo",
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
        S(cfg, pad_id=small_tokenizer.pad_token_id),
        NonFiniteGuard(3),
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
    # Activation checkpointing (the GPU path) recomputes each layer in backward; the PPO
    # gradient (policy and critic) must not change. It must also really be on: the MLP of a
    # checkpointed layer runs twice per micro-batch (forward, then the recompute).
    from mem1_core.models.model import enable_gradient_checkpointing, is_checkpointing

    models = fresh(policy)
    rb, targets = prepared(models, trajs, small_tokenizer.pad_token_id)
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = torch.tensor([2, 0, 3, 1])
    metrics, _ = accumulate_gradients(models, rb.batch, targets, rows, S())
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
    again, _ = accumulate_gradients(checkpointed, rb.batch, targets, rows, S())
    del mlp.forward
    assert calls[0] == 2 * len(rows) // PPO.micro_batch_size
    for a, b in zip(plain, _grads(checkpointed), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for k, v in metrics.items():
        torch.testing.assert_close(again[k], v, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # no gradient, no checkpointing: scoring is unchanged
        torch.testing.assert_close(
            score(checkpointed, rb, S()).old_values, targets.old_values, atol=1e-5, rtol=0
        )


def test_sequence_bucketing_changes_no_logprob_value_or_gradient(policy, trajs, small_tokenizer):
    # Padding L to a multiple of seq_bucket (so a compiled FlexAttention sees few
    # lengths) is invisible: padding is its own tree node that no real token attends to.
    models = fresh(policy)
    pad = small_tokenizer.pad_token_id
    plain = make_rollout_batch(trajs, pad)
    bucketed = make_rollout_batch(trajs, pad, seq_bucket=64)
    length = plain.batch.input_ids.shape[1]
    assert bucketed.batch.input_ids.shape[1] % 64 == 0
    assert bucketed.batch.input_ids.shape[1] > length
    t1 = score(models, plain, S())
    t2 = score(models, bucketed, S(seq_bucket=64))
    for name in ("old_logp", "ref_logp", "old_values"):
        a, b = getattr(t1, name), getattr(t2, name)
        torch.testing.assert_close(b[:, :length], a, atol=1e-5, rtol=0)
        assert (b[:, length:] == 0).all()
    t1, _ = estimate_advantages(plain, t1, S())
    t2, _ = estimate_advantages(bucketed, t2, S())
    rows = torch.tensor([2, 0, 3, 1])
    m1, _ = accumulate_gradients(models, plain.batch, t1, rows, S())
    g1 = _grads(models)
    for m in (models.policy, models.critic):
        m.zero_grad(set_to_none=True)
    m2, _ = accumulate_gradients(models, bucketed.batch, t2, rows, S(seq_bucket=64))
    for a, b in zip(g1, _grads(models), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for k, v in m1.items():
        torch.testing.assert_close(m2[k], v, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flex_learner_on_cuda_equals_the_dense_cpu_learner(trajs, small_tokenizer):
    # The learner's GPU path: FlexAttention (BlockMask), activation checkpointing
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
    t_gpu = score(gpu, rb_gpu, S(attn="flex_attention", seq_bucket=128))
    length = rb.batch.input_ids.shape[1]
    for name in ("old_logp", "ref_logp", "old_values"):
        got = getattr(t_gpu, name)[:, :length].cpu()
        torch.testing.assert_close(got, getattr(targets, name), atol=1e-4, rtol=0)
    t_gpu, _ = estimate_advantages(rb_gpu, t_gpu, S())
    with torch.no_grad():  # move away from the old policy so ratios differ from 1
        for a, b in zip(cpu.policy.parameters(), gpu.policy.parameters(), strict=True):
            a.add_(0.05 * torch.randn_like(a))
            b.copy_(a)
    rows = torch.tensor([2, 0, 3, 1])
    accumulate_gradients(cpu, rb.batch, targets, rows, S())
    accumulate_gradients(
        gpu, rb_gpu.batch, t_gpu, rows.cuda(), S(attn="flex_attention", seq_bucket=128)
    )
    for a, b in zip(_grads(cpu), _grads(gpu), strict=True):
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-3)


# ------------------------------------------- the RL-toolbox options, through the config

# The test's PPO settings as `--set` overrides on the smoke profile, so each option below
# reaches the update as a user's `--set` does (config -> Learner.update -> update).
BASE_SET = [
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=2",
    "ppo.ppo_epochs=2",
    "ppo.kl_coef=0.01",
    "ppo.entropy_coef=0.01",
]
CRITIC_FREE = ("rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_mean")
OPTIONS = {
    **{est: [f"ppo.adv_estimator={est}"] for est in CRITIC_FREE},
    **{mode: [f"ppo.loss_agg_mode={mode}"] for mode in EXACT_OPTIONS if mode.startswith("seq")},
    "clip-higher": ["ppo.clip_ratio_low=0.1", "ppo.clip_ratio_high=0.28"],
    "no-dual-clip": ["ppo.clip_ratio_c=null"],
    "rollout_is-token": ["ppo.rollout_is=token", "ppo.rollout_is_threshold=1.5"],
    "rollout_is-sequence": ["ppo.rollout_is=sequence"],
    "kl_ctrl-adaptive": ["ppo.kl_ctrl=adaptive", "ppo.target_kl=0.05", "ppo.kl_horizon=10"],
    "gspo": ["ppo.policy_loss=gspo", "ppo.adv_estimator=grpo"],
}


def _learner(cfg, models, tokenizer):
    """A mem1_core.training.learner.Learner around these models, as its constructor would
    leave it (which would also build models and read a run directory's tokenizer)."""
    import contextlib

    from mem1_core.rl.passes import LOCAL
    from mem1_core.training.learner import Learner

    learner = Learner.__new__(Learner)
    learner.cfg, learner.models, learner.tokenizer = cfg, models, tokenizer
    learner.optimizers = optimizers(models, 1e-3)
    learner.guard, learner.kl_coef = NonFiniteGuard(3), cfg.ppo.kl_coef
    learner.split, learner.autocast = LOCAL, contextlib.nullcontext()
    return learner


@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_reaches_the_update_through_the_config(option, policy, trajs, small_tokenizer):
    from mem1_core.config import load_config
    from mem1_core.rl.estimators import get_estimator
    from mem1_core.rl.kl_control import adaptive_kl_coef

    cfg = load_config("smoke", None, [*BASE_SET, *OPTIONS[option]])
    models = fresh(policy, critic=get_estimator(cfg.ppo.adv_estimator).uses_critic)
    learner = _learner(cfg, models, small_tokenizer)
    before = params(models)
    stats = learner.update(trajs, 0)
    assert stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, params(models), strict=True))
    assert ("vf_loss" in stats) == (cfg.ppo.adv_estimator == "gae")
    assert ("dual_clip_frac" in stats) == (option not in ("no-dual-clip", "gspo"))
    assert ("seq_ratio_dev" in stats) == (option == "gspo")
    assert ("rollout_is_mean" in stats) == option.startswith("rollout_is")
    if option.startswith("rollout_is"):  # same weights, same numerics: w = 1, none truncated
        assert stats["rollout_is_threshold"] == cfg.ppo.rollout_is_threshold
        assert stats["rollout_is_truncated_frac"] == 0.0
        assert stats["rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    if get_estimator(cfg.ppo.adv_estimator).whiten:
        assert abs(stats["advantage_mean"]) < 1e-5  # whitened over the batch
    assert stats["kl_coef"] == 0.01  # the coefficient this update used
    if option == "kl_ctrl-adaptive":  # the next one, from this batch's KL (0: policy = ref)
        want = adaptive_kl_coef(0.01, stats["kl_ctrl_measured"], len(trajs), 0.05, 10)
        assert learner.kl_coef == pytest.approx(want) and learner.kl_coef < 0.01
    else:
        assert learner.kl_coef == 0.01


@pytest.mark.parametrize(
    "option", ["token-mean", "seq-mean-token-sum-norm", "gspo", "rollout_is", "clip-higher"]
)
def test_ppo_loss_wires_the_config_into_the_pure_losses(policy, trajs, small_tokenizer, option):
    from mem1_core.rl.losses import POLICY_LOSSES, LossAgg, clipped_value_loss, entropy_bonus

    cfg = dataclasses.replace(PPO, **EXACT_OPTIONS[option])
    models = fresh(policy)
    rb, t = prepared(models, trajs, small_tokenizer.pad_token_id, cfg=cfg, gap=0.1)
    out = forward_tree(models.policy, rb.batch, ATTN, with_entropy=True)
    logp = out.logprobs + 0.05 * torch.randn(out.logprobs.shape)  # ratios away from 1
    values = models.critic(rb.batch, ATTN)
    agg = LossAgg.of(t.loss_mask, cfg.loss_agg_mode, cfg.loss_scale_factor)
    got, _ = ppo_loss(logp, out.entropy, values, t, S(cfg), agg)
    low, high = cfg.clip_range
    pg, _ = POLICY_LOSSES[cfg.policy_loss](
        logp,
        t.old_logp,
        t.advantages,
        t.loss_mask,
        low,
        clip_eps_high=high,
        dual_clip=cfg.clip_ratio_c,
        is_weights=t.is_weights,
        normalizer=agg,
    )
    vf, _ = clipped_value_loss(
        values, t.old_values, t.returns, t.loss_mask, cfg.value_clip_eps, normalizer=agg
    )
    ent = entropy_bonus(out.entropy, t.loss_mask, agg)
    torch.testing.assert_close(got, pg + vf - cfg.entropy_coef * ent)
    assert (t.is_weights is not None) == (option == "rollout_is")
    if option == "rollout_is":  # a 0.1 gap and a cap of 1.05: some weights truncated
        assert (t.is_weights[t.loss_mask] == 1.05).any()
