"""FSDP2 for the learner (mem1_core.training.fsdp, mem1_core.training.fsdp_learner), on CPU with two
gloo ranks. The sharding: each rank runs its half of a batch of trees through the sharded
policy and critic; the summed gradients, the gradient norm, one AdamW step and the full
state dict equal those of the unsharded models on the whole batch. The learner group (two
Ray actors): one PPO update, with a critic (gae) and without (grpo), gives the single
learner's weights on the same trajectories; a checkpoint restores the group exactly and
reads as a single learner's; and `train_rl` trains, checkpoints and resumes with it. The
CUDA path (NCCL, bf16 compute over float32 master weights) is the same code with another
mesh and `param_dtype`."""

from __future__ import annotations

import copy
import json
import os
import random
import socket
from pathlib import Path

import pytest
import torch

VOCAB = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mem1_core.rl.critic import Critic

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True,
    )  # fmt: skip
    lm = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    critic = Critic.from_policy(lm)
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # values vary per token
    return lm, critic.eval()


def _batch():
    from mem1_core.trajectory.tree import Segment, collate, flatten

    rng = random.Random(0)

    def ids(n):
        return tuple(rng.randrange(VOCAB - 1) for _ in range(rng.randint(n // 2, n)))

    trees = []
    for _ in range(4):  # MEM1-shaped: prompt, then per turn the last gen + info and a new gen
        prompt, gens, infos = ids(16), [ids(8) for _ in range(3)], [ids(10) for _ in range(3)]
        paths = []
        for t in range(3):
            ctx = [Segment(("p",), prompt, False)]
            if t:
                ctx += [
                    Segment(("g", t - 1), gens[t - 1], False),
                    Segment(("i", t - 1), infos[t - 1], False),
                ]
            paths.append([*ctx, Segment(("g", t), gens[t], True)])
        trees.append(flatten(paths))
    return collate(trees, VOCAB - 1)  # fmt: skip


def _loss(out_logp, values, batch, n):
    # A PPO-shaped objective: log-probs and values at generated tokens, / the whole batch's count.
    return ((out_logp + 0.5 * values.pow(2)) * batch.loss_mask).sum() / n


def _worker(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from mem1_core.rl.batch import select_rows
    from mem1_core.training.fsdp import full_state_dict, rank_rows, shard_critic, shard_policy
    from mem1_core.trajectory.logprobs import forward_tree, tree_attention_mask

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        lm, critic = _models()
        batch = _batch()
        n = batch.loss_mask.sum()
        # The definition: unsharded models, whole batch.
        ref_lm, ref_critic = copy.deepcopy(lm), copy.deepcopy(critic)
        mask = tree_attention_mask(batch, "sdpa", torch.float32)
        logp = forward_tree(ref_lm, batch, "sdpa", mask=mask).logprobs
        _loss(logp, ref_critic(batch, "sdpa", mask=mask), batch, n).backward()
        ref_params = list(ref_lm.parameters()) + list(ref_critic.parameters())
        ref_grads = {**{f"lm.{k}": p.grad.clone() for k, p in ref_lm.named_parameters()},
                     **{f"critic.{k}": p.grad.clone() for k, p in ref_critic.named_parameters()}}  # fmt: skip
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_params, 1e-3)
        torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.0).step()

        mesh = init_device_mesh("cpu", (world,))
        policy, sharded_critic = shard_policy(lm, mesh), shard_critic(critic, mesh)
        mine = rank_rows(torch.arange(batch.input_ids.shape[0]), rank, world)
        mb = select_rows(batch, mine, batch.input_ids.shape[1])
        mmask = tree_attention_mask(mb, "sdpa", torch.float32)
        out = policy(mb, "sdpa", mask=mmask)
        _loss(out.logprobs, sharded_critic(mb, "sdpa", mask=mmask), mb, n).backward()
        grads = {**{k: p.grad for k, p in policy.named_parameters()},
                 **{f"critic.{k}": p.grad for k, p in sharded_critic.named_parameters()}}  # fmt: skip
        assert grads.keys() == ref_grads.keys()
        for k, g in grads.items():
            torch.testing.assert_close(g.full_tensor(), ref_grads[k], atol=1e-6, rtol=1e-5, msg=k)
        params = list(policy.parameters()) + list(sharded_critic.parameters())
        norm = torch.nn.utils.clip_grad_norm_(params, 1e-3)
        torch.testing.assert_close(norm.full_tensor(), ref_norm, atol=1e-6, rtol=1e-5)
        torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0).step()
        for sharded, ref in ((policy, ref_lm), (sharded_critic, ref_critic)):
            state = full_state_dict(sharded)  # on rank 0 only
            if rank:
                assert state == {}
                continue
            assert state.keys() == ref.state_dict().keys()  # the keys a rollout worker loads
            for k, v in ref.state_dict().items():
                torch.testing.assert_close(state[k], v, atol=1e-6, rtol=1e-5, msg=k)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_fsdp_ranks_give_the_unsharded_gradient_step_and_weights():
    import torch.multiprocessing as mp

    pytest.importorskip("torch.distributed.fsdp")
    mp.spawn(_worker, args=(2, _free_port()), nprocs=2, join=True)


# ---- the learner group ---------------------------------------------------------------------

GROUP = [
    "resources.learner_cpus=1",  # one torch thread per rank
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=1",  # 5 trajectories: uneven shares, and rank 1 runs stand-ins
    "ppo.ppo_epochs=1",
    "ppo.actor_lr=1e-3",
    "ppo.critic_lr=1e-3",
    "ppo.kl_coef=0.01",
    "ppo.entropy_coef=0.05",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]
FSDP = ["resources.learner_strategy=fsdp", "resources.learner_ranks=2"]


def _config(*extra: str):
    from mem1_core.config import load_config

    return load_config("smoke", None, [*GROUP, *extra])


@pytest.fixture(scope="module")
def ray_session():
    """One private Ray for this module's groups and runs (train_rl then does not own it)."""
    ray = pytest.importorskip("ray")
    from mem1_core.training.ray_start import start_ray

    owns = start_ray(_config(*FSDP).resources)
    yield
    if owns:
        ray.shutdown()


@pytest.fixture(scope="module")
def rolled(tmp_path_factory):
    """A prepared run directory and 5 trajectories of the initial policy (3 tasks x 2
    samples, the last dropped), the first sample of each task declared right so that the
    advantages are not all zero."""
    from mem1_core.domains.inputs import load_tasks, prepare
    from mem1_core.training.workers import RolloutWorker

    cfg = _config()
    root = tmp_path_factory.mktemp("fsdp_run")
    paths = prepare(cfg, root)
    tasks = load_tasks(cfg, paths, "train", cfg.data.train_objectives)[:3]
    trajs = RolloutWorker(cfg, str(root)).rollout(tasks, seed=0, samples_per_task=2)[:5]
    for t in trajs:
        t.em = [float(t.sample == 0)] * len(t.em)
    return root, trajs


def _on_all(ranks, method, *args):
    import ray

    return ray.get([getattr(r, method).remote(*args) for r in ranks])


ADAM_NOISE = 1e-4
"""Weights after AdamW steps at lr 1e-3 agree to lr / 10, not to float precision: Adam's
first step moves a weight by about lr * g / (|g| + eps), so where a gradient entry is near
eps (embedding rows of tokens seen only in a context) a float-level difference of the
forward (the group's one-pass mask against the single learner's shared prefix) shows as a
fraction of lr: the single learner against itself with the one-pass mask differs by 5e-5
(measured). A wrong gradient moves weights by ~2 lr; gradient norms and losses are
compared to 1e-4 relative besides (their float32 sums are off by ~1e-5 either way)."""


def _assert_same_weights(got, want, atol=ADAM_NOISE):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=atol, msg=k)


