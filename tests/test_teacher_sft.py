"""The scripted teacher and SFT over the flattened tree (checked against re-running turns)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from mem1_core.config import ModelConfig, RolloutConfig
from mem1_core.models.model import build_tiny_model
from mem1_core.qa.env import QAEnvironment
from mem1_core.qa.teacher import ScriptedTeacher
from mem1_core.rollout.loop import rollout
from mem1_core.training.sft import (
    eval_steps,
    lr_at,
    sft_loss,
    teacher_trajectories,
    train_on_trajectories,
)
from mem1_core.trajectory.logprobs import per_turn_logprobs
from mem1_core.trajectory.record import Action, turn_paths
from mem1_core.trajectory.tree import flatten

CFG = RolloutConfig()


def small_model(tokenizer):
    return build_tiny_model(
        ModelConfig(
            hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
        ),
        tokenizer,
    )


@pytest.fixture(scope="module")
def env(small_tokenizer, small_index):
    return QAEnvironment(small_tokenizer, small_index, topk=3)


def test_teacher_refuses_tasks_without_plans(small_tasks):
    """The teacher plays from the world's plans. Real questions (HotpotQA, NQ) have none: it
    would answer `?` to all of them, and SFT on that would teach exactly that."""
    from mem1_core.qa.teacher import can_play
    from mem1_core.rollout.loop import Task

    real = Task("nq-0", "Question 1: who?\n", ["who?"], [["Ilse Varro", "Varro"]], ["[]"])
    assert can_play(small_tasks) and not can_play([real]) and not can_play([*small_tasks, real])
    with pytest.raises(ValueError, match="plays only the world's tasks"):
        ScriptedTeacher(None, [*small_tasks, real])


@pytest.mark.parametrize("policy", ["mem1", "full"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_teacher_plays_the_format_well_under_both_policies(
    small_world, small_tokenizer, env, policy, n
):
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, n, split="test")
    tasks = tasks_from_table(table)[:8]
    trajs = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory=policy)
    assert all(t.format_errors == 0 and t.done for t in trajs)
    assert sum(t.reward for t in trajs) / len(trajs) >= 0.9  # retrieval may miss a document
    for t in trajs:
        assert t.turns[-1].action is Action.ANSWER
        assert all(turn.action is Action.QUERY for turn in t.turns[:-1])


def test_teacher_state_carries_forward_what_it_found(small_tasks, small_tokenizer, env):
    tasks = small_tasks[:6]
    trajs = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory="mem1")
    for t in trajs:
        last_state = t.turns[-1].gen_text.split("</IS>")[0]
        for i, em in enumerate(t.em):
            if em == 1.0:  # a right answer was in the memory, under its question's number
                assert f"Q{i + 1}:" in last_state


def test_teacher_actions_use_the_same_tokens_as_the_documents(small_tasks, small_tokenizer, env):
    """A name or year the teacher queries or answers is the same token ids as in running
    text (a state, a document: after a space), not another spelling glued to the tag."""
    from mem1_core.data.prompts import split_answers

    tasks = small_tasks[:8]
    trajs = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory="mem1")
    checked = 0
    for t in trajs:
        for turn in t.turns:
            ids = list(turn.gen_ids)
            open_tag = "<answer>" if turn.action is Action.ANSWER else "<query>"
            start = ids.index(small_tokenizer.convert_tokens_to_ids(open_tag)) + 1
            action = small_tokenizer.decode(ids[start:-1])
            values = split_answers(action) if turn.action is Action.ANSWER else [action.strip()]
            for v in values:
                want = small_tokenizer.encode(" " + v, add_special_tokens=False)
                got = ids[start:-1]
                assert any(got[i : i + len(want)] == want for i in range(len(got))), (v, action)
                checked += 1
    assert checked >= 2 * len(trajs)


def test_teacher_errs_on_purpose(small_tasks, small_tokenizer, env):
    tasks = small_tasks[:8]
    wrong = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks, error_rate=1.0), env, CFG)
    assert sum(t.reward for t in wrong) / len(wrong) <= 0.2


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_forgetful_teacher_answers_what_it_moved_on_from_with_a_question_mark(
    small_world, small_tokenizer, env, n
):
    """forget_rate=1: each finished objective but the last is `?` in every later state and in
    the answer; the rest of the play is the perfect teacher's. Checked against the perfect
    teacher's own trajectories."""
    from mem1_core.data.compose import compose
    from mem1_core.data.prompts import split_answers
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, n, split="train")
    tasks = tasks_from_table(table)[:12]
    good = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory="mem1")
    bad = rollout(
        tasks, ScriptedTeacher(small_tokenizer, tasks, forget_rate=1.0), env, CFG, memory="mem1"
    )
    for g, b in zip(good, bad, strict=True):
        assert [t.query for t in b.turns] == [t.query for t in g.turns]  # same lookups
        assert b.em == [0.0] * (n - 1) + g.em[-1:]
        answers = split_answers(b.answer)
        assert answers[: n - 1] == ["?"] * (n - 1) and answers[-1] == split_answers(g.answer)[-1]
        for turn_g, turn_b in zip(g.turns, b.turns, strict=True):
            for i in range(n - 1):
                if f"Q{i + 2}" in turn_g.gen_text:  # objective i is done and left behind
                    assert f"Q{i + 1}: ?." in turn_b.gen_text
            if n == 1:
                assert turn_b.gen_text == turn_g.gen_text


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_counting_teacher_states_the_next_question_of_n_then_done_n_of_n(
    small_world, small_tokenizer, env, n
):
    """teacher.counting: the same play as the plain teacher (same lookups, same answers),
    each state's `Next: Qk.` read `Next: Qk of N.` and the answer turn's state ending
    `Done: N of N.`"""
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, n, split="train")
    tasks = tasks_from_table(table)[:8]
    plain = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory="mem1")
    counted = rollout(
        tasks, ScriptedTeacher(small_tokenizer, tasks, counting=True), env, CFG, memory="mem1"
    )
    for p, c in zip(plain, counted, strict=True):
        assert c.answer == p.answer and c.em == p.em == [1.0] * n
        assert [t.query for t in c.turns] == [t.query for t in p.turns]
        for tp, tc in zip(p.turns[:-1], c.turns[:-1], strict=True):
            k = tp.gen_text.split("Next: Q")[1].split(".")[0]
            assert tc.gen_text == tp.gen_text.replace(f"Next: Q{k}.", f"Next: Q{k} of {n}.")
        last = p.turns[-1].gen_text
        assert c.turns[-1].gen_text == last.replace(" </IS>", f" Done: {n} of {n}. </IS>")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_slots_teacher_lists_every_question_pending_until_its_first_lookup(
    small_world, small_tokenizer, env, n
):
    """teacher.slots: the same play as the plain teacher (same lookups, same answers); each
    turn's state holds Q1..QN in order, the questions not yet queried (counted from the
    trajectory's own earlier queries) reading `pending`, every other entry as the plain
    teacher wrote it; the answer turn has nothing pending."""
    from mem1_core.data.compose import compose
    from mem1_core.data.prompts import IS_CLOSE, IS_OPEN
    from mem1_core.data.qa_data import world_questions
    from mem1_core.qa.teacher import task_steps
    from mem1_core.rollout.loop import tasks_from_table

    def entries(gen_text: str) -> dict[str, str]:
        state = gen_text.split(IS_OPEN)[1].split(IS_CLOSE)[0]
        state = state.split(" Next: ")[0].strip()
        if state == "Start.":
            return {}
        return dict(e.strip().split(": ", 1) for e in state.rstrip(".").split(". "))

    table, _ = compose(world_questions(small_world.questions).table, n, split="train")
    tasks = tasks_from_table(table)[:8]
    plain = rollout(tasks, ScriptedTeacher(small_tokenizer, tasks), env, CFG, memory="mem1")
    slotted = rollout(
        tasks, ScriptedTeacher(small_tokenizer, tasks, slots=True), env, CFG, memory="mem1"
    )
    for task, p, s in zip(tasks, plain, slotted, strict=True):
        assert s.answer == p.answer and s.em == p.em == [1.0] * n
        assert [t.query for t in s.turns] == [t.query for t in p.turns]
        hops = [len(obj) for obj in task_steps(task)]
        for k, (tp, ts) in enumerate(zip(p.turns, s.turns, strict=True)):
            got, want = entries(ts.gen_text), entries(tp.gen_text)
            assert list(got) == [f"Q{i + 1}" for i in range(n)]
            started = sum(1 for i in range(n) if sum(hops[:i]) < k)  # a lookup before turn k
            for i in range(n):
                assert got[f"Q{i + 1}"] == (want[f"Q{i + 1}"] if i < started else "pending")
        assert "pending" not in s.turns[-1].gen_text


