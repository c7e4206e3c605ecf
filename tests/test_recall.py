"""`mem1+recall`: BM25 over the trajectory's own pruned `<info>` blocks, answered
for a `<query> recall: …</query>`, through the real loop, environment, BM25 index and a real
tiny model.

Checks against definitions: BM25 scores against the formula worked by hand and against
`bm25s`; every turn's context rebuilt from the record against the ids the model was fed, and
its log-probs against a re-run of that context; the teacher's recalls against the perfect
teacher's answers; mem1 (no recall) against mem1+recall where nothing was forgotten."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from mem1_core.config import MEMORIES, ModelConfig, RolloutConfig, load_config
from mem1_core.data.prompts import split_answers
from mem1_core.models.model import build_tiny_model
from mem1_core.qa.env import QAEnvironment, format_passages, info_body
from mem1_core.qa.teacher import ScriptedTeacher, Step, task_steps
from mem1_core.rollout.generation import Generation
from mem1_core.rollout.loop import rollout
from mem1_core.rollout.recall import (
    best_block,
    bm25_scores,
    is_recall,
    recall_count,
    recall_query,
    store,
    terms,
)
from mem1_core.trajectory.logprobs import per_turn_logprobs, token_logprobs
from mem1_core.trajectory.record import (
    Action,
    Trajectory,
    read_trajectories,
    turn_paths,
    write_trajectories,
)
from mem1_core.trajectory.tree import collate, flatten

# room for every recall: 2 + 4N turns (the profiles give 2 + 2N)
ROOMY = RolloutConfig(turns_per_objective=4)


@pytest.fixture(scope="module")
def env(small_tokenizer, small_index):
    return QAEnvironment(small_tokenizer, small_index, topk=2)


# ---- BM25 ------------------------------------------------------------------------------


def test_bm25_scores_follow_the_formula_by_hand():
    docs = [["a", "b", "b", "c"], ["b", "d"], ["e", "a", "a", "a", "f", "g"]]
    # D = 3, avgdl = 12 / 3 = 4; df(a) = df(b) = 2 -> idf = ln(1 + 1.5 / 2.5) = ln 1.6
    idf = math.log(1.6)
    k1, b = 1.5, 0.75
    norm = [k1 * (1 - b + b * dl / 4) for dl in (4, 2, 6)]  # 1.5, 0.9375, 1.78125
    want = [
        idf * 1 * 2.5 / (1 + norm[0]) + idf * 2 * 2.5 / (2 + norm[0]),  # a once, b twice
        idf * 1 * 2.5 / (1 + norm[1]),  # b once
        idf * 3 * 2.5 / (3 + norm[2]),  # a three times
    ]
    got = bm25_scores(["a", "b"], docs)
    assert got == pytest.approx(want, abs=1e-12)
    assert got[0] == pytest.approx(math.log(1.6) * 17 / 7, abs=1e-12)
    # a repeated query term counts once; a term no doc has adds nothing; no docs, no scores
    assert bm25_scores(["a", "b", "a", "zz"], docs) == pytest.approx(want, abs=1e-12)
    assert bm25_scores(["a"], []) == []


def test_bm25_agrees_with_bm25s_up_to_its_constant_factor(small_world):
    """bm25s's `lucene` method (the project's retriever) drops the (k1 + 1) factor."""
    import bm25s

    texts = small_world.corpus["contents"].to_pylist()[:40]
    docs = [terms(t) for t in texts]
    ref = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    ref.index(docs, show_progress=False)
    for text in texts[::7]:
        query = sorted(set(terms(text)))[:4]  # distinct terms: bm25s sums every query token
        want = [float(x) * 2.5 for x in ref.get_scores(query)]
        assert bm25_scores(query, docs) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_best_block_takes_the_top_score_the_earliest_on_a_tie_and_none_without_a_match():
    blocks = ["Doc 1 (Title: Kalo Vesh) Kalo Vesh was born in 1742.", "Doc 1 (Title: Mira Tol)"]
    assert best_block("Kalo Vesh", blocks) == blocks[0]
    assert best_block("mira", blocks) == blocks[1]
    assert best_block("Doc", blocks) == blocks[1]  # in both: the shorter block wins
    tied = ["Doc 1 (Title: Kalo Vesh)", "Doc 1 (Title: Mira Tol)"]  # the same length
    assert best_block("Doc", tied) == tied[0] and best_block("Doc", tied[::-1]) == tied[1]
    assert best_block("Zorn", blocks) is None and best_block("Kalo", []) is None


def test_a_recall_is_a_query_with_the_prefix():
    assert recall_query("recall: Loshu Lor") == "Loshu Lor"
    assert recall_query("  RECALL:Loshu Lor ") == "Loshu Lor"
    assert recall_query("recall:") == ""
    assert recall_query("Loshu Lor recall:") is None and recall_query(None) is None


def test_info_body_inverts_the_info_block(env):
    for body in ("Doc 1 (Title: A) a.\nDoc 2 (Title: B) b.", "No results.", ""):
        for left in (1, 3):
            assert info_body(env.info_block(body, left)) == body
    with pytest.raises(ValueError, match="not an info block"):
        info_body("Doc 1")


# ---- the environment step, driven by fixed turns --------------------------------------


class ReplayBackend:
    """Plays fixed turns (texts tokenized here) in place of a model; log-probs are zeros."""

    def __init__(self, tok, turns: list[str]):
        self.turns = [tok.encode(t, add_special_tokens=False) for t in turns]
        self.i = 0

    def generate(self, contexts, params, generator=None):
        ids = self.turns[min(self.i, len(self.turns) - 1)]
        self.i += 1
        return [Generation(list(ids), [0.0] * len(ids), "stop") for _ in contexts]


class CountingRetriever:
    def __init__(self, inner):
        self.inner, self.queries = inner, []

    def search(self, queries, k):
        self.queries += list(queries)
        return self.inner.search(queries, k)


def _script(task) -> list[str]:
    first, second = (json.loads(p)[0]["query"] for p in task.plans[:2])
    return [
        f"<IS> s </IS><query> {first}</query>",
        f"<IS> s </IS><query> {second}</query>",
        "<IS> s </IS><query> Start.</query>",  # an invalid-free search that finds little
        f"<IS> s </IS><query> recall: {first}</query>",
        "<IS> s </IS><query> recall: Qqqzz</query>",  # nothing in the store matches
        "<IS> s </IS><answer> x; y</answer>",
    ]


def test_a_recall_is_answered_from_the_trajectorys_own_blocks(
    small_tokenizer, small_index, small_tasks
):
    task = small_tasks[0]
    retriever = CountingRetriever(small_index)
    env = QAEnvironment(small_tokenizer, retriever, topk=2)
    backend = ReplayBackend(small_tokenizer, _script(task))
    traj = rollout([task], backend, env, ROOMY, memory="mem1+recall")[0]
    first = json.loads(task.plans[0])[0]["query"]
    # the retriever saw the three searches only
    assert retriever.queries == [traj.turns[t].query for t in range(3)]
    assert [is_recall(traj, t) for t in range(len(traj.turns))] == [0, 0, 0, 1, 1, 0]
    assert recall_count(traj) == 2
    blocks = [info_body(traj.turns[t].info_text) for t in range(3)]
    assert blocks[0] == format_passages(small_index.search([first], 2)[0])
    # the recall's <info> is the best stored block, byte for byte, with the hint of its turn
    assert best_block(first, blocks) == blocks[0]
    assert traj.turns[3].info_text == env.info_block(blocks[0], traj.max_turns - 4)
    assert traj.turns[3].info_ids == env.encode(traj.turns[3].info_text)
    assert info_body(traj.turns[4].info_text) == "No results."
    # the store holds the searches' blocks, never a recall's copy
    assert [t for t, _ in store(traj)] == [0, 1, 2]


def test_a_recall_query_under_plain_mem1_is_an_ordinary_search(
    small_tokenizer, small_index, small_tasks
):
    task = small_tasks[0]
    retriever = CountingRetriever(small_index)
    env = QAEnvironment(small_tokenizer, retriever, topk=2)
    traj = rollout([task], ReplayBackend(small_tokenizer, _script(task)), env, ROOMY)[0]
    assert traj.memory == "mem1" and recall_count(traj) == 0
    assert len(retriever.queries) == 5 and retriever.queries[3].startswith("recall:")
    hits = small_index.search([retriever.queries[3]], 2)[0]
    assert info_body(traj.turns[3].info_text) == format_passages(hits)


# ---- a real model through the real loop: exact contexts --------------------------------


class TeacherForcedModel:
    """A real model that writes what the teacher writes: the turn's ids are the teacher's,
    their log-probs the model's in the context the loop fed it (recorded for the check)."""

    reads_trajectories = True

    def __init__(self, teacher, model):
        self.teacher, self.model, self.fed = teacher, model, {}

    def generate(self, contexts, params, generator=None, trajectories=None):
        gens = self.teacher.generate(contexts, params, generator, trajectories)
        out = []
        for ctx, gen, traj in zip(contexts, gens, trajectories, strict=True):
            self.fed[(traj.task_id, len(traj.turns))] = list(ctx)
            ids = torch.tensor([ctx + gen.ids])
            with torch.no_grad():
                logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), -1)
            c = len(ctx)
            lp = logp[c - 1 : -1].gather(-1, ids[0, c:, None]).squeeze(-1)
            out.append(Generation(gen.ids, lp.tolist(), gen.finish))
        return out


