"""One forward pass over the flattened tree equals re-running every turn alone (docs/design.md §4.2)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mem1_core.trajectory.logprobs import (
    PrefixPlan,
    forward_tree,
    per_turn_logprobs,
    shared_prefix_plan,
    token_logprobs,
    tree_attention_mask,
)
from mem1_core.trajectory.tree import FlatBatch, Segment, collate, flatten

VOCAB = 300
TOL = 1e-5
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


def tiny_model(attn: str, state: dict | None = None) -> Qwen2ForCausalLM:
    # _from_config writes the attention choice into the config: copy it each time.
    torch.manual_seed(0)
    model = Qwen2ForCausalLM._from_config(copy.deepcopy(CFG), attn_implementation=attn)
    if state is not None:
        model.load_state_dict(state)
    return model.float().eval()


@pytest.fixture(scope="module")
def models() -> dict[str, Qwen2ForCausalLM]:
    sdpa = tiny_model("sdpa")
    state = sdpa.state_dict()
    return {"sdpa": sdpa, "eager": tiny_model("eager", state), "state": state}


def seg(key, ids, generated=False) -> Segment:
    return Segment(key=key, ids=tuple(ids), generated=generated)


def policy_paths(policy: str, p, gens, infos, k: int = 2) -> list[list[Segment]]:
    paths = []
    for t in range(len(gens)):
        first = {"mem1": t - 1, "full": 0, "truncate": t - k}[policy]
        ctx = [seg(("prompt",), p)]
        for s in range(max(first, 0), t):
            ctx += [seg(("gen", s), gens[s]), seg(("info", s), infos[s])]
        paths.append(ctx + [seg(("gen", t), gens[t], True)])
    return paths


def branchy_paths(p, gens, infos) -> list[list[Segment]]:
    """Not a memory policy: turns alternate between two notes X, Y under the prompt and
    return under X later, so a generated node's parent is not its flat neighbour."""
    note = {0: seg("X", infos[0]), 1: seg("Y", infos[1])}
    return [
        [seg(("prompt",), p), note[t % 2], seg(("gen", t), gens[t], True)] for t in range(len(gens))
    ]


def trajectories(seed: int, specs) -> list[list[list[Segment]]]:
    rng = random.Random(seed)

    def ids(lo, hi):
        return [rng.randrange(VOCAB - 1) for _ in range(rng.randint(lo, hi))]

    out = []
    for policy, turns in specs:
        p, gens, infos = (
            ids(8, 20),
            [ids(3, 9) for _ in range(turns)],
            [ids(4, 12) for _ in range(turns)],
        )
        if policy == "branchy":
            out.append(branchy_paths(p, gens, infos))
        else:
            out.append(policy_paths(policy, p, gens, infos))
    return out


# Mixed policies and lengths in one batch, so rows are padded differently.
MIXED = [("mem1", 5), ("full", 4), ("truncate", 6), ("mem1", 2), ("full", 1), ("branchy", 4)]


def max_gap(logp: torch.Tensor, batch: FlatBatch, trajs, reference) -> float:
    """max |tree log-prob - per-turn log-prob| over every generated token."""
    gap = 0.0
    count = 0
    for r, paths in enumerate(trajs):
        ref = reference(paths)
        rows = batch.loss_mask[r].nonzero().squeeze(-1)
        for i in rows.tolist():
            t, o = batch.gen_turn[r, i].item(), batch.gen_offset[r, i].item()
            gap = max(gap, abs(logp[r, i].item() - ref[t][o].item()))
            count += 1
        assert count and len(rows) == sum(len(p[-1].ids) for p in paths)
    return gap


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tree_logprobs_equal_per_turn_recompute(models, attn: str, temperature: float) -> None:
    trajs = trajectories(0, MIXED)
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    with torch.no_grad():
        logp = token_logprobs(models[attn], batch, temperature=temperature)
    assert torch.isfinite(logp).all()

    def reference(paths):
        return per_turn_logprobs(models["sdpa"], paths, temperature=temperature)

    assert max_gap(logp, batch, trajs, reference) <= TOL


