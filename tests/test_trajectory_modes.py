"""The three ways to score a pruned trajectory (`trajectory.mode`), each against an independent
definition, on hand-built MEM1 trajectories (the prompt, then per turn the carried part of the
last turn's generation and its `<info>`) scored by a tiny model built from config:

- `turns`: each row's log-probs equal a re-run of that turn's real context alone; its
  advantages and returns equal the tree's given the same values, for every estimator, and
  equal the GAE recursion written out here across the rows; its PPO gradient equals the
  tree's; the single learner (through the config), SFT and two FSDP ranks (gloo) take it.
- `concat`: equals one plain causal forward over the concatenation built here by hand, and
  differs from the rollout's log-probs from the first pruned turn on (not before).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import socket

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

from mem1_core.config import PPOConfig, load_config
from mem1_core.rl.batch import Models, Targets, make_rollout_batch
from mem1_core.rl.critic import Critic
from mem1_core.rl.estimators import ESTIMATORS, get_estimator
from mem1_core.rl.passes import (
    LOCAL,
    NonFiniteGuard,
    UpdateSettings,
    accumulate_gradients,
    score,
)
from mem1_core.rl.ppo import estimate_advantages, update
from mem1_core.trajectory.logprobs import forward_tree, logprob_tolerance, per_turn_logprobs
from mem1_core.trajectory.modes import get_mode, mode_rows
from mem1_core.trajectory.record import (
    Action,
    SegmentKind,
    SegmentRef,
    Trajectory,
    Turn,
    turn_paths,
)

VOCAB = 200
PAD = VOCAB - 1
TOL = logprob_tolerance(2)
PPO = PPOConfig(
    minibatch_size=8,
    micro_batch_size=4,
    ppo_epochs=1,
    kl_coef=0.05,
    kl_kind="k1",
    entropy_coef=0.01,
    gamma=0.9,  # below 1, so how the chain runs across rows matters
    lam=0.8,
    actor_lr=1e-3,
    critic_lr=1e-3,
)


def tiny_lm(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True,
        initializer_range=0.2,  # a model whose log-probs depend clearly on the context
    )  # fmt: skip
    return Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa").float().eval()


def models_for(lm: Qwen2ForCausalLM, critic: bool) -> Models:
    """A copy of the policy, a reference that differs from it (a KL to penalise), a critic
    whose values vary per token."""
    lm = copy.deepcopy(lm)
    reference = copy.deepcopy(lm).requires_grad_(False)
    with torch.no_grad():
        torch.manual_seed(1)
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    value = None
    if critic:
        value = Critic.from_policy(lm).eval()
        torch.manual_seed(2)
        torch.nn.init.normal_(value.value_head.weight, std=0.5)
    return Models(lm, reference, value)


def hand_trajectories(lm, memory: str = "mem1", n: int = 4, seed: int = 0) -> list[Trajectory]:
    """n trajectories of 1 to 4 turns (two per task group, one rewarded), contexts built as
    the `memory` policy builds them (mem1: the prompt, the last turn's generation from offset 2
    on, its info; full: everything); recorded log-probs are the model's own (each turn re-run)."""
    rng = random.Random(seed)

    def ids(lo: int, hi: int) -> list[int]:
        return [rng.randrange(VOCAB - 1) for _ in range(rng.randint(lo, hi))]

    out = []
    for k in range(n):
        traj = Trajectory(
            task_id=f"task{k // 2}",
            memory=memory,
            prompt_ids=ids(10, 14),
            golden_answers=[["a"], ["b"]],
            group=k // 2,
            sample=k % 2,
        )
        for t in range(1 + (k + 1) % 4):
            ctx = [SegmentRef(SegmentKind.PROMPT)]
            if t and memory == "mem1":
                ctx += [SegmentRef(SegmentKind.GEN, t - 1, 2), SegmentRef(SegmentKind.INFO, t - 1)]
            elif t:
                for j in range(t):
                    ctx += [SegmentRef(SegmentKind.GEN, j), SegmentRef(SegmentKind.INFO, j)]
            traj.turns.append(Turn(ctx, ids(4, 7), [], Action.QUERY, info_ids=ids(5, 8)))
        for turn, logp in zip(traj.turns, per_turn_logprobs(lm, turn_paths(traj)), strict=True):
            turn.gen_logprobs = logp.tolist()
        traj.em = [1.0, 1.0] if k % 2 == 0 else [0.0, 1.0]
        out.append(traj)
    return out