@pytest.fixture(scope="module")
def model(small_tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    return build_tiny_model(cfg, small_tokenizer).eval()


@pytest.fixture(scope="module")
def forced(model, small_tokenizer, env, small_tasks):
    tasks = small_tasks[:8]
    teacher = ScriptedTeacher(small_tokenizer, tasks, forget_rate=1.0)
    backend = TeacherForcedModel(teacher, model)
    trajs = rollout(tasks, backend, env, ROOMY, memory="mem1+recall")
    return trajs, backend.fed


def test_every_turn_of_a_recall_rollout_is_rebuilt_exactly(
    forced, model, small_tokenizer, tmp_path
):
    trajs, fed = forced
    assert sum(recall_count(t) for t in trajs) >= len(trajs)  # N=2, forget_rate 1: each recalls
    for traj in trajs:
        for t, turn in enumerate(traj.turns):
            assert traj.context_ids(t) == fed[(traj.task_id, t)]  # what the model was fed
            assert turn.context_tokens == len(fed[(traj.task_id, t)])
        # the recorded log-probs are the definition's: each turn's real context re-run alone
        for turn, ref in zip(traj.turns, per_turn_logprobs(model, turn_paths(traj)), strict=True):
            torch.testing.assert_close(torch.tensor(turn.gen_logprobs), ref, atol=1e-5, rtol=0)
    # and the flattened tree gives them in one pass
    batch = collate([flatten(turn_paths(t)) for t in trajs], small_tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch, "sdpa")
    for b, traj in enumerate(trajs):
        for t, ref in enumerate(per_turn_logprobs(model, turn_paths(traj))):
            sel = (batch.gen_turn[b] == t) & batch.loss_mask[b]
            got = logp[b][sel][batch.gen_offset[b][sel].argsort()]
            assert (got - ref).abs().max().item() <= 1e-5
    write_trajectories(trajs, tmp_path / "t.parquet")
    back = read_trajectories(tmp_path / "t.parquet")
    assert back == trajs and [recall_count(t) for t in back] == [recall_count(t) for t in trajs]


def test_a_recall_context_stays_as_bounded_as_mem1s(forced):
    """One recalled block at a time: prompt + one turn + one info block, whatever the turn."""
    trajs, _ = forced
    for traj in trajs:
        gen = max(len(t.gen_ids) for t in traj.turns)
        info = max(len(t.info_ids) for t in traj.turns)
        for t, turn in enumerate(traj.turns):
            assert turn.context_tokens <= len(traj.prompt_ids) + gen + info
            if t:  # MEM1's three segments: prompt, the last turn from <IS>, its info
                assert [r.turn for r in turn.context] == [-1, t - 1, t - 1]


# ---- the teacher ------------------------------------------------------------------------


def _tasks(small_world, n, split="test"):
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, n, split=split)
    return tasks_from_table(table)