def test_forgetting_is_a_fixed_draw_per_trajectory_and_objective(small_tasks, small_tokenizer, env):
    """Half the finished first objectives are dropped at forget_rate=0.5, and the same ones on
    a second run (a turn's text depends only on its trajectory)."""
    from mem1_core.data.prompts import split_answers

    tasks = small_tasks[:40]

    def firsts() -> list[str]:
        teacher = ScriptedTeacher(small_tokenizer, tasks, forget_rate=0.5)
        return [split_answers(t.answer)[0] for t in rollout(tasks, teacher, env, CFG)]

    once = firsts()
    assert once == firsts()
    assert 10 <= once.count("?") <= 30  # Binomial(40, 0.5): outside with p < 0.002


def test_the_configured_teacher_keeps_its_format_and_drops_its_lapses_only_when_asked(
    small_tasks, small_tokenizer, env
):
    """ScriptedTeacher.from_config plays as the teacher built from the same settings by hand:
    SFT's data (lapses on) and the evaluation's reference rows (the state format, no lapses)."""
    from mem1_core.config import TeacherConfig

    tasks = small_tasks[:12]
    cfg = TeacherConfig(forget_rate=1.0, error_rate=0.5, slots=True, counting=True, seed=3)

    def texts(teacher):
        return [[t.gen_text for t in tr.turns] for tr in rollout(tasks, teacher, env, CFG)]

    by_hand = ScriptedTeacher(
        small_tokenizer, tasks, error_rate=0.5, forget_rate=1.0, seed=5, slots=True, counting=True
    )
    assert texts(ScriptedTeacher.from_config(small_tokenizer, tasks, cfg, seed_offset=2)) == texts(
        by_hand
    )
    faithful = ScriptedTeacher(small_tokenizer, tasks, seed=3, slots=True, counting=True)
    clean = ScriptedTeacher.from_config(small_tokenizer, tasks, cfg, lapses=False)
    assert texts(clean) == texts(faithful)
    assert texts(clean) != texts(by_hand)  # the lapses were there to drop


