"""The rollout: a real tiny model, a real BM25 index over the world, three memory policies.

Checks against definitions: recorded log-probs equal a re-run of each turn's real context;
the flattened tree gives the same log-probs in one pass; contexts are rebuilt from ids."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import MALFORMED_TURNS

from mem1_core.config import ModelConfig, RolloutConfig
from mem1_core.models.model import build_tiny_model
from mem1_core.qa.env import QAEnvironment
from mem1_core.rollout.generation import HFBackend, SamplingParams
from mem1_core.rollout.kv_cache import TurnCache
from mem1_core.rollout.loop import rollout
from mem1_core.trajectory.logprobs import per_turn_logprobs, token_logprobs
from mem1_core.trajectory.record import (
    Action,
    SegmentKind,
    read_trajectories,
    turn_paths,
    write_trajectories,
)
from mem1_core.trajectory.tree import collate, flatten

CFG = RolloutConfig(
    turns_base=1, turns_per_objective=1, gen_tokens_base=12, gen_tokens_per_objective=2
)
REPLAY = dataclasses.replace(CFG, gen_tokens_base=64)
POLICIES = ("mem1", "full", "truncate", "mem1+recall")
"""Every memory (mem1_core.rollout.memory); mem1+recall's recall turns: tests/test_recall.py."""


@pytest.fixture(scope="module")
def model(small_tokenizer):
    torch.manual_seed(0)
    return build_tiny_model(
        ModelConfig(
            hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
        ),
        small_tokenizer,
    )


@pytest.fixture(scope="module")
def env(small_tokenizer, small_index):
    return QAEnvironment(small_tokenizer, small_index, topk=2)


@pytest.fixture(scope="module")
def rollouts(model, env, small_tasks, small_tokenizer):
    backend = HFBackend(model, small_tokenizer.pad_token_id, small_tokenizer.eos_token_id)
    out = {}
    for policy in POLICIES:
        cfg = dataclasses.replace(CFG, memory=policy, truncate_turns=1)
        out[policy] = rollout(
            small_tasks[:5],
            backend,
            env,
            cfg,
            samples_per_task=1,
            generator=torch.Generator().manual_seed(0),
        )
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_untrained_rollout_runs_to_the_end_and_round_trips(rollouts, policy, tmp_path):
    trajs = rollouts[policy]
    assert len(trajs) == 5 and all(t.done for t in trajs)
    for t in trajs:
        assert len(t.turns) == CFG.max_turns(2)  # garbage never answers: the budget ends it
        assert t.reward == 0.0 and len(t.em) == 2
        assert all(turn.format_error for turn in t.turns)
    write_trajectories(trajs, tmp_path / "t.parquet")
    assert read_trajectories(tmp_path / "t.parquet") == trajs


@pytest.mark.parametrize("policy", POLICIES)
def test_recorded_logprobs_equal_a_rerun_of_each_turns_context(rollouts, model, policy):
    for traj in rollouts[policy]:
        ref = per_turn_logprobs(model, turn_paths(traj))
        for turn, r in zip(traj.turns, ref, strict=True):
            torch.testing.assert_close(torch.tensor(turn.gen_logprobs), r, atol=1e-4, rtol=0)


@pytest.mark.parametrize("policy", POLICIES)
def test_flattened_tree_matches_the_definition_on_real_rollouts(
    rollouts, model, policy, small_tokenizer
):
    trajs = rollouts[policy]
    batch = collate([flatten(turn_paths(t)) for t in trajs], small_tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch, "sdpa")
    for b, traj in enumerate(trajs):
        ref = per_turn_logprobs(model, turn_paths(traj))
        for t, r in enumerate(ref):
            sel = (batch.gen_turn[b] == t) & batch.loss_mask[b]
            order = batch.gen_offset[b][sel].argsort()
            got = logp[b][sel][order]
            assert (got - r).abs().max().item() <= 1e-5


def test_contexts_are_rebuilt_from_ids_per_policy(rollouts):
    m, f, tr = rollouts["mem1"][0], rollouts["full"][0], rollouts["truncate"][0]
    kinds = [r.kind for r in m.turns[2].context]
    if m.turns[1].action is not Action.INVALID:
        assert kinds == [SegmentKind.PROMPT, SegmentKind.GEN, SegmentKind.INFO]
        assert m.turns[2].context[1].turn == 1
    else:  # after an invalid turn MEM1 carries at most a closed <IS> … </IS>, not the whole invalid turn
        assert kinds[0] is SegmentKind.PROMPT and kinds[-1] is SegmentKind.INFO
        assert m.turns[2].context[-1].turn == 1 and len(kinds) <= 3
        assert all(
            r.kind is SegmentKind.GEN and r.end is not None for r in m.turns[2].context[1:-1]
        )
    assert len(f.turns[2].context) == 1 + 2 * 2
    assert [r.turn for r in tr.turns[2].context] == [-1, 1, 1]
    for traj in (m, f, tr):
        for t, turn in enumerate(traj.turns):
            assert turn.context_tokens == len(traj.context_ids(t))
    # full context grows with every turn; mem1 keeps prompt + one turn + one info block
    assert f.turns[2].context_tokens > m.turns[2].context_tokens