@pytest.mark.parametrize("n", [2, 3])
def test_the_teacher_recalls_what_it_forgot_and_answers_as_the_perfect_teacher(
    small_world, small_tokenizer, env, n
):
    tasks = _tasks(small_world, n)[:10]
    perfect = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, ROOMY)
    lapsing = rollout(
        tasks,
        ScriptedTeacher(small_tokenizer, tasks, forget_rate=1.0),
        env,
        ROOMY,
        memory="mem1+recall",
    )
    for p, r in zip(perfect, lapsing, strict=True):
        task = next(t for t in tasks if t.task_id == r.task_id)
        steps = task_steps(task)
        lookups = sum(len(s) for s in steps)
        # the lookups, then every forgotten objective's lookups again as recalls, then the answer
        recalls = [t.query for t in r.turns if t.action is Action.QUERY][lookups:]
        assert recalls == [f"recall: {s.query}" for obj in steps[:-1] for s in obj]
        assert all(is_recall(r, t) for t in range(lookups, len(r.turns) - 1))
        assert r.em == p.em and split_answers(r.answer) == split_answers(p.answer)
        for t in range(lookups, len(r.turns) - 1):  # a recalled fact is in the next state
            step = [s for obj in steps[:-1] for s in obj][t - lookups]
            if step.answer in r.turns[t].info_text:
                state = r.turns[t + 1].gen_text.split("</IS>")[0]
                assert f"Q{step.objective + 1}: ?." not in state