def by_token(rb, x: torch.Tensor) -> dict[tuple[int, int, int], float]:
    """{(trajectory, turn, offset): x there} over the batch's generated tokens."""
    mask = rb.batch.loss_mask
    out = {}
    for r, c in mask.nonzero().tolist():
        key = (int(rb.trajectory[r]), int(rb.batch.gen_turn[r, c]), int(rb.batch.gen_offset[r, c]))
        out[key] = float(x[r, c])
    return out


def moved(rb, values: dict[tuple[int, int, int], float]) -> torch.Tensor:
    """The inverse of by_token: (B, L) with `values` at the batch's generated tokens."""
    out = torch.zeros(rb.batch.loss_mask.shape)
    for r, c in rb.batch.loss_mask.nonzero().tolist():
        key = (int(rb.trajectory[r]), int(rb.batch.gen_turn[r, c]), int(rb.batch.gen_offset[r, c]))
        out[r, c] = values[key]
    return out


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


@pytest.fixture(scope="module")
def trajs(lm):
    return hand_trajectories(lm)


# ---- turns: the rows ---------------------------------------------------------------------


def test_each_turn_row_is_that_turns_real_context_rerun(lm, trajs):
    rb = make_rollout_batch(trajs, PAD, mode="turns")
    assert rb.batch.input_ids.shape[0] == sum(len(t.turns) for t in trajs)
    logp = forward_tree(lm, rb.batch, "sdpa").logprobs
    row = 0
    for k, traj in enumerate(trajs):
        definition = per_turn_logprobs(lm, turn_paths(traj))
        for t, turn in enumerate(traj.turns):
            mask = rb.batch.loss_mask[row]
            n = len(traj.context_ids(t)) + len(turn.gen_ids)
            assert int(rb.trajectory[row]) == k and int(rb.batch.seq_lens[row]) == n
            assert rb.batch.input_ids[row, :n].tolist() == traj.context_ids(t) + turn.gen_ids
            assert rb.batch.position_ids[row, :n].tolist() == list(range(n))  # its own positions
            assert rb.batch.gen_turn[row, mask].eq(t).all()
            torch.testing.assert_close(logp[row, mask], definition[t], atol=TOL, rtol=0)
            torch.testing.assert_close(rb.rollout_logp[row, mask], definition[t], atol=TOL, rtol=0)
            row += 1


def test_tree_and_turns_rows_hold_the_same_generated_tokens(trajs):
    tree, turns = (make_rollout_batch(trajs, PAD, mode=m) for m in ("tree", "turns"))
    assert tree.batch.input_ids.shape[0] == len(trajs)
    assert by_token(tree, tree.batch.input_ids) == by_token(turns, turns.batch.input_ids)
    assert by_token(tree, tree.rollout_logp) == by_token(turns, turns.rollout_logp)
    # every context in full: the shared prompt is paid once per turn
    assert int(turns.batch.seq_lens.sum()) > int(tree.batch.seq_lens.sum())


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="tree, turns, concat"):
        load_config("smoke", None, ["trajectory.mode=rows"])
    with pytest.raises(ValueError, match="unknown trajectory mode"):
        mode_rows([], "rows")


# ---- turns: advantages -------------------------------------------------------------------


def scored(models: Models, rb, cfg: PPOConfig) -> Targets:
    return score(models, rb, UpdateSettings.of(cfg, "sdpa"))


@pytest.mark.parametrize("estimator", ESTIMATORS.names)
def test_turns_advantages_equal_the_trees_given_the_same_values(lm, trajs, estimator):
    """The math says: same tokens, rewards and values in the same generation order -> the
    same advantages and returns. The turns rows get the tree's old / reference log-probs and
    values (moved token by token), so the comparison is exact; the turns rows' own scoring
    agrees with the tree's to float rounding."""
    cfg = dataclasses.replace(PPO, adv_estimator=estimator)
    models = models_for(lm, critic=get_estimator(estimator).uses_critic)
    tree, turns = (make_rollout_batch(trajs, PAD, mode=m) for m in ("tree", "turns"))
    tree_t = scored(models, tree, cfg)
    own = scored(models, turns, cfg)
    fields = ["old_logp", "ref_logp"] + (["old_values"] if models.critic is not None else [])
    moved_in = {}
    for name in fields:
        want = by_token(tree, getattr(tree_t, name))
        got = by_token(turns, getattr(own, name))
        assert max(abs(got[k] - want[k]) for k in want) < TOL, name
        moved_in[name] = moved(turns, want)
    turns_t = dataclasses.replace(own, **moved_in)
    settings = UpdateSettings.of(cfg, "sdpa")
    tree_t, tree_rewards = estimate_advantages(tree, tree_t, settings)
    turns_t, turns_rewards = estimate_advantages(turns, turns_t, settings)
    for a, b in (
        (by_token(tree, tree_t.advantages), by_token(turns, turns_t.advantages)),
        (by_token(tree, tree_t.returns), by_token(turns, turns_t.returns)),
        (by_token(tree, tree_rewards), by_token(turns, turns_rewards)),
    ):
        assert a.keys() == b.keys()
        assert max(abs(a[k] - b[k]) for k in a) < 1e-6
    assert any(abs(v) > 1e-3 for v in by_token(turns, turns_t.advantages).values())