def test_every_token_logprob_matches_its_own_context(models) -> None:
    # Context tokens too (re-read memory, info): checks prev_index and positions where the
    # predecessor is far back in the flat row, not only on generated tokens.
    trajs = trajectories(6, MIXED)
    trees = [flatten(p) for p in trajs]
    batch = collate(trees, pad_id=VOCAB - 1)
    model = models["sdpa"]
    with torch.no_grad():
        logp = token_logprobs(model, batch)
        checked = 0
        for r, (paths, tree) in enumerate(zip(trajs, trees, strict=True)):
            first: dict[tuple, int] = {}
            for i, v in enumerate(tree.node_ids.tolist()):
                first.setdefault(tree.node_keys[v], i)
            for path in paths:
                ids = torch.tensor([[i for s in path for i in s.ids]])
                ref = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0], -1)
                keys, j = (), 0
                for s in path:
                    keys = keys + (s.key,)
                    for o in range(len(s.ids)):
                        i = first[keys] + o
                        want = ref[j - 1, ids[0, j]].item() if j else 0.0
                        assert abs(logp[r, i].item() - want) <= TOL, (r, keys, o)
                        checked += 1
                        j += 1
    assert checked > batch.seq_lens.sum()  # shared tokens are checked once per turn


def test_eager_with_a_boolean_mask_would_be_wrong(models) -> None:
    # Why the eager path gets an additive float mask: Hugging Face adds a 4D mask to the
    # scores, so a boolean one masks nothing (docs/design.md §6). Guards the mask choice above.
    trajs = trajectories(1, [("mem1", 3)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    with torch.no_grad():
        wrong = forward_tree(
            models["eager"], batch, mask=tree_attention_mask(batch, "sdpa", torch.float32)
        )
    ref = lambda paths: per_turn_logprobs(models["sdpa"], paths)  # noqa: E731
    assert max_gap(wrong.logprobs, batch, trajs, ref) > 1e-3


def test_entropy_and_hidden_and_padding_invariance(models) -> None:
    trajs = trajectories(2, [("truncate", 4), ("mem1", 3)])
    trees = [flatten(p) for p in trajs]
    batch = collate(trees, pad_id=VOCAB - 1, pad_to_multiple=32)
    model = models["sdpa"]
    with torch.no_grad():
        out = forward_tree(model, batch, with_entropy=True)
        alone = forward_tree(model, collate(trees[1:], pad_id=0), with_entropy=True)
    n = trees[1].num_tokens
    assert torch.allclose(out.logprobs[1, :n], alone.logprobs[0, :n], atol=TOL)
    assert torch.allclose(out.hidden[1, :n], alone.hidden[0, :n], atol=TOL)
    assert out.hidden.shape == (*batch.input_ids.shape, CFG.hidden_size)
    # Entropy of the distribution predicting the last turn's first generated token.
    path = trajs[0][-1]
    context = [i for s in path[:-1] for i in s.ids]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context]), use_cache=False).logits[0, -1]
    want = torch.distributions.Categorical(logits=logits).entropy()
    i = ((batch.gen_turn[0] == len(trajs[0]) - 1) & (batch.gen_offset[0] == 0)).nonzero().item()
    assert abs(out.entropy[0, i].item() - want.item()) <= TOL
    assert (out.entropy[batch.prev_index < 0] == 0).all()


@pytest.mark.parametrize("forward", ["shared_prefix", "one_pass"])
def test_gradients_equal_per_turn_sum(models, forward: str) -> None:
    # The PPO gradient: d/dθ of the summed generated log-probs, tree vs per-turn contexts.
    # Through the shared prefix it flows back into the trunk through the cached keys/values.
    trajs = trajectories(3, [("full", 3), ("mem1", 3), ("branchy", 3)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = tiny_model("sdpa", models["state"])
    mask = None if forward == "shared_prefix" else tree_attention_mask(batch, "sdpa", torch.float32)
    logp = forward_tree(model, batch, mask=mask).logprobs
    (logp * batch.loss_mask).sum().backward()
    tree_grads = {k: v.grad.clone() for k, v in model.named_parameters()}
    model.zero_grad()
    total = 0.0
    for paths in trajs:
        for path in paths:
            ids = torch.tensor([[i for s in path for i in s.ids]])
            g = len(path[-1].ids)
            lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1], -1)
            total = total + lp[-g:].gather(-1, ids[0, -g:, None]).sum()
    total.backward()
    for k, v in model.named_parameters():
        assert torch.allclose(tree_grads[k], v.grad, atol=1e-4, rtol=1e-4), k


