"""FSDP2 sharding for the flattened-tree forward (mem1_core.fsdp, issue #7), on CPU: two
ranks (gloo) each run their half of a batch of trees through the sharded policy and critic;
the summed gradients, the gradient norm, one AdamW step and the full state dict equal those
of the unsharded models on the whole batch. The CUDA path (NCCL, bf16 compute over float32
master weights) is the same code with another mesh and `param_dtype`."""

from __future__ import annotations

import copy
import os
import random
import socket

import pytest
import torch

VOCAB = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mem1_core.critic import Critic

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
    from mem1_core.tree import Segment, collate, flatten

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

    from mem1_core.fsdp import full_state_dict, rank_rows, shard_critic, shard_policy
    from mem1_core.logprobs import forward_tree, tree_attention_mask
    from mem1_core.ppo import select_rows

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


def test_the_trainer_refuses_fsdp_until_it_runs_ranks(tmp_path):
    from mem1_core.assets import RunPaths
    from mem1_core.config import load_config
    from mem1_core.ray_runtime import Runtime

    cfg = load_config("smoke", None, ["ppo.learner_strategy=fsdp", "ppo.learner_gpus=2"])
    with pytest.raises(NotImplementedError, match="learner_strategy=fsdp"):
        Runtime.start(cfg, RunPaths(tmp_path), init=None, estimator="gae", use_ray=False)