def test_the_teacher_takes_nothing_from_a_recall_that_brings_nothing_back(
    small_world, small_tokenizer, env, monkeypatch
):
    """Facts come only from the recalled <info>, never from the teacher's own plan: with a
    store that answers every recall "No results.", what it forgot stays `?`."""
    import mem1_core.qa.env as qa_env

    monkeypatch.setattr(qa_env, "recall", lambda traj, query: "No results.")
    tasks = _tasks(small_world, 2)[:10]
    trajs = rollout(
        tasks,
        ScriptedTeacher(small_tokenizer, tasks, forget_rate=1.0),
        env,
        ROOMY,
        memory="mem1+recall",
    )
    for traj in trajs:
        assert recall_count(traj) >= 1
        assert split_answers(traj.answer)[0] == "?" and traj.em[0] == 0.0
        first = next(k for k in range(len(traj.turns)) if is_recall(traj, k))
        for turn in traj.turns[first:]:  # Q1 stays unknown (a comparison may keep one name)
            assert re.search(r"Q1: [^.]*\?\.", turn.gen_text.split("</IS>")[0]), turn.gen_text


def test_the_teacher_recalls_only_what_its_turn_budget_leaves_room_for(
    small_world, small_tokenizer, env
):
    cfg = RolloutConfig()  # 2 + 2N turns
    tasks = _tasks(small_world, 4)[:12]
    trajs = rollout(
        tasks,
        ScriptedTeacher(small_tokenizer, tasks, forget_rate=1.0),
        env,
        cfg,
        memory="mem1+recall",
    )
    for traj in trajs:
        assert len(traj.turns) <= traj.max_turns and traj.turns[-1].action is Action.ANSWER
        assert traj.format_errors == 0
    assert sum(recall_count(t) for t in trajs) > 0


def test_recall_plan_takes_whole_objectives_in_order_within_the_spare_turns():
    def obj(i, k):
        return [Step(i, f"q{i}{j}", f"q{i}{j}", f"a{i}{j}") for j in range(k)]

    steps = [obj(0, 2), obj(1, 1), obj(2, 2), obj(3, 1)]  # 6 lookups
    traj = Trajectory("t", "mem1+recall", [], [[]] * 4, max_turns=10)  # 3 spare turns
    plan = ScriptedTeacher.recall_plan(traj, steps, {0, 1, 2})
    assert plan == obj(0, 2) + obj(1, 1)
    assert ScriptedTeacher.recall_plan(traj, steps, {2, 1}) == obj(1, 1) + obj(2, 2)
    assert ScriptedTeacher.recall_plan(dataclasses.replace(traj, max_turns=7), steps, {0}) == []


