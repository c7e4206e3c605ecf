"""The work counted per iteration (mem1_core.rl.roofline) against hand formulas: the weights of
a tiny Qwen2 built from config, counted from its dimensions; a tree forward's matrix FLOPs
against torch's own count of them (the decoder at every tree token, the vocabulary projection
at the generated ones only); the learner's phases; the prefill's tokens and the decoding
steps of hand-made trajectories; and the `work_*` columns an update records, where
`ppo.old_logprobs=rollout` saves exactly one policy pass."""

from __future__ import annotations

import dataclasses

import torch
from test_ppo import PPO, S, fresh, optimizers, policy, trajs  # noqa: F401 (fixtures)
from torch.utils.flop_counter import FlopCounterMode

from mem1_core.rl.batch import make_rollout_batch
from mem1_core.rl.critic import Critic
from mem1_core.rl.passes import NonFiniteGuard
from mem1_core.rl.ppo import update
from mem1_core.rl.roofline import (
    ModelSize,
    forward_flops,
    learner_work,
    model_size,
    rollout_work,
)
from mem1_core.trajectory.logprobs import forward_tree, tree_attention_mask
from mem1_core.trajectory.record import Action, SegmentKind, SegmentRef, Trajectory, Turn


def test_weights_counted_from_the_configs_dimensions(policy):  # noqa: F811
    # test_ppo's policy: hidden 32, 2 layers, 4 heads of 8, 2 key-value heads, MLP 64, tied.
    h, kv, mlp = 32, 2 * 8, 64
    # q, k and v with their biases, o, the MLP's three matrices, two norms
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * mlp + 2 * h
    vocab = policy.config.vocab_size
    assert model_size(policy) == ModelSize(body=2 * layer + h, head=vocab * h)
    assert model_size(policy).weights == 2 * layer + h + vocab * h  # tied: one matrix
    critic = Critic.from_policy(policy, 1)
    assert model_size(critic) == ModelSize(body=layer + h + (h + 1))  # one layer, norm, value head


def test_a_tree_forwards_matrix_flops_are_torchs_count(policy, trajs, small_tokenizer):  # noqa: F811
    """One trajectory's tree, one pass, no padding: torch counts 2 x (matrix weights) per
    tree token and 2 x (vocabulary projection) per generated token; the 6P rule's body also
    counts the biases and norms (the vectors), which multiply nothing."""
    batch = make_rollout_batch(trajs[:1], small_tokenizer.pad_token_id).batch
    tokens, generated = int(batch.seq_lens.sum()), int(batch.loss_mask.sum())
    assert batch.input_ids.shape == (1, tokens) and 0 < generated < tokens
    mask = tree_attention_mask(batch, "sdpa", torch.float32)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        forward_tree(policy, batch, "sdpa", mask=mask)
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(v for op, v in counts.items() if "attention" not in str(op))
    vectors = sum(p.numel() for p in policy.get_decoder().parameters() if p.dim() == 1)
    size = model_size(policy)
    assert matmuls == forward_flops(size, tokens, generated) - 2 * vectors * tokens


def test_the_learners_phases_by_hand():
    lm, critic = ModelSize(body=100, head=30), ModelSize(body=40)
    # 1000 tree tokens, 200 generated, 2 epochs: a policy pass 2 (100 x 1000 + 30 x 200)
    # = 212,000; the reference's the same; the critic's 2 x 40 x 1000 = 80,000.
    work = learner_work(lm, lm, critic, 1000, 200, epochs=2, recompute=True)
    assert work == {
        "work_score_flops": 212_000 + 212_000 + 80_000,
        "work_update_flops": 2 * 3 * (212_000 + 80_000),
    }
    bypass = learner_work(lm, lm, critic, 1000, 200, epochs=2, recompute=False)
    assert bypass["work_score_flops"] == 212_000 + 80_000
    alone = learner_work(lm, None, None, 1000, 200, epochs=1, recompute=False)
    assert alone == {"work_score_flops": 0, "work_update_flops": 3 * 212_000}