def test_turns_gae_is_the_recursion_across_rows_written_out(lm, trajs):
    """GAE by hand, row after row: k1 KL penalty on every generated token, the score on the
    final row's last token, each row's last value bootstrapping from the next row's first,
    0 after the final row; then whitening over all generated tokens (unbiased variance)."""
    models = models_for(lm, critic=True)
    rb = make_rollout_batch(trajs, PAD, mode="turns")
    targets = scored(models, rb, PPO)
    got, _ = estimate_advantages(rb, targets, UpdateSettings.of(PPO, "sdpa"))
    raw, returns = {}, {}
    for k, traj in enumerate(trajs):
        chain = []  # (row, col) of the trajectory's generated tokens, row after row
        for r in torch.nonzero(rb.trajectory == k).squeeze(1).tolist():
            chain += [(r, c) for c in torch.nonzero(rb.batch.loss_mask[r]).squeeze(1).tolist()]
        next_value, running = 0.0, 0.0
        for i in range(len(chain) - 1, -1, -1):
            r, c = chain[i]
            reward = -PPO.kl_coef * float(targets.old_logp[r, c] - targets.ref_logp[r, c])
            if i == len(chain) - 1:
                reward += traj.reward
            value = float(targets.old_values[r, c])
            running = reward + PPO.gamma * next_value - value + PPO.gamma * PPO.lam * running
            raw[r, c], returns[r, c] = running, running + value
            next_value = value
    for (r, c), want in returns.items():
        assert abs(float(got.returns[r, c]) - want) < 1e-5
    values = torch.tensor(list(raw.values()), dtype=torch.float64)
    mean, std = values.mean(), values.std(unbiased=True)
    for (r, c), a in raw.items():
        assert abs(float(got.advantages[r, c]) - float((a - mean) / std)) < 1e-4
    assert len(returns) == int(rb.batch.loss_mask.sum())


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_a_trajectory_without_a_turn_has_no_row_and_the_rest_chain_as_the_tree(
    lm, trajs, estimator
):
    """A trajectory that ended before its first turn: no row under turns (an empty one under
    the tree), its score still counts in its group, and the others' advantages are the tree's."""
    trajs = copy.deepcopy(trajs)
    trajs[0].turns = []
    trajs[1].turns, trajs[2].turns = trajs[1].turns[:2], trajs[2].turns[:1]
    # 0 + 2 + 1 + 1 turns: as many rows as trajectories, yet not one row each
    cfg = dataclasses.replace(PPO, adv_estimator=estimator)
    models = models_for(lm, critic=estimator == "gae")
    tree, turns = (make_rollout_batch(trajs, PAD, mode=m) for m in ("tree", "turns"))
    assert turns.trajectory.tolist() == [1, 1, 2, 3] and not turns.one_row_each
    settings = UpdateSettings.of(cfg, "sdpa")
    tree_t = scored(models, tree, cfg)
    own = scored(models, turns, cfg)
    names = ["old_logp", "ref_logp"] + (["old_values"] if models.critic is not None else [])
    own = dataclasses.replace(
        own, **{n: moved(turns, by_token(tree, getattr(tree_t, n))) for n in names}
    )
    want, _ = estimate_advantages(tree, tree_t, settings)
    got, _ = estimate_advantages(turns, own, settings)
    a, b = by_token(tree, want.advantages), by_token(turns, got.advantages)
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-6


# ---- turns: the update, on every estimator and both learners -----------------------------