def test_mem1_context_stays_bounded_as_turns_grow(model, env, small_tasks, small_tokenizer):
    backend = HFBackend(model, small_tokenizer.pad_token_id, small_tokenizer.eos_token_id)
    cfg = dataclasses.replace(CFG, turns_base=8, turns_per_objective=0)
    traj = rollout(small_tasks[:1], backend, env, cfg, greedy=True)[0]
    assert len(traj.turns) == 8
    prompt = len(traj.prompt_ids)
    bound = prompt + cfg.max_new_tokens(2) + max(len(t.info_ids) for t in traj.turns)
    assert all(t.context_tokens <= bound for t in traj.turns)
    full = rollout(
        small_tasks[:1], backend, env, dataclasses.replace(cfg, memory="full"), greedy=True
    )[0]
    assert full.turns[-1].context_tokens > 2 * traj.turns[-1].context_tokens


# ---- the environment's rules for untrusted output --------------------------------------


class ReplayBackend:
    """Plays fixed turns (texts tokenized here) in place of a model, to drive the
    environment through each rule; log-probs are zeros."""

    def __init__(self, tok, turns: list[str]):
        self.turns = [tok.encode(t, add_special_tokens=False) for t in turns]
        self.i = 0

    def generate(self, contexts, params, generator=None):
        from mem1_core.rollout.generation import Generation

        out = []
        for _ in contexts:
            ids = self.turns[min(self.i, len(self.turns) - 1)][: params.max_new_tokens]
            finish = "stop" if ids and ids[-1] in params.stop_ids else "length"
            out.append(Generation(list(ids), [0.0] * len(ids), finish))
        self.i += 1
        return out


@pytest.mark.parametrize(
    ("text", "error"),
    MALFORMED_TURNS,
)
def test_each_malformed_turn_has_one_rule(env, small_tokenizer, text, error):
    ids = small_tokenizer.encode(text, add_special_tokens=False)
    parsed = env.parse(ids, "stop")
    assert parsed.action is Action.INVALID and error in parsed.error


def test_runaway_turn_is_invalid(env, small_tokenizer):
    ids = small_tokenizer.encode("<IS> a </IS><query> x", add_special_tokens=False)
    assert env.parse(ids, "length").error == "token budget exhausted"


def test_query_then_answer_is_scored_per_objective(env, small_tasks, small_tokenizer):
    task = small_tasks[0]
    gold = [g[0] for g in task.golden_answers]
    script = [
        f"<IS> start </IS><query>{task.questions[0]}</query>",
        f"<IS> found </IS><answer>{gold[0]}; wrong</answer>",
    ]
    traj = rollout([task], ReplayBackend(small_tokenizer, script), env, REPLAY)[0]
    assert [t.action for t in traj.turns] == [Action.QUERY, Action.ANSWER]
    assert traj.em == [1.0, 0.0] and traj.reward == 0.5 and traj.em_sum == 1.0
    info = traj.turns[0].info_text
    assert info.startswith("<info>Doc 1 (Title: ") and "[HINT] You have 2 turns left." in info
    assert traj.turns[0].query == task.questions[0]


def test_invalid_turn_gets_a_format_info_and_the_last_turn_must_answer(
    env, small_tasks, small_tokenizer
):
    script = ["garbage", "<IS> s </IS><query> q </query>", "<IS> s </IS><query> q </query>"]
    traj = rollout(small_tasks[:1], ReplayBackend(small_tokenizer, script), env, REPLAY)[0]
    assert traj.turns[0].action is Action.INVALID and "[FORMAT]" in traj.turns[0].info_text
    assert "[HINT] This is your last turn: answer now." in traj.turns[1].info_text
    assert len(traj.turns) == 3 and traj.turns[2].info_ids == []
    assert traj.done and traj.reward == 0.0 and traj.format_errors == 1


