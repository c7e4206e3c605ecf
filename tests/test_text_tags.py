"""Tags as text under a pretrained tokenizer (docs/design.md §8).

A stand-in for a hub model, built in tests/conftest.py: a byte-level BPE with Qwen2.5's
pre-tokenizer trained on the world's text (the tags are not tokens of it) and a
Qwen2-architecture model from config with that vocabulary, saved with save_pretrained and
loaded back through load_tokenizer / load_model from the directory, as a hub model is.

Checked against definitions: the tags stay out of the vocabulary and the embedding table is
unchanged; the stop rule of the generation backends equals "the first token at which the
decoded turn contains a closing tag"; the text codec's tag positions equal those found by
decoding prefixes; the teacher's trajectories score as under the tiny tokenizer's special
tags; generation stops on closing tags that span several tokens, start inside one or end
inside one; and the flattened tree's log-probs equal re-running every turn on trajectories
sampled under the text scheme.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import types

import pytest
import torch
from conftest import MALFORMED_TURNS

from mem1_core.config import RolloutConfig
from mem1_core.data.prompts import ANSWER_CLOSE, IS_OPEN, QUERY_CLOSE, TAGS
from mem1_core.models.model import load_model
from mem1_core.models.tags import tag_codec, tag_scheme, token_ends, turn_text
from mem1_core.models.tokenizer import load_tokenizer
from mem1_core.qa.env import QAEnvironment
from mem1_core.qa.teacher import ScriptedTeacher
from mem1_core.rollout.generation import HFBackend, SamplingParams, StopStrings
from mem1_core.rollout.loop import rollout
from mem1_core.trajectory.logprobs import per_turn_logprobs, token_logprobs
from mem1_core.trajectory.record import Action, SegmentKind, turn_paths
from mem1_core.trajectory.tree import collate, flatten

STOPS = (QUERY_CLOSE, ANSWER_CLOSE)


@pytest.fixture(scope="module")
def hub_tok(hub_dir):
    return load_tokenizer(hub_dir)


@pytest.fixture(scope="module")
def hub_model(hub_dir, hub_tok, hub_model_config):
    return load_model(hub_dir, hub_model_config, hub_tok)


@pytest.fixture(scope="module")
def env(hub_tok, small_index):
    return QAEnvironment(hub_tok, small_index, topk=3)


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def first_stop(tok, ids: list[int], strings=STOPS) -> int | None:
    """The definition, by brute force: the shortest prefix whose text holds a stop string."""
    return next(
        (n for n in range(1, len(ids) + 1) if any(s in turn_text(tok, ids[:n]) for s in strings)),
        None,
    )


# ---- the hub tokenizer and model load as they were saved ------------------------------------


def test_tags_stay_text_and_the_embedding_table_is_unchanged(
    hub_dir, hub_tokenizer, hub_tok, hub_model, small_tokenizer
):
    from safetensors.torch import load_file

    for tok in (hub_tokenizer, hub_tok):  # as trained, and as loaded from the directory
        vocab = tok.get_vocab()
        assert not any(t in vocab for t in TAGS)
        assert all(len(enc(tok, t)) >= 2 for t in TAGS)
        assert tag_scheme(tok) == "text" and tag_codec(tok).scheme == "text"
    assert len(hub_tok) == len(hub_tokenizer)  # nothing added on loading
    assert type(hub_tok).__name__ == "Qwen2Tokenizer"  # through AutoTokenizer, as from the hub
    text = (
        "Question 1: In what year was Kalo Vesh born?\n<IS> Q1: 1874. </IS><answer> 1874</answer>"
    )
    assert enc(hub_tok, text) == enc(hub_tokenizer, text)
    assert tag_scheme(small_tokenizer) == "special"

    saved = load_file(hub_dir / "model.safetensors")["model.embed_tokens.weight"]
    emb = hub_model.get_input_embeddings().weight
    assert emb.shape == saved.shape == (len(hub_tok), hub_model.config.hidden_size)
    assert torch.equal(emb.detach(), saved)
    assert hub_model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # still tied


def test_a_tokenizer_larger_than_the_table_is_refused(hub_dir, hub_model_config, small_tokenizer):
    """Resizing would read the extra ids through random rows (docs/design.md §8)."""
    assert len(small_tokenizer) > 800
    with pytest.raises(ValueError, match="embedding rows"):
        load_model(hub_dir, hub_model_config, small_tokenizer)


# ---- the stop rule and the codec against their definitions ---------------------------------


def random_turns(tok, n: int, seed: int, whole_text: bool = False) -> list[list[int]]:
    """Id sequences that hold tags in many tokenisations: encoded text with tags and stray
    tag pieces, glued from separately encoded parts, with random ids in between (bytes of
    unfinished characters included, unless `whole_text`: then only ids that decode alone)."""
    rng = random.Random(seed)
    parts = [*TAGS, "</", "query", "answer", ">", ">.\n", " </", "<", "x", " Kalo", " 1874", "é中"]
    pool = range(len(tok))
    if whole_text:
        pool = [i for i in pool if "\ufffd" not in turn_text(tok, [i])]
    out = []
    for _ in range(n):
        ids: list[int] = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.25:
                ids.append(rng.choice(pool))
            else:
                ids += enc(tok, "".join(rng.choice(parts) for _ in range(rng.randint(1, 3))))
        out.append(ids)
    return out


def test_stop_strings_end_a_turn_at_the_first_token_that_completes_a_tag(hub_tok):
    stop = StopStrings(hub_tok, STOPS)
    hits = 0
    for ids in random_turns(hub_tok, 300, seed=0):
        want = first_stop(hub_tok, ids)
        assert stop.index(ids) == want
        # the check after every generated token (the Hugging Face backend) stops there too
        incremental = next((n for n in range(1, len(ids) + 1) if stop.completes(ids[:n])), None)
        assert incremental == want
        hits += want is not None and want < len(ids)
    assert hits > 50  # many sequences go on after their stop


def test_text_codec_finds_tags_where_decoding_prefixes_does(hub_tok):
    codec = tag_codec(hub_tok)
    for ids in random_turns(hub_tok, 200, seed=1, whole_text=True):
        text = turn_text(hub_tok, ids)
        spans = codec.find(ids)
        assert [s.tag for s in spans] == _scan(text)  # every tag, in the order of the text
        for s in spans:
            assert text[s.start : s.end] == s.tag
            # first: the token whose prefix first reaches the tag's first character; last: the
            # token whose prefix first holds the whole tag in its place
            assert s.first == _first_prefix(hub_tok, ids, lambda t, s=s: len(t) > s.start)
            assert s.last == _first_prefix(hub_tok, ids, lambda t, s=s: t[s.start : s.end] == s.tag)
        ends = token_ends(hub_tok, ids, text)
        assert ends[-1] == len(text) and ends == sorted(ends)
    for ids in random_turns(hub_tok, 200, seed=2):  # with bytes that never make a character
        text = turn_text(hub_tok, ids)
        spans = codec.find(ids)
        assert [s.tag for s in spans] == _scan(text)
        assert all(text[s.start : s.end] == s.tag and s.first <= s.last for s in spans)


def _scan(text: str) -> list[str]:
    found, i = [], 0
    while i < len(text):
        tag = next((t for t in TAGS if text.startswith(t, i)), None)
        found += [tag] if tag else []
        i += len(tag) if tag else 1
    return found


def _first_prefix(tok, ids, pred) -> int:
    """The first token k at which turn_text(ids[:k+1]) satisfies `pred` (on whole text: an
    unfinished character at the end of a prefix is not text yet)."""
    for k in range(len(ids)):
        t = turn_text(tok, ids[: k + 1]).rstrip("\ufffd")
        if pred(t):
            return k
    raise AssertionError("no prefix satisfies the predicate")


# ---- the environment under text tags --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        *MALFORMED_TURNS,
        ("<IS> a </IS><query> x </query>.\nmore", "tags out of order"),
        ("noise <IS> s </IS><query>Kalo</query>\n", "text outside the tags"),  # a preamble
        ("<IS> s </IS> so <query>Kalo</query>", "text outside the tags"),
        ("<IS> s </IS><info>made up</info><query>Kalo</query>", "wrote an <info>"),
    ],
)
def test_each_malformed_turn_has_one_rule(env, hub_tok, text, error):
    parsed = env.parse(enc(hub_tok, text), "stop")
    assert parsed.action is Action.INVALID and error in parsed.error


@pytest.mark.parametrize(
    ("text", "action", "said"),
    [
        ("<IS> Start. </IS><query> Kalo Vesh </query>", Action.QUERY, "Kalo Vesh"),
        ("\n <IS> s </IS>\n<query>Kalo</query>\n", Action.QUERY, "Kalo"),  # `>\n`: one token
        ("<IS> Q1: 1874. </IS><answer> 1874; Kalo</answer>.\n", Action.ANSWER, "1874; Kalo"),
        ("<IS> s </IS><answer></answer>", Action.ANSWER, ""),
    ],
)
def test_actions_are_read_from_the_decoded_turn(env, hub_tok, text, action, said):
    parsed = env.parse(enc(hub_tok, text), "stop")
    assert parsed.action is action and parsed.text == said and parsed.error is None


# ---- the teacher round-trips under both schemes ---------------------------------------------


@pytest.mark.parametrize("memory", ["mem1", "full"])
@pytest.mark.parametrize("n", [1, 2])
def test_teacher_scores_as_under_special_tags(
    small_world, small_tokenizer, small_index, hub_tok, env, memory, n
):
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, n, split="test")
    tasks = tasks_from_table(table)[:8]
    cfg = RolloutConfig()
    special_env = QAEnvironment(small_tokenizer, small_index, topk=3)
    ref = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), special_env, cfg, memory=memory)
    got = rollout(tasks, ScriptedTeacher(hub_tok, tasks), env, cfg, memory=memory)
    assert sum(t.reward for t in got) / len(got) >= 0.9  # retrieval may miss a document
    for g, r in zip(got, ref, strict=True):
        assert g.format_errors == 0 and g.done
        assert g.reward == r.reward and g.em == r.em and g.answer == r.answer
        assert [t.action for t in g.turns] == [t.action for t in r.turns]
        assert [t.query for t in g.turns] == [t.query for t in r.turns]
        assert [t.info_text for t in g.turns] == [t.info_text for t in r.turns]
        # contexts are id segments: MEM1 carries an exact slice of the last turn's ids
        for t in range(1, len(g.turns)):
            prev = g.turns[t - 1]
            if memory == "mem1":
                start = env.codec.state_start(prev.gen_ids)
                assert g.turns[t].context[1].kind is SegmentKind.GEN
                assert g.context_ids(t) == g.prompt_ids + prev.gen_ids[start:] + prev.info_ids
                assert turn_text(hub_tok, prev.gen_ids[start:]).lstrip().startswith(IS_OPEN)
            assert g.turns[t].context_tokens == len(g.context_ids(t))


# ---- stops in real generation ----------------------------------------------------------------


def test_generation_stops_on_closing_tags_split_across_tokens(hub_reciter, hub_tok, env):
    """The reciting model (tests/conftest.py) writes on past each closing tag; the closing tag
    is 3 tokens, the first shared with a space (` </`) or not, the last with what follows
    (`>\n`, `>.\n`); `</IS><` shares the token `><` between two tags."""
    model, cases = hub_reciter
    backend = HFBackend(model, hub_tok.pad_token_id, hub_tok.eos_token_id, tokenizer=hub_tok)
    contexts = [c.context for c in cases]
    free = backend.generate(contexts, SamplingParams(40, (), 0.0))
    for g, c in zip(free, cases, strict=True):
        assert g.ids[: len(c.script)] == c.script  # it writes past the tag if nothing stops it
    params = SamplingParams(40, env.stop_ids, 0.0, stop_strings=env.stop_strings)
    got = backend.generate(contexts, params)
    for g, c in zip(got, cases, strict=True):
        script, action, said, tail = c.script, Action(c.action), c.text, c.tail
        n = first_stop(hub_tok, script)
        assert g.ids == script[:n] and g.finish == "stop"
        [closer] = [s for s in env.codec.find(g.ids) if s.tag in STOPS]
        assert closer.first < closer.last == n - 1  # several tokens, the last one completes it
        assert turn_text(hub_tok, g.ids).endswith(closer.tag + tail)  # it carries `tail` on
        parsed = env.parse(g.ids, g.finish)
        assert (parsed.action, parsed.text) == (action, said)
    # the rows stop at different steps: the cache pruning keeps the other row exact
    [alone] = backend.generate(contexts[1:], params)
    assert alone.ids == got[1].ids
    torch.testing.assert_close(torch.tensor(alone.logprobs), torch.tensor(got[1].logprobs))


def test_a_string_stop_needs_the_tokenizer(hub_reciter, hub_tok):
    model, cases = hub_reciter
    with pytest.raises(ValueError, match="tokenizer"):
        HFBackend(model, hub_tok.pad_token_id).generate(
            [cases[0].context], SamplingParams(4, (), 0.0, stop_strings=STOPS)
        )


# ---- the exactness contract on sampled text-tag trajectories --------------------------------

CFG = RolloutConfig(
    turns_base=1, turns_per_objective=1, gen_tokens_base=40, gen_tokens_per_objective=4
)


@pytest.fixture(scope="module")
def sampled(hub_dir, hub_tok, hub_model_config, env, small_world, small_tasks):
    """A model that has had a little SFT on the teacher (so its samples write tags, mostly
    malformed), sampled at T = 1 under each memory policy."""
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table
    from mem1_core.training.sft import teacher_trajectories, train_on_trajectories

    table, _ = compose(world_questions(small_world.questions).table, 1, split="train")
    tasks = tasks_from_table(table)[:32]
    teach = teacher_trajectories(tasks, hub_tok, env, RolloutConfig(), memory="mem1")
    model = load_model(hub_dir, hub_model_config, hub_tok)
    train_on_trajectories(
        model, teach, hub_tok.pad_token_id, lr=1e-2, batch_size=4, minutes=1.0,
        max_steps=40, warmup_steps=5, progress=False,
    )  # fmt: skip
    backend = HFBackend(model, hub_tok.pad_token_id, hub_tok.eos_token_id, tokenizer=hub_tok)
    out = {}
    for memory in ("mem1", "full"):
        cfg = dataclasses.replace(CFG, memory=memory)
        gen = torch.Generator().manual_seed(0)
        out[memory] = rollout(small_tasks[:6], backend, env, cfg, generator=gen)
    return model, out


@pytest.mark.parametrize("memory", ["mem1", "full"])
def test_flattened_tree_matches_the_definition_under_text_tags(sampled, hub_tok, memory):
    model, by_memory = sampled
    trajs = by_memory[memory]
    turns = [turn for t in trajs for turn in t.turns]
    stopped = [u for u in turns if u.finish == "stop"]
    assert len(stopped) >= len(turns) // 4  # string stops fired on sampled turns
    assert all(any(s in u.gen_text for s in STOPS) for u in stopped)
    batch = collate([flatten(turn_paths(t)) for t in trajs], hub_tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch, "sdpa")
    for b, traj in enumerate(trajs):
        ref = per_turn_logprobs(model, turn_paths(traj))
        for t, (turn, r) in enumerate(zip(traj.turns, ref, strict=True)):
            # the rollout's own log-probs, and one pass over the flattened tree, = the rerun
            torch.testing.assert_close(torch.tensor(turn.gen_logprobs), r, atol=1e-4, rtol=0)
            sel = (batch.gen_turn[b] == t) & batch.loss_mask[b]
            got = logp[b][sel][batch.gen_offset[b][sel].argsort()]
            assert (got - r).abs().max().item() <= 1e-5


# ---- the vLLM side without vLLM: what we ask of it, and what we make of its answer ----------


class _FakeVLLM(types.ModuleType):
    """Only records the SamplingParams we build (the real engine is tests/test_vllm_backend.py)."""

    def __init__(self):
        super().__init__("vllm")
        self.SamplingParams = lambda **kw: kw


def _backend(tokenizer):
    from mem1_core.rollout.generation_vllm import LOGPROBS_MODE, VLLMBackend

    config = types.SimpleNamespace(
        logprobs_mode=LOGPROBS_MODE, skip_tokenizer_init=tokenizer is None
    )
    llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(model_config=config))
    return VLLMBackend(llm, eos_id=0, tokenizer=tokenizer)


def test_vllm_requests_stop_strings_kept_in_the_output(monkeypatch, hub_tok):
    monkeypatch.setitem(sys.modules, "vllm", _FakeVLLM())
    params = SamplingParams(16, (), 0.0, stop_strings=STOPS)
    kw = _backend(hub_tok).sampling_params(params, seed=None)
    assert kw["stop"] == list(STOPS) and kw["include_stop_str_in_output"] is True
    assert kw["detokenize"] is True and kw["skip_special_tokens"] is False
    assert kw["stop_token_ids"] == [0]
    ids_only = _backend(None).sampling_params(SamplingParams(16, (5,), 0.0), seed=None)
    assert ids_only["stop"] is None and ids_only["detokenize"] is False
    with pytest.raises(ValueError, match="tokenizer"):
        _backend(None).sampling_params(params, seed=None)


def test_vllm_output_is_cut_at_our_stop(hub_tok):
    """vLLM ends its ids with the token that completed the stop string; if it ever returns
    more (several tokens a step), the ids and log-probs are cut where the definition stops."""
    from mem1_core.rollout.generation_vllm import _to_generation

    ids = enc(hub_tok, "<IS> Q1: 1874. </IS><answer> 1874</answer>.\nQuestion 2: more")
    n = first_stop(hub_tok, ids)
    strings = StopStrings(hub_tok, STOPS)
    for returned, reason in ((ids[:n], "stop"), (ids, "stop"), (ids[: n - 1], "length")):
        out = types.SimpleNamespace(
            token_ids=returned,
            logprobs=[{t: types.SimpleNamespace(logprob=-0.5 - i)} for i, t in enumerate(returned)],
            finish_reason=reason,
        )
        g = _to_generation(out, strings)
        keep = min(len(returned), n)
        assert g.ids == ids[:keep] and g.logprobs == [-0.5 - i for i in range(keep)]
        assert g.finish == ("stop" if keep == n else "length")