def gradients(models: Models) -> list[torch.Tensor]:
    mods = [models.policy] + ([models.critic] if models.critic is not None else [])
    return [p.grad.clone() for m in mods for p in m.parameters() if p.grad is not None]


@pytest.mark.parametrize("estimator", ESTIMATORS.names)
def test_every_estimator_trains_on_turn_rows_with_the_trees_gradient(lm, trajs, estimator):
    """Under token-mean the turns mode is the tree's objective computed row by row: the same
    gradient (to float rounding); and `update` takes an optimiser step on it."""
    cfg = dataclasses.replace(PPO, adv_estimator=estimator)
    critic = get_estimator(estimator).uses_critic
    settings = UpdateSettings.of(cfg, "sdpa")
    grads = {}
    for mode in ("tree", "turns"):
        models = models_for(lm, critic)
        rb = make_rollout_batch(trajs, PAD, mode=mode)
        targets, _ = estimate_advantages(rb, scored(models, rb, cfg), settings)
        accumulate_gradients(models, rb.batch, targets, torch.arange(len(rb.trajectory)), settings)
        grads[mode] = gradients(models)
    assert len(grads["tree"]) == len(grads["turns"]) > 0
    for a, b in zip(grads["tree"], grads["turns"], strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    models = models_for(lm, critic)
    opts = {"policy": torch.optim.AdamW(models.policy.parameters(), lr=1e-3)}
    if critic:
        opts["critic"] = torch.optim.AdamW(models.critic.parameters(), lr=1e-3)
    turns = dataclasses.replace(settings, trajectory_mode="turns")
    stats = update(models, opts, trajs, turns, NonFiniteGuard(3), torch.Generator().manual_seed(0))
    assert stats["optimizer_steps"] == 1 and stats["skipped_steps"] == 0
    assert stats["logp_mismatch_max"] < TOL  # the rows score what the rollout sampled
    assert stats["reward"] == pytest.approx(sum(t.reward for t in trajs) / len(trajs))


def test_the_learner_reads_the_mode_from_the_config(lm, trajs):
    """Learner.update hands `trajectory.mode` to the update: the processed tokens are the
    turn rows' (every context in full), not the tree's."""
    from mem1_core.training.learner import Learner

    tokens = {}
    for mode in ("tree", "turns"):
        cfg = load_config(
            "smoke", None, [f"trajectory.mode={mode}", "ppo.adv_estimator=gae", "ppo.kl_coef=0.05"]
        )
        learner = Learner.__new__(Learner)  # around these models, without building any
        learner.cfg, learner.models = cfg, models_for(lm, critic=True)
        learner.tokenizer = type("Tok", (), {"pad_token_id": PAD})()
        learner.optimizers = {"policy": torch.optim.AdamW(learner.models.policy.parameters())}
        learner.guard, learner.kl_coef = NonFiniteGuard(3), cfg.ppo.kl_coef
        learner.split, learner.autocast = LOCAL, contextlib.nullcontext()
        tokens[mode] = learner.update(trajs, 0)["tree_tokens"]
    rows = {m: make_rollout_batch(trajs, PAD, mode=m) for m in tokens}
    assert tokens == {m: int(rb.batch.seq_lens.sum()) for m, rb in rows.items()}


def test_sft_on_turn_rows_is_the_trees_loss_and_trains(lm, trajs):
    from mem1_core.training.sft import sft_loss, train_on_trajectories

    losses = {}
    for mode in ("tree", "turns", "concat"):
        rows, _ = mode_rows(trajs, mode)
        losses[mode] = float(sft_loss(lm, rows, PAD, "sdpa")[0])
    assert losses["turns"] == pytest.approx(losses["tree"], abs=TOL)
    assert abs(losses["concat"] - losses["tree"]) > 1e-3  # scored with unseen context
    model = copy.deepcopy(lm)
    result = train_on_trajectories(
        model, trajs, PAD, lr=1e-3, batch_size=2, minutes=5, max_steps=2, progress=False,
        trajectory_mode="turns",
    )  # fmt: skip
    assert result.steps == 2
    moved_any = any(
        not torch.equal(a, b) for a, b in zip(model.parameters(), lm.parameters(), strict=True)
    )
    assert moved_any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_worker(rank: int, world: int, port: int) -> None:
    """Two gloo ranks score and backpropagate a turns-mode batch through the FSDP hook
    (RankSplit); their targets and summed gradients equal the single learner's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from mem1_core.training.fsdp import shard_critic, shard_policy
    from mem1_core.training.fsdp_learner import Rank, RankSplit

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        lm = tiny_lm()
        trajs = hand_trajectories(lm)
        models = models_for(lm, critic=True)
        rb = make_rollout_batch(trajs, PAD, mode="turns")
        rows = torch.arange(len(rb.trajectory))
        single = UpdateSettings.of(PPO, "sdpa")
        ref_models = Models(
            copy.deepcopy(models.policy), models.reference, copy.deepcopy(models.critic)
        )
        want, _ = estimate_advantages(rb, scored(ref_models, rb, PPO), single)
        accumulate_gradients(ref_models, rb.batch, want, rows, single)
        mesh = init_device_mesh("cpu", (world,))
        sharded = Models(
            shard_policy(models.policy, mesh),
            shard_policy(models.reference, mesh),
            shard_critic(models.critic, mesh),
        )
        split = RankSplit(me=Rank(rank, world))
        settings = dataclasses.replace(single, split=split, trajectory_mode="turns")
        got, _ = estimate_advantages(rb, score(sharded, rb, settings), settings)
        for name in ("old_logp", "ref_logp", "old_values", "advantages", "returns"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-5, rtol=0)
        accumulate_gradients(sharded, rb.batch, got, rows, settings)
        for mod, ref in ((sharded.policy, ref_models.policy), (sharded.critic, ref_models.critic)):
            ref_grads = [p.grad for p in ref.parameters()]
            for p, g in zip(mod.parameters(), ref_grads, strict=True):
                torch.testing.assert_close(p.grad.full_tensor(), g, atol=1e-6, rtol=1e-4)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_fsdp_ranks_train_turn_rows_as_the_single_learner():
    import torch.multiprocessing as mp

    pytest.importorskip("torch.distributed.fsdp")
    mp.spawn(_fsdp_worker, args=(2, _free_port()), nprocs=2, join=True)


# ---- concat ------------------------------------------------------------------------------


def test_concat_is_one_causal_pass_over_the_concatenation(lm, trajs):
    """The definition, built here: prompt, then each turn's generation and info, in order;
    one plain causal forward with positions 0..; a generated token's log-prob from the
    logits one place before it."""
    rb = make_rollout_batch(trajs, PAD, mode="concat")
    assert rb.batch.input_ids.shape[0] == len(trajs)
    logp = by_token(rb, forward_tree(lm, rb.batch, "sdpa").logprobs)
    assert not get_mode("concat").exact
    for k, traj in enumerate(trajs):
        ids, where = list(traj.prompt_ids), {}
        for t, turn in enumerate(traj.turns):
            where.update({(k, t, o): len(ids) + o for o in range(len(turn.gen_ids))})
            ids += turn.gen_ids + (turn.info_ids if t < len(traj.turns) - 1 else [])
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([ids])).logits[0].float()
        every = F.log_softmax(logits, -1)
        n = int(rb.batch.seq_lens[k])
        assert rb.batch.input_ids[k, :n].tolist() == ids
        assert rb.batch.position_ids[k, :n].tolist() == list(range(n))  # global positions
        for key, at in where.items():
            assert abs(logp[key] - float(every[at - 1, ids[at]])) < TOL


def test_concat_departs_from_the_rollout_once_a_turn_was_pruned(lm, trajs):
    rb = make_rollout_batch(trajs, PAD, mode="concat")
    learner = by_token(rb, forward_tree(lm, rb.batch, "sdpa").logprobs)
    rollout = by_token(rb, rb.rollout_logp)
    gap: dict[int, float] = {}
    for key, lp in learner.items():
        gap[key[1]] = max(gap.get(key[1], 0.0), abs(lp - rollout[key]))
    assert gap[0] < TOL  # turn 0 ran on the prompt alone: the concatenation's prefix
    assert all(gap[t] > 1e-3 for t in gap if t > 0)  # later turns read what was pruned


def test_concat_of_a_full_context_trajectory_is_its_tree(lm):
    """Nothing pruned: the concatenation is the full-context agent's chain, token for token."""
    trajs = hand_trajectories(lm, memory="full")
    concat, tree = (make_rollout_batch(trajs, PAD, mode=m) for m in ("concat", "tree"))
    for name in ("input_ids", "position_ids", "prev_index", "loss_mask", "gen_turn"):
        assert torch.equal(getattr(concat.batch, name), getattr(tree.batch, name)), name
