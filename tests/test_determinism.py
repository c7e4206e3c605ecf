"""The learner's passes are bit-reproducible run to run with several intra-op threads: parts
of an experiment run in separate processes and must reproduce the whole run exactly.

On CPU, the backward of `x[index]` (index_put_ with accumulate=True) adds repeated rows with
float atomics from every thread once the gradient holds 32768 elements or more, so a trunk's
keys/values read by several branch rows (the shared-prefix forward) got a gradient whose
last bits changed from run to run, and two trainings from one seed drifted apart by ~1e-5.
The tree forward takes its rows with `take_rows` (index_select, whose backward adds in index
order) instead."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mem1_core.rl.critic import Critic
from mem1_core.trajectory.logprobs import forward_tree, shared_prefix_plan, take_rows
from mem1_core.trajectory.tree import Segment, collate, flatten

VOCAB = 300
CFG = Qwen2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_take_rows_sums_repeated_rows_in_index_order(two_threads) -> None:
    # Rows read several times, interleaved (as the branch rows of several trajectories are,
    # sorted by length), in a gradient past the 32768 elements of CPU's parallel path: the
    # gradient is the in-order sum, bit for bit, every time.
    torch.manual_seed(0)
    x = torch.randn(8, 2, 128, 16, requires_grad=True)
    index = torch.tensor([3, 0, 1, 3, 2, 0, 7, 1, 3, 6, 5, 4, 2, 0, 3, 7, 6, 5]).view(3, 6)
    g = torch.randn(3, 6, 2, 128, 16)
    assert torch.equal(take_rows(x, index), x[index])
    expected = torch.zeros_like(x)
    for i, row in enumerate(index.reshape(-1).tolist()):
        expected[row] += g.reshape(-1, *x.shape[1:])[i]
    for _ in range(10):
        x.grad = None
        (take_rows(x, index) * g).sum().backward()
        assert torch.equal(x.grad, expected)


def _trees(seed: int, trajectories: int = 4, turns: int = 8, prompt: int = 128):
    """MEM1-shaped trees (a long task prompt, then one branch per turn: the previous turn's
    generation and information, then this turn's): the trunk is read by many branch rows."""
    rng = random.Random(seed)

    def ids(lo, hi):
        return tuple(rng.randrange(VOCAB - 1) for _ in range(rng.randint(lo, hi)))

    out = []
    for _ in range(trajectories):
        p = Segment(("prompt",), ids(prompt, prompt), False)
        gens, infos = [ids(3, 12) for _ in range(turns)], [ids(4, 16) for _ in range(turns)]
        paths = []
        for t in range(turns):
            ctx = [p]
            if t:
                ctx += [
                    Segment(("gen", t - 1), gens[t - 1], False),
                    Segment(("info", t - 1), infos[t - 1], False),
                ]
            paths.append([*ctx, Segment(("gen", t), gens[t], True)])
        out.append(flatten(paths))
    return collate(out, pad_id=VOCAB - 1)


def test_a_tree_forward_and_backward_is_bit_identical_with_two_threads(two_threads) -> None:
    # The learner's pass (policy log-probs and entropy, critic values, the shared-prefix
    # forward) run again from the same weights: every gradient bit-identical.
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM._from_config(copy.deepcopy(CFG), attn_implementation="sdpa")
    policy = policy.float().eval()
    critic = Critic.from_policy(policy).eval()
    torch.nn.init.normal_(critic.value_head.weight)
    batch = _trees(0)
    plan = shared_prefix_plan(batch, "sdpa", torch.float32)
    gathered = max(len(rows) for rows in plan.split.row_batch) * plan.split.trunk_width * 32
    assert gathered >= 32768  # the trunk keys' gradient takes CPU's parallel path
    params = [*policy.parameters(), *critic.parameters()]

    def grads() -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        out = forward_tree(policy, batch, "sdpa", with_entropy=True, mask=plan)
        values = critic(batch, "sdpa", mask=plan)
        mask = batch.loss_mask
        loss = (out.logprobs * mask).sum() + (out.entropy * mask).sum() + values.pow(2).sum()
        loss.backward()
        return [p.grad.clone() for p in params]

    first = grads()
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, grads(), strict=True))