def test_sft_loss_is_the_mean_nll_of_generated_tokens_in_their_real_contexts(
    small_tasks, small_tokenizer, env
):
    trajs = teacher_trajectories(small_tasks[:3], small_tokenizer, env, CFG, memory="mem1")
    model = small_model(small_tokenizer)
    trees = [flatten(turn_paths(t)) for t in trajs]
    with torch.no_grad():
        loss, n = sft_loss(model, trees, small_tokenizer.pad_token_id, "sdpa")
        ref = torch.cat([lp for t in trajs for lp in per_turn_logprobs(model, turn_paths(t))])
    assert n == ref.numel() == sum(len(turn.gen_ids) for t in trajs for turn in t.turns)
    torch.testing.assert_close(loss, -ref.mean(), atol=1e-5, rtol=0)


def test_context_loss_is_the_plain_language_model_loss_on_environment_tokens(
    small_tasks, small_tokenizer, env
):
    """Under `full` each trajectory is one chain, so the definition is a plain causal forward
    over the concatenated ids: mean NLL of generated tokens + w * mean NLL of the rest (every
    token but the first). Unflagged rows add nothing."""
    import torch.nn.functional as F

    trajs = teacher_trajectories(small_tasks[:3], small_tokenizer, env, CFG, memory="full")
    model = small_model(small_tokenizer)
    trees = [flatten(turn_paths(t)) for t in trajs]
    flags = [True, False, True]
    gen_nll, ctx_nll = [], []
    with torch.no_grad():
        loss, _ = sft_loss(
            model,
            trees,
            small_tokenizer.pad_token_id,
            "sdpa",
            context_weight=0.5,
            context_rows=flags,
        )
        for t, flag in zip(trajs, flags, strict=True):
            ids, gen = list(t.prompt_ids), [False] * len(t.prompt_ids)
            for turn in t.turns:  # the full-context chain: prompt, then each turn's G and I
                ids += turn.gen_ids + turn.info_ids
                gen += [True] * len(turn.gen_ids) + [False] * len(turn.info_ids)
            x = torch.tensor([ids])
            nll = (
                -F.log_softmax(model(input_ids=x).logits[0, :-1], -1)
                .gather(-1, x[0, 1:, None])
                .squeeze(-1)
            )
            is_gen = torch.tensor(gen[1:])
            gen_nll.append(nll[is_gen])
            if flag:
                ctx_nll.append(nll[~is_gen])
    want = torch.cat(gen_nll).mean() + 0.5 * torch.cat(ctx_nll).mean()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=0)