def forest_paths(p, gens, infos) -> list[list[Segment]]:
    """No shared root (the shared prefix is empty): each turn under one of two notes."""
    note = {0: seg("X", infos[0]), 1: seg("Y", infos[1])}
    return [[note[t % 2], seg(("gen", t), gens[t], True)] for t in range(len(gens))]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prefix_and_one_pass_agree_on_every_token(models, attn: str) -> None:
    # The two-stage forward (default) against the one pass with the dense tree mask, on
    # every token's log-prob, entropy and hidden state (trunk, branch rows, packed rows),
    # in a batch mixing chains, stars, a forest and padding.
    trajs = trajectories(7, MIXED)
    rng = random.Random(7)
    ids = lambda n: [rng.randrange(VOCAB - 1) for _ in range(n)]  # noqa: E731
    trajs.append(forest_paths(None, [ids(4), ids(3), ids(5)], [ids(6), ids(2)]))
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1, pad_to_multiple=16)
    model = models[attn]
    every = batch.prev_index >= 0
    plan = shared_prefix_plan(batch, attn, torch.float32)
    assert plan.split.trunk_lens[-1] == 0 and len(plan.split.rows) >= 1
    with torch.no_grad():
        one = forward_tree(
            model,
            batch,
            mask=tree_attention_mask(batch, attn, torch.float32),
            with_entropy=True,
            positions=every,
        )
        two = forward_tree(model, batch, mask=plan, with_entropy=True, positions=every)
    real = torch.arange(batch.input_ids.shape[1]) < batch.seq_lens[:, None]
    assert (one.logprobs - two.logprobs).abs().max() <= TOL
    assert (one.entropy - two.entropy).abs().max() <= TOL
    assert (one.hidden - two.hidden)[real].abs().max() <= TOL
    ref = lambda paths: per_turn_logprobs(models["sdpa"], paths)  # noqa: E731
    assert max_gap(two.logprobs, batch, trajs, ref) <= TOL