def test_under_mem1_the_lapsing_teacher_plays_as_before(small_world, small_tokenizer, env):
    """mem1 never recalls; mem1+recall plays turn for turn the same until its first recall,
    and exactly the same where nothing was forgotten (so recall costs nothing there)."""
    tasks = _tasks(small_world, 2)[:40]

    def play(memory):
        teacher = ScriptedTeacher(small_tokenizer, tasks, forget_rate=0.5)
        return rollout(tasks, teacher, env, ROOMY, memory=memory)

    plain, backed = play("mem1"), play("mem1+recall")
    assert not any("recall:" in (t.query or "") for tr in plain for t in tr.turns)
    forgot = 0
    for m, r in zip(plain, backed, strict=True):
        k = next((t for t in range(len(r.turns)) if is_recall(r, t)), None)
        if k is None:
            assert [t.gen_ids for t in m.turns] == [t.gen_ids for t in r.turns] and m.em == r.em
            continue
        forgot += 1
        assert [t.gen_ids for t in m.turns[:k]] == [t.gen_ids for t in r.turns[:k]]
        assert sum(r.em) >= sum(m.em)
    assert 5 <= forgot <= 35  # Binomial(40, 0.5)


def test_the_summary_counts_recalls(forced):
    from mem1_core.evaluation.summary import summarize

    trajs, _ = forced
    assert summarize(trajs)["recalls"] == sum(recall_count(t) for t in trajs) / len(trajs) > 0
    plain = [dataclasses.replace(t, memory="mem1") for t in trajs]  # the same turns, no recall
    assert summarize(plain)["recalls"] == 0


# ---- registered everywhere memories are listed, and trained through config -------------------


def test_mem1_recall_is_a_memory_of_config_cli_and_evaluation():
    from mem1_core.cli.commands.evaluate import parse_agent
    from mem1_core.cli.main import build_parser
    from mem1_core.rollout.memory import MEMORY_POLICIES

    assert "mem1+recall" in MEMORIES and set(MEMORIES) == set(MEMORY_POLICIES)
    assert (
        load_config("smoke", None, ["rollout.memory=mem1+recall"]).rollout.memory == "mem1+recall"
    )
    with pytest.raises(ValueError, match="mem1\\+recall"):
        load_config("smoke", None, ["rollout.memory=recall"])
    parse = build_parser().parse_args
    assert parse(["rollout", "--run", "r", "--out", "o", "--memory", "mem1+recall"]).memory == (
        "mem1+recall"
    )
    assert parse(["train", "sft", "--out", "o", "--memory", "mem1+recall"]).memory == "mem1+recall"
    assert parse_agent("a=DIR:mem1+recall") == ("a", "DIR", "mem1+recall")
    with pytest.raises(ValueError, match="not one of"):
        parse_agent("a=DIR:recall")


@pytest.mark.slow
def test_sft_then_ppo_under_mem1_recall_through_the_cli(tmp_path, monkeypatch, capsys):
    """`mem1 train sft --memory mem1+recall` on a forgetful teacher trains on recall turns;
    `mem1 train ppo --set rollout.memory=mem1+recall` runs from it and logs recalls."""
    from mem1_core.cli.main import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    sft = tmp_path / "sft"
    argv = ["train", "sft", "--profile", "smoke", "--out", str(sft), "--memory", "mem1+recall"]
    sets = ["--set", "teacher.forget_rate=1.0", "--set", "sft.steps=4", "--set", "sft.n_teacher_tasks=16"]  # fmt: skip
    assert main([*argv, *sets]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["memory"] == "mem1+recall" and result["steps"] == 4
    taught = read_trajectories(sft / "teacher_trajectories.parquet")
    assert all(t.memory == "mem1+recall" for t in taught)
    assert sum(recall_count(t) for t in taught) >= len(taught) // 2
    assert (sft / "policy" / "model.safetensors").exists()

    ppo = tmp_path / "ppo"
    argv = ["train", "ppo", "--profile", "smoke", "--out", str(ppo), "--init", str(sft)]
    sets = [
        "rollout.memory=mem1+recall",
        "ppo.iterations=1",
        "ppo.tasks_per_iteration=2",
        "ppo.minibatch_size=8",
        "ppo.micro_batch_size=8",
        "data.max_eval_tasks=2",
    ]
    assert main([*argv, "--no-ray", "--no-progress", *[a for s in sets for a in ("--set", s)]]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (ppo / "metrics.jsonl").read_text().splitlines()]
    assert rows and "recalls" in rows[-1]
    part = next((ppo / "trajectories").glob("*.parquet"))
    assert all(t.memory == "mem1+recall" for t in read_trajectories(part))