def test_every_rank_runs_as_many_micro_batches():
    from mem1_core.training.fsdp_learner import Rank, rank_micro_batches
    from mem1_core.trajectory.tree import Segment, collate, flatten

    trees = [flatten([[Segment(("p",), (1,) * (3 + i), True)]]) for i in range(5)]
    batch = collate(trees, 0)
    for rows, size in (([4, 0, 2], 1), ([3], 2), ([1, 2, 3, 4, 0], 2)):
        rows = torch.tensor(rows)
        plans = [rank_micro_batches(rows, size, batch, 1, Rank(r, 2)) for r in range(2)]
        assert len(plans[0]) == len(plans[1])  # the same passes on every rank
        real = [m for plan in plans for m, _, is_real in plan if is_real]
        assert sorted(torch.cat(real).tolist()) == sorted(rows.tolist())  # each row once
        for plan in plans:
            for m, n, _ in plan:
                assert len(m) <= size and n == int(batch.seq_lens[m].max())


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_the_fsdp_group_updates_saves_and_restores_as_the_single_learner(
    estimator, rolled, ray_session
):
    import ray

    from mem1_core.rl.critic import Critic
    from mem1_core.training.checkpoint import TrainState, read_state
    from mem1_core.training.fsdp_learner import start_learner_group
    from mem1_core.training.learner import Learner

    root, trajs = rolled
    est = f"ppo.adv_estimator={estimator}"
    single = Learner(_config(est), str(root), None, threads=1)
    before = {k: v.clone() for k, v in single.get_weights().items()}  # on CPU: not copies
    want = single.update(trajs, 0)
    want_weights = single.get_weights()
    ranks = start_learner_group(_config(*FSDP, est), str(root), None)
    try:
        got = _on_all(ranks, "update", trajs, 0)[0]
        weights, nothing = _on_all(ranks, "get_weights")
        assert nothing == {}  # rank 0 hands the weights out
        _assert_same_weights(weights, want_weights)
        assert any(not torch.equal(weights[k], before[k]) for k in before)  # it did move
        assert got["optimizer_steps"] == want["optimizer_steps"] == 2
        assert got["skipped_steps"] == 0 and got["gen_tokens"] == want["gen_tokens"]
        norms = [k for k in want if k.endswith("_grad_norm")]
        assert norms == ["policy_grad_norm"] + (["critic_grad_norm"] if estimator == "gae" else [])
        for k in [*norms, "pg_loss", "approx_kl", "entropy", "reward", "advantage_mean"]:
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k

        # A checkpoint in the single learner's files: what --init and evaluation read.
        path = Path(_on_all(ranks, "save", TrainState(1, 2.0, {"init": None}))[0])
        assert read_state(path).extra["learner_strategy"] == "fsdp"
        warm = Learner(_config(est), str(root), str(path / "policy"), threads=1)
        _assert_same_weights(warm.get_weights(), weights, atol=0.0)
        if estimator == "gae":
            critic = Critic.load(path / "critic").state_dict()
            _assert_same_weights(critic, warm.models.critic.state_dict(), atol=0.0)
        with pytest.raises(ValueError, match="learner_strategy=fsdp"):
            warm.restore(str(path))  # its optimiser state is keyed for the group

        # Resume: back to the checkpoint, the next update is the same as without the stop.
        _on_all(ranks, "update", trajs, 1)
        after = _on_all(ranks, "get_weights")[0]
        state = _on_all(ranks, "restore", str(path))[0]
        assert state == TrainState(1, 2.0, read_state(path).extra)
        _assert_same_weights(_on_all(ranks, "get_weights")[0], weights, atol=0.0)
        _on_all(ranks, "update", trajs, 1)
        _assert_same_weights(_on_all(ranks, "get_weights")[0], after, atol=0.0)

        if estimator == "grpo":  # NaN advantages in one group: some ranks' losses only
            bad = copy.deepcopy(trajs)
            bad[0].em = [float("nan")] * len(bad[0].em)
            want, got = single.update(bad, 2), _on_all(ranks, "update", bad, 2)[0]
            assert got["skipped_steps"] == want["skipped_steps"] >= 1  # all ranks skip alike
            assert got["optimizer_steps"] == want["optimizer_steps"]
            assert got["nonfinite_total"] == want["nonfinite_total"] == want["skipped_steps"]
    finally:
        for r in ranks:
            ray.kill(r)


