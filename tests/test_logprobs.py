"""One forward pass over the flattened tree equals re-running every turn alone (DESIGN §4.2)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mem1_core.logprobs import (
    forward_tree,
    per_turn_logprobs,
    token_logprobs,
    tree_attention_mask,
)
from mem1_core.tree import FlatBatch, Segment, collate, flatten

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
    # scores, so a boolean one masks nothing (DESIGN §6). Guards the mask choice above.
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


def test_gradients_equal_per_turn_sum(models) -> None:
    # The PPO gradient: d/dθ of the summed generated log-probs, tree vs per-turn contexts.
    trajs = trajectories(3, [("full", 3), ("mem1", 3)])
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1)
    model = tiny_model("sdpa", models["state"])
    logp = token_logprobs(model, batch)
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
def test_flex_attention_forward_and_backward_on_cuda(models) -> None:
    trajs = trajectories(5, MIXED)
    batch = collate([flatten(p) for p in trajs], pad_id=VOCAB - 1).to("cuda")
    grads, logps = {}, {}
    for attn in ("sdpa", "flex_attention"):
        model = tiny_model(attn, models["state"]).cuda()
        logp = token_logprobs(model, batch)
        (logp * batch.loss_mask).sum().backward()
        grads[attn] = {k: v.grad for k, v in model.named_parameters()}
        logps[attn] = logp.detach().cpu()
    ref = lambda paths: per_turn_logprobs(tiny_model("sdpa", models["state"]), paths)  # noqa: E731
    assert max_gap(logps["flex_attention"], batch.to("cpu"), trajs, ref) <= 1e-4
    for k, g in grads["sdpa"].items():
        assert torch.allclose(grads["flex_attention"][k], g, atol=1e-4, rtol=1e-3), k


def test_bench_trajectory_cli_and_its_baseline(tmp_path, capsys) -> None:
    import json

    from mem1_core.bench_trajectory import (
        TrajectoryBenchConfig,
        per_turn_batched_logprobs,
        synthetic_trajectories,
        tiny_qwen2,
    )
    from mem1_core.cli import main

    # The timed baseline (length-sorted padded micro-batches) computes the definition too.
    small = dict(vocab_size=100, hidden_size=32, intermediate_size=64)
    cfg = TrajectoryBenchConfig(prompt_len=12, gen_len=5, info_len=7, trajectories=3, **small)
    model = tiny_qwen2(cfg)
    trajs = synthetic_trajectories(cfg, "truncate", 4)
    seqs = [[i for s in path for i in s.ids] for p in trajs for path in p]
    batched = per_turn_batched_logprobs(model, seqs, rows=3, pad_id=cfg.vocab_size - 1)
    ref = [lp for p in trajs for lp in per_turn_logprobs(model, p)]
    for got, want in zip(batched, ref, strict=True):
        assert torch.allclose(got[-len(want) :], want, atol=TOL)

    out = tmp_path / "bench.jsonl"
    argv = ["bench", "trajectory", "--turns", "3", "--policies", "mem1", "full"]
    argv += ["--prompt-len", "12", "--gen-len", "5", "--info-len", "7", "--repeats", "1"]
    argv += ["--vocab-size", "100", "--hidden-size", "32", "--intermediate-size", "64"]
    assert main([*argv, "--trajectories", "2", "--no-flex", "--out", str(out)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["policy"], r["turns"]) for r in printed] == [("mem1", 3), ("full", 3)]
    for r in printed:
        assert r["max_abs_dlogp_dense"] <= TOL and r["max_abs_dlogp_flex"] is None
        assert r["token_ratio"] == r["flat_tokens"] / r["per_turn_tokens"] < 1
        assert r["time_ratio"] > 0 and r["dense_mask_bytes"] == 2 * r["flat_len"] ** 2