def _traj(prompt, turns, n=2) -> Trajectory:
    """turns: (context refs, generated ids, info ids)."""
    traj = Trajectory("t", "mem1", prompt, [["a"]] * n)
    for refs, gen, info in turns:
        traj.turns.append(Turn(refs, gen, [0.0] * len(gen), Action.QUERY, info_ids=info))
    return traj


def test_the_prefill_and_decoding_by_hand():
    P, G, INFO = SegmentKind.PROMPT, SegmentKind.GEN, SegmentKind.INFO  # noqa: N806
    ids = iter(range(1000))

    def new(k):
        return [next(ids) for _ in range(k)]

    prompt = new(10)
    # Full context: turn 1 reads prompt, gen 0 (5), info 0 (4); turn 2 also gen 1 (6), info 1 (3).
    full = _traj(prompt, [
        ([SegmentRef(P)], new(5), new(4)),
        ([SegmentRef(P), SegmentRef(G, 0), SegmentRef(INFO, 0)], new(6), new(3)),
        ([SegmentRef(P), SegmentRef(G, 0), SegmentRef(INFO, 0), SegmentRef(G, 1), SegmentRef(INFO, 1)],
         new(3), []),
    ])  # fmt: skip
    # MEM1: turn 1 reads the prompt, the first 3 of gen 0 (its <IS>) and info 0.
    mem1 = _traj(prompt, [
        ([SegmentRef(P)], new(7), new(4)),
        ([SegmentRef(P), SegmentRef(G, 0, 0, 3), SegmentRef(INFO, 0)], new(2), []),
    ])  # fmt: skip
    short = _traj(prompt, [([SegmentRef(P)], new(9), [])], n=1)  # another task length
    # Prefill: full 10, then the last generated token + info 0 (5), then likewise (1 + 3);
    # MEM1 10, then its info (4: prompt and <IS> are held); the other task 10.
    # Decoding, per (turn, task length), the longest generation less its first token:
    # turn 0 at N=2 max(4, 6), at N=1 8; turn 1 at N=2 max(5, 1); turn 2 2.
    size = ModelSize(body=100, head=30)
    work = rollout_work([full, mem1, short], size, bytes_per_weight=2)
    prefill, turns, steps = 10 + 5 + 4 + 10 + 4 + 10, 6, 6 + 8 + 5 + 2
    assert work == {
        "work_prefill_tokens": prefill,
        "work_prefill_flops": 2 * (100 * prefill + 30 * turns),
        "work_decode_steps": steps,
        "work_decode_bytes": steps * 130 * 2,
    }


def test_an_update_records_each_phases_work(policy, trajs, small_tokenizer):  # noqa: F811
    out = {}
    for source in ("recompute", "rollout"):
        models = fresh(policy)
        cfg = dataclasses.replace(PPO, old_logprobs=source)
        settings = S(cfg, pad_id=small_tokenizer.pad_token_id)
        out[source] = update(models, optimizers(models, 0.0), trajs, settings, NonFiniteGuard(3))
    rec, byp = out["recompute"], out["rollout"]
    pass_flops = forward_flops(model_size(policy), rec["tree_tokens"], rec["gen_tokens"])
    assert rec["work_score_flops"] - byp["work_score_flops"] == pass_flops
    assert rec["work_update_flops"] == byp["work_update_flops"] > 3 * pass_flops  # and the critic
    assert rec["work_prefill_flops"] > 2 * model_size(policy).body * rec["work_prefill_tokens"]
    assert rec["work_decode_bytes"] == rec["work_decode_steps"] * model_size(policy).weights * 4
    for k in rec:
        if k.startswith("work_"):
            assert isinstance(rec[k], int) and rec[k] > 0, k


def test_nothing_generated_is_no_decoding():
    traj = _traj([1, 2, 3], [([SegmentRef(SegmentKind.PROMPT)], [], [])])
    work = rollout_work([traj], ModelSize(body=10, head=5), 4)
    assert work["work_decode_steps"] == 0 and work["work_prefill_tokens"] == 3
