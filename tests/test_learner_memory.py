"""What the learner's passes keep for the backward. Log-probs and entropy over the vocabulary
in chunks (mem1_core.trajectory.logprobs.vocab_logprobs) against the plain definition,
log_softmax over the whole (n, V) logits: the same values and gradients for any chunk size,
at a sampling temperature, with bf16 autocast recomputed alike; under autograd no (n, V)
tensor is kept; the tree's log-probs and gradients through a real model do not change with
the chunk. The attention masks: under autocast every layer keeps the one mask built in the
compute dtype, not a copy of its own, and no layer keeps a (Q, K) matrix per head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_logprobs import MIXED, VOCAB, models, tiny_model, trajectories  # noqa: F401 (fixture)

from mem1_core.trajectory import logprobs as lp
from mem1_core.trajectory.logprobs import shared_prefix_plan
from mem1_core.trajectory.tree import collate, flatten

N, H, V = 37, 16, 50


def definition(h, targets, head, temperature):
    """The whole (n, V) logits at once: log-prob of each target, entropy of each row."""
    logp_all = F.log_softmax(head(h).float() / temperature, dim=-1)
    return logp_all.gather(-1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    h = torch.randn(N, H, generator=gen) * 2
    targets = torch.randint(0, V, (N,), generator=gen)
    weights = torch.randn(2, N, generator=gen)  # an arbitrary loss over both outputs
    return head, h, targets, weights


def grads_of(fn, head, h, targets, weights, temperature):
    head.zero_grad()
    h = h.clone().requires_grad_(True)
    logp, entropy = fn(h, targets, head, temperature)
    ((logp * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    return logp.detach(), entropy.detach(), h.grad, head.weight.grad.clone()


@pytest.mark.parametrize("rows", [1, 5, N, 4 * N])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunks_equal_the_whole_vocabulary_at_once(monkeypatch, rows, temperature):
    monkeypatch.setattr(lp, "VOCAB_CHUNK_ELEMENTS", rows * V)
    assert lp.vocab_chunk_rows(V) == rows
    head, h, targets, weights = inputs()
    expected = grads_of(definition, head, h, targets, weights, temperature)

    def chunked(h, targets, head, temperature):
        return lp.vocab_logprobs(h, targets, head, temperature, with_entropy=True)

    got = grads_of(chunked, head, h, targets, weights, temperature)
    for name, a, b in zip(("logp", "entropy", "d h", "d W"), got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():  # scoring: no checkpoint, the same numbers
        logp, entropy = lp.vocab_logprobs(h, targets, head, temperature, with_entropy=True)
    torch.testing.assert_close(logp, expected[0], atol=1e-6, rtol=1e-5)
    assert lp.vocab_logprobs(h, targets, head, temperature)[1] is None


def test_bf16_autocast_chunks_recompute_in_bf16(monkeypatch):
    """Under autocast the checkpoint recomputes each chunk in bf16, as its forward ran (a
    float32 recompute would fail checkpoint's check of the saved tensors' dtypes): values as
    the unchunked bf16 ones to bf16 rounding, gradients too (their partial sums round apart)."""
    head, h, targets, weights = inputs(1)
    results = []
    for chunk_rows in (4, 10 * N):
        monkeypatch.setattr(lp, "VOCAB_CHUNK_ELEMENTS", chunk_rows * V)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(
                grads_of(
                    lambda h, t, m, T: lp.vocab_logprobs(h, t, m, T, with_entropy=True),
                    head, h, targets, weights, 1.0,
                )
            )  # fmt: skip
    for a, b in zip(*results, strict=True):
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 2e-2


def test_no_vocabulary_sized_tensor_waits_for_the_backward(monkeypatch):
    """What autograd keeps from the forward: with chunks of 5 rows, nothing of more than 5
    rows x V (the checkpoint keeps each chunk's (5, H) input); unchunked, the (n, V) log-softmax."""
    head, h, targets, _ = inputs()
    h = h.requires_grad_(True)

    def kept(chunk_rows: int) -> int:
        monkeypatch.setattr(lp, "VOCAB_CHUNK_ELEMENTS", chunk_rows * V)
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp.vocab_logprobs(h, targets, head, 0.7, with_entropy=True)
        return max(sizes)

    assert kept(5) <= 5 * V
    assert kept(N) >= N * V


def test_the_trees_logprobs_and_gradients_do_not_depend_on_the_chunk(models, monkeypatch):  # noqa: F811
    trajs = trajectories(5, MIXED)
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    n = int(batch.loss_mask.sum())
    out = []
    for rows in (3, 4 * n):
        monkeypatch.setattr(lp, "VOCAB_CHUNK_ELEMENTS", rows * VOCAB)
        model = tiny_model("sdpa", models["state"])
        res = lp.forward_tree(model, batch, with_entropy=True, temperature=0.7)
        (res.logprobs.sum() + 0.1 * res.entropy.sum()).backward()
        out.append((res.logprobs, res.entropy, [p.grad for p in model.parameters()]))
    (logp_a, ent_a, grads_a), (logp_b, ent_b, grads_b) = out
    # the vocabulary summed in chunks: a few float32 ulps apart on some CPUs (AMD EPYC, AVX512)
    torch.testing.assert_close(logp_a, logp_b, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-6, rtol=1e-6)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, atol=5e-6, rtol=1e-5)


def test_under_autocast_every_layer_keeps_the_one_mask_and_no_head_keeps_q_by_k(models):  # noqa: F811
    """A mask built in the compute dtype is kept once for every layer; one in float32 is cast
    to bf16 in each layer, and each layer keeps its cast (the cost the compute dtype avoids)."""
    trajs = trajectories(5, MIXED)
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = tiny_model("sdpa", models["state"])
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers

    def kept_masks(dtype):
        kept = []

        def pack(t):
            kept.append(t)
            return t

        with torch.autocast("cpu", dtype=torch.bfloat16):
            plan = shared_prefix_plan(batch, "sdpa", dtype)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                lp.forward_tree(model, batch, mask=plan).logprobs.sum().backward()
        (mask,) = plan.branch_masks  # these trees: one group of branch rows
        rows, _, q, k = mask.shape
        assert not [t for t in kept if t.shape == (rows, heads, q, k)]  # no (Q, K) per head
        return mask, {t.untyped_storage().data_ptr() for t in kept if t.shape == mask.shape}

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lp.mask_dtype(model) == torch.bfloat16  # what the learner builds under autocast
    assert lp.mask_dtype(model) == torch.float32
    mask, kept = kept_masks(torch.bfloat16)
    assert kept == {mask.untyped_storage().data_ptr()}
    _, kept = kept_masks(torch.float32)
    assert len(kept) == layers
