"""Per-turn rollout/learner log-prob mismatch against a Python loop, on synthetic
trajectories, in both the trajectory form and the trainer's flattened-tree layout."""

from __future__ import annotations

import random

import pytest
import torch

from mem1_core.rl.batch import make_rollout_batch
from mem1_core.rollout.memory import get_memory
from mem1_core.trajectory.mismatch import rollout_logprob_mismatch, turn_logprob_mismatch
from mem1_core.trajectory.record import Action, Trajectory, Turn


def make_trajectories(policy: str, n: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    context_of = get_memory(policy)
    opts = {"state_start": lambda ids: ids.index(7) if 7 in ids else 0, "truncate_turns": 1}
    trajs = []
    for i in range(n):
        traj = Trajectory(f"t{i}", policy, [rng.randrange(10, 50) for _ in range(5)], [["a"]])
        for _ in range(rng.randint(1, 4)):
            gen = [7] + [rng.randrange(10, 50) for _ in range(rng.randint(0, 6))]
            lps = [-rng.random() * 5 for _ in gen]
            info = [rng.randrange(10, 50) for _ in range(rng.randint(1, 4))]
            traj.turns.append(Turn(context_of(traj, opts), gen, lps, Action.QUERY, info_ids=info))
        trajs.append(traj)
    return trajs


def slow_mismatch(trajs, learner) -> tuple[list[float], list[float]]:
    gaps: dict[int, list[float]] = {}
    for traj, row in zip(trajs, learner, strict=True):
        k = 0
        for t, turn in enumerate(traj.turns):
            for lp in turn.gen_logprobs:
                gaps.setdefault(t, []).append(abs(lp - float(row[k])))
                k += 1
    n = max(gaps) + 1
    means = [sum(gaps.get(t, [0.0])) / max(len(gaps.get(t, [])), 1) for t in range(n)]
    maxes = [max(gaps.get(t, [0.0])) for t in range(n)]
    return means, maxes


@pytest.mark.parametrize("policy", ["mem1", "full", "truncate"])
def test_per_turn_mismatch_equals_a_python_loop(policy):
    trajs = make_trajectories(policy, 6, seed=len(policy))
    g = torch.Generator().manual_seed(0)
    learner = []
    for traj in trajs:
        rec = torch.tensor([lp for turn in traj.turns for lp in turn.gen_logprobs])
        learner.append(rec + 0.1 * torch.randn(rec.shape, generator=g))
    got = rollout_logprob_mismatch(trajs, learner)
    means, maxes = slow_mismatch(trajs, learner)
    torch.testing.assert_close(got["mean"], torch.tensor(means), atol=1e-6, rtol=0)
    torch.testing.assert_close(got["max"], torch.tensor(maxes), atol=1e-6, rtol=0)
    counts = [sum(len(t.turns[k].gen_ids) for t in trajs if k < len(t.turns)) for k in range(4)]
    assert got["tokens"].tolist() == counts[: len(got["tokens"])]


@pytest.mark.parametrize("policy", ["mem1", "full"])
def test_tree_layout_gives_the_same_numbers(policy):
    """The trainer's form: (B, L) tensors over the flattened trees, turn = gen_turn."""
    trajs = make_trajectories(policy, 5, seed=3)
    rb = make_rollout_batch(trajs, pad_id=0)
    mask = rb.batch.loss_mask
    learner = torch.where(mask, rb.rollout_logp + torch.rand(mask.shape), 0.0)
    tree = turn_logprob_mismatch(rb.rollout_logp, learner, rb.batch.gen_turn, mask)
    rows = rollout_logprob_mismatch(trajs, [learner[r][mask[r]] for r in range(len(trajs))])
    for key in ("mean", "max", "tokens"):
        torch.testing.assert_close(tree[key], rows[key], atol=1e-6, rtol=0)


def test_equal_logprobs_give_zero_and_lengths_are_checked():
    trajs = make_trajectories("mem1", 3, seed=1)
    same = [[lp for turn in t.turns for lp in turn.gen_logprobs] for t in trajs]
    got = rollout_logprob_mismatch(trajs, same)
    assert got["mean"].abs().max() == 0 and got["max"].abs().max() == 0
    with pytest.raises(ValueError, match="learner log-probs for"):
        rollout_logprob_mismatch(trajs, [row[:-1] for row in same])