def test_cli_rollout_of_the_untrained_model_writes_trajectories(tmp_path, capsys):
    import json

    from mem1_core.cli.main import main

    out = tmp_path / "t.parquet"
    assert (
        main(
            [
                "rollout",
                "--profile",
                "smoke",
                "--run",
                str(tmp_path / "run"),
                "-n",
                "2",
                "--tasks",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    trajs = read_trajectories(out)
    assert report["tasks"] == len(trajs) == 3 and all(t.done for t in trajs)
    assert all(t.n_objectives == 2 for t in trajs)


def test_turn_kv_reused_across_calls_equals_the_whole_context(model, env, small_tasks):
    """HFBackend with a TurnCache against the definition, the same backend running each
    whole context in one forward: same greedy ids and log-probs, turn after turn. The second
    turn's contexts are the full context's (the last context, its generated ids and new
    info), MEM1's (the prompt, then something new), one sharing nothing, and one shorter than
    its last sequence; reused lengths of every size in one batch."""
    tok = env.tok
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id, max_batch=3)
    prompts = [env.encode_prompt(t.prompt) for t in small_tasks[:3]]
    assert len({len(p) for p in prompts}) > 1
    tail = env.encode(" <IS> </IS> <info> Doc </info>")
    params = SamplingParams(8, env.stop_ids, temperature=0.0)

    def check(contexts, keys, turns):
        whole = backend.generate(contexts, params)
        got = backend.generate(contexts, params, None, keys, turns)
        for w, g in zip(whole, got, strict=True):
            assert g.ids == w.ids and g.finish == w.finish
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs))
        return got

    turns = TurnCache()
    first = [prompts[0] + tail, prompts[1], prompts[2] + tail[:3], prompts[0][:2] + tail]
    keys = ["a", "b", "c", "d"]
    gens = check(first, keys, turns)
    # each key holds its context and the ids generated in it, but the last
    for k, c, g in zip(keys, first, gens, strict=True):
        assert turns.seqs[k][0] == c + g.ids[:-1]
    second = [
        first[0] + gens[0].ids + tail,  # the full context: all of the last sequence
        prompts[1] + tail,  # MEM1: the prompt, then a new state
        tail,  # nothing in common
        first[3][:3],  # a prefix of the last sequence: all of it but its last token
    ]
    reused = [turns.reusable(k, c) for k, c in zip(keys, second, strict=True)]
    common = len(first[1]) + next(
        (n for n, (x, y) in enumerate(zip(gens[1].ids[:-1], tail, strict=False)) if x != y),
        min(len(gens[1].ids) - 1, len(tail)),
    )
    assert reused == [len(first[0]) + len(gens[0].ids) - 1, common, 0, 2]
    check(second, keys, turns)
    turns.drop("a")
    assert len(turns) == 3 and turns.reusable("a", second[0]) == 0
    # a cache with room for the shorter of two sequences keeps it; the longer's next turn runs
    # whole (its context: the prompt, the tail and what it generated; the other's: the prompt)
    pair = [prompts[1], prompts[1] + tail]
    probe = TurnCache()
    check(pair, ["x", "y"], probe)
    assert len(probe.seqs["x"][0]) < len(probe.seqs["y"][0])
    small = TurnCache(max_bytes=sum(k.nbytes + v.nbytes for k, v in probe.seqs["x"][1]))
    gens = check(pair, ["x", "y"], small)
    assert list(small.seqs) == ["x"] and small.reusable("y", pair[1] + gens[1].ids) == 0
    check([pair[0] + gens[0].ids, pair[1] + gens[1].ids], ["x", "y"], small)
    with pytest.raises(ValueError, match="one key per context"):
        backend.generate(first, params, None, keys[:2], turns)
    with pytest.raises(ValueError, match="its own key"):
        backend.generate(first[:2], params, None, ["a", "a"], turns)


def test_prefill_chunks_are_the_cheapest_grouping_of_all():
    """The prefill's grouping against every partition of the rows (a brute force over set
    partitions, not only runs of the sorted rows): the least tokens run, each group costing its
    rows times its longest row plus a forward's overhead."""
    import random

    from mem1_core.rollout.kv_cache import prefill_chunks

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            yield [[first], *p]
            for k in range(len(p)):
                yield [*p[:k], [first, *p[k]], *p[k + 1 :]]

    def cost(groups, lengths, overhead):
        return sum(overhead + len(g) * max(lengths[r] for r in g) for g in groups)

    rng = random.Random(0)
    for _ in range(60):
        lengths = [rng.choice([1, 5, 40, 150, 160, 600, 650]) for _ in range(rng.randint(1, 6))]
        overhead = rng.choice([0, 30, 128, 10_000])
        got = prefill_chunks(lengths, overhead)
        assert sorted(r for g in got for r in g) == list(range(len(lengths)))
        want = min(cost(p, lengths, overhead) for p in partitions(list(range(len(lengths)))))
        assert cost(got, lengths, overhead) == want, (lengths, overhead, got)
    assert prefill_chunks([10, 40, 31, 8, 30, 100], 20) == [[5], [1, 2, 4], [0, 3]]
    assert prefill_chunks([650, 150, 160], float("inf")) == [[0, 2, 1]]