@pytest.mark.slow
def test_train_rl_with_an_fsdp_learner_trains_checkpoints_and_resumes(
    tmp_path, monkeypatch, ray_session
):
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.model import load_model
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.checkpoint import read_state
    from mem1_core.training.train_rl import train_rl

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    run = [*FSDP, "ppo.tasks_per_iteration=4", "ppo.minutes=60", "ppo.checkpoint_every=1"]
    first = train_rl(_config(*run, "ppo.iterations=1"), out, use_ray=True, show=False)
    assert first["iterations"] == 1 and first["checkpoint"].endswith("iter_000001")
    ckpt = Path(first["checkpoint"])
    assert read_state(ckpt).extra["learner_strategy"] == "fsdp"
    cfg = _config(*run, "ppo.iterations=2")
    load_model(ckpt / "policy", cfg.model, ensure_tokenizer(cfg, RunPaths(out)))  # loads alone

    second = train_rl(cfg, out, resume=True, use_ray=True, show=False)
    assert second["iterations"] == 2 and second["checkpoint"].endswith("iter_000002")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(r["train/optimizer_steps"] == 1 and r["train/skipped_steps"] == 0 for r in rows)
    # The resumed workers sampled with the restored group's weights.
    assert rows[1]["train/logp_mismatch_max"] < 1e-4