def test_logprobs_only_where_asked(models) -> None:
    # The trainer reads generated tokens only: by default only they go through the LM head.
    trajs = trajectories(8, [("mem1", 3), ("full", 2)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = models["sdpa"]
    with torch.no_grad():
        default = forward_tree(model, batch, with_entropy=True)
        every = forward_tree(model, batch, with_entropy=True, positions=batch.prev_index >= 0)
    gen = batch.loss_mask
    assert (default.logprobs[~gen] == 0).all() and (default.entropy[~gen] == 0).all()
    assert torch.equal(default.logprobs[gen], every.logprobs[gen])
    assert torch.equal(default.entropy[gen], every.entropy[gen])
    assert (every.logprobs[~gen & (batch.prev_index >= 0)] != 0).all()


def test_gradient_checkpointing_falls_back_to_one_pass(models) -> None:
    # Checkpointed layers run without the KV cache the two stages share: with no mask given
    # the tree then runs in one pass (still exact); a prebuilt plan is refused, not ignored.
    trajs = trajectories(10, [("mem1", 3), ("truncate", 4)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = tiny_model("sdpa", models["state"])
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # no dropout in the tiny config: train mode computes the same function
    logp = forward_tree(model, batch).logprobs
    (logp * batch.loss_mask).sum().backward()
    ref = lambda paths: per_turn_logprobs(models["sdpa"], paths)  # noqa: E731
    assert max_gap(logp.detach(), batch, trajs, ref) <= TOL
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="checkpointing"):
        forward_tree(model, batch, mask=shared_prefix_plan(batch, "sdpa", torch.float32))
    with torch.no_grad():  # no backward, no replay: the cache is kept, the plan is fine
        plan = forward_tree(model, batch, mask=shared_prefix_plan(batch, "sdpa", torch.float32))
    assert max_gap(plan.logprobs, batch, trajs, ref) <= TOL


def test_prebuilt_plan_is_reusable_and_flex_has_none() -> None:
    trajs = trajectories(9, [("mem1", 3)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    plan = shared_prefix_plan(batch, "sdpa", torch.float32)
    assert isinstance(plan, PrefixPlan) and plan.branch_masks[0].dtype == torch.float32
    with pytest.raises(ValueError, match="one pass"):
        shared_prefix_plan(batch, "flex_attention", torch.float32)


@pytest.mark.slow
def test_flex_attention_forward_on_cpu(models) -> None:
    # FlexAttention has no CPU backward; forward only. First call compiles (tens of s).
    trajs = trajectories(4, MIXED[:3])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = tiny_model("flex_attention", models["state"])
    with torch.no_grad():
        logp = token_logprobs(model, batch)
    ref = lambda paths: per_turn_logprobs(models["sdpa"], paths)  # noqa: E731
    assert max_gap(logp, batch, trajs, ref) <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_attention_forward_and_backward_on_cuda(models, dtype) -> None:
    # The GPU training path: FlexAttention with the tree's BlockMask, forward and
    # backward, against the dense boolean mask under sdpa. float32: to float tolerance; bf16:
    # flex is no further from the float32 definition than the dense path is, and its
    # gradients agree with the dense path's to bf16 precision. L is bucketed to the block.
    torch.backends.cuda.matmul.allow_tf32 = False
    trajs = trajectories(5, MIXED)
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1, pad_to_multiple=128)
    grads, logps = {}, {}
    for attn in ("sdpa", "flex_attention"):
        model = tiny_model(attn, models["state"]).to("cuda", dtype)
        # One pass with the tree mask (dense for sdpa): the path under test, not the
        # shared-prefix forward forward_tree picks for sdpa by default.
        gpu = batch.to("cuda")
        logp = forward_tree(
            model, gpu, mask=tree_attention_mask(gpu, attn, dtype), positions=gpu.prev_index >= 0
        ).logprobs
        (logp * gpu.loss_mask).sum().backward()
        grads[attn] = {k: v.grad.float() for k, v in model.named_parameters()}
        logps[attn] = logp.detach().cpu()
    ref = lambda paths: per_turn_logprobs(tiny_model("sdpa", models["state"]), paths)  # noqa: E731
    flex_gap = max_gap(logps["flex_attention"], batch, trajs, ref)
    if dtype == torch.float32:
        assert flex_gap <= 1e-4
        for k, g in grads["sdpa"].items():
            assert torch.allclose(grads["flex_attention"][k], g, atol=1e-4, rtol=1e-3), k
        return
    assert flex_gap <= 2 * max_gap(logps["sdpa"], batch, trajs, ref) + 1e-2
    for k, g in grads["sdpa"].items():
        diff = (grads["flex_attention"][k] - g).abs().max() / g.abs().max().clamp_min(1e-12)
        assert diff <= 5e-2, (k, float(diff))


def test_bench_trajectory_cli_and_its_baseline(tmp_path, capsys) -> None:
    import json

    from mem1_core.cli.commands.bench import load_benchmark
    from mem1_core.cli.main import main

    bench = load_benchmark("bench_trajectory")
    TrajectoryBenchConfig, tiny_qwen2 = bench.TrajectoryBenchConfig, bench.tiny_qwen2
    per_turn_batched_logprobs = bench.per_turn_batched_logprobs
    synthetic_trajectories = bench.synthetic_trajectories

    # The timed baseline (length-sorted padded micro-batches) computes the definition too,
    # a generated first token with no context included.
    small = dict(vocab_size=100, hidden_size=32, intermediate_size=64)
    cfg = TrajectoryBenchConfig(prompt_len=12, gen_len=5, info_len=7, trajectories=3, **small)
    model = tiny_qwen2(cfg)
    trajs = synthetic_trajectories(cfg, "truncate", 4)
    trajs.append([[seg(("gen", 0), [5, 6, 7], True)]])
    seqs = [[i for s in path for i in s.ids] for p in trajs for path in p]
    gens = [len(path[-1].ids) for p in trajs for path in p]
    with torch.no_grad():
        batched = per_turn_batched_logprobs(model, seqs, gens, rows=3, pad_id=cfg.vocab_size - 1)
    ref = [lp for p in trajs for lp in per_turn_logprobs(model, p)]
    for got, want in zip(batched, ref, strict=True):
        assert got.shape == want.shape and torch.allclose(got, want, atol=TOL)

    out = tmp_path / "bench.jsonl"
    argv = ["bench", "trajectory", "--turns", "3", "--memories", "mem1", "full"]
    argv += ["--prompt-len", "12", "--gen-len", "5", "--info-len", "7", "--repeats", "1"]
    argv += ["--vocab-size", "100", "--hidden-size", "32", "--intermediate-size", "64"]
    argv += ["--clock", "cpu"]
    assert main([*argv, "--trajectories", "2", "--no-flex", "--out", str(out)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["memory"], r["turns"]) for r in printed] == [("mem1", 3), ("full", 3)]
    for r in printed:
        assert r["max_abs_dlogp"] <= TOL and r["max_abs_dlogp_dense"] <= TOL
        assert r["max_abs_dlogp_flex"] is None
        assert r["token_ratio"] == r["flat_tokens"] / r["per_turn_tokens"] < 1
        assert r["time_ratio"] > 0 and r["dense_time_ratio"] > 0 and r["clock"] == "cpu"
        assert r["dense_mask_bytes"] == 2 * r["flat_len"] ** 2
        assert r["flat_tokens"] <= r["flat_slots"] and r["per_turn_tokens"] <= r["per_turn_slots"]
    # The full-context tree is one chain: its trunk is everything, with no branch rows.
    full = printed[1]
    assert full["branch_rows"] == [] and full["prefix_mask_bytes"] == 0