def test_prefill_in_length_chunks_equals_each_context_alone(model, env, small_tasks, monkeypatch):
    """Contexts whose new tokens differ several-fold, the prefill in chunks (each call under a
    forward overhead at which it splits and some chunk still pads its shorter rows; their keys
    and values laid into one batch cache), some with reused prefixes: each row's greedy ids and
    log-probs equal that context generated alone (batch of one: no pad, no chunk)."""
    from mem1_core.rollout import generation
    from mem1_core.rollout.kv_cache import prefill_chunks

    def split_with_pads(new):
        for overhead in range(1, max(new) * len(new)):
            chunks = prefill_chunks(new, overhead)
            if len(chunks) > 1 and any(len({new[r] for r in c}) > 1 for c in chunks):
                monkeypatch.setattr(generation, "PREFILL_FORWARD_TOKENS", overhead)
                return
        raise AssertionError(f"no overhead splits {new} with pads left in a chunk")

    tok = env.tok
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    prompts = [env.encode_prompt(t.prompt) for t in small_tasks[:3]]
    tail = env.encode(" <IS> </IS> <info> Doc </info>")
    contexts = [
        prompts[0],
        prompts[1] + tail * 6,
        prompts[2] + tail,
        tail[:4],
        prompts[0] + tail * 3,
    ]
    split_with_pads([len(c) for c in contexts])
    params = SamplingParams(8, env.stop_ids, temperature=0.0)

    def alone(contexts):
        return [backend.generate([c], params)[0] for c in contexts]

    def same(got, want):
        for g, w in zip(got, want, strict=True):
            assert g.ids == w.ids and g.finish == w.finish
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs))

    same(backend.generate(contexts, params), alone(contexts))
    # the next turn, keyed: reused prefixes of every length beside rows that reuse nothing
    turns, keys = TurnCache(), list(range(len(contexts)))
    first = backend.generate(contexts, params, None, keys, turns)
    second = [
        contexts[0] + first[0].ids + tail * 5,
        prompts[1] + tail,
        tail * 4,
        contexts[3] + first[3].ids + tail,
        prompts[0] + tail * 2,
    ]
    reused = [turns.reusable(k, c) for k, c in zip(keys, second, strict=True)]
    assert 0 in reused and len(set(reused)) > 2
    split_with_pads([len(c) - n for c, n in zip(second, reused, strict=True)])
    same(backend.generate(second, params, None, keys, turns), alone(second))


def test_turn_cache_takes_a_share_of_the_memory_free_where_the_model_runs(model, monkeypatch):
    """A rollout's TurnCache is sized by the memory free on the model's device now (the
    host's available memory on a CPU, as psutil reads it), not a fixed GiB that kept 12 of 32
    MEM1 WebShop rows; where the free memory cannot be read, the old GiB."""
    import psutil

    from mem1_core.rollout import kv_cache

    backend = HFBackend(model, 0)
    free = kv_cache.free_memory_bytes(torch.device("cpu"))
    assert abs(free - psutil.virtual_memory().available) < 0.05 * free
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 8 * 2**30)
    assert backend.turn_cache().max_bytes == 8 * 2**30 * kv_cache.TURN_CACHE_SHARE
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: None)
    assert backend.turn_cache().max_bytes == kv_cache.TURN_CACHE_FALLBACK
    assert kv_cache.free_memory_bytes(torch.device("meta")) is None


def test_decode_layer_holds_what_a_dynamic_layer_holds():
    """The backend's KV layer (spare room, autocast dtype) against transformers' DynamicLayer
    (a new tensor per update) cast to that dtype: equal keys and values after a prefill, token
    after token past its room, a batch selection and a crop."""
    from transformers.cache_utils import DynamicLayer

    from mem1_core.rollout.kv_cache import DecodeLayer

    g = torch.Generator().manual_seed(0)
    for dtype in (None, torch.bfloat16):
        ours, ref = DecodeLayer(dtype), DynamicLayer()

        def step(m, ours=ours, ref=ref, dtype=dtype):
            B = ref.keys.shape[0] if ref.is_initialized else 3
            k, v = torch.randn(B, 2, m, 4, generator=g), torch.randn(B, 2, m, 4, generator=g)
            got, want = ours.update(k, v), ref.update(k, v)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b if dtype is None else b.to(dtype))

        step(40)
        for _ in range(100):  # past the first room (2 × 41)
            step(1)
        for layer in (ours, ref):
            layer.batch_select_indices(torch.tensor([0, 2]))
        step(1)
        for layer in (ours, ref):
            layer.crop(-21)  # 141 tokens -> 120
        step(5)
        assert ours.keys.shape == ref.keys.shape == (2, 2, 125, 4)