def test_teacher_worlds_are_fresh_and_train_only(small_world_config, tmp_path):
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.qa.tasks import teacher_world
    from mem1_core.runs.layout import RunPaths

    cfg = load_config("smoke")
    paths = RunPaths(tmp_path)
    eval_tasks = load_tasks(cfg, paths, "test", 1)
    sub_cfg, sub_paths = teacher_world(cfg, paths, 0)
    assert sub_cfg.world.seed != cfg.world.seed and sub_paths.root != paths.root
    assert teacher_world(cfg, paths, 1)[0].world.seed != sub_cfg.world.seed
    fresh = load_tasks(sub_cfg, sub_paths, "train", 1)
    # fresh names: the extra world's questions are not the evaluation world's
    assert not {q for t in fresh for q in t.questions} & {
        q for t in eval_tasks for q in t.questions
    }


def test_sft_lowers_the_loss_on_teacher_trajectories(small_tasks, small_tokenizer, env):
    cfg = dataclasses.replace(CFG, memory="mem1")
    trajs = teacher_trajectories(small_tasks[:16], small_tokenizer, env, cfg, memory="mem1")
    model = small_model(small_tokenizer)
    trees = [flatten(turn_paths(t)) for t in trajs]
    with torch.no_grad():
        before = float(sft_loss(model, trees, small_tokenizer.pad_token_id, "sdpa")[0])
    result = train_on_trajectories(
        model,
        trajs,
        small_tokenizer.pad_token_id,
        lr=3e-3,
        batch_size=8,
        minutes=5.0,
        max_steps=30,
        warmup_steps=3,
        progress=False,
    )
    with torch.no_grad():
        after = float(sft_loss(model, trees, small_tokenizer.pad_token_id, "sdpa")[0])
    assert result.steps == 30 and after < before - 1.0


def _fake_clock(monkeypatch, tick: float) -> list[float]:
    """sft's clock, on the test's own: each reading `tick` seconds on."""
    import types

    from mem1_core.training import sft

    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += tick
        return clock[0]

    monkeypatch.setattr(sft, "time", types.SimpleNamespace(perf_counter=perf_counter))
    return clock


@pytest.fixture(scope="module")
def eight(small_tasks, small_tokenizer, env):
    return teacher_trajectories(small_tasks[:8], small_tokenizer, env, CFG, memory="mem1")


def _train(trajs, tokenizer, **options):
    """A small model trained on `trajs` (lr 1e-3, batch 4) -> (model, SFTResult)."""
    model = small_model(tokenizer)
    options = {"lr": 1e-3, "batch_size": 4, "progress": False} | options
    return model, train_on_trajectories(model, trajs, tokenizer.pad_token_id, **options)


def test_held_out_evaluations_do_not_eat_the_sft_cap(eight, small_tokenizer, monkeypatch):
    """The cap is training time: an evaluation after every step that takes 1 s would stop a
    2-second cap after two steps if it counted; all six steps run. On a clock of the test's
    own (each reading 1 ms on, an evaluation 1 s), so a loaded machine cannot decide it."""
    clock = _fake_clock(monkeypatch, 1e-3)
    calls = []

    def slow_eval() -> dict:
        clock[0] += 1.0
        calls.append(1)
        return {"eval_reward": 0.0}

    _, result = _train(
        eight, small_tokenizer, minutes=2.0 / 60, max_steps=6, eval_fn=slow_eval, evals=5
    )
    assert result.steps == 6 and len(calls) == 5 and result.stopped_by == "count"
    assert result.seconds < 2.0 + 1.0  # training time, not the 5 seconds of evaluations
    assert [r["step"] for r in result.curve] == [1, 2, 3, 4, 5, 6]
    assert result.curve[-1]["stopped_by"] == "count"