def test_impossible_fsdp_settings_fail_with_the_way_out(tmp_path):
    from mem1_core.config import load_config
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.actor_start import start_runtime

    cfg = load_config("smoke", None, FSDP)
    assert cfg.resources.learner_world == 2 and load_config("smoke").resources.learner_world == 1
    with pytest.raises(ValueError, match="Ray"):
        start_runtime(cfg, RunPaths(tmp_path), init=None, use_ray=False)
    for overrides, message in (
        (["resources.learner_strategy=fsdp", "resources.learner_gpus=1"], "one rank"),
        (["resources.learner_strategy=fsdp", "resources.learner_ranks=1"], "one rank"),
        (
            [
                "resources.learner_strategy=fsdp",
                "resources.learner_gpus=4",
                "resources.learner_ranks=2",
            ],
            "one GPU",
        ),
        (["resources.learner_ranks=2"], "learner_strategy=fsdp"),
    ):
        with pytest.raises(ValueError, match=message):
            load_config("smoke", None, overrides)


def test_an_fsdp_updates_phase_timers_are_its_slowest_ranks_with_the_spread():
    """Every rank times its own phases; the collective waits for the slowest, so the
    iteration's timer is the maximum over ranks, and the spread names a straggler. Every
    other statistic is rank 0's (the ranks reduce their gradients: the same numbers)."""
    from mem1_core.training.runtime import merge_rank_stats

    ranks = [
        {"pg_loss": 0.5, "phase_score_seconds": 2.0, "phase_epochs_seconds": 10.0},
        {"pg_loss": 0.7, "phase_score_seconds": 3.5, "phase_epochs_seconds": 9.0},
    ]
    got = merge_rank_stats(ranks)
    assert got == {
        "pg_loss": 0.5,
        "phase_score_seconds": 3.5,
        "phase_score_seconds_spread": 1.5,
        "phase_epochs_seconds": 10.0,
        "phase_epochs_seconds_spread": 1.0,
    }
    assert merge_rank_stats(ranks[:1])["phase_epochs_seconds_spread"] == 0.0