def test_evaluations_fall_on_evenly_spaced_steps():
    assert eval_steps(100, 4) == {20, 40, 60, 80}
    assert eval_steps(41, 4) == {8, 16, 25, 33}
    assert eval_steps(6, 5) == {1, 2, 3, 4, 5}
    assert eval_steps(3, 8) == {1, 2}  # never the end (the evaluation after the stage)
    assert eval_steps(100, 0) == frozenset()


def test_the_clock_changes_nothing_an_sft_stage_computes(eight, small_tokenizer, monkeypatch):
    """The same steps on a fast clock and on one 1000x slower (still under the cap) train the
    same weights: the lr schedule and the evaluations follow the steps, not the minutes."""
    runs = []
    for tick in (1e-4, 1e-1):
        _fake_clock(monkeypatch, tick)
        calls: list[int] = []
        model, result = _train(
            eight,
            small_tokenizer,
            minutes=10.0,
            max_steps=8,
            warmup_steps=2,
            eval_fn=lambda calls=calls: calls.append(1) or {"eval_reward": 0.0},
            evals=3,
        )
        runs.append((result, [p.detach().clone() for p in model.parameters()], len(calls)))
    (fast, w_fast, e_fast), (slow, w_slow, e_slow) = runs
    assert fast.steps == slow.steps == 8 and e_fast == e_slow == 3
    assert fast.seconds < slow.seconds  # the clocks did differ
    assert all(torch.equal(a, b) for a, b in zip(w_fast, w_slow, strict=True))


def test_the_minutes_cap_stops_an_sft_stage_with_a_warning(
    eight, small_tokenizer, monkeypatch, caplog
):
    _fake_clock(monkeypatch, 1.0)  # every reading a second on: a 0.1-minute cap is 6 s
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.sft"):
        _, result = _train(eight, small_tokenizer, minutes=0.1, max_steps=50, stage="sft (mem1)")
    assert 0 < result.steps < 50 and result.stopped_by == "minutes"
    assert result.curve[-1] == result.curve[-1] | {"step": result.steps, "stopped_by": "minutes"}
    assert f"cap stopped it after {result.steps} of 50 steps" in caplog.text


def test_learning_rate_schedule():
    assert lr_at(0.0, 0.1, 1.0) == 0.0
    assert lr_at(0.05, 0.1, 1.0) == pytest.approx(0.5)
    assert lr_at(0.1, 0.1, 1.0) == pytest.approx(1.0)
    assert lr_at(1.0, 0.1, 1.0) == pytest.approx(0.1)


def test_a_repeated_n_weights_the_warm_start_data(tmp_path, monkeypatch, capsys):
    """`sft.warm_start_objectives=[1,1,2]`: the teacher's N=1 trajectories are two thirds of the
    warm start's data (the format-first start is `[1,1,1,2]`), counted in what it trained
    on, and an N given once is an even split."""
    import json

    from mem1_core.cli.main import main
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "disabled")
    for ns, want in (("[1,1,2]", {1: 8, 2: 4}), ("[1,2]", {1: 6, 2: 6})):
        out = tmp_path / ns.strip("[]").replace(",", "")
        argv = ["train", "sft", "--warm-start", "--profile", "smoke", "--out", str(out)]
        sets = [f"sft.warm_start_objectives={ns}", "sft.warm_start_steps=1", "sft.n_teacher_tasks=12", "sft.eval_tasks=0"]  # fmt: skip
        assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 1
        taught = read_trajectories(out / "teacher_trajectories.parquet")
        counts = {n: sum(t.n_objectives == n for t in taught) for n in (1, 2)}
        assert counts == want, ns


def test_an_objective_whose_lookups_ran_out_of_turns_is_answered_unknown():
    """Forced to answer before its lookups are done (a turn budget under two per objective),
    the teacher says it does not know, for a comparison as for a chain, instead of failing."""
    from mem1_core.qa.teacher import UNKNOWN, Step, final_answer

    comparison = [Step(0, "Ana Bel", "Ana Bel", "1901"), Step(0, "Cor Dan", "Cor Dan", "1890")]
    assert final_answer(comparison, ["1901", "1890"]) == "Cor Dan"
    assert final_answer(comparison, ["1901"]) == UNKNOWN
    chain = [Step(0, "Ana Bel", "Ana Bel", "Cor Dan"), Step(0, "Cor Dan", "Cor Dan", "1890")]
    assert final_answer(chain, ["Cor Dan"]) == UNKNOWN
    assert final_answer(chain, ["Cor Dan", "1890"]) == "1890"
